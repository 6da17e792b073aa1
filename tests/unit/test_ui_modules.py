"""The web UI's JavaScript modules, run in headless Chromium without a controller: the SSE parser on
streams cut at every awkward place (CRLF split across chunks, events split mid-line), the virtualised
timeline (a 100,000-record session keeps a few dozen DOM rows), flow grouping across hosts, and verdict
ranking. The modules are served as static files, as the controller serves them."""

from __future__ import annotations

import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page

from tests.ui_browser import browser, open_page

UI_DIR = Path(__file__).resolve().parents[2] / "src" / "netsleuth" / "controller" / "ui"


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    handler = functools.partial(_Quiet, directory=str(UI_DIR.parent))  # so /ui/... resolves
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with browser() as instance:
            opened = open_page(instance, f"http://127.0.0.1:{server.server_address[1]}")
            # A page of the same origin with the UI's stylesheet (the timeline's scroll box is CSS).
            opened.page.goto("/ui/vendor/uplot/uPlot.min.css")
            opened.page.evaluate(
                """() => new Promise((resolve, reject) => {
                    document.body.textContent = '';
                    const link = document.createElement('link');
                    link.rel = 'stylesheet';
                    link.href = '/ui/app.css';
                    link.onload = resolve; link.onerror = reject;
                    document.head.append(link);
                })"""
            )
            yield opened.page
            opened.assert_no_errors()
    finally:
        server.shutdown()
        server.server_close()


def run_module(page: Page, script: str, arg: Any = None) -> Any:
    return page.evaluate(f"async (arg) => {{ {script} }}", arg)


SSE_SCRIPT = """
const { streamEvents } = await import('/ui/js/api.js');
const chunks = arg;
const encoder = new TextEncoder();
// Replace fetch with a stream that delivers exactly these chunks.
const realFetch = window.fetch;
window.fetch = async () => new Response(new ReadableStream({
    start(controller) { for (const c of chunks) controller.enqueue(encoder.encode(c)); controller.close(); }
}), { status: 200, headers: { 'Content-Type': 'text/event-stream' } });
const events = [];
try {
    const lastId = await streamEvents('/x', (name, data, id) => events.push([name, data, id ?? null]));
    return { events, lastId: lastId ?? null };
} finally {
    window.fetch = realFetch;
}
"""


def test_sse_parser_handles_crlf_split_events_comments_and_ids(page: Page) -> None:
    stream = (
        ": keepalive\r\n\r\n"
        'event: status\r\ndata: {"host": "lb", "state": "ready"}\r\n\r\n'
        'id: 7\r\nevent: record\r\ndata: {"host": "server",\r\ndata:  "type": "drop"}\r\n\r\n'
        "event: end\ndata: plain text\n\n"
    )
    expected = [
        ["status", {"host": "lb", "state": "ready"}, None],
        ["record", {"host": "server", "type": "drop"}, "7"],
        ["end", "plain text", "7"],
    ]
    # Every split point, including between CR and LF and in the middle of a JSON value.
    for cut in range(1, len(stream)):
        result = run_module(page, SSE_SCRIPT, [stream[:cut], stream[cut:]])
        assert result["events"] == expected, cut
        assert result["lastId"] == "7"
    # One byte per chunk, the worst case for buffering.
    assert run_module(page, SSE_SCRIPT, list(stream))["events"] == expected


def test_sse_parser_is_linear_in_a_large_chunk(page: Page) -> None:
    """10,000 events in one chunk (a client catching up): parsed in well under a second."""
    events = "".join(f'event: record\ndata: {{"n": {n}}}\n\n' for n in range(10_000))
    elapsed = run_module(
        page,
        "const t = performance.now();"
        + SSE_SCRIPT.replace("return { events", "arg = performance.now() - t; return { ms: arg, events"),
        [events],
    )
    assert len(elapsed["events"]) == 10_000 and elapsed["events"][-1][1] == {"n": 9999}
    assert elapsed["ms"] < 1000, elapsed["ms"]


TIMELINE_SCRIPT = """
const { Timeline, flowKey } = await import('/ui/js/timeline.js');
const timeline = new Timeline();
document.body.append(timeline.scroller);
const hosts = ['client', 'lb', 'server'];
const batch = [];
for (let n = 0; n < 100000; n++) {
    batch.push({ type: 'drop', host: hosts[n % 3], time: '2026-11-23T09:00:00.000001+00:00', proto: 'tcp',
                 saddr: '198.18.0.5', sport: 40000 + (n % 100), daddr: '198.18.2.7', dport: 8080,
                 reason: 'NETFILTER_DROP', location: 'nft_do_chain' });
}
const t = performance.now();
timeline.add(batch);
timeline.render(true);
const renderMs = performance.now() - t;
const rows = timeline.scroller.querySelectorAll('.trow').length;
const lastText = [...timeline.scroller.querySelectorAll('.trow:not([hidden])')].pop().textContent;
let t2 = performance.now();
timeline.setView({ grouped: true });
const groupMs = performance.now() - t2;
const groups = timeline.groupList.length;
const firstGroup = timeline.row(0);
const hops = [1, 2, 3].map((i) => [timeline.row(i).hop, timeline.row(i).rec.host]);
// Streaming into the grouped view costs per record, not per view: 10,000 more records then one frame.
const more = batch.slice(0, 10000);
t2 = performance.now();
timeline.add(more);
timeline.render();
const groupedFrameMs = performance.now() - t2;
const lastGroupRow = timeline.row(timeline.length - 1);
// Both directions of one connection are one flow; a server-given flow key wins over the tuple.
const forward = flowKey({ proto: 'tcp', saddr: '198.18.0.5', sport: 1, daddr: '198.18.2.7', dport: 2 });
const reverse = flowKey({ proto: 'tcp', saddr: '198.18.2.7', sport: 2, daddr: '198.18.0.5', dport: 1 });
const keyed = flowKey({ flow: 'tcp 198.18.0.5:1 > 198.18.1.10:80', saddr: '198.18.2.7' });
timeline.scroller.remove();
return { renderMs, rows, lastText, total: timeline.records.length, groups, firstText: firstGroup.text,
         hops, same: forward === reverse, keyed, groupMs, groupedFrameMs, length: timeline.length,
         lastHop: [lastGroupRow.hop, lastGroupRow.rec.host] };
"""


def test_timeline_is_virtualised_and_groups_flows_per_hop(page: Page) -> None:
    result = run_module(page, TIMELINE_SCRIPT)
    assert result["total"] == 110_000
    assert result["rows"] < 60, result["rows"]  # a window of rows, not one per record
    assert result["renderMs"] < 500, result["renderMs"]
    assert "NETFILTER_DROP" in result["lastText"] and "198.18.0.5:40099" in result["lastText"]
    assert result["groups"] == 100
    assert "1000 records on 3 hosts" in result["firstText"]  # when the view was built
    assert result["length"] == 110_000 + 100  # every record plus one header per flow
    assert result["lastHop"] == [1, "client"]  # record 9,999 of flow :40099, which client saw first
    assert result["groupMs"] < 1000, result["groupMs"]  # switching views: one pass
    assert result["groupedFrameMs"] < 100, result["groupedFrameMs"]  # streaming: per record, no rebuild
    assert result["hops"] == [[1, "client"], [2, "lb"], [3, "server"]]
    assert result["same"] is True
    assert result["keyed"] == "f:tcp 198.18.0.5:1 > 198.18.1.10:80"


def test_verdicts_rank_lost_traffic_first(page: Page) -> None:
    order = run_module(
        page,
        """
        const { rankVerdicts } = await import('/ui/js/verdicts.js');
        const list = [
            { type: 'verdict', flow: 'ok', outcome: 'established', hops: [] },
            { type: 'verdict', host: 'a', severity: 'info', category: 'retransmits', cause: 'i' },
            { type: 'verdict', host: 'b', severity: 'warning', category: 'firewall', cause: 'w' },
            { type: 'verdict', flow: 'lost', outcome: 'dropped', hops: [{}, {}, {}] },
            { type: 'verdict', host: 'c', severity: 'critical', category: 'udp-rcvbuf', cause: 'c' },
            { type: 'verdict', flow: 'quiet', outcome: 'unanswered', hops: [{}] },
        ];
        return rankVerdicts(list).map((v) => v.flow || v.category);
        """,
    )
    assert order == ["lost", "udp-rcvbuf", "firewall", "quiet", "retransmits", "ok"]
