// Tiny DOM helpers: build elements from plain data so no string ever becomes HTML (records carry text from
// the network: process names, rule texts, interface names).

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (value === true) el.setAttribute(key, "");
    else el.setAttribute(key, String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Replace an element's children (null/false children are skipped, unlike Element.append's "null"). */
export function put(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function badge(state) {
  const word = String(state ?? "unknown");
  return h("span", { class: `badge s-${word.replace(/[^a-z]/g, "")}` }, word);
}

let uid = 0;
export function nextId(prefix) {
  uid += 1;
  return `${prefix}-${uid}`;
}

/** A labelled control: every input on every page goes through here, so none is left without a label. */
export function field(labelText, control, hint) {
  if (!control.id) control.id = nextId("f");
  let help = null;
  if (hint) {
    help = h("p", { class: "hint", id: nextId("hint") }, hint);
    control.setAttribute("aria-describedby", help.id);
  }
  return h("div", { class: "field" }, h("label", { for: control.id }, labelText), control, help);
}

export function fmtCount(n) {
  return n === undefined || n === null ? "–" : Number(n).toLocaleString("en-US");
}

export function fmtTime(iso) {
  if (!iso) return "–";
  const d = typeof iso === "number" ? new Date(iso * 1000) : new Date(iso);
  if (Number.isNaN(d.getTime())) return String(iso);
  return d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function fmtAgo(iso) {
  if (!iso) return "never";
  const t = typeof iso === "number" ? iso * 1000 : Date.parse(iso);
  if (Number.isNaN(t)) return String(iso);
  const s = Math.max(0, Math.round((Date.now() - t) / 1000));
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

export function fmtOffset(ns) {
  if (ns === undefined || ns === null) return "–";
  const ms = Number(ns) / 1e6;
  return `${ms >= 0 ? "+" : ""}${ms.toFixed(ms > -10 && ms < 10 ? 2 : 0)} ms`;
}
