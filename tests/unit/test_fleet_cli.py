"""`netsleuth fleet` without a controller: the SSE reader, the filters it sends, the lines it prints and how
the controller's answers become exit codes."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def test_summary_lines_count_what_each_diagnostic_totals() -> None:
    """conn and diagnose summaries carry their totals per kind, not at the top: the line sums them (it
    printed `total ?` for both)."""
    totals = {"seen": 9, "total": 4, "emitted": 4, "sampled": 1, "lost": 2, "ungrouped": 0}
    conn = {
        "type": "summary", "host": "client", "diagnostic": "conn", "connections": 2,
        "outcomes": {"reset": 1, "timeout": 1}, "drops": totals,
        "events": {"state": {**totals, "total": 5, "lost": 0}, "reset_sent": {**totals, "total": 1}},
    }  # fmt: skip
    line = fleet._record_line(conn)
    assert line.endswith("connections 2 (reset 1, timeout 1)  total 10  lost 4  sampled 3"), line
    diagnose = {"type": "summary", "host": "server", "diagnostic": "diagnose", "verdicts": 3, "drops": totals}
    assert fleet._record_line(diagnose).endswith("verdicts 3  total 4  lost 2  sampled 1")
    assert "?" not in line + fleet._record_line(diagnose)


class _FakeController:
    """The two calls `fleet run` makes, answered from memory; `lose` makes the event stream fail as httpx
    does when the controller goes away, every time (`lose_once`: the first time only)."""

    def __init__(self, lose: bool = False, lose_once: bool = False) -> None:
        self.lose = lose
        self.lose_once = lose_once
        self.streams = 0

    def next_controller(self) -> None:
        pass

    def request(self, method: str, path: str, **kwargs: object) -> httpx.Response:
        if method == "POST":
            return httpx.Response(201, json={"id": "5e551011", "hosts": {"a": {}, "b": {}}})
        return httpx.Response(200, json={"id": "5e551011", "state": "ended", "partial": False, "hosts": {}})

    def stream_events(self, path: str) -> Iterator[tuple[str, dict[str, Any]]]:
        self.streams += 1
        record = {"type": "drop", "host": "a", "time": "2026-11-26T09:00:00.000001+00:00"}
        yield "session", {"id": "5e551011", "timeline": [record] if self.streams > 1 else []}
        yield "status", {"host": "a", "state": "running"}
        yield "record", record
        if self.lose or (self.lose_once and self.streams == 1):
            raise EnvironmentProblem("lost the controller at http://127.0.0.1:1: Server disconnected")
        yield "end", {"state": "ended"}


def _run_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    fleet.add_arguments(parser)
    return parser.parse_args(["run", "conn", "--hosts", "a,b", "--duration", "2", *extra])


def test_run_json_writes_the_session_id_first(capsys: pytest.CaptureFixture[str]) -> None:
    assert fleet._run(_run_args("--json"), _FakeController()) == 0  # type: ignore[arg-type]
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first == {"type": "session", "id": "5e551011", "diagnostic": "conn", "hosts": ["a", "b"],
                     "duration": 2.0}  # fmt: skip


def test_losing_the_controller_names_the_session(monkeypatch: pytest.MonkeyPatch) -> None:
    """Followed again a bounded number of times (another controller may take the session over), then one
    sentence that names the session."""
    monkeypatch.setattr(fleet, "_FOLLOW_AGAIN_WAIT_S", 0.0)
    for extra in ((), ("--json",)):
        with pytest.raises(EnvironmentProblem) as raised:
            fleet._run(_run_args(*extra), _FakeController(lose=True))  # type: ignore[arg-type]
        assert "session 5e551011" in str(raised.value)
        assert "netsleuth fleet show 5e551011" in str(raised.value)


def test_a_lost_stream_is_followed_again_and_each_record_printed_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(fleet, "_FOLLOW_AGAIN_WAIT_S", 0.0)
    controller = _FakeController(lose_once=True)
    assert fleet._run(_run_args("--json"), controller) == 0  # type: ignore[arg-type]
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert controller.streams == 2
    assert [line.get("type") for line in lines].count("drop") == 1, lines


def test_new_key_prints_the_settings_under_the_names_agents_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What `controller new-key` prints, pasted into an agent's [fleet] table, is what the agent loads."""
    import tomllib

    from netsleuth.agent.config import parse_config
    from netsleuth.cli import main
    from netsleuth.fleet.protocol import private_key_from_text, public_key_to_text

    assert main(["controller", "new-key", "--out", str(tmp_path / "signing.key")]) == 0
    printed = capsys.readouterr().out
    fleet_table = '[fleet]\nurl = "nats://127.0.0.1:4222"\nhost_id = "node-a"\n' + "\n".join(
        line for line in printed.splitlines() if not line.startswith("#")
    )
    config = parse_config(tomllib.loads(fleet_table))
    assert config.fleet is not None
    private = private_key_from_text((tmp_path / "signing.key").read_text())
    assert public_key_to_text(config.fleet.controller_key) == public_key_to_text(private.public_key())
