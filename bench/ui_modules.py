"""The web UI's JavaScript modules on large inputs, in headless Chromium without a controller (the modules
served as static files, tests/ui_browser.py): do they stay linear, and how far from the floor?

1. The SSE parser (streamEvents, src/netsleuth/controller/ui/js/api.js) on one large chunk, as a client
   catching up on a session receives it: 10,000 / 30,000 / 100,000 `event: record` events fed to the real
   module through a stand-in for fetch, timed with performance.now() around the whole parse; rounds alternate
   with the floor: the same text only split into events and each `data:` JSON.parse'd (no framing, ids or
   callbacks). Time per event that stays flat as the chunk grows is a linear parser (a quadratic one, e.g.
   re-scanning the buffer per event, grows tenfold from 10,000 to 100,000).
2. The timeline (js/timeline.js) with N drop records of 100 flows on 3 hosts: add + first render (a
   virtualised window of rows), switching to the grouped-by-flow view, and one frame after 10,000 more records
   stream into the grouped view (costs per record, not a rebuild of the view); the floor is computing
   flowKey once per record, the least any grouping does.
Medians of --rounds.

    python bench/ui_modules.py [--rounds N]

These were wall-clock bounds in tests/unit/test_ui_modules.py (10,000 events parsed under 1 s; 100,000
records rendered under 500 ms, regrouped under 1 s, a grouped frame of 10,000 more under 100 ms); the unit
tests keep what they checked besides (every event in order; the window of rows, the groups and hops).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from playwright.sync_api import Page  # noqa: E402
from tests.ui_browser import SSE_SCRIPT, module_page, run_module  # noqa: E402

SSE_SIZES = (10_000, 30_000, 100_000)
TIMELINE_SIZES = (30_000, 100_000)

# SSE_SCRIPT timed inside the page; only the count comes back (transfers to and from Python are not timed).
SSE_PARSE = "const started = performance.now();" + SSE_SCRIPT.replace(
    "return { events,", "return { ms: performance.now() - started, count: events.length,"
)
SSE_FLOOR = """
const [text] = arg;
const started = performance.now();
const events = [];
for (const block of text.split('\\n\\n')) {
    if (!block) continue;
    events.push(JSON.parse(block.slice(block.indexOf('\\ndata: ') + 7)));
}
return { ms: performance.now() - started, count: events.length };
"""

TIMELINE = """
const { Timeline, flowKey } = await import('/ui/js/timeline.js');
const hosts = ['client', 'lb', 'server'];
const batch = [];
for (let n = 0; n < arg; n++) {
    batch.push({ type: 'drop', host: hosts[n % 3], time: '2026-11-23T09:00:00.000001+00:00', proto: 'tcp',
                 saddr: '198.18.0.5', sport: 40000 + (n % 100), daddr: '198.18.2.7', dport: 8080,
                 reason: 'NETFILTER_DROP', location: 'nft_do_chain' });
}
const timeline = new Timeline();
document.body.append(timeline.scroller);
let started = performance.now();
timeline.add(batch);
timeline.render(true);
const renderMs = performance.now() - started;
started = performance.now();
timeline.setView({ grouped: true });
const groupMs = performance.now() - started;
started = performance.now();
timeline.add(batch.slice(0, 10000));
timeline.render();
const groupedFrameMs = performance.now() - started;
const groups = timeline.groupList.length;
timeline.scroller.remove();
started = performance.now();
const keys = new Set();
for (const rec of batch) keys.add(flowKey(rec));
const floorMs = performance.now() - started;
return { renderMs, groupMs, groupedFrameMs, floorMs, groups, flows: keys.size };
"""


def _per_event(ms: float, count: int) -> str:
    return f"{ms:8.1f} ms ({ms * 1e3 / count:5.2f} us/record)"


def sse(page: Page, rounds: int) -> None:
    print(f"ui_modules: SSE parser, one chunk of N events, {rounds} rounds (medians)")
    for size in SSE_SIZES:
        chunk = "".join(f'event: record\ndata: {{"n": {n}}}\n\n' for n in range(size))
        parsed, floor = [], []
        for _ in range(rounds):
            result = run_module(page, SSE_PARSE, [chunk])
            bare = run_module(page, SSE_FLOOR, [chunk])
            assert result["count"] == size and bare["count"] == size, (result["count"], bare["count"])
            parsed.append(float(result["ms"]))
            floor.append(float(bare["ms"]))
        ms, floor_ms = statistics.median(parsed), statistics.median(floor)
        print(
            f"  {size:>7} events   streamEvents {_per_event(ms, size)}   floor {_per_event(floor_ms, size)}"
            f"   x{ms / floor_ms:.1f}"
        )


def timeline(page: Page, rounds: int) -> None:
    print(f"ui_modules: timeline, N drop records of 100 flows on 3 hosts, {rounds} rounds (medians)")
    for size in TIMELINE_SIZES:
        runs: list[dict[str, Any]] = []
        for _ in range(rounds):
            result = run_module(page, TIMELINE, size)
            assert result["groups"] == result["flows"] == 100, result
            runs.append(result)

        ms = {
            key: statistics.median(float(run[key]) for run in runs) for key in runs[0] if key.endswith("Ms")
        }
        print(
            f"  {size:>7} records  add+render {_per_event(ms['renderMs'], size)}"
            f"   grouped view {_per_event(ms['groupMs'], size)}"
            f"   floor (flowKey each) {_per_event(ms['floorMs'], size)}"
        )
        print(f"{'':18}one grouped frame after 10000 more {_per_event(ms['groupedFrameMs'], 10_000)}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with module_page() as page:
        sse(page, args.rounds)
        timeline(page, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
