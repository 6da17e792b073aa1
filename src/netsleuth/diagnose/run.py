"""One diagnosis: a doctor snapshot, a combined BPF watch for `duration` seconds, a second snapshot, then
verdicts from both on the same window.

Every tracepoint is attached once: kfree_skb by the drops object (which also sees listen-queue, socket
buffer and backlog drops by their reasons), the TCP reset and retransmit tracepoints by the tcp object.
`DiagnosisSession` is a session of the diagnostic model: it yields no records while it watches and its
ranked verdicts when it ends (`drain`), so the CLI, an agent session and a fleet task run it alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from netsleuth.diagnose.correlate import merge_findings
from netsleuth.diagnose.dns_watch import DnsWatch
from netsleuth.diagnose.drop_rules import DropContext, drop_verdicts
from netsleuth.diagnose.listeners import FullListener, full_listeners, listener_verdicts
from netsleuth.diagnose.route_rules import RouteWatch
from netsleuth.diagnose.softirq_rules import SoftirqWatch
from netsleuth.diagnose.tcp_rules import TcpWatch
from netsleuth.diagnose.verdicts import Verdict, rank
from netsleuth.diagnostics.drops import DropsConfig, DropsDiagnostic, DropTotals
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.model import RunOptions
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.doctor.findings import Report
from netsleuth.doctor.rules import diagnose as doctor_rules
from netsleuth.doctor.snapshot import collect_snapshot
from netsleuth.doctor.window import Window, counter_delta
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.netns import current_netns_inode

if TYPE_CHECKING:
    from netsleuth.doctor.model import Snapshot
    from netsleuth.kernel.context import KernelClock

__all__ = ["DiagnoseConfig", "DiagnoseSummary", "DiagnosisSession", "RankedVerdict"]

_LISTENER_SAMPLE_S = 1.0  # how often the accept queues are looked at while watching
_WATCH_STEP_S = 0.25
_OVERFLOWS = "TcpExt.ListenOverflows"


@dataclass(frozen=True)
class DiagnoseConfig:
    duration: float = 10.0
    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    netns_name: str | None = None  # doctor reads this namespace's devices and sysctls
    root: Path = Path("/")
    pods: str | None = None  # how --pod / --k8s-namespace named what is watched

    @property
    def watched(self) -> str:
        netns = f"netns {self.netns_name}" if self.netns_name else None
        if self.pods:
            return f"{self.pods}, {netns}" if netns else self.pods
        return netns or "this host"

    @property
    def run_options(self) -> RunOptions:
        return RunOptions(summary=True, duration=self.duration)


@dataclass(frozen=True)
class RankedVerdict:
    rank: int
    verdict: Verdict

    def to_json(self) -> dict[str, Any]:
        return {**self.verdict.to_json(self.rank), "v": SCHEMA_VERSIONS["verdict"]}


@dataclass(frozen=True)
class DiagnoseSummary:
    seconds: float
    watched: str
    verdicts: tuple[Verdict, ...]
    drop_totals: DropTotals
    report: Report
    attach: str
    interrupted: bool
    clock: KernelClock
    problems: tuple[str, ...] = ()
    own_drops: int = 0  # left out of `drop_totals`: netsleuth's own footprint, not the host's

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "diagnose",
            "seconds": round(self.seconds, 3),
            "watched": self.watched,
            "verdicts": len(self.verdicts),
            "drops": self.drop_totals.to_json(),
            "own_drops": self.own_drops,
            "all_good": list(self.report.all_good),
            "problems": list(self.problems),
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
        }


class DiagnosisSession:
    """Watch for `config.duration` (the caller's clock decides when to stop), then judge."""

    def __init__(self, config: DiagnoseConfig, context: KernelContext | None = None) -> None:
        self.config = config
        self._context = context or KernelContext(firewall=True)
        self._own_context = context is None
        self._drops = DropsDiagnostic(
            DropsConfig(packet_filter=config.packet_filter, summary_only=True, skip_own=True), self._context
        )
        self._tcp = TcpWatch(config.packet_filter, self._drops.reasons, self._context)
        self._dns = DnsWatch(config.packet_filter, self._context, config.duration)
        self._route = RouteWatch(config.packet_filter, self._context)
        self._softirq = SoftirqWatch(self._context)
        self._before: Snapshot | None = None
        self._started = 0.0
        self._sampled_at = 0.0
        self._listeners: dict[tuple[str, int], FullListener] = {}
        self._summary: DiagnoseSummary | None = None

    @property
    def attach_kind(self) -> str:
        return self._drops.attach_kind

    def start(self) -> None:
        self._before = collect_snapshot(self.config.root, self.config.netns_name)
        self._drops.start()
        self._tcp.start()
        self._dns.start()
        self._route.start()
        self._softirq.start()
        self._drops.enricher.prepare(self.config.packet_filter.netns)
        self._started = time.monotonic()

    def poll(self, timeout_ms: int) -> list[RankedVerdict]:
        time.sleep(min(_WATCH_STEP_S, timeout_ms / 1000))
        self._tcp.poll()
        self._dns.poll()
        if time.monotonic() - self._sampled_at >= _LISTENER_SAMPLE_S:
            self._sampled_at = time.monotonic()
            for listener in full_listeners(self.config.netns_name):
                self._listeners[(listener.address, listener.port)] = listener
        return []

    def progress(self) -> tuple[float, int, int, int]:
        """(seconds watched, drops, resets, retransmits) so far."""
        elapsed = time.monotonic() - self._started
        return elapsed, self._drops.totals().matched, self._tcp.resets(), self._tcp.retransmits()

    def drain(self) -> list[RankedVerdict]:
        summary = self._judge(interrupted=False)
        return [RankedVerdict(number, verdict) for number, verdict in enumerate(summary.verdicts, start=1)]

    def _judge(self, interrupted: bool) -> DiagnoseSummary:
        if self._summary is not None:
            return self._summary
        assert self._before is not None, "start() first"
        config = self.config
        seconds = time.monotonic() - self._started
        self._tcp.poll()
        totals = self._drops.totals()
        own_drops = self._drops.raw.own_drops()
        route_verdicts = self._route.verdicts(seconds)
        groups = self._route.unexplained(self._drops.groups())  # NEIGH_* drops a next hop explains
        tcp_verdicts = self._tcp.verdicts(seconds)
        resets_by_flow = self._tcp.resets_by_flow()
        after = collect_snapshot(config.root, config.netns_name, settings_from=self._before)
        report = doctor_rules(Window(self._before, after))
        context = DropContext(
            seconds=seconds,
            sysctls=after.sysctls,
            resets_by_flow=resets_by_flow,
            host_netns=current_netns_inode(),
            netns_file=self._context.netns_path,
        )
        dns_verdicts, kernel_verdicts = self._dns.verdicts(seconds, drop_verdicts(groups, context))
        verdicts = kernel_verdicts + self._softirq.verdicts()  # may absorb time-squeeze
        if not any(verdict.category == "listen-overflow" for verdict in verdicts):
            overflows = counter_delta(self._before.netstat.get(_OVERFLOWS), after.netstat.get(_OVERFLOWS))
            somaxconn = after.sysctls.get("net.core.somaxconn")
            verdicts += listener_verdicts(
                list(self._listeners.values()), overflows, somaxconn, config.netns_name
            )
        verdicts = merge_findings(verdicts, report.findings) + tcp_verdicts + dns_verdicts + route_verdicts
        problems = tuple(
            problem
            for problem in (self._tcp.problem, self._dns.problem, self._route.problem, self._softirq.problem)
            if problem
        )
        self._summary = DiagnoseSummary(
            seconds,
            config.watched,
            tuple(rank(verdicts)),
            totals,
            report,
            self._drops.attach_kind,
            interrupted,
            self._context.clock,
            problems,
            own_drops,
        )
        return self._summary

    def totals(self) -> DropTotals:
        return self._drops.totals()

    def summary(self, interrupted: bool) -> DiagnoseSummary:
        return self._judge(interrupted)

    def program_fds(self) -> dict[str, int]:
        return {
            **self._drops.program_fds(),
            **self._tcp.program_fds(),
            **self._dns.program_fds(),
            **self._route.program_fds(),
            **self._softirq.program_fds(),
        }

    def notes(self) -> list[str]:
        summary = self._summary
        notes = [*(summary.problems if summary is not None else ()), *self._drops.notes()]
        if summary is not None and summary.own_drops:
            notes.append(
                f"{summary.own_drops} QUEUE_PURGE drop(s) of netsleuth's own netlink sockets (the unread "
                "replies its firewall reads left when they closed) are not counted as this host's"
            )
        if not self._drops.raw.own_marked:
            notes.append(
                "netsleuth's own netlink drops cannot be told apart on this kernel (that needs "
                "sock:sock_send_length and typed tracepoints, Linux 6.3): QUEUE_PURGE verdicts may hold "
                "some"
            )
        return notes

    def close(self) -> None:
        self._drops.close()
        self._tcp.close()
        self._dns.close()
        self._route.close()
        self._softirq.close()
        if self._own_context:
            self._context.close()
