// Verdicts, ranked: per-flow verdicts from the controller's merge (hops across hosts) and per-host verdicts
// from `diagnose` (severity, cause, evidence, fix). Worst first: lost traffic before warnings before info.

import { badge, h } from "./dom.js";

// One scale for both kinds. The merged per-hop verdict of a flow that lost traffic is what the fleet
// exists for, so it leads; then each host's verdicts by severity; healthy flows last.
const SEVERITY = { critical: 1, warning: 2, info: 4 };
// A merged verdict's outcome is what the application saw (reset, refused, timeout) or, without its view, what
// the hosts saw (dropped): all lost traffic.
const OUTCOME = { dropped: 0, reset: 0, refused: 0, timeout: 0, failed: 1, unanswered: 3, open: 4, established: 5, closed: 5, seen: 5 };

export function isHostVerdict(v) {
  return v && v.type === "verdict" && v.cause !== undefined && v.severity !== undefined;
}

export function rankKey(v) {
  if (isHostVerdict(v)) return [SEVERITY[v.severity] ?? 4, -(v.evidence?.count || v.evidence?.drops || 0)];
  return [OUTCOME[v.outcome] ?? 3, -(v.hops?.length || 0)];
}

export function rankVerdicts(list) {
  return [...list].sort((a, b) => {
    const x = rankKey(a);
    const y = rankKey(b);
    return x[0] - y[0] || x[1] - y[1];
  });
}

function value(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

function evidenceList(evidence) {
  const rows = [];
  for (const [key, val] of Object.entries(evidence || {})) {
    if (val && typeof val === "object" && !Array.isArray(val)) {
      for (const [k2, v2] of Object.entries(val)) rows.push(h("dt", {}, `${key}.${k2}`), h("dd", {}, value(v2)));
    } else {
      rows.push(h("dt", {}, key), h("dd", {}, value(val)));
    }
  }
  return h("dl", { class: "evidence" }, rows);
}

function hopText(hop) {
  if (typeof hop === "string") return hop;
  const text = hop.detail || hop.event || "";
  // The controller's details usually name the host already ("on host lb"); say it only when they do not.
  return hop.host && !text.includes(`host ${hop.host}`) ? `${text} (host ${hop.host})` : text;
}

export function verdictItem(v) {
  if (isHostVerdict(v)) {
    const where = [v.host ? `host ${v.host}` : null, v.category].filter(Boolean).join(" · ");
    return h(
      "li",
      { class: "verdict", dataset: { category: v.category || "", host: v.host || "" } },
      h("div", { class: "row" }, badge(v.severity), h("span", { class: "where" }, where)),
      h("p", { class: "cause" }, v.cause),
      v.fix?.length ? h("div", {}, h("h3", {}, "Fix"), v.fix.map((line) => h("pre", {}, line))) : null,
      Object.keys(v.evidence || {}).length ? h("details", {}, h("summary", {}, "Evidence"), evidenceList(v.evidence)) : null,
    );
  }
  const missing = v.missing_hosts?.length ? h("p", { class: "error small" }, `Partial: no result from ${v.missing_hosts.join(", ")}.`) : null;
  return h(
    "li",
    { class: "verdict", dataset: { flow: v.flow || "", outcome: v.outcome || "" } },
    h("div", { class: "row" }, badge(v.outcome || "flow"), h("span", { class: "where mono" }, v.flow || "")),
    // The first line: what the application saw, the hop where it began, the cause.
    h("p", { class: "cause" }, v.text || (v.hops || []).map(hopText).join(" → ")),
    v.hops?.length ? h("ol", { class: "hops", "aria-label": "Hops" }, v.hops.map((hop, i) => hopItem(hop, i, v.clocks_ms))) : null,
    missing,
    v.fix?.length ? h("div", {}, h("h3", {}, "Fix"), v.fix.map((line) => h("pre", {}, line))) : null,
  );
}

// One hop as the controller told it: in causal order; where it began marked; its time on the controller's
// clock with how far its host's clock may be off; a hop the clocks cannot order against the one before says
// so instead of pretending an order.
function hopItem(hop, index, clocks) {
  if (typeof hop === "string") return h("li", {}, hop);
  const off = clocks?.[hop.host];
  const when = hop.time ? hop.time.slice(11, 26) + (off ? ` ±${off} ms` : "") : "before the session";
  const order = hop.order === "concurrent"
    ? h("span", { class: "order small" }, ` · order against hop ${index} unknown: clocks ±${hop.uncertainty_ms} ms`)
    : null;
  return h(
    "li",
    { class: hop.began ? "hop began" : "hop", dataset: { host: hop.host || "", event: hop.event || "", order: hop.order || "" } },
    h("span", { class: "time small" }, when), " ",
    h("span", { class: "detail" }, hopText(hop)),
    hop.began ? h("strong", { class: "began-mark small" }, " ← it began here") : null,
    order,
    hop.evidence ? h("details", {}, h("summary", {}, "Evidence"), evidenceList(hop.evidence)) : null,
  );
}
