"""Web UI benchmark: does the live session page keep up, and stay responsive, at 5,000 records/s?

1. Render throughput (always). The page under test is the real one (the files shipped in
   src/netsleuth/controller/ui), in Debian's headless Chromium. Its records come from a feeder in this
   process that speaks the controller's SSE framing byte for byte (one `event: record` per merged record, as
   src/netsleuth/controller/app.py sends them) at a fixed offered rate, so the browser's side is measured
   alone and the rate is exact. Inside the page: records applied per second, frame intervals
   (requestAnimationFrame), long tasks (> 50 ms), and the event-loop lag seen by a 50 ms timer, the same
   numbers again with no stream (the baseline), and the work done per batched frame.
   The same run is repeated with the naive renderer (one DOM row appended per record, no batching) for the
   ratio that shows why the page batches and virtualises.
2. Page load and time-to-first-verdict (`--lab`, root): against the real controller, nats-server and agents
   of the fleet testbed (tests/fleet_lab.py): sign-in to hosts table, the session page's first paint, and
   from "Start diagnosis" to the first verdict on the page.

    python bench/ui_load.py [--rate 5000] [--seconds 8] [--lab]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import uvicorn  # noqa: E402
from fastapi import FastAPI  # noqa: E402
from fastapi.responses import FileResponse, HTMLResponse, StreamingResponse  # noqa: E402
from fastapi.staticfiles import StaticFiles  # noqa: E402
from tests.netlab import wait_for  # noqa: E402
from tests.ui_browser import browser, open_page  # noqa: E402

UI_DIR = REPO / "src" / "netsleuth" / "controller" / "ui"
HOSTS = ("client", "lb", "server")
REASONS = ("NETFILTER_DROP", "NO_SOCKET", "TCP_INVALID_SEQUENCE", "SKB_CSUM")
SESSION = "bench0001"

# In-page probes, installed before any page script runs: frame intervals, long tasks, timer lag.
PROBES = """
(() => {
  const p = (window.__probe = { frames: [], longtasks: [], lag: [], running: true });
  let last = performance.now();
  const frame = (t) => { p.frames.push(t - last); last = t; if (p.running) requestAnimationFrame(frame); };
  requestAnimationFrame(frame);
  new PerformanceObserver((list) => { for (const e of list.getEntries()) p.longtasks.push(e.duration); })
    .observe({ type: "longtask", buffered: true });
  let expected = performance.now() + 50;
  setInterval(() => {
    const now = performance.now();
    p.lag.push(Math.max(0, now - expected));
    expected = now + 50;
  }, 50);
})();
"""

# The naive alternative the page does NOT use: one DOM row per record, appended as each event arrives.
NAIVE = """
async (url) => {
  const list = document.createElement("div");
  list.style.cssText = "height:420px;overflow:auto;font-family:monospace;font-size:12px";
  document.body.prepend(list);
  const stats = { received: 0, applied: 0, firstRecordAt: null, lastAppliedAt: null };
  window.__netsleuthStats = stats;
  const res = await fetch(url, { headers: { Authorization: "Bearer bench" } });
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    let cut;
    while ((cut = buffer.indexOf("\\n\\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      const data = block.split("\\n").find((l) => l.startsWith("data: "));
      if (!data || !block.startsWith("event: record")) continue;
      const rec = JSON.parse(data.slice(6));
      const row = document.createElement("div");
      const flow = `${rec.saddr}:${rec.sport} -> ${rec.daddr}:${rec.dport}`;
      row.textContent = `${rec.time} ${rec.host} ${rec.type} ${flow} ${rec.reason}`;
      list.append(row);
      if (stats.firstRecordAt === null) stats.firstRecordAt = performance.now();
      stats.received += 1;
      stats.applied += 1;
      stats.lastAppliedAt = performance.now();
    }
  }
}
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def drop_record(n: int, now: datetime) -> dict[str, Any]:
    """A merged drop record shaped like the controller's (drops' to_json plus host, host_time and flow)."""
    sport = 40000 + n % 200
    host = HOSTS[n % 3]
    reason = REASONS[(n // 3) % len(REASONS)]
    stamp = now.isoformat(timespec="microseconds")
    record: dict[str, Any] = {
        "type": "drop",
        "v": 1,
        "time": stamp,
        "host_time": stamp,
        "host": host,
        "flow": f"tcp 198.18.0.2:{sport} > 198.18.1.10:80",
        "reason": reason,
        "reason_code": 6,
        "location": "nf_hook_slow",
        "family": 4,
        "proto": "tcp",
        "saddr": "198.18.0.2",
        "daddr": "198.18.2.7",
        "sport": sport,
        "dport": 8080,
        "length": 60,
        "pid": 4242,
        "comm": "curl",
        "netns_name": host,
        "ifname": "eth0",
        "tcp_flags": "SYN",
    }
    if reason == "NETFILTER_DROP":
        record["netfilter"] = {
            "rule": "-A INPUT -p tcp --dport 8080 -j DROP",
            "table": "filter",
            "chain": "INPUT",
        }
    return record


class Feeder:
    """The controller's session endpoints for one running session, with records at a fixed rate."""

    def __init__(self, rate: int, seconds: float) -> None:
        self.rate = rate
        self.seconds = seconds
        self.sent = 0
        self.started = threading.Event()
        self.app = FastAPI()
        self._routes()

    def session(self, state: str) -> dict[str, Any]:
        status = {"state": "running", "reason": "", "offset_ns": 41000, "totals": {}, "lost": 0, "sampled": 0}
        return {
            "id": SESSION,
            "user": "bench",
            "diagnostic": "drops",
            "config": {"proto": "tcp"},
            "duration": self.seconds,
            "state": state,
            "created": datetime.now(UTC).isoformat(),
            "t0": datetime.now(UTC).isoformat(),
            "ended": None,
            "hosts": {host: dict(status) for host in HOSTS},
            "partial": False,
            "verdicts": [],
            "timeline": [],
            "timeline_length": 0,
        }

    def _routes(self) -> None:
        app = self.app

        @app.get("/")
        def index() -> FileResponse:
            return FileResponse(UI_DIR / "index.html")

        app.mount("/ui", StaticFiles(directory=UI_DIR), name="ui")

        @app.get("/api/v1/me")
        def me() -> dict[str, Any]:
            allowed = {"diagnostics": ["*"], "hosts": ["*"], "netns": ["*"]}
            return {"user": "bench", "roles": ["admin"], "admin": True, "allowed": allowed}

        @app.get("/api/v1/hosts")
        def hosts() -> list[dict[str, Any]]:
            now = datetime.now(UTC).isoformat()
            return [
                {"host": h, "kernel": "6.18", "status": "up", "state": "up", "heartbeat": now} for h in HOSTS
            ]

        @app.get("/api/v1/sessions/{session_id}")
        def get_session(session_id: str) -> dict[str, Any]:
            return self.session("running")

        @app.get("/api/v1/sessions/{session_id}/events")
        def events(session_id: str) -> StreamingResponse:
            return StreamingResponse(self._stream(), media_type="text/event-stream")

        @app.get("/blank")
        def blank() -> HTMLResponse:
            return HTMLResponse("<!doctype html><title>naive</title><body></body>")

        @app.get("/api/v1/feed")
        def feed() -> StreamingResponse:
            return StreamingResponse(self._stream(), media_type="text/event-stream")

    async def _stream(self) -> AsyncIterator[bytes]:
        def event(name: str, data: dict[str, Any]) -> bytes:
            return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()

        yield event("session", self.session("running"))
        self.started.set()
        total = int(self.rate * self.seconds)
        began = time.monotonic()
        n = 0
        while n < total:
            # Paced by the clock, not by sleeps: whatever the loop's jitter, the offered rate is exact.
            due = min(total, int((time.monotonic() - began) * self.rate))
            if due > n:
                now = datetime.now(UTC)
                chunk = b"".join(event("record", drop_record(i, now)) for i in range(n, due))
                n = due
                self.sent = n
                yield chunk
            await asyncio.sleep(0.005)
        final = self.session("ended")
        for host in HOSTS:
            final["hosts"][host].update(state="ended", reason="duration")
        yield event("end", {k: final[k] for k in ("id", "state", "partial", "hosts")})


@contextmanager
def serve(app: FastAPI) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, 15, "the feeder to listen")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def probe_summary(probe: dict[str, list[float]]) -> dict[str, float]:
    frames = probe["frames"][2:]  # the first frames include page start-up
    return {
        "frames": len(frames),
        "frame_p50_ms": percentile(frames, 0.5),
        "frame_p95_ms": percentile(frames, 0.95),
        "frame_max_ms": max(frames, default=0.0),
        "longtasks": len(probe["longtasks"]),
        "longtask_max_ms": max(probe["longtasks"], default=0.0),
        "lag_p95_ms": percentile(probe["lag"], 0.95),
        "lag_max_ms": max(probe["lag"], default=0.0),
    }


def render_run(rate: int, seconds: float, mode: str) -> dict[str, float]:
    """mode: `ui` (the page as shipped), `grouped` (its per-flow view), `naive` (one DOM row per record)."""
    naive = mode == "naive"
    feeder = Feeder(rate, seconds)
    total = int(rate * seconds)
    with serve(feeder.app) as base, browser() as instance:
        bp = open_page(instance, base)
        page = bp.page
        page.add_init_script("sessionStorage.setItem('netsleuth.token', 'bench');")
        page.add_init_script(PROBES)
        if naive:
            page.goto("/blank")  # an empty document of the same origin
            page.evaluate(f"() => {{ ({NAIVE})('/api/v1/feed'); }}")
        else:
            page.goto(f"/#/session/{SESSION}")
            if mode == "grouped":
                page.get_by_label("Group by flow (one line per hop)").check()
        wait_for(
            lambda: page.evaluate("() => window.__netsleuthStats?.applied || 0") >= total,
            seconds * 20 + 60,
            f"the page to apply {total} records",
        )
        page.wait_for_timeout(500)  # a last throttled chart draw, so the stats cover the whole session
        stats = page.evaluate("() => window.__netsleuthStats")
        probe = page.evaluate("() => { window.__probe.running = false; return window.__probe; }")
        # DOM rows holding records: the page's pool of reused rows, or the naive list's one row per record.
        rows_js = (
            "document.body.firstElementChild.childElementCount"
            if naive
            else "document.querySelectorAll('.trow').length"
        )
        shown = page.evaluate(f"() => {rows_js}")
        bp.assert_no_errors()
    result = probe_summary(probe)
    # Rate over the stream itself (first record arrived -> last record applied), in the page's own clock.
    stream_ms = max(1e-3, stats["lastAppliedAt"] - stats["firstRecordAt"])
    result.update(
        applied=float(stats["applied"]),
        applied_per_s=stats["applied"] / stream_ms * 1000,
        dom_rows=float(shown),
    )
    if not naive:
        result.update(
            batched_frames=float(stats["frames"]),
            flush_mean_ms=stats["flushMsTotal"] / max(1, stats["frames"]),
            flush_p95_ms=percentile(stats["flushes"], 0.95),
            flush_max_ms=float(stats["maxFlushMs"]),
        )
    return result


def median_of(results: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in results) for key in results[0]}


def idle_baseline(seconds: float) -> dict[str, float]:
    """The same page with no stream: what frame and timer jitter look like on this machine anyway."""
    feeder = Feeder(0, 0)
    with serve(feeder.app) as base, browser() as instance:
        page = open_page(instance, base).page
        page.add_init_script("sessionStorage.setItem('netsleuth.token', 'bench');")
        page.add_init_script(PROBES)
        page.goto("/#/hosts")
        page.wait_for_selector("tbody tr[data-host]")
        page.wait_for_timeout(seconds * 1000)
        probe = page.evaluate("() => { window.__probe.running = false; return window.__probe; }")
    return probe_summary(probe)


# A paced UDP sender for the client host: datagrams to a closed port on the server, each one a NO_SOCKET
# drop there and so one record through agent -> NATS -> controller -> SSE -> page.
PACED_SENDER = """
import socket, sys, time
rate, seconds, address = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
began = time.monotonic(); sent = 0
while True:
    elapsed = time.monotonic() - began
    if elapsed >= seconds:
        break
    due = int(elapsed * rate)
    while sent < due:
        s.sendto(b"x", (address, 9)); sent += 1
    time.sleep(0.001)
print(sent)
"""


def lab_run(duration: float, rate: int) -> dict[str, float]:
    """On the real stack: page load, time to the first verdict, and a real record stream at `rate`/s."""
    from tests.privileged.test_fleet_ui import fleet_ui_stack, start_diagnosis, wait_cards

    with fleet_ui_stack() as stack:
        bp = open_page(stack.browser, stack.base_url)
        page = bp.page
        page.add_init_script(PROBES)
        started = time.monotonic()
        page.goto("/")
        page.get_by_label("API token").fill(stack.admin_token)
        page.get_by_role("button", name="Sign in").click()
        page.wait_for_selector("tbody tr[data-host]")
        load_s = time.monotonic() - started
        timing = page.evaluate("() => performance.getEntriesByType('navigation')[0].toJSON()")

        # Time to first verdict: diagnose on the three hosts, SYNs once they all run.
        clicked = time.monotonic()
        start_diagnosis(page, "diagnose", int(duration))
        page.wait_for_selector(".hostcard")
        session_paint_s = time.monotonic() - clicked
        wait_cards(page, dict.fromkeys(stack.hosts, "running"), 40)
        running_s = time.monotonic() - clicked
        stack.drive_traffic(1.0)
        page.wait_for_selector(".verdict", timeout=(duration + 40) * 1000)
        verdict_s = time.monotonic() - clicked
        wait_cards(page, dict.fromkeys(stack.hosts, "ended"), 60)

        # A real stream: `drops` on the server while the client sends `rate` datagrams/s to a closed port.
        stream_s = 5.0
        start_diagnosis(page, "drops", int(stream_s + 3), proto="udp")
        wait_cards(page, dict.fromkeys(stack.hosts, "running"), 40)
        server = stack.lab.hosts["server"].address
        sent = stack.lab.hosts["client"].run("python3", "-c", PACED_SENDER, str(rate), str(stream_s), server)
        wait_cards(page, dict.fromkeys(stack.hosts, "ended"), 90)
        page.wait_for_timeout(1000)
        stats = page.evaluate("() => window.__netsleuthStats")
        probe = page.evaluate("() => { window.__probe.running = false; return window.__probe; }")
        totals = page.locator('.hostcard[data-host="server"] dd[data-k="total"]').inner_text()
        bp.assert_no_errors()
    stream_ms = max(1e-3, (stats["lastAppliedAt"] or 0) - (stats["firstRecordAt"] or 0))
    result = {
        "signin_to_hosts_s": load_s,
        "dom_content_loaded_ms": float(timing["domContentLoadedEventEnd"]),
        "load_event_ms": float(timing["loadEventEnd"]),
        "start_to_session_page_s": session_paint_s,
        "start_to_all_running_s": running_s,
        "start_to_first_verdict_s": verdict_s,
        "diagnose_duration_s": duration,
        "stream_datagrams_sent": float(sent.stdout.strip() or 0),
        "stream_server_total": float(totals.replace(",", "") or 0) if totals.strip("–") else 0.0,
        "stream_records_on_page": float(stats["applied"]),
        "stream_records_per_s_on_page": stats["applied"] / stream_ms * 1000,
    }
    result.update({f"stream_{k}": v for k, v in probe_summary(probe).items()})
    return result


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rate", type=int, default=5000, help="records per second offered to the page")
    parser.add_argument("--seconds", type=float, default=8.0, help="how long the stream lasts")
    parser.add_argument(
        "--lab", action="store_true", help="also measure load and first verdict on the real stack"
    )
    parser.add_argument("--lab-duration", type=float, default=4.0)
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (medians are printed)")
    args = parser.parse_args()
    random.seed(1)

    print(
        f"render throughput: {args.rate} records/s offered for {args.seconds:g} s, "
        f"median of {args.repeat} runs per column"
    )
    # This machine is shared: each figure is the median of `--repeat` runs, the modes interleaved.
    runs: dict[str, list[dict[str, float]]] = {"idle": [], "ui": [], "grouped": [], "naive": []}
    for _ in range(args.repeat):
        runs["idle"].append(idle_baseline(min(args.seconds, 4.0)))
        for mode in ("ui", "grouped", "naive"):
            runs[mode].append(render_run(args.rate, args.seconds, mode))
    baseline, page, grouped, naive = (median_of(runs[mode]) for mode in ("idle", "ui", "grouped", "naive"))
    rows = (
        "applied_per_s",
        "frame_p50_ms",
        "frame_p95_ms",
        "frame_max_ms",
        "longtasks",
        "longtask_max_ms",
        "lag_p95_ms",
        "lag_max_ms",
        "dom_rows",
    )
    print(f"{'':22} {'idle page':>12} {'netsleuth UI':>14} {'UI, grouped':>12} {'naive (row/record)':>20}")
    for key in rows:
        print(
            f"{key:22} {baseline.get(key, float('nan')):12.1f} {page[key]:14.1f} {grouped[key]:12.1f} "
            f"{naive[key]:20.1f}"
        )
    per_frame = page["applied"] / max(1, page["batched_frames"])
    print(
        f"batched frames {page['batched_frames']:.0f}, {per_frame:.0f} records per frame, "
        f"flush mean {page['flush_mean_ms']:.2f} ms, p95 {page['flush_p95_ms']:.1f} ms, "
        f"max {page['flush_max_ms']:.1f} ms"
    )
    print(
        f"ratios UI/naive: frame p95 {page['frame_p95_ms'] / max(naive['frame_p95_ms'], 1e-9):.2f}, "
        f"timer lag p95 {page['lag_p95_ms'] / max(naive['lag_p95_ms'], 1e-9):.2f}, "
        f"DOM rows {page['dom_rows'] / max(naive['dom_rows'], 1):.4f}"
    )
    if args.lab:
        lab = lab_run(args.lab_duration, args.rate)
        print("real stack (controller + nats-server + agents in namespaces, the page as admin):")
        for key, value in lab.items():
            print(f"  {key:28} {value:10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
