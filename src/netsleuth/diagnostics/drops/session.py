"""`drops` attached: raw drops from the kernel (netsleuth.diagnostics.drops.program), named by a
`DropEnricher` that shares the run's `KernelContext`, delivered as batches (netsleuth.diagnostics.drops.batch:
one decode, naming and JSON encoding per kind of drop).

`open_drops` resolves the user's typed `DropsConfig` on this host - the namespace (or pod) as inodes, the
reason names as this kernel's numbers, the older kernels' fallbacks NETSLEUTH_DROPS_FALLBACK forces - before
anything loads, so a name this host does not have is an error of one sentence (exit 2).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from msgspec import UNSET

from netsleuth.diagnostics.drops.program import (
    NO_REASON_FILTER,
    DropsProgramConfig,
    DropsSession,
    DropTotals,
    drop_reasons_for_run,
    forced_fallbacks,
)
from netsleuth.diagnostics.drops.records import DropGroup, DropsConfig, DropsSummary
from netsleuth.errors import UsageError

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.batch import DropBatch, DropBatcher
    from netsleuth.diagnostics.drops.decode import RawDropGroup
    from netsleuth.diagnostics.drops.enrich import DropEnricher
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.kernel.context import KernelContext
    from netsleuth.kernel.reasons import DropReasons

__all__ = ["DropsDiagnostic", "groups_since", "open_drops", "program_config"]

# A group's identity in the kernel's drop_groups map (bpf/drops.h): reason x location x netns.
_GroupKey = tuple[int, int, int]

_INFERRED_NOTE = (
    "drop reasons are inferred from where each packet was freed, not given by the kernel (its skb:kfree_skb "
    "passes none before Linux 5.17): they are marked inferred"
)
_PERF_NOTE = (
    "events travel through per-CPU perf buffers (no ring buffer before Linux 5.8): events of different CPUs "
    "may arrive out of order; totals stay exact and losses are counted"
)


def program_config(
    config: DropsConfig,
    packet_filter: PacketFilter,
    reasons: DropReasons | None = None,
) -> tuple[DropsProgramConfig, DropReasons | None]:
    """The program's config for `config` on this host, and the reason table when names had to be read. The
    reason names are looked up in the kernel's BTF only when some are given: a run without --reason reads
    nothing more before it attaches (the program asks the kernel itself at load)."""
    from netsleuth.bpf import features

    forced = forced_fallbacks()
    wanted, unwanted = config.reason, config.exclude_reason
    if (wanted or unwanted) and (forced.get("kernel_reasons") is False or not features.drop_reasons()):
        raise UsageError(NO_REASON_FILTER)
    if wanted or unwanted:
        reasons = reasons or drop_reasons_for_run(forced.get("kernel_reasons"))
    program = DropsProgramConfig(
        packet_filter=packet_filter,
        reasons=frozenset(reasons.parse(wanted)) if reasons is not None else frozenset(),
        exclude_reasons=frozenset(reasons.parse(unwanted)) if reasons is not None else frozenset(),
        stack=config.stack,
        snaplen=config.snaplen,
        summary_only=config.summary,
        sample_every=config.sample,
        **forced,
    )
    return program, reasons


def groups_since(
    groups: Iterable[RawDropGroup], base: Mapping[_GroupKey, tuple[int, int]]
) -> Iterator[RawDropGroup]:
    """The groups' drops since `base` (each group's count and bytes then, by reason x location x netns): a
    group with none since is left out. Its example stays the first drop the kernel kept for it, which may be
    older than the base."""
    for group in groups:
        count, size = base.get((group.reason, group.location, group.netns), (0, 0))
        if group.count > count:
            yield dataclasses.replace(group, count=group.count - count, bytes=group.bytes - size)


def open_drops(
    config: DropsConfig,
    context: KernelContext | None = None,
    *,
    vmlinux: str | None = None,
    find_vmlinux: bool = False,
) -> DropsDiagnostic:
    """The session of a user's `drops` (CLI, agent session, fleet task), resolved on this host now."""
    names = context.netns_names if context is not None else None
    program, reasons = program_config(config, config.packet_filter(names))
    return DropsDiagnostic(program, context, reasons, vmlinux=vmlinux, find_vmlinux=find_vmlinux)


class DropsDiagnostic:
    """`drops` as a session of the diagnostic model: raw drops from the kernel, named by a `DropEnricher`
    that shares the run's `KernelContext`. A run that emits drops reads the names (kallsyms, namespaces, the
    firewall's rules) before attaching, so its first drops are named as they come; a --summary run names
    only its groups, at the end, and attaches without reading them. `conn` and `diagnose` run it with their
    own program config."""

    def __init__(
        self,
        config: DropsProgramConfig,
        context: KernelContext | None = None,
        reasons: DropReasons | None = None,
        vmlinux: str | None = None,
        explain_firewall: bool = True,
        find_vmlinux: bool = False,
    ) -> None:
        """`vmlinux`: a debug vmlinux for source lines; `find_vmlinux`: look for one when names are first
        needed (after attaching: the search imports the symbolizer, which attaching does not need)."""
        self.config = config
        self._reasons = reasons
        self._raw = DropsSession(config, reasons)
        self._context = context
        self._vmlinux = vmlinux
        self._find_vmlinux = find_vmlinux
        self._explain_firewall = explain_firewall
        self._enricher: DropEnricher | None = None
        self._batcher: DropBatcher | None = None
        self._window: dict[_GroupKey, tuple[int, int]] = {}  # the groups when the window started

    @property
    def reasons(self) -> DropReasons:
        """The kernel's reason names, read when first needed (naming, after attaching) unless given."""
        if self._reasons is None:
            self._reasons = drop_reasons_for_run(self.config.kernel_reasons)
        return self._reasons

    @property
    def attach_kind(self) -> str:
        return self._raw.attach_kind

    @property
    def raw(self) -> DropsSession:
        return self._raw

    def start(self) -> None:
        if not self.config.summary_only:
            # Read after attaching, the names took longer (0.3-0.5 s at the first poll) than a storm needs to
            # fill half the ring (~50 ms at 350k drops/s): the kernel was sampling by then, and 6-10% of a 2 M
            # storm was never printed (bench/drops_storm.py --issue22). Read first, every drop of it is.
            # Who cannot load the programs hears that first, not what naming needs (kallsyms' addresses).
            from netsleuth.bpf.features import require_tracing

            require_tracing(ring_buffer=False)
            _ = self.enricher
        self._raw.start()

    @property
    def enricher(self) -> DropEnricher:
        if self._enricher is None:
            from netsleuth.diagnostics.drops.enrich import DropEnricher

            if self._vmlinux is None and self._find_vmlinux:
                from netsleuth.kernel.symbolizer import find_debug_vmlinux

                self._vmlinux = find_debug_vmlinux()
            self._enricher = DropEnricher(
                self.reasons,
                want_stack=self.config.stack,
                vmlinux=self._vmlinux,
                explain_firewall=self._explain_firewall,
                context=self._context,
                infer_reasons=self._raw.reasons_inferred,
            )
            self._enricher.prepare(self.config.packet_filter.netns)
        return self._enricher

    @property
    def _batcher_of_run(self) -> DropBatcher:
        if self._batcher is None:
            from netsleuth.diagnostics.drops.batch import DropBatcher

            enricher = self.enricher
            self._batcher = DropBatcher(
                self._raw.decode, enricher.enrich_many, lambda: enricher.context.wall_offset_ns
            )
        return self._batcher

    def poll(self, timeout_ms: int) -> DropBatch:
        """The drops that arrived, enriched once per kind (netsleuth.diagnostics.drops.batch)."""
        return self._batcher_of_run.batch_blob(*self._raw.poll_blob(timeout_ms))

    def drain(self) -> DropBatch:
        """The run's last drops: every caller drains once, at its end (the CLI, agent and fleet sessions,
        conn, diagnose), so the programs stop first and the totals read after it are final."""
        return self._batcher_of_run.batch(self._raw.last_records())

    def totals(self) -> DropTotals:
        return self._raw.totals()

    def start_window(self) -> None:
        """Count the groups from now on, not from attach: a fleet session's T0, where its totals' window
        starts too (netsleuth.fleet.session_runner), so the summary's groups add up to its totals."""
        self._window = {
            (group.reason, group.location, group.netns): (group.count, group.bytes)
            for group in self._raw.groups()
        }

    def groups(self) -> list[DropGroup]:
        enrich_group = self.enricher.enrich_group
        in_window = groups_since(self._raw.groups(), self._window)
        return sorted((enrich_group(group) for group in in_window), key=lambda g: -g.count)

    def summary(self, interrupted: bool) -> DropsSummary:
        from netsleuth.spec.summary import ClockPart, Summary

        self._raw.stop()  # one read of stopped counters, also when the run ended without its drain
        return DropsSummary(
            diagnostic="drops",
            **Summary.totals_fields(self._raw.totals()),
            attach=self._raw.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self.enricher.context.clock.to_json()),
            groups=tuple(self.groups()),
            reasons_inferred=True if self._raw.reasons_inferred else UNSET,
        )

    def program_fds(self) -> dict[str, int]:
        return self._raw.program_fds()

    def notes(self) -> list[str]:
        # Naming a rule means reading the firewall of the drop's namespace, which can be out of reach
        # (entering another namespace needs CAP_SYS_ADMIN, which the agent's unit does not grant): the drops
        # are still reported, with their hook, and the run says why rules are missing.
        problems = self._enricher.firewall_problems.values() if self._enricher is not None else ()
        notes = [f"firewall rules are not named in this session: {text}" for text in problems]
        if self._raw.reasons_inferred:
            notes.append(_INFERRED_NOTE)
        if self._raw.buffer == "perf":
            notes.append(_PERF_NOTE)
        return notes

    def close(self) -> None:
        self._raw.close()
        if self._enricher is not None:
            self._enricher.close()
            self._enricher = None
            self._batcher = None
