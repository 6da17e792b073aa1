// Live session: per-host status strip, ranked verdicts, rate chart and the merged timeline over SSE.
// Incoming events are queued and applied once per animation frame, so the page stays responsive however
// fast records arrive. An ended session (reopened from history) is drawn from GET /sessions/{id}, read-only.

import { ApiError, api, download, streamEvents } from "./api.js";
import { badge, fmtCount, fmtOffset, fmtTime, h, put } from "./dom.js";
import { RateChart } from "./ratechart.js";
import { Timeline } from "./timeline.js";
import { isHostVerdict, rankVerdicts, verdictItem } from "./verdicts.js";

// "interrupted": a session the controller lost in a restart (read back from the history stream).
const FINAL = new Set(["ended", "failed", "cancelled", "interrupted"]);
const MAX_PER_FRAME = 20_000;

// Counters a benchmark (bench/ui_load.py) reads; cheap to keep. Fresh for every session page.
const stats = (window.__netsleuthStats = {});
function resetStats() {
  Object.assign(stats, { received: 0, applied: 0, frames: 0, maxFlushMs: 0, flushMsTotal: 0, flushes: [], firstRecordAt: null, lastAppliedAt: null, firstVerdictAt: null, endedAt: null, openedAt: performance.now() });
}

function verdictKey(v) {
  return isHostVerdict(v) ? `h:${v.host}|${v.category}|${v.cause}` : `f:${v.flow}|${v.text}`;
}

export async function renderSession(root, ctx, id) {
  resetStats();
  // Without the timeline first (it can be megabytes): a live session's stream starts with all of it anyway.
  let snapshot = await api(`/sessions/${encodeURIComponent(id)}?timeline=false`);
  if (FINAL.has(snapshot.state)) snapshot = await api(`/sessions/${encodeURIComponent(id)}`);
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
  const endNote = h("p", { class: "ended-note", role: "status", hidden: true });
  const counters = h("p", { class: "counters", "aria-live": "off" });
  const strip = h("div", { class: "strip", role: "list", "aria-label": "Hosts in this session" });
  const verdictList = h("ol", { class: "verdicts", "aria-label": "Verdicts, worst first" });
  const verdictEmpty = h("p", { class: "muted" });
  const streamNote = h("p", { class: "muted small", role: "status" });
  const error = h("p", { class: "form-error", role: "alert", hidden: true });
  const cancel = h("button", { type: "button", class: "danger", hidden: !live }, "Cancel session");
  const downloadButton = h("button", { type: "button", class: "quiet" }, "Download JSON lines");

  const grouped = h("input", { type: "checkbox" });
  // Following makes sense only while records can still come: an ended session has no toggle, and a reopened
  // one opens at its first record.
  const follow = h("input", { type: "checkbox", checked: live });
  const followLabel = h("label", { class: "check", hidden: !live }, follow, "Follow new records");
  timeline.follow = live;
  const hostFilter = h("select", { id: "timeline-host" }, h("option", { value: "" }, "all hosts"));

  root.append(
    h("div", { class: "session-head" }, h("h1", {}, `Session ${id}`), stateBadge, h("div", { class: "row" }, downloadButton, cancel)),
    meta,
    endNote,
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
      followLabel,
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
    stats.lastAppliedAt = performance.now();
    dirty.strip = true;
  }

  function renderHead() {
    put(stateBadge, badge(session.partial && FINAL.has(session.state) ? "partial" : session.state));
    const scope = session.config?.netns ? ` in netns ${session.config.netns}` : "";
    let clock = "";
    if (session.t0 && !FINAL.has(session.state)) {
      const elapsed = Math.max(0, (Date.now() - Date.parse(session.t0)) / 1000);
      clock = elapsed > 0 ? ` · ${Math.min(elapsed, session.duration ?? elapsed).toFixed(0)} of ${session.duration ?? "?"} s` : " · waiting for T0";
    }
    meta.textContent = `${session.diagnostic}${scope} on ${hosts.size} host${hosts.size === 1 ? "" : "s"}, ${session.duration ?? "?"} s, by ${session.user} · created ${fmtTime(session.created)}${session.t0 ? ` · T0 ${fmtTime(session.t0)}` : ""}${session.ended ? ` · ended ${fmtTime(session.ended)}` : ""}${clock}`;
    cancel.hidden = FINAL.has(session.state);
    if (FINAL.has(session.state)) {
      streamNote.textContent = live ? "The session is over; this view no longer changes." : "Reopened from history (read-only).";
      endNote.textContent = endedSentence();
      endNote.hidden = false;
      followLabel.hidden = true;
      timeline.follow = false;
      chart.end();
    }
  }

  /** What came of the session: when it ended, how many records its hosts sent (the controller's count, which
   * the download has in full), and which hosts did not end. */
  function endedSentence() {
    const word = { ended: "Ended", failed: "Failed", cancelled: "Cancelled", interrupted: "Interrupted" }[session.state] || session.state;
    const states = [...hosts.entries()].sort(([a], [b]) => a.localeCompare(b));
    let records = 0;
    for (const [host, st] of states) records += Math.max(st.records || 0, received.get(host) || 0);
    const sent = records ? `${fmtCount(records)} record${records === 1 ? "" : "s"}` : "no records";
    const unfinished = states.filter(([, st]) => st.state && st.state !== "ended").map(([host, st]) => `${host} ${st.state}`);
    const at = session.ended ? ` at ${fmtTime(session.ended)}` : "";
    return `${word}${at}: ${sent} from ${hosts.size} host${hosts.size === 1 ? "" : "s"}${unfinished.length ? `; ${unfinished.join(", ")}` : ""}.`;
  }

  // Host cards are keyed and updated in place: records move the counters every frame, and rebuilding the
  // cards each time would cost layout and lose focus.
  const cards = new Map();
  const CARD_FIELDS = [
    ["offset", (st) => fmtOffset(st.offset_ns)],
    ["total", (st) => fmtCount(st.totals?.total ?? st.totals?.matched)],
    ["emitted", (st) => fmtCount(st.totals?.emitted)],
    ["lost", (st) => fmtCount(st.totals?.lost ?? st.lost)],
    ["sampled", (st) => fmtCount(st.totals?.sampled ?? st.sampled)],
    ["records here", (st, host) => fmtCount(Math.max(received.get(host) || 0, st.records || 0))],
  ];

  function card(host) {
    let entry = cards.get(host);
    if (!entry) {
      const values = CARD_FIELDS.map(([name]) => h("dd", { dataset: { k: name.split(" ")[0] } }));
      const state = h("span");
      const reason = h("p", { hidden: true });
      const el = h(
        "div",
        { class: "hostcard", role: "listitem", dataset: { host } },
        h("h3", {}, h("span", {}, host), state),
        h("dl", {}, CARD_FIELDS.map(([name], i) => [h("dt", {}, name), values[i]])),
        reason,
      );
      entry = { el, values, state, reason, last: "" };
      cards.set(host, entry);
    }
    return entry;
  }

  function renderStrip() {
    const order = [...hosts.keys()].sort();
    for (const host of order) {
      const st = hosts.get(host) || {};
      const entry = card(host);
      const texts = CARD_FIELDS.map(([, value]) => value(st, host));
      texts.forEach((text, i) => {
        if (entry.values[i].textContent !== text) entry.values[i].textContent = text;
      });
      const state = st.state || "unknown";
      if (entry.el.dataset.state !== state) {
        entry.el.dataset.state = state;
        put(entry.state, badge(state));
      }
      const failed = state === "failed" || state === "rejected";
      entry.reason.hidden = !st.reason;
      entry.reason.className = failed ? "reason" : "muted small";
      if (entry.reason.textContent !== (st.reason || "")) entry.reason.textContent = st.reason || "";
    }
    if (strip.children.length !== order.length) strip.replaceChildren(...order.map((host) => cards.get(host).el));
    const known = new Set([...hostFilter.options].map((o) => o.value));
    for (const host of order) if (!known.has(host)) hostFilter.append(h("option", { value: host }, host));
  }

  function renderVerdicts() {
    const ranked = rankVerdicts([...verdicts.values()]);
    verdictList.replaceChildren(...ranked.map(verdictItem));
    verdictEmpty.textContent = ranked.length ? "" : FINAL.has(session.state) ? "No verdict: nothing went wrong in the window, or no host saw the traffic." : "Verdicts appear here as the hosts report.";
  }

  function flush() {
    raf = 0;
    const started = performance.now();
    // A reopened or caught-up session can bring 100,000+ records at once: apply them over several frames.
    let batch = pending;
    pending = [];
    if (batch.length > MAX_PER_FRAME) {
      pending = batch.slice(MAX_PER_FRAME);
      batch = batch.slice(0, MAX_PER_FRAME);
    }
    if (batch.length) takeRecords(batch);
    if (dirty.head) renderHead();
    if (dirty.strip) renderStrip();
    if (dirty.verdicts) renderVerdicts();
    dirty = { strip: false, verdicts: false, head: false };
    timeline.render();
    const t0 = session.t0 ? Date.parse(session.t0) / 1000 : null;
    if (t0) chart.setWindow(Math.floor(t0), Math.floor(session.ended ? Date.parse(session.ended) / 1000 : Math.max(t0, Date.now() / 1000)));
    chart.draw(FINAL.has(session.state));
    const dropped = timeline.dropped ? `, ${fmtCount(timeline.dropped)} oldest trimmed from this tab (the download has them)` : "";
    const count = timeline.records.length + timeline.dropped;
    counters.textContent = `${fmtCount(count)} record${count === 1 ? "" : "s"}${dropped}`;
    const took = performance.now() - started;
    stats.frames += 1;
    stats.flushMsTotal += took;
    stats.maxFlushMs = Math.max(stats.maxFlushMs, took);
    if (stats.flushes.length < 20_000) stats.flushes.push(took);
    if (pending.length) schedule();
  }

  function schedule() {
    if (!raf) raf = requestAnimationFrame(flush);
  }

  function onEvent(name, data, eventId) {
    lastEventId = eventId;
    if (name === "record") {
      const batch = Array.isArray(data.records) ? data.records : [data];
      stats.received += batch.length;
      if (stats.firstRecordAt === null) stats.firstRecordAt = performance.now();
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
        pending = pending.concat(data.timeline); // not push(...): spreading 100,000+ arguments overflows the stack
      }
    } else if (name === "end") {
      takeSession(data);
      stats.endedAt = performance.now();
      // The end event names the states; the session's own record adds when it ended.
      api(`/sessions/${encodeURIComponent(id)}?timeline=false`)
        .then((final) => {
          takeSession(final);
          schedule();
        })
        .catch(showError);
    }
    schedule();
  }

  takeSession(snapshot);
  if (!live) {
    if (Array.isArray(snapshot.timeline)) pending = pending.concat(snapshot.timeline);
    flush();
    return () => {
      controller.abort();
      if (raf) cancelAnimationFrame(raf);
    };
  }
  flush();
  // The chart redraws at most twice a second and the session clock moves on; one tick a second covers both.
  const ticker = setInterval(() => {
    dirty.head = true;
    schedule();
  }, 1000);

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
          takeSession(await api(`/sessions/${encodeURIComponent(id)}?timeline=false`));
          schedule();
        } catch (err) {
          showError(err);
          return;
        }
        if (!FINAL.has(session.state)) {
          // A reconnect replays the whole session: start the timeline afresh rather than double it.
          timeline.clear();
          pending = [];
          chart.reset();
          received.clear();
        }
      }
    }
    schedule();
  })();
  return () => {
    controller.abort();
    clearInterval(ticker);
    if (raf) cancelAnimationFrame(raf);
  };
}
