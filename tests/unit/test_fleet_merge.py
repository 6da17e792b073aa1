"""The merged fleet timeline and its per-hop verdicts, on recorded sessions: clock correction, the NAT join
across hosts, the causal order of hops, the packet that skipped a NAT, and whose record is whose.

three_stories_session.json is one real `conn` session on the lab's three hosts (`python -m tests.fleet_lab
--record FILE`): the seed-001 story (an ACK 1 GiB out of window skips the server's REDIRECT and draws a RST
from the application's LISTEN socket), a SYN dropped by the server's firewall, and a reply that bypasses the
lb's DNAT."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from netsleuth.fleet.causal_order import Placed, causal_order
from netsleuth.fleet.merge import MergedTimeline, iso_from_ns, parse_time_ns

FIXTURES = Path(__file__).parent.parent / "fixtures" / "fleet"
FIXTURE = FIXTURES / "dnat_drop_session.json"
STORIES = FIXTURES / "three_stories_session.json"
HOSTS = ("client", "lb", "server")


def _merged() -> MergedTimeline:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    merged = MergedTimeline(data["hostnames"])
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    return merged


def _stories() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(STORIES.read_text())
    return data


def _verdicts(data: dict[str, Any], netns_owner: dict[str, str] | None = None) -> list[dict[str, Any]]:
    merged = MergedTimeline(data["hostnames"], netns_owner=netns_owner)
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    return merged.verdicts(data["host_states"])


def _story(verdicts: list[dict[str, Any]], port: int) -> dict[str, Any]:
    return next(v for v in verdicts if v["flow"].endswith(f"> 198.18.1.10:{port}"))


def _events(verdict: dict[str, Any]) -> list[tuple[str, str]]:
    return [(hop["host"], hop["event"]) for hop in verdict["hops"]]


def _server_netns(data: dict[str, Any]) -> str:
    return next(
        str(item["record"]["netns"])
        for item in data["records"]
        if item["host"] == "server" and item["record"]["type"] == "conntrack_stats"
    )


# -- the timeline --------------------------------------------------------------------------------------------
def test_timeline_is_ordered_on_the_controller_clock() -> None:
    timeline = _merged().timeline()
    order = [(entry["host"], entry["type"]) for entry in timeline]
    # The server's drop stamped 09:00:02.101 on a clock 2 s ahead happened at 09:00:00.101, after the SYN.
    assert order[:4] == [("client", "state"), ("server", "drop"), ("client", "retrans"), ("server", "drop")]
    first_drop = timeline[1]
    assert first_drop["host_time"] == "2026-11-23T09:00:02.101000+00:00"
    assert first_drop["time"] == "2026-11-23T09:00:00.101000+00:00"
    lb_entry = next(entry for entry in timeline if entry["host"] == "lb")
    assert parse_time_ns(lb_entry["time"]) == parse_time_ns(lb_entry["host_time"]) + 500_000  # type: ignore[operator]


def test_flows_are_joined_across_the_dnat() -> None:
    timeline = _merged().timeline()
    flows = {entry["flow"] for entry in timeline if entry["type"] in ("state", "drop", "retrans")}
    # The client's pair (to the VIP) and the server's pair (to the backend) are one flow, named as the
    # client sees it.
    assert flows == {"tcp 198.18.0.2:40312 > 198.18.1.10:80"}


def test_per_hop_verdict_without_the_applications_view() -> None:
    """Loose drop and state records (no `conn` report): the outcome is what the hosts saw, a drop."""
    verdicts = _merged().verdicts({h: {"state": "ended"} for h in HOSTS})
    dropped = [v for v in verdicts if v["outcome"] == "dropped"]
    assert len(dropped) == 1
    verdict = dropped[0]
    assert verdict["path"] == (
        "SYN left web-1 (host client) -> DNAT 198.18.1.10:80 -> 198.18.2.7:8080 on lb-1 (host lb) -> "
        'dropped on host server by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP" (x2)'
    )
    assert verdict["text"] == (
        "tcp 198.18.0.2:40312 > 198.18.1.10:80: its packets were dropped; it began at hop 3 on host server: "
        'SYN dropped by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"'
    )
    assert [hop["host"] for hop in verdict["hops"]] == ["client", "lb", "server"]
    assert verdict["missing_hosts"] == []


def test_a_missing_host_makes_the_verdict_partial() -> None:
    states = {"client": {"state": "ended"}, "lb": {"state": "ended"}}
    states["server"] = {"state": "failed", "reason": "agent stopped answering"}
    verdict = _merged().verdicts(states)[0]
    assert verdict["missing_hosts"] == ["server"]
    assert verdict["text"].endswith("(partial: host server failed: agent stopped answering)")
    assert verdict["path"].endswith("(partial: host server failed: agent stopped answering)")


def test_conn_report_timeline_is_expanded_and_joined() -> None:
    merged = MergedTimeline({"a": "alpha"})
    conn = {
        "type": "conn",
        "client": "198.18.0.2:40000",
        "server": "198.18.0.3:80",
        "outcome": "refused",
        "client_netns": "a",
        "errno": "ECONNREFUSED",
        "timeline": [
            {
                "time": "2026-11-23T09:00:00.000001+00:00",
                "event": "state",
                "netns": "a",
                "text": "SYN_SENT",
                "old_state": "CLOSE",
                "new_state": "SYN_SENT",
            },
            {
                "time": "2026-11-23T09:00:00.000300+00:00",
                "event": "reset",
                "netns": "a",
                "text": "RST received (SYN_SENT): nothing listens",
                "direction": "received",
            },
        ],
    }
    entries = merged.add("a", conn)
    assert [entry["type"] for entry in entries] == ["conn_event", "conn_event", "conn"]
    verdict = merged.verdicts()[0]
    assert verdict["outcome"] == "refused"  # what the application saw, from its own report
    assert verdict["text"].startswith("tcp 198.18.0.2:40000 > 198.18.0.3:80: connect() on host a was refused")
    assert verdict["path"].startswith("SYN left alpha (host a) -> RST received (SYN_SENT) on host a")


def test_entries_beyond_the_bound_are_counted() -> None:
    merged = MergedTimeline(max_entries=1)
    record = {"type": "summary", "time": "2026-11-23T09:00:00+00:00"}
    merged.add("a", record)
    merged.add("a", record)
    assert len(merged.timeline()) == 1
    assert merged.dropped_entries == 1


# -- the seed-001 story: an INVALID ACK skips the sidecar's REDIRECT -----------------------------------------
def test_the_invalid_ack_that_skipped_the_redirect_is_its_own_hop_and_the_cause() -> None:
    data = _stories()
    verdict = _story(_verdicts(data), 82)
    assert verdict["outcome"] == "reset"
    # Causal order: the SYN through both NATs, the handshake (the server's socket is made by the client's last
    # ACK), the ACK that skipped the REDIRECT and drew the RST, the RST reaching the client.
    assert _events(verdict) == [
        ("client", "sent"), ("lb", "nat"), ("server", "nat"), ("client", "established"),
        ("server", "accepted"), ("server", "bypass"), ("client", "reset"),
    ]  # fmt: skip
    bypass = verdict["hops"][5]
    assert bypass["began"] is True and verdict["began"] == 5
    assert "skipped REDIRECT → :15006 on host server (conntrack INVALID: out of window)" in bypass["detail"]
    assert (
        "→ reached the LISTEN socket of python3[" in bypass["detail"] and "on :9000 → RST" in bypass["detail"]
    )
    # Its evidence: the REDIRECT entry, the segment, conntrack's INVALID counter over the window.
    evidence = bypass["evidence"]
    assert evidence["nat"].startswith("REDIRECT 198.18.2.7:9000 -> :15006")
    assert evidence["segment"]["flags"] == "ACK"
    assert evidence["conntrack_invalid"] >= 1 and evidence["nf_conntrack_tcp_be_liberal"] == 0
    assert evidence["reset"]["state"] == "LISTEN"
    # The first line: what the application saw, where it began, the cause.
    assert verdict["text"].startswith(
        "tcp 198.18.0.5:59240 > 198.18.1.10:82: the application on host client had its connection reset "
        "(ECONNRESET); it began at hop 6 on host server: ACK 198.18.0.5:59240 > 198.18.2.7:9000 skipped "
        "REDIRECT → :15006 (conntrack INVALID: out of window) → reached the LISTEN socket of python3["
    )
    # The fixes people use, each with its trade-off, for that namespace.
    netns = _server_netns(data)
    assert verdict["fix"][0].startswith(
        f"ip netns exec {netns} sysctl -w net.netfilter.nf_conntrack_tcp_be_liberal=1   # "
    )
    assert verdict["fix"][1].startswith(
        f"ip netns exec {netns} iptables -I INPUT -p tcp -d 198.18.2.7 --dport 9000 -m conntrack "
        "--ctstate INVALID -j DROP   # "
    )
    # The reset and the drop of that ACK are the bypass hop's, not hops of their own.
    assert not [
        hop for hop in verdict["hops"] if hop["host"] == "server" and hop["event"] in ("reset", "drop")
    ]


def test_nat_hops_are_timed_by_conntrack_events_inside_the_session() -> None:
    """Each NAT hop has the time conntrack's NEW arrived (between the client's SYN and its RST), not the
    time the table was read at the end of the session."""
    data = _stories()
    verdict = _story(_verdicts(data), 82)
    times = {(hop["host"], hop["event"]): parse_time_ns(hop["time"]) for hop in verdict["hops"]}
    sent, reset = times[("client", "sent")], times[("client", "reset")]
    assert sent is not None and reset is not None
    for host in ("lb", "server"):
        nat = times[(host, "nat")]
        assert nat is not None and sent - 20_000_000 < nat < reset + 20_000_000, (host, nat, sent)
    # The table was read at the session's end, seconds later: that is not when the NAT happened.
    ended = [
        stamp
        for item in data["records"]
        if item["record"]["type"] == "conntrack_stats" and (stamp := parse_time_ns(item["record"]["time"]))
    ]
    lb_nat = times[("lb", "nat")]
    assert lb_nat is not None and lb_nat < min(ended) - 1_000_000_000


def test_an_entry_older_than_the_session_is_told_first_without_a_time() -> None:
    data = _stories()
    for item in data["records"]:
        if item["host"] == "lb" and item["record"]["type"] == "conntrack":
            item["record"]["created"] = None  # in the table at the end, no NEW event in the window
    verdict = _story(_verdicts(data), 82)
    lb = next(hop for hop in verdict["hops"] if hop["host"] == "lb")
    assert lb["time"] is None and lb["detail"].endswith("(entry older than the session)")
    assert verdict["hops"][0]["host"] == "lb"


def test_the_causal_order_holds_whatever_the_clocks_say_within_their_uncertainty() -> None:
    """The server's clock measured 4 ms off either way (its offset's round trip allows 5 ms): the client
    still receives the RST after the server sent it, the server still accepts after the client's handshake."""
    for skew_ns in (-4_000_000, 4_000_000):
        data = _stories()
        data["offsets"]["server"] += skew_ns
        data["host_states"]["server"]["rtt_ns"] = 10_000_000
        verdict = _story(_verdicts(data), 82)
        assert _events(verdict)[3:] == [
            ("client", "established"), ("server", "accepted"), ("server", "bypass"), ("client", "reset"),
        ], skew_ns  # fmt: skip
        assert verdict["clocks_ms"]["server"] == 5.0


def test_hops_the_clocks_cannot_order_are_marked_concurrent() -> None:
    items = [Placed("a", 1_000_000), Placed("b", 1_200_000), Placed("b", 9_000_000)]
    uncertainty = {"a": 500_000, "b": 500_000}
    order = causal_order(items, [], uncertainty)
    assert [(o.index, o.relation) for o in order] == [(0, "first"), (1, "concurrent"), (2, "causal")]
    assert order[1].uncertainty_ns == 1_000_000
    # Known to have happened before: told in that order, whatever the clocks say.
    order = causal_order(items, [(1, 0)], uncertainty)
    assert [(o.index, o.relation) for o in order] == [(1, "first"), (0, "causal"), (2, "clock")]
    # Far enough apart for the clocks to tell.
    order = causal_order([Placed("a", 0), Placed("b", 5_000_000)], [], uncertainty)
    assert [o.relation for o in order] == ["first", "clock"]


# -- the other two stories -----------------------------------------------------------------------------------
def test_a_syn_dropped_by_the_far_firewall() -> None:
    data = _stories()
    verdict = _story(_verdicts(data), 80)
    assert verdict["outcome"] == "timeout"  # the application gave up connecting
    assert _events(verdict) == [("client", "sent"), ("lb", "nat"), ("server", "drop")]
    assert verdict["path"].startswith(
        "SYN left host client -> DNAT 198.18.1.10:80 -> 198.18.2.7:8080 on host lb -> "
    )
    assert 'dropped on host server by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"' in verdict["path"]
    assert "gave up connecting after 1.5" in verdict["text"]
    assert verdict["text"].endswith(
        'it began at hop 3 on host server: SYN dropped by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"'
    )
    assert verdict["fix"] == [
        f"ip netns exec {_server_netns(data)} iptables -t filter -D INPUT 1   # if this traffic should pass"
    ]


def test_a_reply_that_bypasses_the_dnat() -> None:
    data = _stories()
    verdict = _story(_verdicts(data), 81)
    assert verdict["outcome"] == "timeout"
    assert _events(verdict) == [("client", "sent"), ("lb", "nat"), ("client", "bypass"), ("server", "drop")]
    assert verdict["hops"][2]["began"] is True
    assert verdict["hops"][2]["detail"].startswith(
        "the reply SYN|ACK 198.18.2.7:8081 > 198.18.0.5:50036 came straight back to host client, bypassing "
        "the NAT on host lb (nothing undid the DNAT: no socket expects it) → reached no socket on :50036 "
        "→ RST"
    )


def test_a_dropped_reset_comes_after_the_reset_whatever_the_clocks_say() -> None:
    """The server drops the client's RST (its half-open connection ends there). Stamped 5 ms before the
    reset that sent it - as a clock-offset error would put it - it is still told after it."""
    data = _stories()
    for item in data["records"]:
        record = item["record"]
        if item["host"] == "server" and record["type"] == "drop" and record.get("tcp_flags") == "RST":
            record["time"] = iso_from_ns(parse_time_ns(record["time"]) - 5_000_000)  # type: ignore[operator]
    verdict = _story(_verdicts(data), 81)
    assert _events(verdict)[2:] == [("client", "bypass"), ("server", "drop")]
    server_drop, bypass = verdict["hops"][3], verdict["hops"][2]
    assert server_drop["order"] == "causal"
    # Its time is still what was seen (corrected), not moved: only the telling follows causality.
    assert parse_time_ns(server_drop["time"]) < parse_time_ns(bypass["time"])  # type: ignore[operator]


# -- whose record (issue 18: a host is who its subject says) -------------------------------------------------
def test_a_record_naming_another_hosts_namespace_stays_on_its_sender() -> None:
    """The client sends a drop record naming the server's namespace and a rule of its choosing: the merge
    keeps it on the client (marked), never on the server."""
    data = _stories()
    server_netns = _server_netns(data)
    flow = _story(_verdicts(copy.deepcopy(data)), 80)
    sport = int(flow["flow"].split(":")[1].split(" ")[0])
    sent = next(hop["time"] for hop in flow["hops"] if hop["event"] == "sent")
    forged = {
        "type": "drop", "v": 1, "time": iso_from_ns(parse_time_ns(sent) + 1_000_000),  # type: ignore[operator]
        "reason": "NETFILTER_DROP", "location": "nft_do_chain+0x46f", "family": 4, "proto": "tcp",
        "saddr": "198.18.0.5", "sport": sport, "daddr": "198.18.2.7", "dport": 8080, "tcp_flags": "SYN",
        "netns": 4026532999, "netns_name": server_netns,
        "netfilter": {"hook": "input", "table": "filter", "chain": "INPUT",
                      "rule": "-A INPUT -j DROP --comment forged-by-client"},
    }  # fmt: skip
    data["records"].append({"host": "client", "record": forged})
    owners = {server_netns: "server"}
    merged = MergedTimeline(data["hostnames"], netns_owner=owners)
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    verdict = _story(merged.verdicts(data["host_states"]), 80)
    forged_hops = [hop for hop in verdict["hops"] if "forged-by-client" in hop["detail"]]
    assert [hop["host"] for hop in forged_hops] == ["client"]
    assert forged_hops[0]["detail"].startswith('dropped on host client by "-A INPUT -j DROP --comment forged')
    assert "a record naming a namespace of host server" in forged_hops[0]["detail"]
    assert merged.foreign_records == 1
    entry = next(e for e in merged.timeline() if "forged-by-client" in json.dumps(e))
    assert entry["host"] == "client" and entry["claims_netns_of"] == "server"


def test_iso_from_ns_is_datetimes_isoformat_to_the_microsecond() -> None:
    """The cached second (spec.records.iso_second) gives what one datetime per call gave."""
    import datetime

    for ns in (0, 999_999_999, 1_000_000_000, 1_764_200_000_123_456_789, 1_764_200_001_999_999_999):
        seconds, rest = divmod(ns, 1_000_000_000)
        moment = datetime.datetime.fromtimestamp(seconds, datetime.UTC) + datetime.timedelta(
            microseconds=rest // 1000
        )
        assert iso_from_ns(ns) == moment.isoformat(timespec="microseconds"), ns
        assert parse_time_ns(iso_from_ns(ns)) == ns - ns % 1000
