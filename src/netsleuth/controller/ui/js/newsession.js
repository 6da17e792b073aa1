// New diagnosis: only what the role allows is offered (diagnostics, namespaces); everything is still checked
// by the server. Its refusal is shown next to the form: when it blames one field, that field is marked and
// the problem is worded with the field's label here (the server's sentence names the CLI's flag, for the CLI).

import { ApiError, api } from "./api.js";
import { clear, field, h } from "./dom.js";
import { hostState, namespaceNames, support } from "./hosts.js";

// Used only when the role says "*" and the controller has no catalogue endpoint.
const KNOWN_DIAGNOSTICS = ["diagnose", "drops", "resets", "conn", "tcp.life", "tcp.states", "tcp.retrans", "tcp.connlat", "tcp.queues"];

const DESCRIPTIONS = {
  diagnose: "drops, resets, retransmits and path health in one window; ranked verdicts",
  drops: "every packet the kernel frees as dropped, with reason, rule and owner",
  resets: "TCP resets sent and received, with their cause",
  conn: "per-connection life: handshake, retransmits, drops, resets, outcome",
};

/** Role entries are names or globs (`web-*`, `*`), as the controller matches them (fnmatch). */
function globMatch(pattern, value) {
  const re = new RegExp(`^${pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
  return re.test(value);
}

function allows(list, value) {
  return Array.isArray(list) && list.some((pattern) => globMatch(pattern, value));
}

/** The role may run on a host's own namespace (no netns in the request): `*` or `host` in its netns list. */
function allowsWholeHost(list) {
  return Array.isArray(list) && (list.includes("*") || list.includes("host"));
}

/** What the hosts can run (each reports its catalogue), limited to what the role allows. */
function catalogue(me, hosts) {
  const allowed = me.allowed?.diagnostics || [];
  const offered = new Set();
  for (const host of hosts) for (const name of host.diagnostics || []) offered.add(name);
  let names = offered.size ? [...offered] : allowed.includes("*") ? KNOWN_DIAGNOSTICS : allowed;
  names = names.filter((d) => allows(allowed, d));
  // The usual entry points first, then the rest by name.
  return names.sort((a, b) => (KNOWN_DIAGNOSTICS.indexOf(a) + 1 || 99) - (KNOWN_DIAGNOSTICS.indexOf(b) + 1 || 99) || a.localeCompare(b));
}

/** Filters as the CLI spells them; values go to the server as typed so its validation sentence is the CLI's. */
const FILTERS = [
  ["proto", "Protocol", "tcp, udp, icmp, icmpv6, sctp or a number"],
  ["host", "Either address", "ADDR[/LEN], comma separated"],
  ["src", "Source address", "ADDR[/LEN], comma separated"],
  ["dst", "Destination address", "ADDR[/LEN], comma separated"],
  ["port", "Either port", "1–65535"],
  ["sport", "Source port", "1–65535"],
  ["dport", "Destination port", "1–65535"],
  ["pid", "Process id", "the sender or the socket's owner"],
  ["comm", "Process name", "as in /proc/PID/comm"],
  ["dev", "Interface", "e.g. veth0"],
];
const LIST_FILTERS = new Set(["host", "src", "dst"]);
const NUMBER_FILTERS = new Set(["port", "sport", "dport", "pid"]);

export async function renderNew(root, ctx) {
  const me = ctx.me;
  const hosts = await api("/hosts");
  const diagnostics = catalogue(me, hosts);
  hosts.sort((a, b) => String(a.host).localeCompare(String(b.host)));
  const allowedNetns = me.allowed?.netns || [];

  const error = h("div", { class: "form-error", role: "alert", id: "new-error", hidden: true });
  const submit = h("button", { type: "submit" }, "Start diagnosis");

  // Hosts: by name (checkboxes) or by label (key=value).
  const byName = h("input", { type: "radio", name: "pick", value: "name", checked: true });
  const byLabel = h("input", { type: "radio", name: "pick", value: "label" });
  const hostBoxes = hosts.map((host) => {
    const box = h("input", { type: "checkbox", name: "hosts", value: host.host });
    box.checked = ctx.selectedHosts.has(host.host);
    const label = h("label", { class: "check" }, box, h("span", {}, host.host), h("span", { class: "muted small" }, hostState(host)));
    return { box, label, host };
  });
  const labelInput = h("input", { type: "text", placeholder: "role=lb", autocomplete: "off", disabled: true });
  const hostList = h("div", { class: "pill-list", role: "group", "aria-label": "Hosts by name" }, hostBoxes.map((b) => b.label));

  // Scope: namespaces the chosen hosts report, limited to those the role allows.
  const netnsSelect = h("select", { name: "netns" });
  const diagSelect = h("select", { name: "diagnostic", required: true }, diagnostics.map((d) => h("option", { value: d }, d)));
  const diagField = field("Diagnostic", diagSelect, " ");
  const diagHelp = diagField.querySelector(".hint");
  const duration = h("input", { type: "number", name: "duration", min: "1", max: "3600", step: "1", value: "10", required: true, inputmode: "numeric" });
  const family = h("select", { name: "family" }, h("option", { value: "" }, "IPv4 and IPv6"), h("option", { value: "4" }, "IPv4 only"), h("option", { value: "6" }, "IPv6 only"));
  const filterInputs = Object.fromEntries(FILTERS.map(([key]) => [key, h("input", { type: "text", name: key, autocomplete: "off", spellcheck: "false" })]));

  function chosenHosts() {
    return hostBoxes.filter((b) => b.box.checked).map((b) => b.host);
  }

  function refreshScope() {
    const previous = netnsSelect.value;
    const picked = chosenHosts();
    const chosen = byName.checked && picked.length ? picked : hosts;
    const names = new Set();
    for (const host of chosen) for (const ns of namespaceNames(host)) if (allows(allowedNetns, ns)) names.add(ns);
    clear(netnsSelect);
    if (allowsWholeHost(allowedNetns)) netnsSelect.append(h("option", { value: "" }, "each host's own"));
    for (const ns of [...names].sort()) netnsSelect.append(h("option", { value: ns }, ns));
    if (!netnsSelect.options.length) netnsSelect.append(h("option", { value: "", disabled: true }, "none your role allows here"));
    if ([...netnsSelect.options].some((o) => o.value === previous)) netnsSelect.value = previous;
  }

  // A chosen host that cannot run the diagnostic says why here (the controller's words), before any request.
  function refreshDiag() {
    const picked = byName.checked ? chosenHosts() : [];
    const cannot = picked.flatMap((host) =>
      support(host)
        .filter((entry) => entry.diagnostic === diagSelect.value && entry.runs === false)
        .map((entry) => `${host.host} cannot run it: ${entry.why.join("; ")}`),
    );
    diagHelp.textContent = cannot.length ? `${cannot.join(". ")}.` : DESCRIPTIONS[diagSelect.value] || "";
    diagHelp.classList.toggle("error", cannot.length > 0);
  }

  for (const b of hostBoxes) {
    b.box.addEventListener("change", refreshScope);
    b.box.addEventListener("change", refreshDiag);
  }
  for (const radio of [byName, byLabel]) {
    radio.addEventListener("change", () => {
      labelInput.disabled = !byLabel.checked;
      for (const b of hostBoxes) b.box.disabled = byLabel.checked;
      refreshScope();
      refreshDiag();
    });
  }
  diagSelect.addEventListener("change", refreshDiag);
  refreshScope();
  refreshDiag();

  const form = h(
    "form",
    { class: "panel", "aria-labelledby": "new-title", novalidate: true },
    h("h1", { id: "new-title" }, "New diagnosis"),
    h(
      "fieldset",
      {},
      h("legend", {}, "Hosts"),
      h("div", { class: "row" }, h("label", { class: "check" }, byName, "By name"), h("label", { class: "check" }, byLabel, "By label")),
      hosts.length ? hostList : h("p", { class: "muted" }, "Your role may see no host."),
      field("Label selector", labelInput, "key=value, e.g. role=lb"),
    ),
    h(
      "fieldset",
      {},
      h("legend", {}, "What and where"),
      h("div", { class: "grid" }, diagField, field("Network namespace", netnsSelect, "as the hosts report it"), field("Duration (seconds)", duration)),
    ),
    h(
      "details",
      { class: "filters", open: window.innerWidth > 700 },
      h("summary", {}, "Filters (optional; applied in the kernel, checked like the CLI's)"),
      h("div", { class: "grid" }, FILTERS.map(([key, text, hint]) => field(text, filterInputs[key], hint)), field("Address family", family)),
    ),
    error,
    h("div", { class: "row" }, submit, h("span", { class: "muted small" }, "Every request is checked and audited by the controller.")),
  );
  form.setAttribute("aria-describedby", error.id);

  function body() {
    const config = {};
    for (const [key] of FILTERS) {
      const text = filterInputs[key].value.trim();
      if (!text) continue;
      if (LIST_FILTERS.has(key)) config[key] = text.split(/[\s,]+/).filter(Boolean);
      else if (NUMBER_FILTERS.has(key) && /^\d+$/.test(text)) config[key] = Number(text);
      else config[key] = text; // the server answers the CLI's sentence for anything it cannot use
    }
    if (family.value) config.family = Number(family.value);
    if (netnsSelect.value) config.netns = netnsSelect.value;
    const seconds = duration.value.trim();
    const request = { diagnostic: diagSelect.value, config, duration: /^\d+(\.\d+)?$/.test(seconds) ? Number(seconds) : seconds };
    if (byLabel.checked) {
      const text = labelInput.value.trim();
      const eq = text.indexOf("=");
      request.selector = eq > 0 ? { [text.slice(0, eq).trim()]: text.slice(eq + 1).trim() } : { [text]: "" };
    } else {
      request.hosts = chosenHosts().map((host) => host.host);
    }
    return request;
  }

  // Every control is named by its config field (`dport`, `duration`), which is how the server names a field
  // it refuses; a group of checkboxes has no single control to mark.
  let marked = null;
  function controlFor(name) {
    const found = form.elements.namedItem(name);
    return found instanceof HTMLElement ? found : null;
  }

  function unmark() {
    if (!marked) return;
    marked.removeAttribute("aria-invalid");
    const ids = (marked.getAttribute("aria-describedby") || "").split(" ").filter((id) => id && id !== error.id);
    if (ids.length) marked.setAttribute("aria-describedby", ids.join(" "));
    else marked.removeAttribute("aria-describedby");
    marked = null;
  }

  function showRefusal(err) {
    const control = err.field ? controlFor(err.field) : null;
    if (!control) {
      error.textContent = err.message;
      error.hidden = false;
      error.focus?.();
      return;
    }
    const label = control.labels?.[0]?.textContent?.trim() || err.field;
    error.textContent = `${label}: ${String(err.problem).replace(/\.$/, "")}.`;
    error.hidden = false;
    marked = control;
    control.setAttribute("aria-invalid", "true");
    control.setAttribute("aria-describedby", `${control.getAttribute("aria-describedby") || ""} ${error.id}`.trim());
    const folded = control.closest("details");
    if (folded) folded.open = true;
    control.focus();
  }

  form.addEventListener("input", (event) => {
    if (event.target === marked) unmark();
  });

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    error.hidden = true;
    unmark();
    const request = body();
    // Only the checks that need no knowledge of the fleet are made here; the server makes all of them.
    let local = null;
    if (request.hosts && !request.hosts.length) local = "Choose at least one host, or select hosts by label.";
    else if (request.selector && !labelInput.value.includes("=")) local = "Write the label selector as key=value, e.g. role=lb.";
    else if (!request.diagnostic) local = "Your role allows no diagnostic; ask an administrator.";
    if (local) {
      error.textContent = local;
      error.hidden = false;
      return;
    }
    submit.disabled = true;
    try {
      const session = await api("/sessions", { method: "POST", body: request });
      ctx.navigate(`#/session/${encodeURIComponent(session.id)}`);
    } catch (err) {
      if (err instanceof ApiError && err.status === 401) return ctx.signedOut(err.message);
      showRefusal(err);
    } finally {
      submit.disabled = false;
    }
  });
  root.append(form);
}
