// History: the user's sessions (admins: everyone's), newest first; each opens read-only (or live if running).
// Sessions a Prometheus alert started are marked "started by alert NAME" (GET /api/v1/alerts, docs/alerts.md).

import { api } from "./api.js";
import { badge, field, fmtCount, fmtTime, h } from "./dom.js";

function outcome(session) {
  if (session.partial && session.state === "ended") return "partial";
  return session.state;
}

// Session id -> the alert that started it; empty when the controller takes no alerts or the user may see none.
async function alertOrigins() {
  try {
    const records = await api("/alerts");
    return new Map(records.map((record) => [record.session, record]));
  } catch {
    return new Map();
  }
}

export async function renderHistory(root, ctx) {
  const [sessions, origins] = await Promise.all([api("/sessions"), alertOrigins()]);
  const search = h("input", { type: "search", placeholder: "diagnostic, host, user, id…", autocomplete: "off" });
  const tbody = h("tbody");
  const count = h("p", { class: "muted small", role: "status" });
  root.append(
    h("h1", {}, ctx.me.admin ? "Sessions (everyone's)" : "Your sessions"),
    h("div", { class: "toolbar" }, h("div", { class: "grow" }, field("Filter", search))),
    count,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { "aria-label": "Sessions, newest first" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ["Session", "State", "Diagnostic", "Hosts", "Per-hop verdicts", "Records", "Created", "User"].map((t, i) => h("th", { scope: "col", class: [4, 5, 7].includes(i) ? "hide-narrow" : null }, t)),
          ),
        ),
        tbody,
      ),
    ),
  );

  function refresh() {
    const words = search.value.trim().toLowerCase().split(/\s+/).filter(Boolean);
    const shown = sessions.filter((s) => {
      const text = [s.id, s.user, s.diagnostic, s.state, ...Object.keys(s.hosts || {}), s.config?.netns, origins.get(s.id)?.started_by].join(" ").toLowerCase();
      return words.every((w) => text.includes(w));
    });
    tbody.replaceChildren(
      ...shown.map((s) => {
        const hostStates = Object.entries(s.hosts || {}).map(([host, st]) => h("span", { class: `tag s-${String(st.state).replace(/[^a-z]/g, "")}` }, `${host}: ${st.state}`));
        const origin = origins.get(s.id);
        const startedBy = origin ? h("div", { class: "muted small", title: origin.verdict || origin.alert?.summary || "" }, `started by ${origin.started_by}`) : null;
        return h(
          "tr",
          { dataset: { session: s.id } },
          h("td", { "data-label": "Session" }, h("a", { href: `#/session/${encodeURIComponent(s.id)}` }, h("span", { class: "mono" }, s.id)), startedBy),
          h("td", { "data-label": "State" }, badge(outcome(s))),
          h("td", { "data-label": "Diagnostic" }, s.diagnostic, s.config?.netns ? h("div", { class: "muted small" }, `netns ${s.config.netns}`) : null),
          h("td", { "data-label": "Hosts" }, h("div", { class: "tags" }, hostStates)),
          h("td", { class: "num hide-narrow", "data-label": "Per-hop verdicts" }, fmtCount(s.verdicts_count ?? s.verdicts?.length)),
          h("td", { class: "num hide-narrow", "data-label": "Records" }, fmtCount(s.timeline_length)),
          h("td", { "data-label": "Created" }, fmtTime(s.created)),
          h("td", { class: "hide-narrow", "data-label": "User" }, s.user),
        );
      }),
    );
    if (!shown.length) tbody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "empty" }, sessions.length ? "No session matches the filter." : "No session yet. Start one from New diagnosis.")));
    count.textContent = `${shown.length} of ${sessions.length} sessions`;
  }
  search.addEventListener("input", refresh);
  refresh();
}
