"""`netsleuth fleet` without a controller: the SSE reader, the filters it sends, the lines it prints and how
the controller's answers become exit codes."""

from __future__ import annotations

import argparse

import httpx
import pytest

from netsleuth.commands import fleet
from netsleuth.errors import EnvironmentProblem, UsageError


def test_sse_events_are_parsed_and_keepalives_skipped() -> None:
    lines = [
        "event: session", 'data: {"id": "s1"}', "",
        ": keepalive", "",
        "event: record", 'data: {"type": "drop",', 'data: "host": "b"}', "",
        "event: broken", "data: {not json", "",
        "event: end", 'data: {"state": "ended"}', "",
    ]  # fmt: skip
    events = list(fleet.sse_events(iter(lines)))
    assert events == [
        ("session", {"id": "s1"}),
        ("record", {"type": "drop", "host": "b"}),
        ("end", {"state": "ended"}),
    ]


def test_filters_become_the_session_config() -> None:
    parser = argparse.ArgumentParser()
    fleet.add_arguments(parser)
    args = parser.parse_args(
        ["run", "drops", "--hosts", "a,b", "--duration", "3", "--dport", "8080", "--host", "198.18.0.1",
         "--netns", "web", "--reason", "NETFILTER_DROP"]
    )  # fmt: skip
    assert fleet.filters_to_config(args) == {
        "host": ["198.18.0.1"], "dport": "8080", "netns": "web", "reason": ["NETFILTER_DROP"],
    }  # fmt: skip


def test_record_lines() -> None:
    drop = {
        "type": "drop", "time": "2026-11-23T09:00:00.101000+00:00", "host": "server",
        "reason": "NETFILTER_DROP", "tcp_flags": "SYN", "location": "nft_do_chain+0x3e8",
        "flow": "tcp 198.18.0.5:1 > 198.18.1.10:80",
        "netfilter": {"rule": "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"},
    }  # fmt: skip
    assert fleet._record_line(drop) == (
        "09:00:00.101000  server       drop        tcp 198.18.0.5:1 > 198.18.1.10:80  NETFILTER_DROP SYN at "
        'nft_do_chain+0x3e8  rule "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"'
    )
    summary = {"type": "summary", "host": "lb", "total": 20, "lost": 1, "sampled": 0}
    assert fleet._record_line(summary).endswith("summary     total 20  lost 1  sampled 0")


class _Args(argparse.Namespace):
    controller = "http://127.0.0.1:1"
    token_file = None


def test_answers_become_exit_codes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NETSLEUTH_TOKEN", "t" * 20)
    client = fleet._Client(_Args())
    refused = httpx.Response(403, json={"error": "your roles do not allow diagnostic resets."})
    with pytest.raises(UsageError, match=r"^your roles do not allow diagnostic resets \(HTTP 403\)$"):
        client._check(refused)
    with pytest.raises(EnvironmentProblem, match="the controller failed"):
        client._check(httpx.Response(500, text="oops"))
    with pytest.raises(EnvironmentProblem, match="cannot reach the controller"):
        client.request("GET", "/api/v1/hosts")  # nothing listens on port 1


def test_a_missing_token_or_bad_url_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NETSLEUTH_TOKEN", raising=False)
    with pytest.raises(UsageError, match="NETSLEUTH_TOKEN"):
        fleet._Client(_Args())
    monkeypatch.setenv("NETSLEUTH_TOKEN", "t" * 20)
    args = _Args()
    args.controller = "ftp://x"
    with pytest.raises(UsageError, match="must be an http"):
        fleet._Client(args)
