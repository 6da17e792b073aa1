"""`diagnose` goes on when one of its watches cannot load: the watch says why and holds nothing open."""

from __future__ import annotations

from netsleuth.diagnose.session_watch import SessionWatch
from netsleuth.errors import NetsleuthError


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


class _RouteWatch(SessionWatch[_Session]):
    watched = "routing"


def test_a_watch_that_cannot_start_says_why_and_holds_nothing() -> None:
    session = _Session(fails=True)
    watch = _RouteWatch(session)
    watch.start()
    assert watch.problem == "routing not watched: tracepoint fib:fib_table_lookup is missing"
    assert session.closed == 1
    assert watch.program_fds() == {}
    watch.close()
    assert session.closed == 1  # closed once, when it failed


def test_a_watch_that_starts_reports_its_programs_and_closes_once() -> None:
    session = _Session(fails=False)
    watch = _RouteWatch(session)
    watch.start()
    assert watch.problem is None
    assert watch.program_fds() == {"route_fib_b": 7}
    watch.close()
    watch.close()
    assert session.closed == 1
