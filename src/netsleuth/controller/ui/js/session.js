// Live session: per-host status strip, ranked verdicts, rate chart and the merged timeline over SSE.
// Incoming events are queued and applied once per animation frame, so the page stays responsive however
// fast records arrive. An ended session (reopened from history) is drawn from GET /sessions/{id}, read-only.

import { ApiError, api, download, streamEvents } from "./api.js";
import { badge, fmtCount, fmtOffset, fmtTime, h, put } from "./dom.js";
import { RateChart } from "./ratechart.js";
import { Timeline } from "./timeline.js";
import { isHostVerdict, rankVerdicts, verdictItem } from "./verdicts.js";

const FINAL = new Set(["ended", "failed", "cancelled"]);
const HOST_STATES = ["preparing", "ready", "running", "ended", "failed", "rejected"];

// Counters a benchmark (bench/ui_load.py) reads; cheap to keep.
const stats = (window.__netsleuthStats = { received: 0, applied: 0, frames: 0, maxFlushMs: 0, flushMsTotal: 0, firstVerdictAt: null, endedAt: null, openedAt: performance.now() });

function verdictKey(v) {
  return isHostVerdict(v) ? `h:${v.host}|${v.category}|${v.cause}` : `f:${v.flow}|${v.text}`;
}

export async function renderSession(root, ctx, id) {
  const snapshot = await api(`/sessions/${encodeURIComponent(id)}`);
  const live = !FINAL.has(snapshot.state);
  const controller = new AbortController();
  let session = snapshot;
  const hosts = new Map(Object.entries(snapshot.hosts || {}));
  const verdicts = new Map();
  const received = new Map(); // host -> records seen on this page
  let pending = [];
  let dirty = { strip: true, verdicts: true, head: true };
  let raf = 0;
  let lastEventId;

  const timeline = new Timeline();
  const chart = new RateChart();
  const stateBadge = h("span");
  const meta = h("p", { class: "meta" });
  const counters = h("p", { class: "counters", "aria-live": "off" });
  const strip = h("div", { class: "strip", role: "list", "aria-label": "Hosts in this session" });
  const verdictList = h("ol", { class: "verdicts", "aria-label": "Verdicts, worst first" });
  const verdictEmpty = h("p", { class: "muted" });
  const streamNote = h("p", { class: "muted small", role: "status" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const cancel = h("button", { type: "button", class: "danger", hidden: !live }, "Cancel session");
  const downloadButton = h("button", { type: "button", class: "quiet" }, "Download JSON lines");

  const grouped = h("input", { type: "checkbox" });
  const follow = h("input", { type: "checkbox", checked: true });
  const hostFilter = h("select", { id: "timeline-host" }, h("option", { value: "" }, "all hosts"));

  root.append(
    h("div", { class: "session-head" }, h("h1", {}, `Session ${id}`), stateBadge, h("div", { class: "row" }, downloadButton, cancel)),
    meta,
    error,
    h("h2", {}, "Hosts"),
    strip,
    h("h2", {}, "Verdicts"),
    verdictEmpty,
    verdictList,
    h("h2", {}, "Rate per host and reason"),
    chart.el,
    chart.caption,
    h("h2", { id: "timeline-title" }, "Merged timeline"),
    h(
      "div",
      { class: "timeline-tools" },
      h("label", { class: "check" }, grouped, "Group by flow (one line per hop)"),
      h("label", { class: "check" }, follow, "Follow new records"),
      h("span", { class: "inline" }, h("label", { for: "timeline-host" }, "Host"), hostFilter),
      counters,
    ),
    timeline.scroller,
    streamNote,
  );
  timeline.scroller.setAttribute("aria-labelledby", "timeline-title");
  timeline.onFollowChange = (on) => {
    follow.checked = on;
  };
  grouped.addEventListener("change", () => timeline.setView({ grouped: grouped.checked }));
  follow.addEventListener("change", () => {
    timeline.follow = follow.checked;
    timeline.render(true);
  });
  hostFilter.addEventListener("change", () => timeline.setView({ hostFilter: hostFilter.value }));
  downloadButton.addEventListener("click", async () => {
    try {
      await download(`/sessions/${encodeURIComponent(id)}/records`, `netsleuth-${id}.jsonl`);
    } catch (err) {
      showError(err);
    }
  });
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    try {
      session = { ...session, ...(await api(`/sessions/${encodeURIComponent(id)}/cancel`, { method: "POST" })) };
      dirty.head = true;
      schedule();
    } catch (err) {
      showError(err);
      cancel.disabled = false;
    }
  });

  function showError(err) {
    if (err instanceof ApiError && err.status === 401) return ctx.signedOut(err.message);
    error.textContent = err.message || String(err);
    error.hidden = false;
  }

  function addVerdict(v) {
    const key = verdictKey(v);
    if (verdicts.has(key)) return;
    verdicts.set(key, v);
    if (stats.firstVerdictAt === null) stats.firstVerdictAt = performance.now();
    dirty.verdicts = true;
  }

  function takeSession(s) {
    session = { ...session, ...s };
    for (const [host, status] of Object.entries(s.hosts || {})) hosts.set(host, { ...hosts.get(host), ...status });
    for (const v of s.verdicts || []) addVerdict(v);
    dirty.strip = dirty.head = true;
  }

  function takeRecords(batch) {
    for (const rec of batch) {
      received.set(rec.host, (received.get(rec.host) || 0) + 1);
      if (isHostVerdict(rec)) addVerdict(rec);
    }
    timeline.add(batch);
    chart.add(batch);
    stats.applied += batch.length;
    dirty.strip = true;
  }

  function renderHead() {
    put(stateBadge, badge(session.partial && FINAL.has(session.state) ? "partial" : session.state));
    const scope = session.config?.netns ? ` in netns ${session.config.netns}` : "";
    meta.textContent = `${session.diagnostic}${scope} on ${hosts.size} host${hosts.size === 1 ? "" : "s"}, ${session.duration ?? "?"} s, by ${session.user} · created ${fmtTime(session.created)}${session.t0 ? ` · T0 ${fmtTime(session.t0)}` : ""}${session.ended ? ` · ended ${fmtTime(session.ended)}` : ""}`;
    cancel.hidden = FINAL.has(session.state);
    if (FINAL.has(session.state)) streamNote.textContent = live ? "The session is over; this view no longer changes." : "Reopened from history (read-only).";
  }

  function renderStrip() {
    const cards = [];
    for (const [host, st] of [...hosts.entries()].sort()) {
      const totals = st.totals || {};
      const card = h(
        "div",
        { class: "hostcard", role: "listitem", dataset: { host, state: st.state || "" } },
        h("h3", {}, h("span", {}, host), badge(st.state || "unknown")),
        h(
          "dl",
          {},
          h("dt", {}, "offset"),
          h("dd", {}, fmtOffset(st.offset_ns)),
          h("dt", {}, "total"),
          h("dd", { dataset: { k: "total" } }, fmtCount(totals.total ?? totals.matched)),
          h("dt", {}, "emitted"),
          h("dd", {}, fmtCount(totals.emitted)),
          h("dt", {}, "lost"),
          h("dd", { dataset: { k: "lost" } }, fmtCount(totals.lost ?? st.lost)),
          h("dt", {}, "sampled"),
          h("dd", {}, fmtCount(totals.sampled ?? st.sampled)),
          h("dt", {}, "records here"),
          h("dd", {}, fmtCount(Math.max(received.get(host) || 0, st.records || 0))),
        ),
        st.reason ? h("p", { class: st.state === "failed" || st.state === "rejected" ? "reason" : "muted small" }, st.reason) : null,
      );
      cards.push(card);
    }
    strip.replaceChildren(...cards);
    const known = new Set([...hostFilter.options].map((o) => o.value));
    for (const host of hosts.keys()) if (!known.has(host)) hostFilter.append(h("option", { value: host }, host));
  }

  function renderVerdicts() {
    const ranked = rankVerdicts([...verdicts.values()]);
    verdictList.replaceChildren(...ranked.map(verdictItem));
    verdictEmpty.textContent = ranked.length ? "" : FINAL.has(session.state) ? "No verdict: nothing went wrong in the window, or no host saw the traffic." : "Verdicts appear here as the hosts report.";
  }

  function flush() {
    raf = 0;
    const started = performance.now();
    const batch = pending;
    pending = [];
    if (batch.length) takeRecords(batch);
    if (dirty.head) renderHead();
    if (dirty.strip) renderStrip();
    if (dirty.verdicts) renderVerdicts();
    dirty = { strip: false, verdicts: false, head: false };
    timeline.render();
    chart.draw(FINAL.has(session.state));
    const dropped = timeline.dropped ? `, ${fmtCount(timeline.dropped)} oldest trimmed from this tab (the download has them)` : "";
    counters.textContent = `${fmtCount(timeline.records.length + timeline.dropped)} records${dropped}`;
    const took = performance.now() - started;
    stats.frames += 1;
    stats.flushMsTotal += took;
    stats.maxFlushMs = Math.max(stats.maxFlushMs, took);
    if (chart.dirty) schedule(); // a throttled chart redraw is still owed
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(flush);
  }

  function onEvent(name, data, eventId) {
    lastEventId = eventId;
    if (name === "record") {
      const batch = Array.isArray(data.records) ? data.records : [data];
      stats.received += batch.length;
      for (const rec of batch) pending.push(rec);
    } else if (name === "status") {
      hosts.set(data.host, { ...hosts.get(data.host), ...data });
      dirty.strip = true;
    } else if (name === "verdict") {
      addVerdict(data);
    } else if (name === "session") {
      // The controller's catch-up: everything so far, then live events.
      const fresh = timeline.records.length === 0 && pending.length === 0;
      takeSession(data);
      if (fresh && Array.isArray(data.timeline)) {
        stats.received += data.timeline.length;
        pending.push(...data.timeline);
      }
    } else if (name === "end") {
      takeSession(data);
      stats.endedAt = performance.now();
    }
    schedule();
  }

  takeSession(snapshot);
  if (!live) {
    if (Array.isArray(snapshot.timeline)) pending.push(...snapshot.timeline);
    flush();
    chart.draw(true);
    return () => controller.abort();
  }
  flush();

  (async () => {
    let attempts = 0;
    while (!FINAL.has(session.state) && !controller.signal.aborted) {
      try {
        streamNote.textContent = "Live: records stream in as the hosts send them.";
        lastEventId = await streamEvents(`/sessions/${encodeURIComponent(id)}/events`, onEvent, { signal: controller.signal, lastEventId });
        attempts = 0;
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err instanceof ApiError && err.status >= 400 && err.status < 500) return showError(err);
        attempts += 1;
        streamNote.textContent = `The live stream dropped (${err.message}); reconnecting…`;
        await new Promise((resolve) => setTimeout(resolve, Math.min(5000, 500 * attempts)));
      }
      if (!FINAL.has(session.state) && !controller.signal.aborted) {
        // The stream closed without `end`: take the session as the controller has it now.
        try {
          takeSession(await api(`/sessions/${encodeURIComponent(id)}`));
          schedule();
        } catch (err) {
          showError(err);
          return;
        }
        if (!FINAL.has(session.state)) {
          // A reconnect replays the whole session: start the timeline afresh rather than double it.
          timeline.records.length = 0;
          timeline.dropped = 0;
          chart.reset();
          received.clear();
        }
      }
    }
    schedule();
  })();
  return () => {
    controller.abort();
    if (raf) cancelAnimationFrame(raf);
  };
}

export { HOST_STATES };
