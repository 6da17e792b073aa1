"""`dns` attached: every DNS query a process sends, joined with its answer in the kernel (bpf/dns.bpf.c).

The kernel counts queries and answers exactly by (process, server, name, type) with answers by response code
and a latency histogram, and sends each joined answer (the query's facts + the answer's bytes) and every
dropped DNS packet. Here: answers are parsed with dnspython, the process that asked is named the way drops
names a socket's owner, queries older than `--timeout` are swept out of the kernel's pending table and become
timeout records, and a timeout is joined with the drop of its query or answer on this host (the firewall rule,
a full receive buffer) - also when the answer did reach the socket but the kernel dropped it there.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from netsleuth._generated.dns_abi import (
    DnsConfigC,
    DnsEvent,
    DnsEventKind,
    DnsGroupKey,
    DnsGroupValue,
    DnsMaps,
    DnsObject,
    DnsPendingKey,
    DnsPrograms,
    DnsQueryC,
    DnsRodata,
    DnsStat,
)
from netsleuth.bpf.btf import vmlinux_btf
from netsleuth.bpf.program_session import ProgramSession
from netsleuth.bpf.skeleton import Skeleton
from netsleuth.diagnostics.attribution import Owner, OwnerFacts, owner_json
from netsleuth.diagnostics.dns.records import (
    DnsAnswer,
    DnsConfig,
    DnsDrop,
    DnsRecord,
    DnsSummary,
    DnsTimeout,
    DnsUnmatched,
    dns_drop,
    timeout_record,
)
from netsleuth.diagnostics.dns.summary import DnsGroupStats, DnsTotals, summary_rows
from netsleuth.diagnostics.dns.wire import dns_in_packet, name_from_wire, parse_answer, rcode_name, type_name
from netsleuth.diagnostics.filter_maps import OwnerInodeSync, fill_address_maps, fill_filter_config
from netsleuth.diagnostics.packet_abi import decode_tuple
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import EnvironmentProblem
from netsleuth.kernel.kconfig import thread_size
from netsleuth.packet import PacketTuple
from netsleuth.spec.parts import pod_ref
from netsleuth.spec.records import WallTime
from netsleuth.spec.summary import ClockPart, Summary

if TYPE_CHECKING:
    from netsleuth.diagnostics.drops.enrich import DropEnricher
    from netsleuth.diagnostics.filters import PacketFilter
    from netsleuth.kernel.context import KernelContext
    from netsleuth.kernel.reasons import DropReasons

__all__ = ["DnsDiagnostic", "cgroup2_root"]

_EVENT_SIZE = ctypes.sizeof(DnsEvent)
_QUERY_SIZE = ctypes.sizeof(DnsQueryC)
_SWEEP_S = 0.2  # timeouts reported within 0.2 s of their deadline
_SUMMARY_SWEEP_S = 1.0  # --summary only counts them: sweep (map walk in syscalls) less often
_TCP = 6
_TCP_RETRY_WINDOW_NS = 10_000_000_000
# A closing socket purging what it had not read (e.g. a TCP answer's FIN after the resolver closed): part of
# a normal close, as drop_rules says; counted in the kernel, not reported.
_BENIGN_DROPS = frozenset({"QUEUE_PURGE"})


# -- the session -----------------------------------------------------------------------------------------


def cgroup2_root(mountinfo: str = "/proc/self/mountinfo") -> str:
    """The mount point of the cgroup v2 hierarchy's root (`/sys/fs/cgroup` or, on hybrid hosts,
    `/sys/fs/cgroup/unified`): programs attached there see every socket of every process."""
    try:
        with open(mountinfo) as lines:
            for line in lines:
                fields = line.split()
                separator = fields.index("-")
                if fields[separator + 1] == "cgroup2" and fields[3] == "/":
                    return fields[4]
    except (OSError, ValueError, IndexError):
        pass
    raise EnvironmentProblem(
        "no cgroup v2 hierarchy is mounted, which netsleuth dns attaches to: "
        "mount one with `mount -t cgroup2 none /sys/fs/cgroup/unified`"
    )


@dataclass
class _HeldAnswer:
    """An answer event kept one poll round, so a drop of that answer in the socket (the kernel writes it
    to the ring right after the answer) turns it into a timeout."""

    event: DnsEvent
    payload: bytes
    held_at: float


class DnsDiagnostic:
    """`dns` as a session of the diagnostic model."""

    attach_kind: str

    def __init__(
        self,
        config: DnsConfig,
        context: KernelContext | None = None,
        *,
        packet_filter: PacketFilter | None = None,
        per_server: bool = False,
    ) -> None:
        """`packet_filter`: one already resolved on this host (diagnose's own), instead of the config's;
        `per_server`: the kernel groups by server only (the agent's exporter: a table that never fills)."""
        self.config = config
        self._context = context
        self._own_context = context is None
        # Resolved on this host now: a namespace, pod or process that is not here is an error before any load.
        self.packet_filter = packet_filter or config.packet_filter(
            context.netns_names if context is not None else None
        )
        self._per_server = per_server
        self._rcodes = config.rcode_numbers()
        self._program = ProgramSession(
            DnsObject,
            ("dns_drop",),
            mirrors=(
                ("dns_event", DnsEvent),
                ("dns_group", DnsGroupValue),
                ("dns_group_key", DnsGroupKey),
                ("dns_query", DnsQueryC),
                ("dns_pending_key", DnsPendingKey),
                ("dns_config", DnsConfigC),
            ),
        )
        self._owners = OwnerInodeSync(self.packet_filter)
        self._cgroup_fd = -1
        self._reasons: DropReasons | None = None
        self._drop_enricher: DropEnricher | None = None
        self._last_sweep = 0.0
        self._sweep_interval = _SUMMARY_SWEEP_S if config.summary else _SWEEP_S
        self._timeouts = 0
        self._group_timeouts: dict[bytes, int] = {}
        self._held: list[_HeldAnswer] = []
        # Recent drops by (client, client port, server, id): what a timeout is joined with.
        self._drops: OrderedDict[tuple[str | None, int, str | None, int], DnsDrop] = OrderedDict()
        self._timed_out: OrderedDict[tuple[int, int], float] = OrderedDict()  # (cookie, id) -> when
        self._truncated: OrderedDict[tuple[int | None, str, int], int] = OrderedDict()
        self.attach_kind = ""

    # -- start -----------------------------------------------------------------------------------------
    @property
    def context(self) -> KernelContext:
        if self._context is None:
            from netsleuth.kernel.context import KernelContext

            self._context = KernelContext(firewall=True)
        return self._context

    def _kernel_config(self, reasons: DropReasons) -> DnsConfigC:
        config = self.config
        cfg = DnsConfigC()
        fill_filter_config(cfg, self.packet_filter)
        none = 0xFFFFFFFF
        cfg.sample_every = config.sample
        # Bit 16 matches no response code: `--rcode TIMEOUT` alone shows timeouts and no answer.
        cfg.rcode_mask = sum(1 << rcode for rcode in self._rcodes) or (1 << 16 if config.filter_rcodes else 0)
        cfg.slow_ns = int((config.slow or 0.0) * 1e6)
        cfg.thread_size = thread_size()
        cfg.consumed_reason = none if reasons.consumed is None else reasons.consumed
        cfg.not_dropped_reason = none if reasons.not_dropped is None else reasons.not_dropped
        cfg.dns_port = config.dns_port
        cfg.emit_events = int(not config.summary)
        cfg.per_server = int(self._per_server)
        arity = vmlinux_btf().tracepoint_arity("kfree_skb")
        cfg.has_rx_sk = int(arity is not None and arity >= 4)
        return cfg

    def start(self) -> None:
        from netsleuth.kernel.reasons import load_drop_reasons

        self._reasons = load_drop_reasons()
        root = cgroup2_root()
        try:
            self._cgroup_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:
            raise EnvironmentProblem(f"cannot open the cgroup v2 root {root}: {error.strerror}") from None

        def prepare(dns: Skeleton[DnsMaps]) -> None:
            fill_address_maps(dns.maps, self.packet_filter)
            self._owners.refresh(dns.maps, force=True)
            # The socket programs attach here, before the drop tracepoint: through BPF links owned by this
            # process, so they go away with it (never bpf_prog_attach, which would outlive a crash).
            dns.bpf_object.attach_cgroup(DnsPrograms.dns_egress.name, self._cgroup_fd)
            dns.bpf_object.attach_cgroup(DnsPrograms.dns_ingress.name, self._cgroup_fd)

        config = (DnsRodata.cfg, self._kernel_config(self._reasons))
        self._program.start(["dns_drop"], config, prepare, ring=DnsMaps.events)
        self.attach_kind = f"cgroup_skb+{self._program.attach_kind}"

    # -- decoding --------------------------------------------------------------------------------------
    def _owner(self, query: DnsQueryC, sock_ino: int) -> Owner:
        in_task = bool(query.in_task) and not query.kthread and query.group.tgid
        return self.context.owner(
            OwnerFacts(
                task_pid=query.group.tgid if in_task else None,
                # The process's name: the kernel reads the thread group leader's comm (bpf/dns.bpf.c).
                task_comm=query.group.comm.decode(errors="replace"),
                tracked_pid=0,
                tracked_comm="",
                sock_ino=sock_ino,
            )
        )

    def _query(self, query: DnsQueryC, query_id: int) -> dict[str, Any]:
        """The keys a query's answer or timeout carries (DnsQuery)."""
        group = query.group
        family = group.family
        return {
            "time": WallTime(self.context.wall_time(query.sent_ns)),
            **owner_json(self._owner(query, query.sock_ino)),
            "netns": group.netns,
            "netns_name": self.context.netns_name(group.netns),
            "proto": "tcp" if group.l4proto == _TCP else "udp",
            "family": family,
            "client": PacketTuple.address_text(family, bytes(query.client)) or "?",
            "client_port": query.client_port,
            "server": PacketTuple.address_text(family, bytes(group.server)) or "?",
            "server_port": group.server_port,
            "id": query_id,
            "name": name_from_wire(bytes(group.qname[: group.qname_len])),
            "qtype": type_name(group.qtype),
            "retransmits": query.retransmits,
            "pod": pod_ref(self.context.pod(group.netns)),
        }

    def _prepared_drop_enricher(self) -> DropEnricher:
        """Names for drops (reason, symbol, firewall rule). Made at the first poll, after attaching, like
        drops does: kallsyms is read and the traced namespace's firewall baseline taken before any drop."""
        from netsleuth.diagnostics.drops.enrich import DropEnricher

        assert self._reasons is not None
        if self._drop_enricher is None:
            self._drop_enricher = DropEnricher(self._reasons, context=self.context)
            self._drop_enricher.prepare(self.packet_filter.netns)
        return self._drop_enricher

    def _drop(self, event: DnsEvent, frames: tuple[int, ...], packet: bytes) -> DnsDrop:
        from netsleuth.diagnostics.drops.decode import RawDrop

        drop_enricher = self._prepared_drop_enricher()
        tuple_ = decode_tuple(event.tuple, event.tuple.l3_len)
        record = drop_enricher.enrich(
            RawDrop(
                monotonic_ns=event.time_ns,
                location=event.location,
                reason=event.reason,
                netns=event.netns,
                pid=event.pid,
                tid=event.tid,
                in_task=bool(event.in_task),
                kthread=bool(event.kthread),
                comm=event.comm.decode(errors="replace"),
                sock_ino=event.sock_ino,
                sk_state=None,
                ifindex=event.ifindex,
                ifname="",
                skb_len=event.tuple.l3_len,
                cpu=0,
                packet=tuple_,
                frames=frames,
                packet_bytes=packet,
            )
        )
        parsed = dns_in_packet(packet, tuple_.family, tuple_.proto)
        to_server = tuple_.dport == self.config.dns_port
        netfilter = record.netfilter or {}
        return dns_drop(
            time=WallTime(record.time),
            direction="query" if to_server else "answer",
            reason=record.reason,
            location=record.location,
            proto=tuple_.proto_name,
            saddr=tuple_.saddr,
            daddr=tuple_.daddr,
            sport=tuple_.sport,
            dport=tuple_.dport,
            id=parsed.id if parsed else None,
            name=parsed.qname if parsed else None,
            pid=record.pid,
            comm=record.comm,
            owner=record.owner,
            netns=record.netns,
            netns_name=record.netns_name,
            rule=netfilter.get("rule"),
            hook=netfilter.get("hook"),
            netfilter=record.netfilter or None,
        )

    def _remember_drop(self, drop: DnsDrop) -> None:
        if drop.id is None:
            return
        if drop.direction == "query":
            key = (drop.saddr, drop.sport or 0, drop.daddr, drop.id)
        else:
            key = (drop.daddr, drop.dport or 0, drop.saddr, drop.id)
        self._drops[key] = drop
        self._drops.move_to_end(key)
        while len(self._drops) > 4096:
            self._drops.popitem(last=False)

    def _drop_for(self, query: dict[str, Any]) -> DnsDrop | None:
        return self._drops.get((query["client"], query["client_port"], query["server"], query["id"]))

    def _answer(self, held: _HeldAnswer) -> DnsRecord | None:
        event = held.event
        query = self._query(event.query, event.id)
        drop = self._drop_for(query)
        if drop is not None and drop.direction == "answer" and query["proto"] == "udp":
            # The answer reached the socket and the kernel dropped it there: the process never saw it.
            return timeout_record(query, self.config.timeout * 1000, drop, event.latency_ns / 1e6)
        parsed = parse_answer(held.payload, event.rcode, event.flags_hi, 0)
        name = parsed.qname or query["name"]
        query["name"] = name
        if not self.config.name_wanted(name):
            return None
        answer_count = parsed.answer_count if parsed.complete else _ancount(held.payload)
        tcp_retry = False
        retry_key = (query["pid"], name.lower(), event.query.group.qtype)
        if parsed.truncated and query["proto"] == "udp":
            self._truncated[retry_key] = event.time_ns
            while len(self._truncated) > 1024:
                self._truncated.popitem(last=False)
        elif query["proto"] == "tcp":
            truncated_at = self._truncated.pop(retry_key, None)
            tcp_retry = truncated_at is not None and event.time_ns - truncated_at < _TCP_RETRY_WINDOW_NS
        return DnsAnswer(
            **query,
            latency_ms=round(event.latency_ns / 1e6, 3),
            rcode=rcode_name(parsed.rcode),
            answer_count=answer_count,
            answers=parsed.answers,
            truncated=parsed.truncated,
            tcp_retry=tcp_retry,
        )

    def _unmatched(self, event: DnsEvent, payload: bytes) -> DnsUnmatched | None:
        tuple_ = decode_tuple(event.tuple, event.tuple.l3_len)
        parsed = parse_answer(payload, event.rcode, event.flags_hi, 0)
        if not self.config.name_wanted(parsed.qname):
            return None
        owner = self.context.owner(OwnerFacts(None, "", 0, "", event.sock_ino))
        return DnsUnmatched(
            time=WallTime(self.context.wall_time(event.time_ns)),
            pid=owner.pid,
            comm=owner.comm,
            netns=event.netns,
            proto=tuple_.proto_name,
            client=tuple_.daddr or "?",
            client_port=tuple_.dport or 0,
            server=tuple_.saddr or "?",
            id=event.id,
            name=parsed.qname,
            rcode=rcode_name(parsed.rcode),
            late=(event.cookie, event.id) in self._timed_out,
        )

    def _decode(self, raw_records: Sequence[bytes], final: bool) -> list[DnsRecord]:
        records: list[DnsRecord] = []
        held_now: list[_HeldAnswer] = []
        for raw in raw_records:
            event = DnsEvent.from_buffer_copy(raw[:_EVENT_SIZE])
            frames_end = _EVENT_SIZE + 8 * event.nr_frames
            payload = raw[frames_end : frames_end + event.caplen]
            if event.kind == DnsEventKind.DROP:
                if self.config.summary:
                    continue  # counted in the kernel; naming it (kallsyms, firewall rules) serves no record
                frames = tuple(
                    int.from_bytes(raw[i : i + 8], "little") for i in range(_EVENT_SIZE, frames_end, 8)
                )
                drop = self._drop(event, frames, payload)
                if drop.reason in _BENIGN_DROPS:
                    continue
                self._remember_drop(drop)
                # A drop outside --netns (event.context) only explains timeouts; it is not a record.
                if not event.context and self.config.name_wanted(drop.name):
                    records.append(drop)
            elif event.kind == DnsEventKind.ANSWER:
                held_now.append(_HeldAnswer(event, payload, time.monotonic()))
            elif event.kind == DnsEventKind.UNMATCHED:
                unmatched = self._unmatched(event, payload)
                if unmatched is not None:
                    records.append(unmatched)
        # Answers from the previous round are settled now that their drops (if any) have arrived.
        settle, self._held = self._held, held_now
        if final:
            settle.extend(self._held)
            self._held = []
        for held in settle:
            record = self._answer(held)
            if record is None:
                continue
            if isinstance(record, DnsTimeout):
                self._counttimeout_record(bytes(held.event.query.group))
                if not self.config.keep_timeouts:
                    continue
            records.append(record)
        return records

    # -- timeouts --------------------------------------------------------------------------------------
    def _counttimeout_record(self, group_key: bytes) -> None:
        self._timeouts += 1
        self._group_timeouts[group_key] = self._group_timeouts.get(group_key, 0) + 1

    def _sweep(self, force: bool = False) -> list[DnsRecord]:
        """Pending queries older than --timeout: deleted from the kernel's table and reported. Whoever
        deletes the entry owns it, so an answer racing with the sweep is counted once (as unmatched)."""
        now = time.monotonic()
        if not force and now - self._last_sweep < self._sweep_interval:
            return []
        self._last_sweep = now
        if not self._program.started:
            return []
        pending = self._program.maps.pending
        deadline_ns = time.monotonic_ns() - int(self.config.timeout * 1e9)
        records: list[DnsRecord] = []
        for key_bytes, value_bytes in list(pending.items()):
            query = DnsQueryC.from_buffer_copy(value_bytes[:_QUERY_SIZE])
            if query.sent_ns > deadline_ns or not pending.delete(key_bytes):
                continue
            key = DnsPendingKey.from_buffer_copy(key_bytes)
            self._counttimeout_record(bytes(query.group))
            self._timed_out[(key.cookie, key.id)] = now
            while len(self._timed_out) > 4096:
                self._timed_out.popitem(last=False)
            if self.config.summary or not self.config.keep_timeouts:
                continue
            fields = self._query(query, key.id)
            if not self.config.name_wanted(fields["name"]):
                continue
            waited = (time.monotonic_ns() - query.sent_ns) / 1e6
            records.append(timeout_record(fields, waited, self._drop_for(fields), None))
        return records

    # -- the session protocol --------------------------------------------------------------------------
    @staticmethod
    def _in_time_order(records: list[DnsRecord]) -> list[DnsRecord]:
        # Answers are held one round (see _HeldAnswer) and drops are not: put each batch back in order.
        return sorted(records, key=lambda record: record.time)

    def poll(self, timeout_ms: int) -> list[DnsRecord]:
        if self._program.started:
            self._owners.refresh(self._program.maps)
            if not self.config.summary:
                self._prepared_drop_enricher()
        records = self._decode(self._program.poll(timeout_ms), final=False)
        if time.monotonic() - self._last_sweep >= self._sweep_interval:
            # What arrived while the batch above was being named is read first: a drop explaining a
            # timeout must be known before the sweep reports that timeout.
            records.extend(self._decode(self._program.drain(), final=False))
            records.extend(self._sweep())
        return self._in_time_order(records)

    def drain(self) -> list[DnsRecord]:
        """The run's last events: the programs stop first (every caller drains once, at its end), so the
        totals and groups read after it are final and agree."""
        self._program.stop()
        return self.catch_up()

    def catch_up(self) -> list[DnsRecord]:
        """Everything queued now, and the timeouts due, without ending the run (the agent's exporter, which
        never ends its run, reads so before each scrape)."""
        records = self._decode(self._program.drain(), final=True)
        records.extend(self._sweep(force=True))
        return self._in_time_order(records)

    def _counters(self) -> list[int]:
        return self._program.counter_sums(DnsMaps.dns_stats, DnsStat.COUNT)

    def totals(self) -> EventTotals:
        sums = self._counters()
        return EventTotals(
            seen=sums[DnsStat.SEEN],
            matched=sums[DnsStat.MATCHED],
            emitted=sums[DnsStat.EMITTED],
            sampled=sums[DnsStat.SAMPLED],
            lost=sums[DnsStat.LOST],
            ungrouped=sums[DnsStat.UNGROUPED],
        )

    def dns_totals(self) -> DnsTotals:
        sums = self._counters()
        return DnsTotals(
            events=self.totals(),
            queries=sums[DnsStat.QUERIES],
            answers=sums[DnsStat.ANSWERS],
            unmatched=sums[DnsStat.UNMATCHED],
            untracked=sums[DnsStat.UNTRACKED],
            retransmits=sums[DnsStat.RETRANSMITS],
            drops=sums[DnsStat.DROPS],
            timeouts=self._timeouts,
            filtered=sums[DnsStat.FILTERED],
        )

    def groups(self) -> list[DnsGroupStats]:
        """The kernel's groups, named, with the timeouts userspace found for each."""
        groups = []
        for key_bytes, value_bytes in self._program.entries(DnsMaps.dns_groups):
            key = DnsGroupKey.from_buffer_copy(key_bytes)
            value = DnsGroupValue.from_buffer_copy(value_bytes)
            query = DnsQueryC()
            query.group = key
            query.in_task = 1 if key.tgid else 0
            owner = self._owner(query, 0)
            groups.append(
                DnsGroupStats(
                    pid=owner.pid,
                    comm=owner.comm,
                    server=PacketTuple.address_text(key.family, bytes(key.server)) or "?",
                    server_port=key.server_port,
                    proto=key.l4proto,
                    netns=key.netns,
                    name=name_from_wire(bytes(key.qname[: key.qname_len])),
                    qtype=key.qtype,
                    queries=value.queries,
                    answers=value.answers,
                    retransmits=value.retransmits,
                    truncated=value.truncated,
                    rcodes={rcode: count for rcode, count in enumerate(value.rcodes) if count},
                    histogram=tuple(value.latency),
                    latency_sum_ns=value.latency_sum_ns,
                    timeouts=self._group_timeouts.get(key_bytes, 0),
                )
            )
        return [group for group in groups if self.config.name_wanted(group.name)]

    def summary(self, interrupted: bool) -> DnsSummary:
        self._program.stop()  # one read of stopped counters: the totals are the groups' sums
        totals = self.dns_totals()
        return DnsSummary(
            diagnostic="dns",
            **Summary.totals_fields(totals.events),
            filtered=totals.filtered,
            queries=totals.queries,
            answers=totals.answers,
            unmatched=totals.unmatched,
            untracked=totals.untracked,
            retransmits=totals.retransmits,
            dns_drops=totals.drops,
            timeouts=totals.timeouts,
            attach=self.attach_kind,
            interrupted=interrupted,
            clock=ClockPart(**self.context.clock.to_json()),
            rows=tuple(summary_rows(self.groups())),
        )

    def program_fds(self) -> dict[str, int]:
        return self._program.program_fds()

    def notes(self) -> list[str]:
        totals = self.dns_totals()
        notes = []
        if totals.untracked:
            notes.append(
                f"{totals.untracked} queries were not tracked (pending table full): no timeout for them"
            )
        if totals.events.ungrouped:
            notes.append(f"{totals.events.ungrouped} queries/answers did not fit the summary table")
        return notes

    def close(self) -> None:
        self._program.close()
        if self._cgroup_fd >= 0:
            os.close(self._cgroup_fd)
            self._cgroup_fd = -1
        if self._drop_enricher is not None:
            self._drop_enricher.close()
            self._drop_enricher = None
        if self._own_context and self._context is not None:
            self._context.close()  # a context made here (firewall matchers) is ours to close

    def __enter__(self) -> DnsDiagnostic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ancount(payload: bytes) -> int:
    return int.from_bytes(payload[6:8], "big") if len(payload) >= 8 else 0
