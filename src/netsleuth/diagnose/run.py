"""One diagnosis: a doctor snapshot, every contributing diagnostic watching one window of `duration` seconds,
a second snapshot, then verdicts from all of them on the same window.

The watches are the registry's: every diagnostic whose spec declares a `diagnose` part
(netsleuth.spec.diagnose) is opened under the same packet filter and kernel context, so each tracepoint is
attached once (kfree_skb by the drops object, which also sees listen-queue, socket buffer and backlog drops
by their reasons; the TCP reset and retransmit tracepoints by the tcp object...). Beside them diagnose looks
at the accept queues itself (sock_diag) while it watches. `DiagnosisSession` is a session of the diagnostic
model: it yields no records while it watches and its ranked verdicts when it ends (`drain`), so the CLI, an
agent session and a fleet task run it alike.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.diagnose import correlate
from netsleuth.diagnose.listeners import FullListener, full_listeners, listener_verdicts
from netsleuth.diagnose.records import DiagnoseConfig, DiagnoseSummary
from netsleuth.diagnose.verdicts import rank
from netsleuth.doctor.findings import Report
from netsleuth.doctor.rules import diagnose as doctor_rules
from netsleuth.doctor.snapshot import collect_snapshot
from netsleuth.doctor.window import Window as DoctorWindow
from netsleuth.doctor.window import counter_delta
from netsleuth.errors import NetsleuthError
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.netns import current_netns_inode
from netsleuth.spec.diagnose import DiagnoseWatch, Watched, WatchInputs, Window
from netsleuth.spec.summary import ClockPart, TotalsPart

if TYPE_CHECKING:
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.diagnostics.model import DiagnosticSession
    from netsleuth.diagnostics.totals import EventTotals
    from netsleuth.doctor.model import Snapshot
    from netsleuth.spec.verdict import Verdict

__all__ = ["DiagnosisSession", "Watch", "contributions"]

_LISTENER_SAMPLE_S = 1.0  # how often the accept queues are looked at while watching
_WATCH_STEP_S = 0.25
_OVERFLOWS = "TcpExt.ListenOverflows"


def contributions() -> Iterator[tuple[str, DiagnoseWatch]]:
    """Every registered diagnostic's part of `diagnose`, in the registry's order."""
    from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic

    for name in diagnostic_names():
        watch = getattr(get_diagnostic(name), "diagnose", None)
        if isinstance(watch, DiagnoseWatch):
            yield name, watch


@dataclass
class Watch:
    """One contribution in this window: its session (None once it could not start or is closed), the
    records it kept for its rules, and why it is not watching (`problem`)."""

    name: str
    spec: DiagnoseWatch
    session: DiagnosticSession | None
    records: list[Any] = field(default_factory=list)
    problem: str | None = None

    def start(self) -> None:
        """Attach. When its programs do not load here, the diagnosis goes on with the others and says why
        - unless the diagnosis cannot run without it."""
        assert self.session is not None
        try:
            self.session.start()
        except NetsleuthError as error:
            if self.spec.required:
                raise
            self.problem = f"{self.spec.watched} not watched: {error}"
            self.close()

    def keep(self, records: Sequence[Any]) -> None:
        self.records.extend(records[: max(0, self.spec.keep - len(self.records))])

    def close(self) -> None:
        if self.session is not None:
            self.session.close()
            self.session = None


class DiagnosisSession:
    """Watch for `config.duration` (the caller's clock decides when to stop), then judge."""

    def __init__(
        self, config: DiagnoseConfig, context: KernelContext | None = None, root: Path = Path("/")
    ) -> None:
        self.config = config
        self.root = root
        self._context = context or KernelContext(firewall=True)
        self._own_context = context is None
        self._watches: list[Watch] = []
        try:
            # Names this host may not have are refused (exit 2) before anything is opened.
            self.packet_filter: PacketFilter = config.packet_filter(self._context.netns_names)
            inputs = WatchInputs(self.packet_filter, self._context, config.duration)
            for name, watch in contributions():
                self._watches.append(Watch(name, watch, watch.open(inputs)))
        except BaseException:
            self.close()
            raise
        required = [watch for watch in self._watches if watch.spec.required]
        assert len(required) == 1, "exactly one diagnose contribution is required (drops)"
        self._base = required[0]
        self._netns_name = self._doctor_netns()
        self._before: Snapshot | None = None
        self._started = 0.0
        self._sampled_at = 0.0
        self._listeners: dict[tuple[str, int], FullListener] = {}
        self._verdicts: list[Verdict] | None = None
        self._summary: DiagnoseSummary | None = None

    def _doctor_netns(self) -> str | None:
        """The namespace doctor reads devices and sysctls in: by its name or a process in it."""
        netns = self.packet_filter.netns
        if netns is None:
            return None
        names = self._context.netns_names
        return names.name_of(netns) or names.path_of(netns)

    @property
    def watched(self) -> str:
        netns = f"netns {self._netns_name}" if self._netns_name else None
        pod, k8s_namespace = self.config.pod, self.config.k8s_namespace
        pods = f"pod {pod}" if pod else f"Kubernetes namespace {k8s_namespace}" if k8s_namespace else None
        if pods:
            return f"{pods}, {netns}" if netns else pods
        return netns or "this host"

    @property
    def attach_kind(self) -> str:
        session = self._base.session
        return session.attach_kind if session is not None else ""

    def start(self) -> None:
        self._before = collect_snapshot(self.root, self._netns_name)
        for watch in self._watches:
            watch.start()
        # A first read prepares what naming needs (symbols, namespaces) before the window starts.
        self._poll_watches()
        self._started = time.monotonic()

    def _live(self) -> Iterator[tuple[Watch, DiagnosticSession]]:
        for watch in self._watches:
            if watch.session is not None:
                yield watch, watch.session

    def _poll_watches(self) -> None:
        for watch, session in self._live():
            watch.keep(session.poll(0))

    def poll(self, timeout_ms: int) -> list[Verdict]:
        time.sleep(min(_WATCH_STEP_S, timeout_ms / 1000))
        self._poll_watches()
        if time.monotonic() - self._sampled_at >= _LISTENER_SAMPLE_S:
            self._sampled_at = time.monotonic()
            for listener in full_listeners(self._netns_name):
                self._listeners[(listener.address, listener.port)] = listener
        return []

    def progress(self) -> str:
        """What the window has seen so far, for a terminal's progress line."""
        elapsed = time.monotonic() - self._started
        parts = [
            watch.spec.progress(session) for watch, session in self._live() if watch.spec.progress is not None
        ]
        counts = ", ".join(parts)
        return f"watching {elapsed:4.1f}/{self.config.duration:g} s" + (f": {counts}" if counts else "")

    def drain(self) -> list[Verdict]:
        self._judge(interrupted=False)
        assert self._verdicts is not None
        return self._verdicts

    def _window(self, seconds: float, sysctls: dict[str, str], results: dict[str, Watched]) -> Window:
        return Window(
            seconds=seconds,
            sysctls=sysctls,
            host_netns=current_netns_inode(),
            netns_file=self._context.netns_path,
            watched_netns=self.packet_filter.netns,
            resets_by_flow=correlate.resets_by_flow(results),
        )

    def _judge(self, interrupted: bool) -> DiagnoseSummary:
        if self._summary is not None:
            return self._summary
        assert self._before is not None, "start() first"
        seconds = time.monotonic() - self._started
        results: dict[str, Watched] = {}
        for watch, session in self._live():
            watch.keep(session.drain())
            results[watch.name] = Watched(watch.records, session.summary(False))
        after = collect_snapshot(self.root, self._netns_name, settings_from=self._before)
        report = doctor_rules(DoctorWindow(self._before, after))
        window = self._window(seconds, after.sysctls, results)
        results = correlate.without_explained_drops(results)
        verdicts = [
            verdict for watch, _ in self._live() for verdict in watch.spec.rules(results[watch.name], window)
        ]
        if not any(verdict.category == "listen-overflow" for verdict in verdicts):
            overflows = counter_delta(self._before.netstat.get(_OVERFLOWS), after.netstat.get(_OVERFLOWS))
            somaxconn = after.sysctls.get("net.core.somaxconn")
            verdicts += listener_verdicts(
                list(self._listeners.values()),
                overflows,
                somaxconn,
                self._netns_name,
                self._path_netns(window),
            )
        verdicts = correlate.absorb_dns_firewall(verdicts, results)
        verdicts = correlate.merge_findings(verdicts, report.findings, self._path_netns(window))
        self._verdicts = rank(verdicts)
        self._summary = self._summarize(seconds, report, interrupted)
        return self._summary

    def _path_netns(self, window: Window) -> int | None:
        """The namespace doctor and the accept-queue checks read: the one watched, else this host's."""
        return window.watched_netns if window.watched_netns is not None else window.host_netns

    def _summarize(self, seconds: float, report: Report, interrupted: bool) -> DiagnoseSummary:
        base = self._base.session
        assert base is not None and self._verdicts is not None
        own = self._base.spec.own_events
        return DiagnoseSummary(
            seconds=round(seconds, 3),
            watched=self.watched,
            verdicts=len(self._verdicts),
            drops=TotalsPart.of(base.totals()),
            own_drops=own(base) if own is not None else 0,
            all_good=tuple(report.all_good),
            problems=tuple(watch.problem for watch in self._watches if watch.problem),
            attach=base.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self._context.clock.to_json()),
        )

    def totals(self) -> EventTotals:
        session = self._base.session
        assert session is not None
        return session.totals()

    def summary(self, interrupted: bool) -> DiagnoseSummary:
        return self._judge(interrupted)

    @property
    def verdicts(self) -> list[Verdict]:
        """The ranked verdicts, once judged."""
        return list(self._verdicts or ())

    def program_fds(self) -> dict[str, int]:
        return {name: fd for _, session in self._live() for name, fd in session.program_fds().items()}

    def notes(self) -> list[str]:
        notes = [watch.problem for watch in self._watches if watch.problem]
        for watch, session in self._live():
            notes += session.notes()
            if watch.spec.notes is not None:
                notes += watch.spec.notes(session)
        return notes

    def close(self) -> None:
        for watch in self._watches:
            watch.close()
        if self._own_context:
            self._context.close()
            self._own_context = False
