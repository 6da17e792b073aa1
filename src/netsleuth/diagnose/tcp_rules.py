"""The TCP half of a diagnosis: resets (with their causes) and retransmits, counted in the kernel by the tcp
object, turned into verdicts. kfree_skb is the drops object's; this one never attaches it."""

from __future__ import annotations

from collections import Counter
from types import TracebackType

from netsleuth._generated.tcp_abi import EventKind
from netsleuth.bpf.errors import BpfError
from netsleuth.diagnose.verdicts import Severity, Verdict
from netsleuth.diagnostics.causes import cause as cause_entry
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.tcp.program import RESET_KINDS, TcpSession, TcpSessionConfig
from netsleuth.diagnostics.tcp.records import ResetGroup, ResetRecord
from netsleuth.diagnostics.tcp.resets import ResetEnricher
from netsleuth.kernel.context import KernelContext
from netsleuth.kernel.reasons import DropReasons

__all__ = ["TcpWatch"]

_RETRANS_KINDS = frozenset({EventKind.RETRANS, EventKind.SYNACK_RETRANS})
# Resets that are the normal end of something, or that a drop verdict already explains.
_QUIET_CAUSES = {"no_listener", "no_socket", "connection_refused"}
_MANY_RETRANSMITS = 50


class TcpWatch:
    def __init__(
        self, packet_filter: PacketFilter, reasons: DropReasons, context: KernelContext | None = None
    ) -> None:
        config = TcpSessionConfig(packet_filter=packet_filter, group=RESET_KINDS | _RETRANS_KINDS)
        self._session = TcpSession(config, drop_reasons=reasons)
        self._context = context
        self._enricher: ResetEnricher | None = None
        self._reset_groups: list[ResetGroup] | None = None
        self.problem: str | None = None

    def start(self) -> None:
        """Attach; a kernel that refuses the tcp programs leaves diagnose with drops and path health, and
        `problem` says why, rather than no diagnosis at all."""
        try:
            self._session.start()
        except BpfError as error:
            self.problem = f"TCP resets and retransmits not watched: {error}"
            return
        self._context = self._context or KernelContext()
        self._context.prepare()
        self._enricher = ResetEnricher(self._context)

    def poll(self) -> None:
        # Nothing is emitted (counts only); polling keeps the session's filters and module watch current.
        if self._enricher is not None:
            self._session.poll(0)

    def _total(self, kinds: frozenset[EventKind]) -> int:
        if self._enricher is None:
            return 0
        totals = self._session.totals()
        return sum(totals[kind].matched for kind in kinds if kind in totals)

    def resets(self) -> int:
        return self._total(RESET_KINDS)

    def retransmits(self) -> int:
        return self._total(_RETRANS_KINDS)

    def _resets(self) -> list[ResetGroup]:
        if self._enricher is None:
            return []
        if self._reset_groups is None:
            groups = (self._enricher.enrich_group(raw) for raw in self._session.groups(RESET_KINDS))
            self._reset_groups = [group for group in groups if group is not None]
        return self._reset_groups

    def resets_by_flow(self) -> dict[tuple[str | None, int | None], int]:
        """RSTs sent per (address, port) they answered for: the no-listener verdict quotes them."""
        flows: Counter[tuple[str | None, int | None]] = Counter()
        for group in self._resets():
            example = group.example
            if isinstance(example, ResetRecord) and example.direction == "sent":
                flows[(example.saddr, example.sport)] += group.count
        return dict(flows)

    def verdicts(self, seconds: float) -> list[Verdict]:
        verdicts = [_reset_verdict(group) for group in self._resets() if _is_news(group)]
        retransmits = self.retransmits()
        if retransmits:
            severity = Severity.WARNING if retransmits >= _MANY_RETRANSMITS else Severity.INFO
            verdicts.append(
                Verdict(
                    "retransmits",
                    severity,
                    f"TCP retransmitted {retransmits} segment(s) in {seconds:.0f} s: packets or ACKs are "
                    "being lost on the path (see the drop verdicts above for where)",
                    {
                        "retransmits": retransmits,
                        "rate_per_s": round(retransmits / seconds, 2) if seconds else None,
                    },
                    cause_entry("retransmits").fixes,
                    retransmits,
                    cause_code="retransmits",
                )
            )
        return verdicts

    def program_fds(self) -> dict[str, int]:
        return self._session.program_fds()

    def close(self) -> None:
        if self._enricher is not None:
            self._enricher.close()
        self._session.close()

    def __enter__(self) -> TcpWatch:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


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
    )
