"""`diagnose` goes on when one of its watches cannot load: the watch says why and holds nothing open; the
one it cannot run without (drops) fails the diagnosis instead."""

from __future__ import annotations

from typing import Any

import pytest

from netsleuth.diagnose.run import Watch, contributions
from netsleuth.errors import NetsleuthError
from netsleuth.spec.diagnose import DiagnoseWatch


class _Session:
    def __init__(self, fails: bool) -> None:
        self.fails = fails
        self.closed = 0

    def start(self) -> None:
        if self.fails:
            raise NetsleuthError("tracepoint fib:fib_table_lookup is missing")

    def program_fds(self) -> dict[str, int]:
        return {"route_fib_b": 7}

    def close(self) -> None:
        self.closed += 1


def _watch(session: _Session, required: bool = False) -> Watch:
    opened: Any = session  # a DiagnosticSession's start/close, no more
    spec = DiagnoseWatch(
        watched="routing", open=lambda inputs: opened, rules=lambda *_: [], required=required
    )
    return Watch("route", spec, opened)


def test_a_watch_that_cannot_start_says_why_and_holds_nothing() -> None:
    session = _Session(fails=True)
    watch = _watch(session)
    watch.start()
    assert watch.problem == "routing not watched: tracepoint fib:fib_table_lookup is missing"
    assert session.closed == 1 and watch.session is None
    watch.close()
    assert session.closed == 1  # closed once, when it failed


def test_a_watch_that_starts_closes_once() -> None:
    session = _Session(fails=False)
    watch = _watch(session)
    watch.start()
    assert watch.problem is None and watch.session is not None
    watch.close()
    watch.close()
    assert session.closed == 1


def test_the_required_watch_failing_fails_the_diagnosis() -> None:
    watch = _watch(_Session(fails=True), required=True)
    with pytest.raises(NetsleuthError, match="fib_table_lookup"):
        watch.start()


def test_the_watches_come_from_the_registry_and_one_is_required() -> None:
    found = dict(contributions())
    assert {"drops", "resets", "dns", "route", "softirq"} <= set(found)
    assert [name for name, watch in found.items() if watch.required] == ["drops"]
    assert found["dns"].keep > 0 and found["route"].keep == 0
