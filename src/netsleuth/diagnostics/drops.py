"""`drops`: every packet the kernel frees with a drop reason, from tracepoint skb:kfree_skb.

`DropsSession` owns the BPF object (open -> configure -> load -> attach) and turns raw ring-buffer records
and map entries into `RawDrop`s and `DropTotals`; `netsleuth.diagnostics.drops_enrich` adds names (reason,
symbol, netns, process, firewall rule) to make `DropRecord`s. Totals come from kernel counters and are exact
whatever was sampled or lost on the way to userspace.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from netsleuth._generated.drops_abi import (
    DROPS_MAX_FRAMES,
    DROPS_MAX_SNAPLEN,
    DropEvent,
    DropGroupKey,
    DropGroupValue,
    DropsConfigC,
    DropStat,
)
from netsleuth._generated.shared_abi import PacketTupleC
from netsleuth.bpf import features
from netsleuth.bpf.features import require_tracing
from netsleuth.bpf.object import BpfObject
from netsleuth.bpf.program_session import PerfFallback, ProgramBacked, ProgramSession, Variant
from netsleuth.diagnostics.drop_runs import groups_with_runs
from netsleuth.diagnostics.filter_maps import OwnerInodeSync, fill_address_maps, fill_filter_config
from netsleuth.diagnostics.filters import FILTER_KEYS, PacketFilter, read_packet_filter
from netsleuth.diagnostics.model import ConfigInput, DiagnosticSpec, RunOptions
from netsleuth.diagnostics.packet_abi import decode_tuple
from netsleuth.diagnostics.schema import SCHEMA_VERSIONS
from netsleuth.diagnostics.struct_layout import flat_struct, frozen_record
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.kconfig import thread_size
from netsleuth.kernel.reasons import DropReasons
from netsleuth.packet import PacketTuple

if TYPE_CHECKING:
    from netsleuth.diagnostics.drop_batch import DropBatch, DropBatcher
    from netsleuth.diagnostics.drops_enrich import DropEnricher, DropGroup
    from netsleuth.kernel.context import KernelClock, KernelContext

__all__ = [
    "DIAGNOSTIC",
    "FALLBACK_ENV",
    "DropTotals",
    "DropsConfig",
    "DropsDiagnostic",
    "DropsSession",
    "DropsSummary",
    "RawDrop",
    "RawDropGroup",
    "RecordDecoder",
    "decode_records",
    "drop_reasons_for_run",
    "forced_fallbacks",
    "read_drops_config",
]

_EVENT_SIZE = ctypes.sizeof(DropEvent)


@dataclass(frozen=True)
class DropsConfig:
    """What a drops run traces and how (a dataclass with a docstring is also cheaper to define: without
    one, dataclasses computes a signature for __doc__ at import, on the way to attaching)."""

    packet_filter: PacketFilter = field(default_factory=PacketFilter)
    reasons: frozenset[int] = frozenset()
    exclude_reasons: frozenset[int] = frozenset()
    stack: bool = False
    snaplen: int = 0
    summary_only: bool = False
    sample_every: int = 1
    duration: float | None = None
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

    @property
    def run_options(self) -> RunOptions:
        return RunOptions(summary=self.summary_only, sample=self.sample_every, duration=self.duration)

    def __post_init__(self) -> None:
        if not 0 <= self.snaplen <= DROPS_MAX_SNAPLEN:
            raise UsageError(f"--snaplen must be between 0 and {DROPS_MAX_SNAPLEN} bytes")
        if self.sample_every < 1:
            raise UsageError("--sample must be 1 (every event) or more")
        if self.reasons and self.exclude_reasons:
            raise UsageError("use either --reason or --exclude-reason, not both")
        if self.kernel_reasons is False and (self.reasons or self.exclude_reasons):
            raise UsageError(_NO_REASON_FILTER)

    @property
    def infers_reasons(self) -> bool:
        """Are reasons inferred from the drop location? As configured, else when the kernel gives none."""
        if self.kernel_reasons is not None:
            return not self.kernel_reasons
        return not features.drop_reasons()


_NO_REASON_FILTER = (
    "--reason and --exclude-reason select the kernel's drop reasons, and this run has none (skb:kfree_skb "
    "passes them from Linux 5.17): its reasons are inferred from where each packet was freed, so select "
    "them in the output instead"
)


@dataclass(frozen=True)
class RawDrop:
    """One drop as the kernel described it, before names are attached."""

    monotonic_ns: int
    location: int
    reason: int
    netns: int
    pid: int  # the current task's when in_task; 0 in softirq/irq
    tid: int
    in_task: bool
    kthread: bool  # the current task is a kernel thread (ksoftirqd, a NAPI thread...)
    comm: str
    sock_ino: int
    sk_state: int | None
    ifindex: int
    ifname: str
    skb_len: int
    cpu: int
    packet: PacketTuple
    frames: tuple[int, ...] = ()
    packet_bytes: bytes = b""


@dataclass(frozen=True)
class RawDropGroup:
    """One in-kernel group (reason x location x netns) with its first drop as the example."""

    reason: int
    location: int
    netns: int
    count: int
    bytes: int
    example: RawDrop


# The drops program's counters (bpf/drops.h enum drop_stat).
DropTotals = EventTotals


def decode_event(event: DropEvent, frames: tuple[int, ...] = (), packet_bytes: bytes = b"") -> RawDrop:
    in_task = bool(event.in_task)
    return RawDrop(
        monotonic_ns=event.time_ns,
        location=event.location,
        reason=event.reason,
        netns=event.netns,
        pid=event.pid,
        tid=event.tid,
        in_task=in_task,
        kthread=bool(event.kthread),
        comm=event.comm.decode(errors="replace") if in_task else "",
        sock_ino=event.sock_ino,
        sk_state=None if event.sk_state == 0xFF else event.sk_state,
        ifindex=event.ifindex,
        ifname=event.ifname.decode(errors="replace"),
        skb_len=event.skb_len,
        cpu=event.cpu,
        packet=decode_tuple(event.tuple, event.tuple.l3_len or event.skb_len),
        frames=frames,
        packet_bytes=packet_bytes,
    )


def decode_record(record: bytes) -> RawDrop:
    """A ring-buffer record: struct drop_event, then nr_frames u64 addresses, then caplen packet bytes."""
    return decode_records([record])[0]


# The event as one struct.unpack_from (netsleuth.diagnostics.struct_layout): field positions by name.
_FLAT = flat_struct(DropEvent)
_UNPACK = _FLAT.unpack_from
_TUPLE_START = _FLAT.offset["tuple"]
_TUPLE_END = _TUPLE_START + ctypes.sizeof(PacketTupleC)
(_TIME, _LOCATION, _SOCK_INO, _REASON, _NETNS, _PID, _TID, _IFINDEX, _SKB_LEN, _CPU, _CAPLEN, _NR_FRAMES) = (
    _FLAT.index[name]
    for name in (
        "time_ns",
        "location",
        "sock_ino",
        "reason",
        "netns",
        "pid",
        "tid",
        "ifindex",
        "skb_len",
        "cpu",
        "caplen",
        "nr_frames",
    )
)
_L3_LEN = _FLAT.index["tuple.l3_len"]
_IN_TASK, _KTHREAD, _SK_STATE, _COMM, _IFNAME = (
    _FLAT.index[name] for name in ("in_task", "kthread", "sk_state", "comm", "ifname")
)
_FRAMES = {count: struct.Struct(f"<{count}Q").unpack_from for count in range(DROPS_MAX_FRAMES + 1)}
_CACHE_LIMIT = 65536


class RecordDecoder:
    """Decodes ring-buffer records in batches. A storm repeats the same few packets, names and devices, so
    the decoded packet tuple (a frozen PacketTuple, shared by every drop with the same header bytes and
    length), comm and device names are remembered by their raw bytes; everything else is one
    struct.unpack_from per record. The result is exactly `decode_event` of the same bytes."""

    def __init__(self) -> None:
        self._packets: dict[tuple[bytes, int], PacketTuple] = {}
        self._texts: dict[bytes, str] = {}

    def _packet(self, record: bytes, length: int) -> PacketTuple:
        key = (record[_TUPLE_START:_TUPLE_END], length)
        packet = self._packets.get(key)
        if packet is None:
            if len(self._packets) >= _CACHE_LIMIT:
                self._packets.clear()  # a scan of many addresses: start over rather than grow
            packet = decode_tuple(PacketTupleC.from_buffer_copy(key[0]), length)
            self._packets[key] = packet
        return packet

    def _text(self, raw: bytes) -> str:
        text = self._texts.get(raw)
        if text is None:
            if len(self._texts) >= _CACHE_LIMIT:
                self._texts.clear()
            # As ctypes reads a char array: up to the first NUL.
            text = raw.split(b"\0", 1)[0].decode(errors="replace")
            self._texts[raw] = text
        return text

    def decode(self, records: list[bytes]) -> list[RawDrop]:
        decoded: list[RawDrop] = []
        append = decoded.append
        text = self._text
        packet_of = self._packet
        for record in records:
            v = _UNPACK(record)
            skb_len = v[_SKB_LEN]
            nr_frames = v[_NR_FRAMES]
            in_task = bool(v[_IN_TASK])
            sk_state = v[_SK_STATE]
            frames_end = _EVENT_SIZE + 8 * nr_frames
            caplen = v[_CAPLEN]
            append(
                frozen_record(
                    RawDrop,
                    {
                        "monotonic_ns": v[_TIME],
                        "location": v[_LOCATION],
                        "reason": v[_REASON],
                        "netns": v[_NETNS],
                        "pid": v[_PID],
                        "tid": v[_TID],
                        "in_task": in_task,
                        "kthread": bool(v[_KTHREAD]),
                        "comm": text(v[_COMM]) if in_task else "",
                        "sock_ino": v[_SOCK_INO],
                        "sk_state": None if sk_state == 0xFF else sk_state,
                        "ifindex": v[_IFINDEX],
                        "ifname": text(v[_IFNAME]),
                        "skb_len": skb_len,
                        "cpu": v[_CPU],
                        "packet": packet_of(record, v[_L3_LEN] or skb_len),
                        "frames": _FRAMES[nr_frames](record, _EVENT_SIZE) if nr_frames else (),
                        "packet_bytes": record[frames_end : frames_end + caplen] if caplen else b"",
                    },
                )
            )
        return decoded


_DECODER = RecordDecoder()


def decode_records(records: list[bytes]) -> list[RawDrop]:
    """A batch of ring-buffer records (see `decode_record`), decoded in one pass."""
    return _DECODER.decode(records)


# tp_btf reads arguments with no copy; raw_tp is the fallback for kernels that refuse tp_btf.
_VARIANTS = (Variant("_tp_btf", "tp_btf"), Variant("_raw_tp", "raw_tp"))
PROGRAMS = tuple("drops" + variant.suffix for variant in _VARIANTS)
# bpf/emit.bpf.h (NS_EMIT_PERF_FALLBACK): the perf event array and the switch that sends events there.
_PERF_FALLBACK = PerfFallback("events_perf", "ns_use_perfbuf")


class DropsSession(ProgramBacked):
    """A live drops trace. Use as a context manager; `start()` attaches, `close()` detaches everything.

    `programs` narrows the variants tried (e.g. `("drops_raw_tp",)` to test the fallback; by default both,
    or raw_tp alone when the config says so)."""

    def __init__(
        self, config: DropsConfig, reasons: DropReasons, programs: tuple[str, ...] | None = None
    ) -> None:
        self.config = config
        self.reasons = reasons
        if programs is None:
            programs = ("drops_raw_tp",) if config.raw_tp_only else PROGRAMS
        # Decided now, before attaching, so the run's enricher knows how to name reasons.
        self.reasons_inferred = config.infers_reasons
        if self.reasons_inferred and (config.reasons or config.exclude_reasons):
            raise UsageError(_NO_REASON_FILTER)
        self.buffer = "none"  # where events travel: "ring" or "perf" once started, "none" when only counting
        self._programs = ProgramSession(
            "drops",
            ("drops",),
            variants=[variant for variant in _VARIANTS if "drops" + variant.suffix in programs],
            mirrors=(("drop_event", DropEvent), ("drop_group", DropGroupValue)),
        )
        self._owners = OwnerInodeSync(config.packet_filter)
        self._decoder = RecordDecoder()

    # -- start -----------------------------------------------------------------------------------------
    def _kernel_config(self, has_rx_sk: bool) -> DropsConfigC:
        packet_filter = self.config.packet_filter
        cfg = DropsConfigC()
        none = 0xFFFFFFFF
        cfg.consumed_reason = none if self.reasons.consumed is None else self.reasons.consumed
        cfg.not_dropped_reason = none if self.reasons.not_dropped is None else self.reasons.not_dropped
        netfilter = self.reasons.value("NETFILTER_DROP")
        cfg.netfilter_reason = none if netfilter is None else netfilter
        fill_filter_config(cfg, packet_filter)
        cfg.sample_every = self.config.sample_every
        cfg.snaplen = self.config.snaplen
        cfg.filter_reasons = 1 if self.config.reasons else 2 if self.config.exclude_reasons else 0
        cfg.want_stack = int(self.config.stack)
        cfg.emit_events = int(not self.config.summary_only)
        cfg.has_rx_sk = int(has_rx_sk)
        cfg.has_reason = int(not self.reasons_inferred)
        task_btf = self.config.current_task_btf
        if task_btf is None:
            # A kernel with drop reasons (5.17) has the helper (5.11): no BTF search on the way to attaching.
            task_btf = features.drop_reasons() or features.bpf_helper("get_current_task_btf")
        cfg.task_btf = int(task_btf)
        cfg.thread_size = thread_size()
        return cfg

    def start(self) -> None:
        found = require_tracing(ring_buffer=False)
        use_perf = self.config.perf_buffer if self.config.perf_buffer is not None else not found.ring_buffer
        # Even a counting-only run takes the perf path on a kernel without ring buffers: it is what retires
        # the ring buffer map, whose creation would fail there.
        perf = _PERF_FALLBACK if use_perf else None
        emit = not self.config.summary_only
        self._programs.start(
            ["drops"],
            # rx_sk (6.11) comes after `reason` (5.17): a run without reasons is one on a kernel without both.
            ("cfg", self._kernel_config(has_rx_sk=features.kfree_skb_rx_sk() and not self.reasons_inferred)),
            fill_maps=self._fill_filter_maps,
            ring="events" if emit else None,
            perf=perf,
        )
        self.buffer = ("perf" if perf is not None else "ring") if emit else "none"

    @property
    def perf_lost(self) -> int | None:
        """With the perf buffer: the records the kernel reported lost to it (PERF_RECORD_LOST), the same
        losses the program counts in LOST; None with a ring buffer."""
        return self._programs.perf_lost

    def _fill_filter_maps(self, bpf_object: BpfObject) -> None:
        reason_set = self.config.reasons or self.config.exclude_reasons
        reason_map = bpf_object.map("reason_filter")
        for value in reason_set:
            reason_map.update(value.to_bytes(4, "little"), b"\x01")
        fill_address_maps(bpf_object, self.config.packet_filter)
        self._owners.refresh(bpf_object, force=True)

    # -- run -------------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int) -> list[RawDrop]:
        return self._decoder.decode(self.poll_records(timeout_ms))

    def drain(self) -> list[RawDrop]:
        return self._decoder.decode(self.drain_records())

    def poll_records(self, timeout_ms: int) -> list[bytes]:
        """The raw records of `poll`, undecoded (DropBatcher decodes one of each kind)."""
        if self._programs.started:
            self._owners.refresh(self._programs.bpf_object)
        return self._programs.poll(timeout_ms)

    def drain_records(self) -> list[bytes]:
        return self._programs.drain()

    def decode(self, records: list[bytes]) -> list[RawDrop]:
        return self._decoder.decode(records)

    def totals(self) -> DropTotals:
        return DropTotals(*self._programs.counter_sums("drop_stats", DropStat.COUNT))

    def groups(self) -> Iterator[RawDropGroup]:
        """Counts by reason x location x netns, each with the first drop of its kind as the example."""
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
        groups = self._programs.map("drop_groups")
        key = bytes(DropGroupKey(location=location, reason=reason, netns=netns))
        value = groups.lookup(key)
        if value is None or not groups.delete(key):
            return None
        # struct drop_group starts with __u64 count, __u64 bytes (bpf/drops.h).
        return int.from_bytes(value[0:8], "little"), int.from_bytes(value[8:16], "little")


# -- the registered diagnostic ---------------------------------------------------------------------------

DROPS_KEYS = (*FILTER_KEYS, *RunOptions.KEYS, "reason", "exclude_reason", "stack", "snaplen")

# NETSLEUTH_DROPS_FALLBACK=perf-buffer,no-reason,raw-tp,no-task-btf forces the older kernels' paths on a newer
# one, for a whole command (the privileged tests run `netsleuth drops` that way); the words are DropsConfig
# fields.
FALLBACK_ENV = "NETSLEUTH_DROPS_FALLBACK"
_FALLBACKS = {
    "perf-buffer": {"perf_buffer": True},
    "no-reason": {"kernel_reasons": False},
    "raw-tp": {"raw_tp_only": True},
    "no-task-btf": {"current_task_btf": False},
}


def forced_fallbacks(text: str | None = None) -> dict[str, bool]:
    """The DropsConfig fields NETSLEUTH_DROPS_FALLBACK (or `text`) sets; an unknown word is a usage error."""
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
    infer reasons from the drop location instead. `kernel_reasons` as in DropsConfig (True: they are
    required, so their absence is the error it always was)."""
    from netsleuth.kernel.reasons import load_drop_reasons

    try:
        return load_drop_reasons()
    except EnvironmentProblem:
        if kernel_reasons or (kernel_reasons is None and features.drop_reasons()):
            raise
        return DropReasons({}, "none: this kernel does not name drop reasons (they are inferred)")


def read_drops_config(values: ConfigInput, reasons: DropReasons | None = None) -> DropsConfig:
    """--reason names are the running kernel's (read from its BTF), so they are checked on the host that
    traces; `reasons` is that kernel's table (loaded here when not given)."""
    options = RunOptions.read(values)
    forced = forced_fallbacks()
    reasons = reasons or drop_reasons_for_run(forced.get("kernel_reasons"))
    snaplen = values.integer("snaplen", default=0)
    if snaplen and options.summary:
        raise UsageError("--pcap needs individual drops: it cannot be combined with --summary")
    wanted, unwanted = values.texts("reason"), values.texts("exclude_reason")
    if (wanted or unwanted) and (forced.get("kernel_reasons") is False or not features.drop_reasons()):
        raise UsageError(_NO_REASON_FILTER)
    return DropsConfig(
        packet_filter=read_packet_filter(values),
        reasons=frozenset(reasons.parse(wanted)),
        exclude_reasons=frozenset(reasons.parse(unwanted)),
        stack=values.flag("stack"),
        snaplen=snaplen,
        summary_only=options.summary,
        sample_every=options.sample,
        duration=options.duration,
        **forced,
    )


@dataclass(frozen=True)
class DropsSummary:
    """What a drops run ends with: exact totals, the groups (reason x location x netns, largest first) and
    the clock that turns the run's kernel timestamps into wall-clock time."""

    totals: DropTotals
    attach: str
    interrupted: bool
    groups: tuple[DropGroup, ...]
    clock: KernelClock
    reasons_inferred: bool = False  # every group's reason was inferred from its location (no kernel reasons)

    def to_json(self) -> dict[str, Any]:
        data = {
            "type": "summary",
            "v": SCHEMA_VERSIONS["summary"],
            "diagnostic": "drops",
            **self.totals.to_json(),
            "attach": self.attach,
            "interrupted": self.interrupted,
            "clock": self.clock.to_json(),
            "groups": [group.to_json() for group in self.groups],
        }
        if self.reasons_inferred:
            data["reasons_inferred"] = True
        return data


class DropsDiagnostic:
    """`drops` as a session of the diagnostic model: raw drops from the kernel, named by a `DropEnricher`
    that shares the run's `KernelContext`. Names are read at the first poll, after attaching: the kernel is
    already counting and queueing while kallsyms is read."""

    def __init__(
        self,
        config: DropsConfig,
        context: KernelContext | None = None,
        reasons: DropReasons | None = None,
        vmlinux: str | None = None,
        explain_firewall: bool = True,
        find_vmlinux: bool = False,
    ) -> None:
        """`vmlinux`: a debug vmlinux for source lines; `find_vmlinux`: look for one when names are first
        needed (after attaching: the search imports the symbolizer, which attaching does not need)."""
        self.config = config
        self.reasons = reasons or drop_reasons_for_run(config.kernel_reasons)
        self._raw = DropsSession(config, self.reasons)
        self._context = context
        self._vmlinux = vmlinux
        self._find_vmlinux = find_vmlinux
        self._explain_firewall = explain_firewall
        self._enricher: DropEnricher | None = None
        self._batcher: DropBatcher | None = None

    @property
    def attach_kind(self) -> str:
        return self._raw.attach_kind

    @property
    def raw(self) -> DropsSession:
        return self._raw

    def start(self) -> None:
        self._raw.start()

    @property
    def enricher(self) -> DropEnricher:
        if self._enricher is None:
            from netsleuth.diagnostics.drops_enrich import DropEnricher

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

    def _batch(self, records: list[bytes]) -> DropBatch:
        if self._batcher is None:
            from netsleuth.diagnostics.drop_batch import DropBatcher

            enricher = self.enricher
            self._batcher = DropBatcher(
                self._raw.decode, enricher.enrich_many, lambda: enricher.context.wall_offset_ns
            )
        return self._batcher.batch(records)

    def poll(self, timeout_ms: int) -> DropBatch:
        """The drops that arrived, enriched once per kind (netsleuth.diagnostics.drop_batch)."""
        return self._batch(self._raw.poll_records(timeout_ms))

    def drain(self) -> DropBatch:
        return self._batch(self._raw.drain_records())

    def totals(self) -> DropTotals:
        return self._raw.totals()

    def groups(self) -> list[DropGroup]:
        enrich_group = self.enricher.enrich_group
        return sorted((enrich_group(group) for group in self._raw.groups()), key=lambda g: -g.count)

    def summary(self, interrupted: bool) -> DropsSummary:
        return DropsSummary(
            self._raw.totals(),
            self._raw.attach_kind,
            interrupted,
            tuple(self.groups()),
            self.enricher.context.clock,
            self._raw.reasons_inferred,
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


_INFERRED_NOTE = (
    "drop reasons are inferred from where each packet was freed, not given by the kernel (its skb:kfree_skb "
    "passes none before Linux 5.17): they are marked inferred"
)
_PERF_NOTE = (
    "events travel through per-CPU perf buffers (no ring buffer before Linux 5.8): events of different CPUs "
    "may arrive out of order; totals stay exact and losses are counted"
)


DIAGNOSTIC: DiagnosticSpec[DropsConfig] = DiagnosticSpec(
    name="drops",
    help="every dropped packet: why (kernel drop reason), where, whose, and which firewall rule",
    keys=DROPS_KEYS,
    read=read_drops_config,
    open=lambda config, context: DropsDiagnostic(config, context),
    objects=("drops",),
    records=("drop", "summary"),
    needs=("can_trace", "btf", "raw_tp"),  # tp_btf, or raw_tp where it is missing; a perf buffer will do
)
