// Audit (admins): every decision, refusal and session end, from the controller's undeletable audit stream.
// user / decision / since go to the server; the action and free-text filters narrow what it returned.

import { ApiError, api } from "./api.js";
import { badge, field, fmtTime, h } from "./dom.js";

const ACTIONS = ["auth", "session.create", "session.cancel", "session.end", "task.rejected", "message.refused", "control.ignored", "audit.read"];

/** A session's end is no decision: what came of it is (the controller's `result`: ended, partial, failed,
 * cancelled), with the hosts that did not end and why. */
function sessionResult(e) {
  return e.action === "session.end" && typeof e.result === "string" ? e.result : null;
}

function unfinishedHosts(e) {
  return Object.entries(e.host_states || {})
    .filter(([, st]) => st?.state && st.state !== "ended")
    .map(([host, st]) => `${host} ${st.state}${st.reason ? `: ${st.reason}` : ""}`);
}

function decisionCell(e) {
  const result = sessionResult(e);
  const unfinished = e.action === "session.end" ? unfinishedHosts(e) : [];
  return [
    badge(result || e.decision || "–"),
    !result && e.status ? h("div", { class: "muted small" }, String(e.status)) : null,
    unfinished.length ? h("ul", { class: "unfinished small" }, unfinished.map((text) => h("li", {}, text))) : null,
  ];
}

function rowData(e) {
  const result = sessionResult(e);
  return { seq: e.seq, action: e.action, decision: e.decision, source: e.source, ...(result ? { result } : {}) };
}

function outcomeText(outcome) {
  if (typeof outcome !== "object") return String(outcome);
  return Object.entries(outcome)
    .map(([key, val]) => `${key}: ${typeof val === "object" ? val?.state || JSON.stringify(val) : val}`)
    .join(", ");
}

export async function renderAudit(root, ctx) {
  const user = h("input", { type: "text", name: "user", autocomplete: "off" });
  const decision = h("select", { name: "decision" }, h("option", { value: "" }, "any"), h("option", { value: "allow" }, "allow"), h("option", { value: "deny" }, "deny"));
  const since = h("input", { type: "text", name: "since", placeholder: "ISO time or unix s", autocomplete: "off" });
  const action = h("select", { name: "action" }, h("option", { value: "" }, "any"), ACTIONS.map((a) => h("option", { value: a }, a)));
  const text = h("input", { type: "search", name: "text", placeholder: "session, host, reason…", autocomplete: "off" });
  const apply = h("button", { type: "submit" }, "Apply");
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const count = h("p", { class: "muted small", role: "status" });
  const tbody = h("tbody");
  let entries = [];

  const form = h(
    "form",
    { class: "toolbar", "aria-label": "Audit filters" },
    h("div", {}, field("User", user)),
    h("div", {}, field("Decision", decision)),
    h("div", {}, field("Since", since)),
    h("div", {}, field("Action", action)),
    h("div", { class: "grow" }, field("Contains", text)),
    h("div", {}, apply),
  );
  root.append(
    h("h1", {}, "Audit"),
    h("p", { class: "muted" }, "Every sign-in failure, request, refusal (by the controller or an agent) and session outcome, newest first. The stream denies delete and purge."),
    form,
    error,
    count,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { "aria-label": "Audit records" },
        h("thead", {}, h("tr", {}, ["Time", "User", "Action", "Decision / result", "What", "Reason / outcome"].map((t) => h("th", { scope: "col" }, t)))),
        tbody,
      ),
    ),
  );

  function what(e) {
    const parts = [];
    if (e.diagnostic) parts.push(e.diagnostic);
    if (e.hosts?.length) parts.push(`on ${e.hosts.join(", ")}`);
    if (e.scope?.netns?.length) parts.push(`netns ${e.scope.netns.join(", ")}`);
    return h("div", {}, parts.join(" "), e.session ? h("div", {}, h("a", { href: `#/session/${encodeURIComponent(e.session)}`, class: "mono small" }, e.session)) : null);
  }

  // Who wrote the record is the subject it was stored under (the server says), not what its body claims.
  function writer(e) {
    const by = e.source === "agent" ? `agent ${e.host}` : e.source;
    const claim = e.claimed ? ` (claimed: ${Object.values(e.claimed).flat().join(", ")})` : "";
    return h("div", { class: "muted small" }, `by ${by}${claim}`);
  }

  function refresh() {
    const words = text.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const shown = entries.filter((e) => (!action.value || e.action === action.value) && words.every((w) => JSON.stringify(e).toLowerCase().includes(w)));
    tbody.replaceChildren(
      ...shown.map((e) =>
        h(
          "tr",
          { dataset: rowData(e) },
          h("td", { class: "mono small", "data-label": "Time" }, fmtTime(e.time)),
          h("td", { "data-label": "User" }, e.user || "–", e.remote ? h("div", { class: "muted small" }, e.remote) : null),
          h("td", { class: "mono", "data-label": "Action" }, e.action, writer(e)),
          h("td", { "data-label": "Decision" }, decisionCell(e)),
          h("td", { "data-label": "What" }, what(e)),
          h("td", { "data-label": "Reason" }, e.reason || "", e.outcome ? h("div", { class: "muted small" }, outcomeText(e.outcome)) : null),
        ),
      ),
    );
    if (!shown.length) tbody.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "empty" }, "No audit record matches.")));
    count.textContent = `${shown.length} of ${entries.length} records`;
  }

  async function load() {
    const query = new URLSearchParams();
    if (user.value.trim()) query.set("user", user.value.trim());
    if (decision.value) query.set("decision", decision.value);
    if (since.value.trim()) query.set("since", since.value.trim());
    query.set("limit", "1000");
    error.hidden = true;
    try {
      entries = (await api(`/audit?${query}`)).reverse(); // the API gives newest last
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return ctx.signedOut(err.message);
      error.textContent = err.message;
      error.hidden = false;
      entries = [];
    }
    refresh();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    load();
  });
  action.addEventListener("change", refresh);
  text.addEventListener("input", refresh);
  await load();
}
