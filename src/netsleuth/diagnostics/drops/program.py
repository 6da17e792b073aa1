"""`drops`' kernel side: every packet the kernel frees with a drop reason, from tracepoint skb:kfree_skb.

`DropsSession` owns the BPF object (open -> configure -> load -> attach) and turns raw ring-buffer records
and map entries into `RawDrop`s and `DropTotals`; netsleuth.diagnostics.drops.enrich adds names (reason,
symbol, netns, process, firewall rule) to make `DropRecord`s. Totals come from kernel counters and are exact
whatever was sampled or lost on the way to userspace.

`DropsProgramConfig` is what the program is loaded with: the user's `DropsConfig` resolved on this host (the
namespace as an inode, reason names as this kernel's numbers), plus what netsleuth itself chooses (the older
kernels' fallbacks, leaving its own footprint out) - also what `conn`, `diagnose` and the exporter, which run
the drops program for their own ends, give it.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING

import msgspec

from netsleuth._generated.drops_abi import (
    DROPS_MAX_SNAPLEN,
    DropEvent,
    DropGroupKey,
    DropGroupValue,
    DropsConfigC,
    DropsMaps,
    DropsObject,
    DropsRodata,
    DropStat,
)
from netsleuth.bpf import features
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.program_session import PerfFallback, ProgramBacked, ProgramSession, Variant
from netsleuth.bpf.skeleton import MapAttr, Skeleton
from netsleuth.diagnostics.drops.runs import groups_with_runs
from netsleuth.diagnostics.filter_maps import OwnerInodeSync, fill_address_maps, fill_filter_config
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.kconfig import thread_size

# What a run needs once attached (decoding, names) loads then: see netsleuth.diagnostics.drops.decode.
if TYPE_CHECKING:
    from netsleuth.bpf.ringbuf import RecordBlob
    from netsleuth.diagnostics.drops.decode import RawDrop, RawDropGroup, RecordDecoder
    from netsleuth.kernel.reasons import DropReasons

__all__ = [
    "FALLBACK_ENV",
    "NO_REASON_FILTER",
    "DropTotals",
    "DropsProgramConfig",
    "DropsSession",
    "drop_reasons_for_run",
    "forced_fallbacks",
]


class DropsProgramConfig(msgspec.Struct, frozen=True):
    """What the drops program traces and how, resolved on this host (a msgspec Struct: defined at import, on
    the way to attaching, some 50 times faster than a dataclass, whose methods are generated and exec()ed)."""

    packet_filter: PacketFilter = msgspec.field(default_factory=PacketFilter)
    reasons: frozenset[int] = frozenset()
    exclude_reasons: frozenset[int] = frozenset()
    stack: bool = False
    snaplen: int = 0
    summary_only: bool = False
    sample_every: int = 1
    # The fallbacks for older kernels, each chosen from what the running kernel has when None (see
    # docs/kernel-support.md) and forced on this one by the tests (or NETSLEUTH_DROPS_FALLBACK):
    # perf_buffer - events through per-CPU perf buffers, as before ring buffers (5.8);
    # kernel_reasons False - skb:kfree_skb's `reason` is not read, as before 5.17, and each drop's reason is
    #   inferred from where the packet was freed (netsleuth.kernel.inferred_reasons), marked inferred;
    # raw_tp_only - attach as a raw tracepoint, as on kernels that refuse tp_btf;
    # current_task_btf False - find the current task with bpf_get_current_task, as before 5.11.
    perf_buffer: bool | None = None
    kernel_reasons: bool | None = None
    raw_tp_only: bool = False
    current_task_btf: bool | None = None
    # Leave netsleuth's own footprint out (bpf/own_sockets.bpf.h): QUEUE_PURGE drops of the netlink sockets
    # its own firewall reads left unread. Counted apart (`own_drops`), never as the host's. diagnose sets it.
    skip_own: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.snaplen <= DROPS_MAX_SNAPLEN:
            raise UsageError(f"--snaplen must be between 0 and {DROPS_MAX_SNAPLEN} bytes")
        if self.sample_every < 1:
            raise UsageError("--sample must be 1 (every event) or more")
        if self.reasons and self.exclude_reasons:
            raise UsageError("use either --reason or --exclude-reason, not both")
        if self.kernel_reasons is False and (self.reasons or self.exclude_reasons):
            raise UsageError(NO_REASON_FILTER)

    @property
    def infers_reasons(self) -> bool:
        """Are reasons inferred from the drop location? As configured, else when the kernel gives none."""
        if self.kernel_reasons is not None:
            return not self.kernel_reasons
        return not features.drop_reasons()


NO_REASON_FILTER = (
    "--reason and --exclude-reason select the kernel's drop reasons, and this run has none (skb:kfree_skb "
    "passes them from Linux 5.17): its reasons are inferred from where each packet was freed, so select "
    "them in the output instead"
)


# The drops program's counters (bpf/drops.h enum drop_stat).
DropTotals = EventTotals


# tp_btf reads arguments with no copy; raw_tp is the fallback for kernels that refuse tp_btf. The first
# tp_btf build reads them through untrusted pointers, which verifies in a fifth of the time on 6.4+ and needs
# 6.3's bpf_rdonly_cast (bpf/kfree_skb.bpf.h); "_tp_btf_tr" is the same program for the kernels before.
_VARIANTS = (Variant("_tp_btf", "tp_btf"), Variant("_tp_btf_tr", "tp_btf"), Variant("_raw_tp", "raw_tp"))
PROGRAMS = tuple("drops" + variant.suffix for variant in _VARIANTS)
# bpf/own_sockets.bpf.h: marks netsleuth's own netlink sockets, one build per variant like the drops program.
_OWN_MARKER = "own_sent"
_OWN_SOCKETS_CARRIED = 512  # of earlier runs' sockets, at most: half the map (bpf/own_sockets.bpf.h)
# bpf/emit.bpf.h (NS_EMIT_PERF_FALLBACK): the perf event array and the switch that sends events there.
_PERF_FALLBACK = PerfFallback(DropsMaps.events_perf, DropsRodata.ns_use_perfbuf)


class DropsSession(ProgramBacked):
    """A live drops trace. Use as a context manager; `start()` attaches, `close()` detaches everything.

    `programs` narrows the variants tried (e.g. `("drops_raw_tp",)` to test the fallback; by default all, in
    order, or raw_tp alone when the config says so)."""

    # The marker of netsleuth's own netlink sockets runs until close: the firewall reads that name a run's
    # last drops (and diagnose's other verdicts) come after the drops program stopped, and their sockets'
    # purges fall in the next run (lazy RCU) unless they are marked and handed on.
    _kept_attached = (_OWN_MARKER,)

    def __init__(
        self,
        config: DropsProgramConfig,
        reasons: DropReasons | None = None,
        programs: tuple[str, ...] | None = None,
    ) -> None:
        """`reasons`: the run's reason table, if the caller has it; loading does not need it (the program
        reads this kernel's reason numbers from its BTF at load)."""
        self.config = config
        self.reasons = reasons
        if programs is None:
            programs = ("drops_raw_tp",) if config.raw_tp_only else PROGRAMS
        self._reasons_inferred: bool | None = None
        if (config.reasons or config.exclude_reasons) and self.reasons_inferred:
            raise UsageError(NO_REASON_FILTER)
        self.buffer = "none"  # where events travel: "ring" or "perf" once started, "none" when only counting
        self._programs = ProgramSession(
            DropsObject,
            ("drops", _OWN_MARKER),
            variants=[variant for variant in _VARIANTS if "drops" + variant.suffix in programs],
            mirrors=(("drop_event", DropEvent), ("drop_group", DropGroupValue)),
        )
        self._owners = OwnerInodeSync(config.packet_filter)
        self._decoder: RecordDecoder | None = None
        self.own_marked = False  # netsleuth's own netlink sockets are told apart in this run
        self._carried: frozenset[int] = frozenset()  # earlier runs' own sockets, marked at start

    @property
    def reasons_inferred(self) -> bool:
        """Are this run's reasons inferred from the drop location (the kernel gives none, or the config says
        so)? Asked of the kernel's BTF when first needed - naming, after attaching - not on the way to it."""
        if self._reasons_inferred is None:
            self._reasons_inferred = self.config.infers_reasons
        return self._reasons_inferred

    # -- start -----------------------------------------------------------------------------------------
    def _kernel_config(self) -> DropsConfigC:
        packet_filter = self.config.packet_filter
        cfg = DropsConfigC()
        fill_filter_config(cfg, packet_filter)
        cfg.sample_every = self.config.sample_every
        cfg.snaplen = self.config.snaplen
        cfg.filter_reasons = 1 if self.config.reasons else 2 if self.config.exclude_reasons else 0
        cfg.want_stack = int(self.config.stack)
        cfg.emit_events = int(not self.config.summary_only)
        # What the kernel offers (reason, rx_sk, bpf_get_current_task_btf) the program reads from its BTF at
        # load; these only force the older kernels' paths (NETSLEUTH_DROPS_FALLBACK).
        cfg.ignore_reason = int(self.config.kernel_reasons is False)
        cfg.ignore_task_btf = int(self.config.current_task_btf is False)
        cfg.thread_size = thread_size()
        cfg.self_tgid = os.getpid() if self.own_marked else 0
        return cfg

    def _can_mark_own(self) -> bool:
        """The marker needs sock:sock_send_length (6.3) and the typed tracepoint (a raw one cannot ask for
        a socket's cookie)."""
        from netsleuth.bpf.btf import vmlinux_btf

        if not self.config.skip_own or self.config.raw_tp_only:
            return False
        return vmlinux_btf().tracepoint_arity("sock_send_length") is not None

    def start(self) -> None:
        found = require_tracing(ring_buffer=False)
        use_perf = self.config.perf_buffer if self.config.perf_buffer is not None else not found.ring_buffer
        # Even a counting-only run takes the perf path on a kernel without ring buffers: it is what retires
        # the ring buffer map, whose creation would fail there.
        perf = _PERF_FALLBACK if use_perf else None
        emit = not self.config.summary_only
        self.own_marked = self._can_mark_own()
        self._programs.start(
            ["drops", _OWN_MARKER] if self.own_marked else ["drops"],
            (DropsRodata.cfg, self._kernel_config()),
            fill_maps=self._fill_filter_maps,
            ring=DropsMaps.events if emit else None,
            perf=perf,
            sizes=self._unused_map_sizes(emit and perf is None),
        )
        self.buffer = ("perf" if perf is not None else "ring") if emit else "none"

    def _unused_map_sizes(self, ring: bool) -> dict[MapAttr, int]:
        """The maps this run's program never touches, made as small as they can be (a counting run sends no
        event; no --pid/--comm, no owner inodes; no --reason, no reason set): creating them is part of the
        start, and a preallocated hash map's cost grows with its size."""
        sizes = {}
        if not ring:
            sizes[DropsMaps.events] = mmap.PAGESIZE  # a ring buffer is a power of two pages: one
        if not self.config.packet_filter.filters_owner:
            sizes[DropsMaps.owner_inodes] = 1
        if not (self.config.reasons or self.config.exclude_reasons):
            sizes[DropsMaps.reason_filter] = 1
        if not self.own_marked:
            sizes[DropsMaps.own_sockets] = 1
        return sizes

    def close(self) -> None:
        if self.own_marked and self._programs.started:
            from netsleuth.diagnostics.own_sockets import remember_own_sockets

            # Only the sockets this run marked: those it carried were left by their own runs, and writing
            # them again would keep them "recent" for as long as runs follow each other.
            keys = self._programs.maps.own_sockets.keys()
            marked = (int.from_bytes(key, "little") for key in keys)
            remember_own_sockets(cookie for cookie in marked if cookie not in self._carried)
        super().close()

    def own_drops(self) -> int:
        """Drops left out as netsleuth's own (bpf/own_sockets.bpf.h), all CPUs."""
        if not self._programs.started or not self.own_marked:
            return 0
        return sum(self._programs.counter_sums(DropsMaps.own_drops, 1))

    @property
    def perf_lost(self) -> int | None:
        """With the perf buffer: the records the kernel reported lost to it (PERF_RECORD_LOST), the same
        losses the program counts in LOST; None with a ring buffer."""
        return self._programs.perf_lost

    def _fill_filter_maps(self, drops: Skeleton[DropsMaps]) -> None:
        reason_set = self.config.reasons or self.config.exclude_reasons
        reason_map = drops.maps.reason_filter
        for value in reason_set:
            reason_map.update(value.to_bytes(4, "little"), b"\x01")
        fill_address_maps(drops.maps, self.config.packet_filter)
        self._owners.refresh(drops.maps, force=True)
        if self.own_marked:
            from netsleuth.diagnostics.own_sockets import recent_own_sockets

            # Sockets earlier runs marked, whose purges (deferred by lazy RCU) may fall in this run.
            own_sockets = drops.maps.own_sockets
            self._carried = frozenset(recent_own_sockets(limit=_OWN_SOCKETS_CARRIED))
            for cookie in self._carried:
                own_sockets.update(cookie.to_bytes(8, "little"), b"\x01")

    # -- run -------------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list[RawDrop]:
        return self.decode(self.poll_records(timeout_ms))

    def drain(self) -> list[RawDrop]:
        return self.decode(self.drain_records())

    def poll_records(self, timeout_ms: int) -> list[bytes]:
        """The raw records of `poll`, undecoded (DropBatcher decodes one of each kind)."""
        if self._programs.started:
            self._owners.refresh(self._programs.maps)
        return self._programs.poll(timeout_ms)

    def drain_records(self) -> list[bytes]:
        """Every record queued now, without waiting; the programs keep running."""
        return self._programs.drain()

    def poll_blob(self, timeout_ms: int) -> RecordBlob:
        """`poll_records`' records in one blob (DropBatcher compares them in place)."""
        if self._programs.started:
            self._owners.refresh(self._programs.maps)
        return self._programs.poll_blob(timeout_ms)

    def last_records(self) -> list[bytes]:
        """The last read of a run: the programs are stopped first (ProgramSession.stop: detached, none still
        running), so every event the counters say was emitted is in what is read here and a run's summary
        adds up to what it printed."""
        return self._programs.last_drain(self._kept_attached)

    def decode(self, records: list[bytes]) -> list[RawDrop]:
        if self._decoder is None:
            from netsleuth.diagnostics.drops.decode import RecordDecoder

            self._decoder = RecordDecoder()
        return self._decoder.decode(records)

    def totals(self) -> DropTotals:
        return DropTotals(*self._programs.counter_sums(DropsMaps.drop_stats, DropStat.COUNT))

    def groups(self) -> Iterator[RawDropGroup]:
        """Counts by reason x location x netns, each with the first drop of its kind as the example."""
        from netsleuth.diagnostics.drops.decode import RawDropGroup, decode_event

        for key, value in groups_with_runs(self._programs):
            frames = tuple(value.example_frames[: value.example.nr_frames])
            yield RawDropGroup(
                reason=key.reason,
                location=key.location,
                netns=key.netns,
                count=value.count,
                bytes=value.bytes,
                example=decode_event(value.example, frames),
            )

    def forget_group(self, reason: int, location: int, netns: int) -> tuple[int, int] | None:
        """Delete one group from the kernel map and return its final (count, bytes); None if it is gone.

        A drop counted between the read and the delete would be lost, so this is only for namespaces that
        no longer exist (no device or socket left in them to drop anything)."""
        if not self._programs.started:
            return None
        groups = self._programs.maps.drop_groups
        key = bytes(DropGroupKey(location=location, reason=reason, netns=netns))
        value = groups.lookup(key)
        if value is None or not groups.delete(key):
            return None
        # struct drop_group starts with __u64 count, __u64 bytes (bpf/drops.h).
        return int.from_bytes(value[0:8], "little"), int.from_bytes(value[8:16], "little")


# NETSLEUTH_DROPS_FALLBACK=perf-buffer,no-reason,raw-tp,no-task-btf forces the older kernels' paths on a newer
# one, for a whole command (the privileged tests run `netsleuth drops` that way); the words set
# DropsProgramConfig fields.
FALLBACK_ENV = "NETSLEUTH_DROPS_FALLBACK"
_FALLBACKS = {
    "perf-buffer": {"perf_buffer": True},
    "no-reason": {"kernel_reasons": False},
    "raw-tp": {"raw_tp_only": True},
    "no-task-btf": {"current_task_btf": False},
}


def forced_fallbacks(text: str | None = None) -> dict[str, bool]:
    """The DropsProgramConfig fields NETSLEUTH_DROPS_FALLBACK (or `text`) sets; an unknown word is a usage
    error."""
    text = os.environ.get(FALLBACK_ENV, "") if text is None else text
    fields: dict[str, bool] = {}
    for word in filter(None, (part.strip() for part in text.split(","))):
        if word not in _FALLBACKS:
            known = ", ".join(_FALLBACKS)
            raise UsageError(f"{FALLBACK_ENV}: unknown fallback {word!r}; known: {known}")
        fields.update(_FALLBACKS[word])
    return fields


def drop_reasons_for_run(kernel_reasons: bool | None = None) -> DropReasons:
    """This kernel's drop reason names, or, on a kernel that has none (before 5.17), an empty table: its runs
    infer reasons from the drop location instead. `kernel_reasons` as in DropsProgramConfig (True: they are
    required, so their absence is the error it always was)."""
    from netsleuth.kernel.reasons import load_drop_reasons

    try:
        return load_drop_reasons()
    except EnvironmentProblem:
        if kernel_reasons or (kernel_reasons is None and features.drop_reasons()):
            raise
        from netsleuth.kernel.reasons import DropReasons

        return DropReasons({}, "none: this kernel does not name drop reasons (they are inferred)")
