// Records per second per host and reason over the session, drawn with uPlot (vendored from npm, pinned).
// Counting is per record (cheap: one map lookup); drawing happens at most twice a second.

import uPlot from "../vendor/uplot/uPlot.esm.js";
import { h } from "./dom.js";

const MAX_SERIES = 8; // the busiest host×reason pairs; the rest are summed as "other"
const PALETTE = ["#0b5cad", "#b42318", "#1a7f37", "#8a5a00", "#6f42c1", "#0f766e", "#c2410c", "#475569", "#9ca3af"];

let lastPrefix = "";
let lastSecond = 0;
/** Whole epoch second of an ISO time; records arrive in order, so the previous answer is usually reused. */
export function epochSecond(time) {
  if (typeof time === "number") return Math.floor(time);
  if (typeof time !== "string") return Math.floor(Date.now() / 1000);
  const prefix = time.slice(0, 19);
  if (prefix !== lastPrefix) {
    const utc = time.endsWith("Z") || time.includes("+00:00") || time.length <= 19;
    const parsed = Date.parse(utc ? `${prefix}Z` : time);
    lastPrefix = prefix;
    lastSecond = Number.isNaN(parsed) ? Math.floor(Date.now() / 1000) : Math.floor(parsed / 1000);
  }
  return lastSecond;
}

export function seriesName(rec) {
  const what = rec.reason || rec.cause_code || rec.outcome || rec.type || "record";
  return `${rec.host ?? "?"} · ${what}`;
}

// Bookkeeping records are not events: they would draw a spike at the end of every session.
const NOT_EVENTS = new Set(["summary", "verdict", "conntrack", "notice"]);

export class RateChart {
  constructor() {
    this.el = h("div", { class: "chart", role: "img", "aria-label": "Records per second per host and reason" });
    this.caption = h("p", { class: "muted small" });
    this.counts = new Map(); // series name -> Map(second -> count)
    this.totals = new Map();
    this.first = null;
    this.last = null;
    this.plot = null;
    this.shape = "";
    this.dirty = false;
    this.lastDraw = 0;
    this.ended = false;
  }

  /** The session is over: no record will come, and the caption must not promise any. */
  end() {
    if (this.ended) return;
    this.ended = true;
    this.dirty = true;
  }

  reset() {
    this.counts.clear();
    this.totals.clear();
    this.first = null;
    this.last = null;
    this.dirty = true;
  }

  /** The session's window (epoch seconds): the x axis spans it even where nothing happened. */
  setWindow(start, end) {
    if (start && (this.windowStart !== start || this.windowEnd !== end)) {
      this.windowStart = start;
      this.windowEnd = end;
      this.dirty = true;
    }
  }

  add(batch) {
    for (const rec of batch) {
      if (NOT_EVENTS.has(rec.type)) continue;
      const second = epochSecond(rec.time);
      const name = seriesName(rec);
      let series = this.counts.get(name);
      if (!series) {
        series = new Map();
        this.counts.set(name, series);
      }
      series.set(second, (series.get(second) || 0) + 1);
      this.totals.set(name, (this.totals.get(name) || 0) + 1);
      if (this.first === null || second < this.first) this.first = second;
      if (this.last === null || second > this.last) this.last = second;
    }
    if (batch.length) this.dirty = true;
  }

  data() {
    const ranked = [...this.totals.entries()].sort((a, b) => b[1] - a[1]).map(([name]) => name);
    const shown = ranked.slice(0, MAX_SERIES);
    const rest = ranked.slice(MAX_SERIES);
    const xs = [];
    const from = Math.min(this.first, this.windowStart ?? this.first);
    const to = Math.max(this.last, this.windowEnd ?? this.last);
    for (let s = from; s <= to; s += 1) xs.push(s);
    const columns = shown.map((name) => xs.map((s) => this.counts.get(name).get(s) || 0));
    if (rest.length) {
      shown.push(`other (${rest.length})`);
      columns.push(xs.map((s) => rest.reduce((sum, name) => sum + (this.counts.get(name).get(s) || 0), 0)));
    }
    return { names: shown, data: [xs, ...columns] };
  }

  draw(force = false) {
    const now = performance.now();
    if (!this.dirty || (!force && now - this.lastDraw < 500)) return;
    if (this.first === null) {
      const when = this.ended ? "in this session" : "yet";
      this.caption.textContent = `No per-event records ${when}: programs that count in the kernel (diagnose, summaries) report exact totals in the host cards instead.`;
      this.el.hidden = true;
      return;
    }
    this.el.hidden = false;
    this.dirty = false;
    this.lastDraw = now;
    const { names, data } = this.data();
    const shape = names.join("\n");
    const width = Math.max(280, this.el.clientWidth - 16);
    if (!this.plot || shape !== this.shape) {
      this.plot?.destroy();
      this.shape = shape;
      // The canvas cannot resolve CSS variables or currentColor: take the theme's colours as computed.
      const style = getComputedStyle(this.el);
      const ink = style.color;
      const line = style.getPropertyValue("--line").trim() || "#d5dae1";
      this.plot = new uPlot(
        {
          width,
          height: 200,
          padding: [10, 32, 0, 0], // room for the last time label
          scales: { x: { time: true } },
          axes: [
            {
              stroke: ink,
              grid: { stroke: line, width: 1 },
              ticks: { stroke: line, width: 1 },
              incrs: [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600],
              values: (u, ticks) => ticks.map((t) => new Date(t * 1000).toISOString().slice(11, 19)),
            },
            { stroke: ink, grid: { stroke: line, width: 1 }, ticks: { stroke: line, width: 1 }, label: "records/s", size: 60 }],
          series: [{}, ...names.map((name, i) => ({ label: name, stroke: PALETTE[i % PALETTE.length], width: 1.5, points: { show: false } }))],
          legend: { live: false },
        },
        data,
        this.el,
      );
    } else {
      if (Math.abs(this.plot.width - width) > 4) this.plot.setSize({ width, height: 200 });
      this.plot.setData(data);
    }
    const total = [...this.totals.values()].reduce((a, b) => a + b, 0);
    const plural = (n, word) => `${n.toLocaleString("en-US")} ${word}${n === 1 ? "" : "s"}`;
    this.caption.textContent = `${plural(total, "record")} over ${data[0].length} s in ${plural(this.totals.size, "host×reason series")}.`.replace("seriess", "series");
  }
}
