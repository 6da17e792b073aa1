"""The merged fleet timeline on a recorded three-host session: clock correction, the NAT join across hosts
and the per-hop verdict."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from netsleuth.fleet.merge import MergedTimeline, iso_from_ns, parse_time_ns

FIXTURE = Path(__file__).parent.parent / "fixtures" / "fleet" / "dnat_drop_session.json"


def _merged() -> MergedTimeline:
    data: dict[str, Any] = json.loads(FIXTURE.read_text())
    merged = MergedTimeline(data["hostnames"])
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    return merged


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


def test_per_hop_verdict() -> None:
    verdicts = _merged().verdicts({h: {"state": "ended"} for h in ("client", "lb", "server")})
    dropped = [v for v in verdicts if v["outcome"] == "dropped"]
    assert len(dropped) == 1
    verdict = dropped[0]
    assert verdict["text"] == (
        "SYN left web-1 (host client) -> DNAT 198.18.1.10:80 -> 198.18.2.7:8080 on lb-1 (host lb) -> "
        'dropped on host server by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP" (x2)'
    )
    assert [hop["host"] for hop in verdict["hops"]] == ["client", "lb", "server"]
    assert verdict["missing_hosts"] == []


def test_a_missing_host_makes_the_verdict_partial() -> None:
    states = {"client": {"state": "ended"}, "lb": {"state": "ended"}}
    states["server"] = {"state": "failed", "reason": "agent stopped answering"}
    verdict = _merged().verdicts(states)[0]
    assert verdict["missing_hosts"] == ["server"]
    assert verdict["text"].endswith("(partial: host server failed: agent stopped answering)")


def test_conn_report_timeline_is_expanded_and_joined() -> None:
    merged = MergedTimeline({"a": "alpha"})
    conn = {
        "type": "conn",
        "client": "198.18.0.2:40000",
        "server": "198.18.0.3:80",
        "outcome": "refused",
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
                "text": "reset received (SYN_SENT): nothing listens",
                "direction": "received",
            },
        ],
    }
    entries = merged.add("a", conn)
    assert [entry["type"] for entry in entries] == ["conn_event", "conn_event", "conn"]
    verdict = merged.verdicts()[0]
    assert verdict["outcome"] == "reset"
    assert verdict["text"].startswith("SYN left alpha (host a) -> reset received")


def test_entries_beyond_the_bound_are_counted() -> None:
    merged = MergedTimeline(max_entries=1)
    record = {"type": "summary", "time": "2026-11-23T09:00:00+00:00"}
    merged.add("a", record)
    merged.add("a", record)
    assert len(merged.timeline()) == 1
    assert merged.dropped_entries == 1


def test_the_dnat_bypass_is_named_from_a_recorded_session() -> None:
    """Real records (tests/fleet_lab.py): the server's SYN-ACK skips the load balancer on its way back, so the
    client sees a SYN-ACK from the backend's address, has no socket for it, and resets."""
    data: dict[str, Any] = json.loads((FIXTURE.parent / "dnat_bypass_session.json").read_text())
    merged = MergedTimeline(data["hostnames"], netns_owner=data["netns_owner"])
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    verdicts = merged.verdicts({host: {"state": "ended"} for host in ("client", "lb", "server")})
    assert [v["outcome"] for v in verdicts] == ["nat-bypass"]
    hops = verdicts[0]["hops"]
    assert [(hop["host"], hop["event"]) for hop in hops] == [
        ("client", "sent"), ("lb", "nat"), ("client", "bypass"), ("client", "reset"), ("client", "drop"),
        ("server", "drop"),
    ]  # fmt: skip
    assert hops[2]["detail"].startswith(
        "the reply from 198.18.2.7:8081 came straight back to host client, bypassing the NAT on host lb"
    )
    # The events the client's conn report carried about the server's namespace sit on the server.
    assert hops[5]["detail"] == "dropped on host server: NOT_SPECIFIED at tcp_v4_rcv+0x91 (x2)"


def test_a_dropped_reset_comes_after_the_reset_whatever_the_clocks_say() -> None:
    """The server drops the client's RST (its half-open connection ends there). Seen on two hosts whose
    corrected clocks differ by more than the gap between the two events, the drop can be stamped before the
    reset that sent it: the verdict still tells them in causal order (conn's timeline carries tcp_flags)."""
    data: dict[str, Any] = json.loads((FIXTURE.parent / "dnat_bypass_session.json").read_text())
    for item in data["records"]:
        record = item["record"]
        for event in record.get("timeline", []):
            if event["event"] == "drop":
                event["tcp_flags"] = event["text"].split("[", 1)[1].split("]", 1)[0]
                if event["tcp_flags"] == "RST":  # 0.3 ms early: as a clock-offset error would put it
                    stamped = parse_time_ns(event["time"]) - 300_000  # type: ignore[operator]
                    event["time"] = iso_from_ns(stamped)
    merged = MergedTimeline(data["hostnames"], netns_owner=data["netns_owner"])
    for host, offset in data["offsets"].items():
        merged.set_offset(host, offset)
    for item in data["records"]:
        merged.add(item["host"], item["record"])
    [verdict] = merged.verdicts({host: {"state": "ended"} for host in ("client", "lb", "server")})
    assert [(hop["host"], hop["event"]) for hop in verdict["hops"]] == [
        ("client", "sent"), ("lb", "nat"), ("client", "bypass"), ("client", "reset"), ("client", "drop"),
        ("server", "drop"),
    ]  # fmt: skip
    server_drop = verdict["hops"][5]
    assert server_drop["detail"] == "dropped on host server: NOT_SPECIFIED at tcp_v4_rcv+0x91 (x2)"
    # Its time is still what was seen (corrected), not moved: only the telling follows causality.
    assert parse_time_ns(server_drop["time"]) < parse_time_ns(verdict["hops"][3]["time"])  # type: ignore[operator]
