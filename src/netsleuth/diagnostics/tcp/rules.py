"""The TCP half of a diagnosis (resets' part of `diagnose`): resets with their causes and retransmits,
counted in the kernel by the tcp object for the window, turned into verdicts. kfree_skb is the drops
object's; this one never attaches it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.diagnostics.causes import cause as cause_entry
from netsleuth.diagnostics.tcp.program import RESET_KINDS, TcpSession, TcpSessionConfig
from netsleuth.diagnostics.tcp.records import ResetGroup, ResetRecord
from netsleuth.diagnostics.tcp.resets import ResetEnricher
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.spec.diagnose import Watched, WatchInputs, Window
from netsleuth.spec.verdict import Severity, Verdict

__all__ = ["TcpWindow", "TcpWindowSession", "progress", "tcp_verdicts"]

_RETRANS_KINDS = frozenset({EventKind.RETRANS, EventKind.SYNACK_RETRANS})
# Resets that are the normal end of something, or that a drop verdict already explains.
_QUIET_CAUSES = {"no_listener", "no_socket", "connection_refused"}
_MANY_RETRANSMITS = 50


@dataclass(frozen=True)
class TcpWindow:
    """What the window's tcp programs counted: the reset groups (named) and the retransmitted segments."""

    resets: tuple[ResetGroup, ...]
    retransmits: int


class TcpWindowSession:
    """The tcp object counting resets and retransmits in the kernel for the window (nothing emitted)."""

    def __init__(self, inputs: WatchInputs) -> None:
        config = TcpSessionConfig(packet_filter=inputs.packet_filter, group=RESET_KINDS | _RETRANS_KINDS)
        self._session = TcpSession(config, drop_reasons=inputs.drop_reasons)
        self._context = inputs.context
        self._enricher: ResetEnricher | None = None

    @property
    def attach_kind(self) -> str:
        return self._session.attach_kind

    def start(self) -> None:
        self._session.start()
        self._context.prepare()
        self._enricher = ResetEnricher(self._context)

    def poll(self, timeout_ms: int) -> list[object]:
        # Nothing is emitted (counts only); polling keeps the session's filters and module watch current.
        self._session.poll(timeout_ms)
        return []

    def drain(self) -> list[object]:
        return []

    def _total(self, kinds: frozenset[EventKind]) -> EventTotals:
        totals = self._session.totals()
        return sum((totals[kind] for kind in sorted(kinds) if kind in totals), EventTotals())

    def totals(self) -> EventTotals:
        return self._total(RESET_KINDS)

    def resets(self) -> int:
        return self._total(RESET_KINDS).matched

    def retransmits(self) -> int:
        return self._total(_RETRANS_KINDS).matched

    def summary(self, interrupted: bool) -> TcpWindow:
        assert self._enricher is not None, "start() first"
        self._session.stop()  # the groups and the retransmits of one window
        groups = (self._enricher.enrich_group(raw) for raw in self._session.groups(RESET_KINDS))
        return TcpWindow(tuple(group for group in groups if group is not None), self.retransmits())

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        if self._enricher is not None:
            self._enricher.close()
            self._enricher = None
        self._session.close()


def progress(session: TcpWindowSession) -> str:
    return f"{session.resets()} resets, {session.retransmits()} retransmits"


def resets_sent_by_flow(resets: Sequence[ResetGroup]) -> dict[tuple[str | None, int | None], int]:
    """RSTs this host sent, per (address, port) they answered for: the no-listener verdict quotes them."""
    flows: dict[tuple[str | None, int | None], int] = {}
    for group in resets:
        example = group.example
        if isinstance(example, ResetRecord) and example.direction == "sent":
            key = (example.saddr, example.sport)
            flows[key] = flows.get(key, 0) + group.count
    return flows


def tcp_verdicts(watched: Watched, window: Window) -> list[Verdict]:
    summary: TcpWindow = watched.summary
    verdicts = [_reset_verdict(group) for group in summary.resets if _is_news(group)]
    retransmits, seconds = summary.retransmits, window.seconds
    if retransmits:
        verdicts.append(
            Verdict(
                category="retransmits",
                severity=Severity.WARNING if retransmits >= _MANY_RETRANSMITS else Severity.INFO,
                cause=f"TCP retransmitted {retransmits} segment(s) in {seconds:.0f} s: packets or ACKs are "
                "being lost on the path (see the drop verdicts above for where)",
                evidence={
                    "retransmits": retransmits,
                    "rate_per_s": round(retransmits / seconds, 2) if seconds else None,
                },
                fix=cause_entry("retransmits").fixes,
                events=retransmits,
                cause_code="retransmits",
                # Counted under diagnose's own filter: of its one namespace, or of the whole host.
                netns=window.watched_netns,
            )
        )
    return verdicts


def _is_news(group: ResetGroup) -> bool:
    example = group.example
    return not (isinstance(example, ResetRecord) and example.cause_code in _QUIET_CAUSES)


def _reset_verdict(group: ResetGroup) -> Verdict:
    example = group.example
    netns_name = example.netns_name
    # Checks that are commands already carry `ip netns exec NS`; advice gets the namespace as a note.
    where = f"   # in netns {netns_name}" if netns_name and netns_name not in example.check else ""
    return Verdict(
        category=f"reset:{example.cause_code}",
        severity=Severity.WARNING,
        cause=f"{group.count} TCP reset(s): {example.cause}",
        evidence={"resets": group.count, "example": example.to_json()},
        fix=(example.check + where,) if example.check else (),
        events=group.count,
        cause_code=example.cause_code,
        netns=example.netns,
        saddr=example.saddr,
        daddr=example.daddr,
    )
