// The merged timeline: a virtualised list (fixed row height, a small pool of row elements reused for the
// visible window) fed in batches, so 5,000 records/s cost one render per animation frame, not one per record.
// Two views: time order, or grouped per flow with one line per hop (host) the flow was seen on.

import { h } from "./dom.js";

const ROW = 26; // px, mirrors --row in app.css
const OVERSCAN = 8;
export const MAX_RECORDS = 200_000; // a browser tab keeps this many; the JSON lines download has them all

function endpoint(addr, port) {
  if (addr === undefined || addr === null) return "?";
  const a = String(addr).includes(":") ? `[${addr}]` : String(addr);
  return port ? `${a}:${port}` : a;
}

/** The flow a record belongs to: the server's join key when it sends one (also across NAT), else the 5-tuple. */
export function flowKey(rec) {
  if (rec.flow !== undefined && rec.flow !== null) return `f:${typeof rec.flow === "object" ? JSON.stringify(rec.flow) : rec.flow}`;
  if (rec.flow_id !== undefined && rec.flow_id !== null) return `f:${rec.flow_id}`;
  if (rec.client && rec.server) return `c:${rec.client}>${rec.server}`;
  if (rec.saddr === undefined && rec.daddr === undefined) return `t:${rec.type || "record"}`;
  const a = endpoint(rec.saddr, rec.sport);
  const b = endpoint(rec.daddr, rec.dport);
  // Both directions of a connection are one flow.
  return `p:${rec.proto || ""} ${a < b ? `${a} ${b}` : `${b} ${a}`}`;
}

export function flowLabel(rec) {
  if (typeof rec.flow === "string" && rec.flow) return rec.flow;
  if (rec.client && rec.server) return `${rec.proto || "tcp"} ${rec.client} → ${rec.server}`;
  if (rec.saddr === undefined && rec.daddr === undefined) return `${rec.type || "record"} records`;
  return `${rec.proto || ""} ${endpoint(rec.saddr, rec.sport)} → ${endpoint(rec.daddr, rec.dport)}`.trim();
}

export function summary(rec) {
  const flow = rec.saddr !== undefined || rec.daddr !== undefined ? `${rec.proto || ""} ${endpoint(rec.saddr, rec.sport)} → ${endpoint(rec.daddr, rec.dport)}` : "";
  const rule = rec.netfilter?.rule ? ` by "${rec.netfilter.rule}"` : "";
  const who = rec.comm ? ` (${rec.comm}${rec.pid ? ` ${rec.pid}` : ""})` : "";
  const where = rec.netns_name ? ` netns ${rec.netns_name}` : "";
  switch (rec.type) {
    case "drop":
      return `${flow} ${rec.tcp_flags ? `[${rec.tcp_flags}] ` : ""}${rec.reason} at ${rec.location}${rule}${where}${who}`;
    case "reset":
      return `${flow} ${rec.direction || ""} ${rec.cause || rec.reason || ""}${rule}${where}${who}`;
    case "abort":
      return `${flow} ${rec.errno || ""} ${rec.cause || ""}${who}`;
    case "conn":
      return `${rec.client} → ${rec.server} ${rec.outcome}: ${rec.verdict}`;
    case "verdict":
      return rec.text || `${rec.severity || ""} ${rec.category || ""}: ${rec.cause || ""}`;
    case "summary": {
      // Exact totals per program ({"seen","total","emitted","sampled","lost"}), the rest in a word each.
      const parts = [rec.diagnostic, rec.seconds !== undefined ? `${Number(rec.seconds).toFixed(1)} s` : null, rec.watched];
      for (const [key, val] of Object.entries(rec)) {
        if (val && typeof val === "object" && "total" in val) parts.push(`${key}: total ${val.total}, emitted ${val.emitted ?? "?"}, lost ${val.lost ?? 0}, sampled ${val.sampled ?? 0}`);
      }
      if (rec.total !== undefined) parts.push(`total ${rec.total}, lost ${rec.lost ?? 0}, sampled ${rec.sampled ?? 0}`);
      if (rec.verdicts !== undefined) parts.push(`${rec.verdicts} verdict${rec.verdicts === 1 ? "" : "s"}`);
      return parts.filter(Boolean).join(" · ");
    }
    case "conntrack": {
      const tuple = (t) => (t ? `${endpoint(t.src, t.sport)} → ${endpoint(t.dst, t.dport)}` : "?");
      const status = Array.isArray(rec.status) ? rec.status.join(",") : rec.status || "";
      return `${rec.proto || ""} orig ${tuple(rec.orig)} reply ${tuple(rec.reply)} ${rec.state || ""} ${status}${rec.netns ? ` netns ${rec.netns}` : ""}`;
    }
    default: {
      if (rec.text) return rec.text;
      const skip = new Set(["type", "v", "time", "host", "monotonic_ns"]);
      return Object.entries(rec)
        .filter(([k]) => !skip.has(k))
        .slice(0, 6)
        .map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`)
        .join(" ");
    }
  }
}

function clock(time) {
  if (typeof time !== "string") return time === undefined ? "" : String(time);
  const t = time.indexOf("T");
  return t < 0 ? time : time.slice(t + 1, t + 16); // HH:MM:SS.ffffff
}

function groupText(group) {
  const n = group.items.length;
  const hosts = group.hosts.length;
  const where = group.isFlow ? `seen on ${group.hosts.join(" → ")}` : `from ${group.hosts.join(", ")}`;
  return `${group.label} · ${n} record${n === 1 ? "" : "s"} on ${hosts} host${hosts === 1 ? "" : "s"}, ${where}`;
}

export class Timeline {
  constructor() {
    this.records = [];
    this.dropped = 0; // records trimmed from the tab (still in the download)
    this.grouped = false;
    this.follow = true;
    this.hostFilter = "";
    // The views are kept up to date record by record (O(1) each), never rebuilt per frame: at 200,000
    // records a rebuild costs ~300 ms, longer than the 250 ms between two.
    this.filtered = []; // records of `hostFilter` when set
    this.groups = new Map(); // flow key -> { label, items, hosts, isFlow }
    this.groupList = []; // groups in order of first appearance
    this.starts = null; // starts[g] = index of group g's header row; rebuilt lazily (O(groups))
    this.groupRows = 0;
    this.scroller = h("div", { class: "timeline", tabindex: "0", role: "list", "aria-label": "Merged timeline" });
    this.spacer = h("div", { class: "spacer" });
    this.layer = h("div", { class: "rows" });
    this.placeholder = h("p", { class: "empty" }, "No record yet.");
    this.scroller.append(this.spacer, this.layer, this.placeholder);
    this.pool = [];
    this.scroller.addEventListener("scroll", () => {
      const atEnd = this.scroller.scrollTop + this.scroller.clientHeight >= this.scroller.scrollHeight - ROW * 2;
      if (!this.programmatic) this.follow = atEnd;
      this.programmatic = false;
      this.onFollowChange?.(this.follow);
      this.render();
    });
    this.scroller.addEventListener("keydown", (event) => this.key(event));
  }

  key(event) {
    const page = this.scroller.clientHeight - ROW;
    const moves = { ArrowDown: ROW, ArrowUp: -ROW, PageDown: page, PageUp: -page };
    if (event.key in moves) this.scroller.scrollTop += moves[event.key];
    else if (event.key === "Home") this.scroller.scrollTop = 0;
    else if (event.key === "End") this.scroller.scrollTop = this.scroller.scrollHeight;
    else return;
    event.preventDefault();
  }

  /** Append a batch (already in merged order from the server). */
  add(batch) {
    for (const rec of batch) {
      this.records.push(rec);
      this.index(rec);
    }
    if (this.records.length > MAX_RECORDS) {
      const cut = this.records.length - MAX_RECORDS + Math.floor(MAX_RECORDS / 10);
      this.records.splice(0, cut);
      this.dropped += cut;
      this.reindex(); // rare: once per MAX_RECORDS / 10 records
    }
  }

  /** Put one record into the current view's structures. */
  index(rec) {
    if (this.hostFilter && rec.host !== this.hostFilter) return;
    if (!this.grouped) {
      if (this.hostFilter) this.filtered.push(rec);
      return;
    }
    const key = flowKey(rec);
    let group = this.groups.get(key);
    if (!group) {
      // Bookkeeping records (summaries, verdicts) share a block per type; they have no hops.
      group = { label: flowLabel(rec), items: [], hosts: [], isFlow: !key.startsWith("t:") };
      this.groups.set(key, group);
      this.groupList.push(group);
      this.groupRows += 1;
    }
    if (!group.hosts.includes(rec.host)) group.hosts.push(rec.host);
    group.items.push(rec);
    this.groupRows += 1;
    this.starts = null;
  }

  reindex() {
    this.filtered = [];
    this.groups = new Map();
    this.groupList = [];
    this.groupRows = 0;
    this.starts = null;
    for (const rec of this.records) this.index(rec);
  }

  clear() {
    this.records = [];
    this.dropped = 0;
    this.reindex();
  }

  setView({ grouped, hostFilter }) {
    if (grouped !== undefined) this.grouped = grouped;
    if (hostFilter !== undefined) this.hostFilter = hostFilter;
    this.reindex();
    this.render(true);
  }

  get length() {
    if (this.grouped) return this.groupRows;
    return this.hostFilter ? this.filtered.length : this.records.length;
  }

  /** Row i of the current view: a record, or a flow's header in the grouped view (binary search). */
  row(i) {
    if (!this.grouped) return { rec: this.hostFilter ? this.filtered[i] : this.records[i] };
    if (!this.starts) {
      this.starts = new Array(this.groupList.length);
      let at = 0;
      this.groupList.forEach((group, g) => {
        this.starts[g] = at;
        at += 1 + group.items.length;
      });
    }
    let lo = 0;
    let hi = this.starts.length - 1;
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1;
      if (this.starts[mid] <= i) lo = mid;
      else hi = mid - 1;
    }
    const group = this.groupList[lo];
    const offset = i - this.starts[lo];
    if (offset === 0) return { group, text: groupText(group) };
    const rec = group.items[offset - 1];
    return { rec, hop: group.isFlow ? group.hosts.indexOf(rec.host) + 1 : 0, inGroup: true };
  }

  paint(el, item, index) {
    const [t, host, kind, text] = el.children;
    el.setAttribute("aria-posinset", String(index + 1));
    if (item.group) {
      el.className = "trow group";
      t.textContent = "";
      host.textContent = "flow";
      kind.textContent = "";
      text.textContent = item.text;
      return;
    }
    const rec = item.rec;
    el.className = `trow ${item.inGroup ? "hop " : ""}t-${rec.type || "record"}`;
    t.textContent = clock(rec.time);
    host.textContent = `${item.hop ? `hop ${item.hop} · ` : ""}${rec.host ?? ""}`;
    kind.textContent = rec.type ?? "";
    text.textContent = summary(rec);
  }

  /** Draw the visible window. Cheap: at most ~(height/ROW + 2*OVERSCAN) rows are touched. */
  render() {
    const total = this.length;
    this.placeholder.hidden = total > 0;
    this.spacer.style.height = `${total * ROW}px`;
    // As tall as its rows, between 3 and 16 rows (and the CSS max-height on small screens): no empty box
    // under a short timeline, and the window stays bounded even if the stylesheet is missing.
    const wanted = `${Math.min(16, Math.max(3, total)) * ROW + 2}px`;
    if (this.scroller.style.height !== wanted) this.scroller.style.height = wanted;
    this.scroller.setAttribute("aria-rowcount", String(total));
    if (this.follow) {
      const bottom = Math.max(0, total * ROW - this.scroller.clientHeight);
      if (Math.abs(this.scroller.scrollTop - bottom) > 1) {
        this.programmatic = true;
        this.scroller.scrollTop = bottom;
      }
    }
    const height = this.scroller.clientHeight || ROW * 16;
    const first = Math.max(0, Math.floor(this.scroller.scrollTop / ROW) - OVERSCAN);
    const last = Math.min(total, Math.ceil((this.scroller.scrollTop + height) / ROW) + OVERSCAN);
    const needed = last - first;
    while (this.pool.length < needed) {
      const el = h("div", { class: "trow", role: "listitem" }, h("span", { class: "t" }), h("span", { class: "h" }), h("span", { class: "k" }), h("span"));
      this.pool.push(el);
      this.layer.append(el);
    }
    this.layer.style.transform = `translateY(${first * ROW}px)`;
    for (let i = 0; i < this.pool.length; i += 1) {
      const el = this.pool[i];
      if (i < needed) {
        el.hidden = false;
        el.setAttribute("aria-setsize", String(total));
        this.paint(el, this.row(first + i), first + i);
      } else {
        el.hidden = true;
      }
    }
  }
}
