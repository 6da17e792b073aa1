"""A diagnostic session `diagnose` runs beside its drops for the diagnosis window (dns, route, softirq): when
its programs cannot load, the diagnosis goes on without it and `problem` says why, rather than no diagnosis
at all."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from netsleuth.errors import NetsleuthError

__all__ = ["SessionWatch"]


class _Session(Protocol):
    def start(self) -> None: ...

    def program_fds(self) -> dict[str, int]: ...

    def close(self) -> None: ...


SessionT = TypeVar("SessionT", bound=_Session)


class SessionWatch(Generic[SessionT]):
    watched = "?"  # what a failed start did not watch, as `problem` names it ("DNS", "routing", ...)

    def __init__(self, session: SessionT) -> None:
        self._session: SessionT | None = session
        self.problem: str | None = None

    def start(self) -> None:
        assert self._session is not None
        try:
            self._session.start()
        except NetsleuthError as error:
            self.problem = f"{self.watched} not watched: {error}"
            self._session.close()
            self._session = None

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds() if self._session is not None else {}

    def close(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None
