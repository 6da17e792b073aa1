// New diagnosis: only what the role allows is offered (diagnostics, namespaces); everything is still checked
// by the server. The form is generated from the controller's catalogue (GET /api/v1/diagnostics: each
// registered diagnostic's config as a JSON Schema, with each field's label, help, fieldset and CLI flag), so
// nothing here names a diagnostic or a filter. The server's refusal is shown next to the form: when it blames
// one field, that field is marked and the problem worded with the field's label here (the server's sentence
// names the CLI's flag, for the CLI).

import { ApiError, api } from "./api.js";
import { clear, field, h } from "./dom.js";
import { hostState, namespaceNames, support } from "./hosts.js";

// What a field is to the session's scope (the catalogue's `x-scope`): the controls that choose where to look.
const WHERE = { namespace: "network-namespace", pods: "kubernetes-namespace" };

/** Role entries are names or globs (`web-*`, `*`), as the controller matches them (fnmatch). */
function globMatch(pattern, value) {
  const re = new RegExp(`^${pattern.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".")}$`);
  return re.test(value);
}

function allows(list, value) {
  return Array.isArray(list) && list.some((pattern) => globMatch(pattern, value));
}

/** The role may run on a host's own namespace (nothing chosen in the request): `*` or `host` in its list. */
function allowsWholeHost(list) {
  return Array.isArray(list) && (list.includes("*") || list.includes("host"));
}

/** What the hosts can run (each reports its catalogue), limited to what the role allows, in the registry's
 * order. */
function offered(me, hosts, entries) {
  const allowed = me.allowed?.diagnostics || [];
  const reported = new Set();
  for (const host of hosts) for (const name of host.diagnostics || []) reported.add(name);
  return entries.filter((entry) => (reported.size ? reported.has(entry.name) : true) && allows(allowed, entry.name));
}

function capitalised(text) {
  const words = String(text || "");
  return words.charAt(0).toUpperCase() + words.slice(1);
}

/** A property's schema with `$ref`s to the config's `$defs` followed. */
function resolved(schema, defs) {
  if (schema && typeof schema.$ref === "string" && schema.$ref.startsWith("#/$defs/")) {
    return resolved(defs[schema.$ref.slice("#/$defs/".length)] || {}, defs);
  }
  return schema || {};
}

/** The alternatives of a property, without `null` (a field left empty is simply not sent). */
function members(schema, defs) {
  const one = resolved(schema, defs);
  const parts = one.anyOf || one.oneOf;
  if (!parts) return one.type === "null" ? [] : [one];
  return parts.flatMap((part) => members(part, defs));
}

/** How a property is edited: a checkbox, a choice, a list, or text (numbers are sent as numbers). */
function kindOf(schema, defs) {
  const parts = members(schema, defs);
  if (parts.length === 1 && parts[0].type === "boolean") return { control: "check" };
  if (parts.length === 1 && parts[0].type === "array") {
    return { control: "list", numeric: members(parts[0].items, defs).some((item) => item.type === "integer" || item.type === "number") };
  }
  const choices = parts.flatMap((part) => (Array.isArray(part.enum) ? part.enum : "const" in part ? [part.const] : [null]));
  if (parts.length && !choices.includes(null)) return { control: "choice", choices };
  return { control: "text", numeric: parts.some((part) => part.type === "integer" || part.type === "number") };
}

function typed(text, numeric) {
  return numeric && /^-?\d+(\.\d+)?$/.test(text) ? Number(text) : text; // the server words anything else
}

/** One config field's control, named by the field (which is how the server names a field it refuses). */
function control(name, schema, defs) {
  const kind = kindOf(schema, defs);
  if (kind.control === "check") {
    const box = h("input", { type: "checkbox", name });
    box.checked = schema.default === true;
    return { element: box, read: () => (box.checked === (schema.default === true) ? undefined : box.checked), keep: (old) => (box.checked = old.checked) };
  }
  if (kind.control === "choice") {
    const select = h("select", { name }, h("option", { value: "" }, "any"), kind.choices.map((value) => h("option", { value: String(value) }, String(value))));
    return {
      element: select,
      read: () => {
        if (!select.value) return undefined;
        const chosen = kind.choices.find((value) => String(value) === select.value);
        return chosen === undefined ? select.value : chosen;
      },
      keep: (old) => (select.value = old.value),
    };
  }
  const input = h("input", { type: "text", name, autocomplete: "off", spellcheck: "false" });
  if (kind.numeric && kind.control === "text") input.setAttribute("inputmode", "numeric");
  const read =
    kind.control === "list"
      ? () => {
          const items = input.value.split(/[\s,]+/).filter(Boolean);
          return items.length ? items.map((item) => typed(item, kind.numeric)) : undefined;
        }
      : () => (input.value.trim() ? typed(input.value.trim(), kind.numeric) : undefined);
  return { element: input, read, keep: (old) => (input.value = old.value) };
}

function hintOf(schema, kind) {
  const words = [schema.description, kind === "list" ? "comma separated" : ""].filter(Boolean).join("; ");
  return schema["x-flag"] ? `${words} (${schema["x-flag"]})` : words;
}

export async function renderNew(root, ctx) {
  const me = ctx.me;
  const [hosts, entries] = await Promise.all([api("/hosts"), api("/diagnostics")]);
  const diagnostics = offered(me, hosts, entries);
  hosts.sort((a, b) => String(a.host).localeCompare(String(b.host)));
  const allowedNetns = me.allowed?.netns || [];
  const allowedPods = me.allowed?.k8s_namespaces || [];

  const error = h("div", { class: "form-error", role: "alert", id: "new-error", hidden: true });
  const submit = h("button", { type: "submit" }, "Start diagnosis");

  // Hosts: by name (checkboxes) or by label (key=value).
  const byName = h("input", { type: "radio", name: "pick", value: "by-name", checked: true });
  const byLabel = h("input", { type: "radio", name: "pick", value: "by-label" });
  const hostBoxes = hosts.map((host) => {
    const box = h("input", { type: "checkbox", name: "hosts", value: host.host });
    box.checked = ctx.selectedHosts.has(host.host);
    const label = h("label", { class: "check" }, box, h("span", {}, host.host), h("span", { class: "muted small" }, hostState(host)));
    return { box, label, host };
  });
  const labelInput = h("input", { type: "text", placeholder: "role=lb", autocomplete: "off", disabled: true });
  const hostList = h("div", { class: "pill-list", role: "group", "aria-label": "Hosts by name" }, hostBoxes.map((b) => b.label));

  const diagSelect = h("select", { name: "diagnostic", required: true }, diagnostics.map((d) => h("option", { value: d.name }, d.name)));
  const diagField = field("Diagnostic", diagSelect, " ");
  const diagHelp = diagField.querySelector(".hint");
  const duration = h("input", { type: "number", name: "duration", min: "1", max: "3600", step: "1", value: "10", required: true, inputmode: "numeric" });
  const whereGrid = h("div", { class: "grid" });
  const optionGroups = h("div", {});

  // The chosen diagnostic's config fields: [name, {element, read, keep, where}].
  let fields = new Map();

  function chosenHosts() {
    return hostBoxes.filter((b) => b.box.checked).map((b) => b.host);
  }

  function hostsInView() {
    const picked = chosenHosts();
    return byName.checked && picked.length ? picked : hosts;
  }

  /** The choices of a field that says where to look: what the chosen hosts report, as far as the role allows. */
  function whereChoices(where) {
    const names = new Set();
    const options = [];
    if (where === WHERE.namespace) {
      for (const host of hostsInView()) for (const ns of namespaceNames(host)) if (allows(allowedNetns, ns)) names.add(ns);
      if (allowedNetns.includes("*")) options.push(["*", "every namespace of each host (host-wide)"]);
      if (allowsWholeHost(allowedNetns)) options.unshift(["", "each host's own"]);
    } else {
      for (const host of hostsInView()) for (const pod of host.pods || []) if (allowedNetns.includes("*") || allows(allowedPods, pod.namespace)) names.add(pod.namespace);
      options.push(["", "none"]);
    }
    return [...options, ...[...names].sort().map((name) => [name, name])];
  }

  function refreshWhere() {
    for (const [, each] of fields) {
      if (!each.where) continue;
      const select = each.element;
      const previous = select.value;
      clear(select);
      for (const [value, text] of whereChoices(each.where)) select.append(h("option", { value }, text));
      if (!select.options.length) select.append(h("option", { value: "", disabled: true }, "none your role allows here"));
      if ([...select.options].some((o) => o.value === previous)) select.value = previous;
    }
  }

  /** A field that says where to look: a choice of what the role allows; choosing one clears the others (a
   * session looks in one place). */
  function whereControl(name, where) {
    const select = h("select", { name });
    select.addEventListener("change", () => {
      if (!select.value) return;
      for (const [other, each] of fields) if (other !== name && each.where && each.element.value) each.element.value = "";
    });
    return { element: select, where, read: () => select.value || undefined, keep: (old) => (select.value = old.value) };
  }

  /** The form of the chosen diagnostic's config, from its schema; what was typed in a field of the same
   * name before is kept. */
  function renderConfig() {
    const entry = diagnostics.find((d) => d.name === diagSelect.value);
    const previous = fields;
    fields = new Map();
    clear(whereGrid);
    clear(optionGroups);
    whereGrid.append(diagField);
    if (!entry) {
      whereGrid.append(field("Duration (seconds)", duration));
      return;
    }
    const schema = entry.config || {};
    const defs = schema.$defs || {};
    const groups = new Map();
    for (const [name, property] of Object.entries(schema.properties || {})) {
      if (property["x-form"] === false) continue;
      const label = capitalised(property.title || name);
      const where = Object.values(WHERE).includes(property["x-scope"]) ? property["x-scope"] : null;
      // Pods by Kubernetes namespace only for a role that may see some.
      if (where === WHERE.pods && !allowedPods.length && !allowedNetns.includes("*")) continue;
      const made = where ? whereControl(name, where) : control(name, property, defs);
      fields.set(name, made);
      const old = previous.get(name);
      if (old && old.element.tagName === made.element.tagName) made.keep(old.element);
      if (where) {
        whereGrid.append(field(label, made.element, where === WHERE.namespace ? "as the hosts report it" : "the pods of this Kubernetes namespace on each host"));
        continue;
      }
      const group = property["x-group"] || "options";
      if (!groups.has(group)) groups.set(group, []);
      const hint = hintOf(property, kindOf(property, defs).control);
      groups.get(group).push(made.element.type === "checkbox" ? h("div", { class: "field" }, h("label", { class: "check" }, made.element, label), hint ? h("p", { class: "hint" }, hint) : null) : field(label, made.element, hint));
    }
    whereGrid.append(field("Duration (seconds)", duration));
    for (const [group, controls] of groups) {
      optionGroups.append(
        h("details", { class: "filters", open: window.innerWidth > 700 }, h("summary", {}, `${capitalised(group)} (optional; checked like the CLI's)`), h("div", { class: "grid" }, controls)),
      );
    }
    refreshWhere();
  }

  // A chosen host that cannot run the diagnostic says why here (the controller's words), before any request.
  function refreshDiag() {
    const entry = diagnostics.find((d) => d.name === diagSelect.value);
    const picked = byName.checked ? chosenHosts() : [];
    const cannot = picked.flatMap((host) =>
      support(host)
        .filter((s) => s.diagnostic === diagSelect.value && s.runs === false)
        .map((s) => `${host.host} cannot run it: ${s.why.join("; ")}`),
    );
    const onlyWide = entry?.scope?.host_wide_only ? ` It runs only host-wide: ${entry.scope.host_wide_only}.` : "";
    diagHelp.textContent = cannot.length ? `${cannot.join(". ")}.` : entry ? `${entry.help}.${onlyWide}` : "";
    diagHelp.classList.toggle("error", cannot.length > 0);
  }

  for (const b of hostBoxes) {
    b.box.addEventListener("change", refreshWhere);
    b.box.addEventListener("change", refreshDiag);
  }
  for (const radio of [byName, byLabel]) {
    radio.addEventListener("change", () => {
      labelInput.disabled = !byLabel.checked;
      for (const b of hostBoxes) b.box.disabled = byLabel.checked;
      refreshWhere();
      refreshDiag();
    });
  }
  diagSelect.addEventListener("change", () => {
    renderConfig();
    refreshDiag();
  });
  renderConfig();
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
    h("fieldset", {}, h("legend", {}, "What and where"), whereGrid),
    optionGroups,
    error,
    h("div", { class: "row" }, submit, h("span", { class: "muted small" }, "Every request is checked and audited by the controller.")),
  );
  form.setAttribute("aria-describedby", error.id);

  function body() {
    const config = {};
    for (const [name, each] of fields) {
      const value = each.read();
      if (value !== undefined) config[name] = value;
    }
    const seconds = duration.value.trim();
    const request = { diagnostic: diagSelect.value, config, duration: /^\d+(\.\d+)?$/.test(seconds) ? Number(seconds) : seconds };
    if (byLabel.checked) {
      const text = labelInput.value.trim();
      const eq = text.indexOf("=");
      const labels = eq > 0 ? { [text.slice(0, eq).trim()]: text.slice(eq + 1).trim() } : { [text]: "" };
      request.selector = { labels };
    } else {
      request.hosts = chosenHosts().map((host) => host.host);
    }
    return request;
  }

  // Every control is named by its field (`duration`, and each config field), which is how the server names a
  // field it refuses; a group of checkboxes has no single control to mark.
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
