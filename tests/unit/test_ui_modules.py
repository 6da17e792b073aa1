"""The web UI's JavaScript modules, run in headless Chromium without a controller: the SSE parser on
streams cut at every awkward place (CRLF split across chunks, events split mid-line), the virtualised
timeline (a 100,000-record session keeps a few dozen DOM rows), flow grouping across hosts, and verdict
ranking. The modules are served as static files, as the controller serves them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page

from tests.ui_browser import SSE_SCRIPT, module_page, run_module


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    with module_page() as opened:
        yield opened


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


def test_sse_parser_reads_a_large_chunk_whole(page: Page) -> None:
    """10,000 events in one chunk (a client catching up), every one in order. How long that takes, and that
    it grows linearly with the chunk, is measured in bench/ui_modules.py."""
    events = "".join(f'event: record\ndata: {{"n": {n}}}\n\n' for n in range(10_000))
    parsed = run_module(page, SSE_SCRIPT, [events])["events"]
    assert [event[1]["n"] for event in parsed] == list(range(10_000))
    assert {event[0] for event in parsed} == {"record"}


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
timeline.add(batch);
timeline.render(true);
const rows = timeline.scroller.querySelectorAll('.trow').length;
const lastText = [...timeline.scroller.querySelectorAll('.trow:not([hidden])')].pop().textContent;
timeline.setView({ grouped: true });
const groups = timeline.groupList.length;
const firstGroup = timeline.row(0);
const hops = [1, 2, 3].map((i) => [timeline.row(i).hop, timeline.row(i).rec.host]);
// 10,000 more records streamed into the grouped view, then one frame.
timeline.add(batch.slice(0, 10000));
timeline.render();
const lastGroupRow = timeline.row(timeline.length - 1);
// Both directions of one connection are one flow; a server-given flow key wins over the tuple.
const forward = flowKey({ proto: 'tcp', saddr: '198.18.0.5', sport: 1, daddr: '198.18.2.7', dport: 2 });
const reverse = flowKey({ proto: 'tcp', saddr: '198.18.2.7', sport: 2, daddr: '198.18.0.5', dport: 1 });
const keyed = flowKey({ flow: 'tcp 198.18.0.5:1 > 198.18.1.10:80', saddr: '198.18.2.7' });
timeline.scroller.remove();
return { rows, lastText, total: timeline.records.length, groups, firstText: firstGroup.text,
         hops, same: forward === reverse, keyed, length: timeline.length,
         lastHop: [lastGroupRow.hop, lastGroupRow.rec.host] };
"""


def test_timeline_is_virtualised_and_groups_flows_per_hop(page: Page) -> None:
    # What rendering, regrouping and streaming into the grouped view cost is measured in bench/ui_modules.py.
    result = run_module(page, TIMELINE_SCRIPT)
    assert result["total"] == 110_000
    assert result["rows"] < 60, result["rows"]  # a window of rows, not one per record
    assert "NETFILTER_DROP" in result["lastText"] and "198.18.0.5:40099" in result["lastText"]
    assert result["groups"] == 100
    assert "1000 records on 3 hosts" in result["firstText"]  # when the view was built
    assert result["length"] == 110_000 + 100  # every record plus one header per flow
    assert result["lastHop"] == [1, "client"]  # record 9,999 of flow :40099, which client saw first
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
