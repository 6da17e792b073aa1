// Hosts: the registry as the user's role may see it, polled every few seconds. Rows are keyed by host id and
// updated in place, so a poll never steals keyboard focus, a ticked checkbox or an opened fold.
// What a host can do is the controller's answer (each host's `support`: which of its diagnostics it runs, and
// in words why not the others); the probed BPF features behind it are folded away.

import { api } from "./api.js";
import { badge, field, fmtAgo, fmtTime, h, put } from "./dom.js";

const POLL_MS = 3000;

export function hostState(host) {
  return host.state || host.status || "unknown";
}

/** Probed BPF features: what the host has, then what it lacks ("no fentry"); other facts are not features. */
export function featureList(features) {
  if (!features || typeof features !== "object") return [];
  const entries = Object.entries(features).filter(([, v]) => typeof v === "boolean");
  return [
    ...entries.filter(([, v]) => v).map(([k]) => ({ text: k, has: true })),
    ...entries.filter(([, v]) => !v).map(([k]) => ({ text: `no ${k}`, has: false })),
  ];
}

/** The controller's verdict on each of the host's diagnostics: `{diagnostic, runs, why}`. */
export function support(host) {
  return Array.isArray(host.support) ? host.support : [];
}

/** The diagnostics the host cannot run (or cannot be told), grouped by the reason, so one missing kernel
 * feature reads once with every diagnostic it stops. */
function reasonsWhyNot(host) {
  const groups = new Map();
  for (const entry of support(host)) {
    if (entry.runs === true) continue;
    const why = (entry.why || []).join("; ") || "the controller does not say why";
    if (!groups.has(why)) groups.set(why, { why, runs: entry.runs, names: [] });
    groups.get(why).names.push(entry.diagnostic);
  }
  return [...groups.values()];
}

function supportCell(host) {
  const all = support(host);
  const runs = all.filter((entry) => entry.runs === true).map((entry) => entry.diagnostic);
  if (!all.length) return [h("span", { class: "muted" }, "none reported"), featuresFold(host)];
  const headline = runs.length === all.length ? `Runs all ${all.length} diagnostics` : runs.length ? `Runs ${runs.length} of ${all.length} diagnostics` : `Runs none of its ${all.length} diagnostics`;
  const whyNot = reasonsWhyNot(host);
  return [
    runs.length
      ? h("details", { class: "fold runnable" }, h("summary", {}, headline), h("div", { class: "tags" }, runs.map((name) => h("span", { class: "tag" }, name))))
      : h("p", { class: "runs" }, headline),
    whyNot.length
      ? h(
          "ul",
          { class: "why-not" },
          whyNot.map((group) => {
            const which = group.names.length === all.length && all.length > 1 ? "any of them" : group.names.join(", ");
            return h("li", { dataset: { runs: String(group.runs) } }, h("strong", {}, `${group.runs === false ? "Cannot run" : "Cannot tell for"} ${which}`), `: ${group.why}.`);
          }),
        )
      : null,
    featuresFold(host),
  ];
}

function featuresFold(host) {
  const features = featureList(host.features);
  if (!features.length) return null;
  return h("details", { class: "fold features" }, h("summary", {}, "BPF features"), h("div", { class: "tags" }, features.map((f) => h("span", { class: f.has ? "tag" : "tag lacks" }, f.text))));
}

export function namespaceNames(host) {
  return (host.namespaces || []).map((ns) => (typeof ns === "string" ? ns : ns.name || String(ns.inode)));
}

// Kubernetes pods the host's container runtime runs, as kubectl spells them across namespaces.
function podNames(host) {
  return (host.pods || []).map((p) => `${p.namespace}/${p.name}`);
}

function containerNames(host) {
  return (host.containers || []).map((c) => (typeof c === "string" ? c : c.name || c.id || JSON.stringify(c)));
}

function labelsOf(host) {
  return Object.entries(host.labels || {}).map(([k, v]) => `${k}=${v}`);
}

function haystack(host) {
  return [host.host, host.hostname, host.kernel, host.version, ...labelsOf(host), ...namespaceNames(host), ...containerNames(host), ...podNames(host)]
    .join(" ")
    .toLowerCase();
}

export async function renderHosts(root, ctx) {
  const search = h("input", { type: "search", placeholder: "name, label, namespace, kernel…", autocomplete: "off" });
  const stateFilter = h(
    "select",
    {},
    h("option", { value: "" }, "any"),
    h("option", { value: "up" }, "up"),
    h("option", { value: "stale" }, "stale"),
  );
  const count = h("p", { class: "muted small", role: "status", "aria-live": "polite" });
  const diagnose = h("button", { type: "button" }, "Diagnose selected");
  const tbody = h("tbody");
  const selectAll = h("input", { type: "checkbox", "aria-label": "Select every shown host" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const rows = new Map();
  const shownSupport = new Map(); // host -> what its Diagnostics cell shows, to rebuild it only on a change
  let hosts = [];

  root.append(
    h("h1", {}, "Hosts"),
    h("div", { class: "toolbar" }, h("div", { class: "grow" }, field("Filter", search)), h("div", {}, field("Status", stateFilter)), h("div", {}, diagnose)),
    error,
    count,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { "aria-label": "Hosts in the fleet" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            h("th", { scope: "col" }, selectAll),
            h("th", { scope: "col" }, "Host"),
            h("th", { scope: "col" }, "Status"),
            h("th", { scope: "col", class: "hide-narrow" }, "Kernel"),
            h("th", { scope: "col" }, "Diagnostics"),
            h("th", { scope: "col", class: "hide-narrow" }, "Agent"),
            h("th", { scope: "col" }, "Heartbeat"),
            h("th", { scope: "col" }, "Namespaces / containers"),
          ),
        ),
        tbody,
      ),
    ),
  );

  function visible(host) {
    const text = search.value.trim().toLowerCase();
    if (stateFilter.value && hostState(host) !== stateFilter.value) return false;
    return !text || text.split(/\s+/).every((word) => haystack(host).includes(word));
  }

  function row(host) {
    let tr = rows.get(host.host);
    if (!tr) {
      const box = h("input", { type: "checkbox", "aria-label": `Select ${host.host}` });
      box.checked = ctx.selectedHosts.has(host.host);
      box.addEventListener("change", () => {
        if (box.checked) ctx.selectedHosts.add(host.host);
        else ctx.selectedHosts.delete(host.host);
        refresh();
      });
      tr = h("tr", { dataset: { host: host.host } }, h("td", { "data-label": "Select" }, box));
      for (const label of ["Host", "Status", "Kernel", "Diagnostics", "Agent", "Heartbeat", "Namespaces"]) tr.append(h("td", { "data-label": label }));
      tr.cells[3].className = "hide-narrow";
      tr.cells[4].className = "support";
      tr.cells[5].className = "hide-narrow";
      rows.set(host.host, tr);
    }
    const cells = tr.cells;
    put(cells[1], h("strong", {}, host.host), host.hostname && host.hostname !== host.host ? h("div", { class: "muted small" }, host.hostname) : null, labelsOf(host).length ? h("div", { class: "tags" }, labelsOf(host).map((l) => h("span", { class: "tag" }, l))) : null);
    put(cells[2], badge(hostState(host)), host.last_error ? h("div", { class: "error small" }, host.last_error) : null);
    put(cells[3], h("span", { class: "mono" }, host.kernel || "–"));
    // Rebuilt only when the answer changes, keeping what the user unfolded.
    const shown = JSON.stringify([host.support, host.features]);
    if (shownSupport.get(host.host) !== shown) {
      const open = new Set([...cells[4].querySelectorAll("details[open]")].map((fold) => fold.className));
      put(cells[4], h("div", { class: "support-body" }, supportCell(host)));
      for (const fold of cells[4].querySelectorAll("details")) fold.open = open.has(fold.className);
      shownSupport.set(host.host, shown);
    }
    put(cells[5], h("span", { class: "mono" }, host.version || "–"));
    put(cells[6], h("span", { title: fmtTime(host.heartbeat) }, fmtAgo(host.heartbeat)));
    const names = [...namespaceNames(host).map((n) => `netns ${n}`), ...containerNames(host).map((c) => `container ${c}`), ...podNames(host).map((p) => `pod ${p}`)];
    put(cells[7], h("div", { class: "tags" }, names.length ? names.map((n) => h("span", { class: "tag" }, n)) : h("span", { class: "muted" }, "none reported")));
    return tr;
  }

  function refresh() {
    const shown = hosts.filter(visible);
    const wanted = shown.map(row);
    // Reorder only when needed so focused checkboxes stay put.
    const current = [...tbody.children];
    if (current.length !== wanted.length || current.some((el, i) => el !== wanted[i])) {
      tbody.replaceChildren(...wanted);
    }
    if (!shown.length) tbody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "empty" }, hosts.length ? "No host matches the filter." : "No host has registered yet, or your role may see none.")));
    const selected = [...ctx.selectedHosts].filter((id) => hosts.some((host) => host.host === id));
    count.textContent = `${shown.length} of ${hosts.length} hosts shown, ${selected.length} selected`;
    selectAll.checked = shown.length > 0 && shown.every((host) => ctx.selectedHosts.has(host.host));
    diagnose.disabled = selected.length === 0;
  }

  selectAll.addEventListener("change", () => {
    for (const host of hosts.filter(visible)) {
      if (selectAll.checked) ctx.selectedHosts.add(host.host);
      else ctx.selectedHosts.delete(host.host);
      const box = rows.get(host.host)?.querySelector("input");
      if (box) box.checked = selectAll.checked;
    }
    refresh();
  });
  search.addEventListener("input", refresh);
  stateFilter.addEventListener("change", refresh);
  diagnose.addEventListener("click", () => ctx.navigate("#/new"));

  async function poll() {
    try {
      hosts = await api("/hosts");
      hosts.sort((a, b) => String(a.host).localeCompare(String(b.host)));
      error.hidden = true;
    } catch (err) {
      if (err.status === 401) return ctx.signedOut(err.message);
      error.textContent = err.message;
      error.hidden = false;
    }
    refresh();
  }
  await poll();
  const timer = setInterval(poll, POLL_MS);
  return () => clearInterval(timer);
}
