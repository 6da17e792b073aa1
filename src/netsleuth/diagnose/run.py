"""One diagnosis: a doctor snapshot, a combined BPF watch for `duration` seconds, a second snapshot, then
verdicts from both on the same window.

Every tracepoint is attached once: kfree_skb by the drops object (which also sees listen-queue, socket
buffer and backlog drops by their reasons), the TCP reset and retransmit tracepoints by the tcp object.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from netsleuth.diagnose.correlate import merge_findings
from netsleuth.diagnose.drop_rules import DropContext, drop_verdicts
from netsleuth.diagnose.listeners import FullListener, full_listeners, listener_verdicts
from netsleuth.diagnose.tcp_rules import TcpWatch
from netsleuth.diagnose.verdicts import Verdict, rank
from netsleuth.diagnostics.drops import DropsConfig, DropsSession, DropTotals
from netsleuth.diagnostics.drops_enrich import DropEnricher
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.doctor.findings import Report
from netsleuth.doctor.rules import diagnose as doctor_rules
from netsleuth.doctor.snapshot import collect_snapshot
from netsleuth.doctor.window import Window, counter_delta
from netsleuth.kernel.reasons import load_drop_reasons

__all__ = ["DiagnoseConfig", "Diagnosis", "Progress", "run_diagnosis"]

_LISTENER_SAMPLE_S = 1.0  # how often the accept queues are looked at while watching
_OVERFLOWS = "TcpExt.ListenOverflows"


@dataclass(frozen=True)
class DiagnoseConfig:
    duration: float = 10.0
    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    netns_name: str | None = None  # doctor reads this namespace's devices and sysctls
    root: Path = Path("/")


@dataclass(frozen=True)
class Progress:
    elapsed: float
    duration: float
    drops: int
    resets: int
    retransmits: int


@dataclass(frozen=True)
class Diagnosis:
    verdicts: list[Verdict]
    seconds: float
    drop_totals: DropTotals
    report: Report
    attach: str
    problems: tuple[str, ...] = ()

    def counts(self) -> dict[str, int]:
        return {"drops": self.drop_totals.matched, "drops_lost": self.drop_totals.lost}


def run_diagnosis(
    config: DiagnoseConfig,
    on_ready: Callable[[], None] = lambda: None,
    on_progress: Callable[[Progress], None] = lambda _progress: None,
    stopped: Callable[[], bool] = lambda: False,
) -> Diagnosis:
    reasons = load_drop_reasons()
    before = collect_snapshot(config.root, config.netns_name)
    drops_config = DropsConfig(packet_filter=config.packet_filter, summary_only=True)
    with (
        contextlib.closing(DropEnricher(reasons, want_stack=True)) as enricher,
        DropsSession(drops_config, reasons) as drops,
        TcpWatch(config.packet_filter, reasons) as tcp,
    ):
        drops.start()
        tcp.start()
        enricher.prepare(config.packet_filter.netns)
        started = time.monotonic()
        on_ready()
        listeners: dict[tuple[str, int], FullListener] = {}
        sampled_at = 0.0
        while not stopped() and (elapsed := time.monotonic() - started) < config.duration:
            time.sleep(min(0.25, max(0.0, config.duration - elapsed)))
            tcp.poll()
            if time.monotonic() - sampled_at >= _LISTENER_SAMPLE_S:
                sampled_at = time.monotonic()
                for listener in full_listeners(config.netns_name):
                    listeners[(listener.address, listener.port)] = listener
            on_progress(
                Progress(
                    time.monotonic() - started,
                    config.duration,
                    drops.totals().matched,
                    tcp.resets(),
                    tcp.retransmits(),
                )
            )
        seconds = time.monotonic() - started
        tcp.poll()
        totals = drops.totals()
        groups = [enricher.enrich_group(group) for group in drops.groups()]
        tcp_verdicts = tcp.verdicts(seconds)
        resets_by_flow = tcp.resets_by_flow()
    after = collect_snapshot(config.root, config.netns_name, settings_from=before)
    report = doctor_rules(Window(before, after))
    context = DropContext(seconds=seconds, sysctls=after.sysctls, resets_by_flow=resets_by_flow)
    verdicts = drop_verdicts(groups, context)
    if not any(verdict.category == "listen-overflow" for verdict in verdicts):
        overflows = counter_delta(before.netstat.get(_OVERFLOWS), after.netstat.get(_OVERFLOWS))
        somaxconn = after.sysctls.get("net.core.somaxconn")
        verdicts += listener_verdicts(list(listeners.values()), overflows, somaxconn, config.netns_name)
    verdicts = merge_findings(verdicts, report.findings) + tcp_verdicts
    problems = (tcp.problem,) if tcp.problem else ()
    return Diagnosis(rank(verdicts), seconds, totals, report, drops.attach_kind, problems)
