"""`drops` on the paths of older kernels, forced on this one (issue 13 item 6): events through per-CPU perf
buffers (no ring buffer before 5.8), reasons inferred from the drop location because skb:kfree_skb's
`reason` is not read (it has none before 5.17), raw_tp instead of tp_btf, and the current task found
without bpf_get_current_task_btf (5.11) - each against real drops in a namespace, whose count the firewall
rule's own nftables counter gives independently."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from netsleuth.bpf import _libbpf
from netsleuth.diagnostics.drops.decode import RawDrop
from netsleuth.diagnostics.drops.program import FALLBACK_ENV, DropsProgramConfig, DropsSession
from netsleuth.diagnostics.drops.records import DropRecord
from netsleuth.diagnostics.drops.session import DropsDiagnostic
from netsleuth.diagnostics.filters import PacketFilter
from netsleuth.kernel.inferred_reasons import infer_reason
from netsleuth.kernel.reasons import load_drop_reasons
from tests.netlab import Host, wait_for
from tests.privileged.conftest import Pair
from tests.privileged.test_drops import tcp_connect, udp
from tests.tracerun import TraceRun, netsleuth_argv

_TABLE = "netsleuth_test_fallback"


def _drop_udp_ports(host: Host, *ports: int) -> Callable[[], int]:
    """An nftables input rule with a counter dropping UDP to `ports`; returns a reader of that counter."""
    wanted = ", ".join(str(port) for port in ports)
    host.run(
        "nft",
        "-f",
        "-",
        input_text=(
            f"table inet {_TABLE} {{\n"
            f"  chain input {{ type filter hook input priority 0; udp dport {{ {wanted} }} counter drop; }}\n"
            "}\n"
        ),
    )

    def packets() -> int:
        for line in host.run("nft", "list", "table", "inet", _TABLE).stdout.splitlines():
            if "counter packets" in line:
                return int(line.split("counter packets", 1)[1].split()[0])
        raise AssertionError("the drop rule's counter is gone")

    return packets


def _collect(session: DropsSession, drops: list[RawDrop], until: Callable[[], bool], what: str) -> None:
    def done() -> bool:
        drops.extend(session.poll(50))
        return until()

    wait_for(done, 15, what)


def test_perf_buffer_delivers_every_drop_with_exact_totals(pair: Pair) -> None:
    dropped = _drop_udp_ports(pair.b, 6201)
    config = DropsProgramConfig(packet_filter=PacketFilter(netns=pair.b.inode, dport=6201), perf_buffer=True)
    with DropsSession(config, load_drop_reasons()) as session:
        session.start()
        assert session.buffer == "perf"
        udp(pair.a, pair.b4, 6201, count=300)
        wait_for(lambda: dropped() == 300, 10, "nftables to count 300 drops")
        drops: list[RawDrop] = []
        _collect(session, drops, lambda: len(drops) >= session.totals().emitted >= 300, "300 events")
        drops.extend(session.drain())
        totals = session.totals()
        assert session.perf_lost == 0
    # The kernel's counters, not the events that arrived, are the totals; here every event arrived too.
    assert totals.matched == dropped() == 300
    assert totals.emitted == len(drops) == 300 and totals.lost == 0 and totals.sampled == 0
    assert {(raw.packet.dport, raw.packet.saddr) for raw in drops} == {(6201, pair.a4)}


def test_perf_buffer_losses_are_counted_and_equal_the_kernels(pair: Pair) -> None:
    dropped = _drop_udp_ports(pair.b, 6202)
    # Large events (a stack and 2 KB of packet each, ~2.5 KB) not read while 1500 drops happen: far more
    # than the 256 KiB each CPU's perf buffer holds.
    config = DropsProgramConfig(
        packet_filter=PacketFilter(netns=pair.b.inode, dport=6202), stack=True, snaplen=2048, perf_buffer=True
    )
    sent = 1500
    with DropsSession(config, load_drop_reasons()) as session:
        session.start()
        udp(pair.a, pair.b4, 6202, count=sent)
        wait_for(lambda: dropped() == sent, 15, f"nftables to count {sent} drops")
        drops = session.drain()
        # The kernel reports a CPU's losses before the next record that fits there: send until it has told
        # the consumer every loss the program counted (a drop may land on the other CPU).
        deadline = time.monotonic() + 15
        while session.perf_lost != session.totals().lost and time.monotonic() < deadline:
            udp(pair.a, pair.b4, 6202)
            sent += 1
            _collect(session, drops, lambda: len(drops) >= session.totals().emitted, "the events")
        totals = session.totals()
        perf_lost = session.perf_lost
    assert totals.lost > 0, "the perf buffers never overflowed"
    assert perf_lost == totals.lost
    assert totals.matched == dropped() == sent
    assert totals.matched == totals.emitted + totals.lost + totals.sampled and totals.sampled == 0
    assert totals.emitted == len(drops)


def _matched_at_one_moment(first: DropsDiagnostic, second: DropsDiagnostic) -> tuple[int, int]:
    """Both exact totals with no drop counted in between: the namespace keeps dropping now and then on its
    own (IPv6 neighbour traffic, NOT_SPECIFIED), so totals read a moment apart can differ by one."""
    deadline = time.monotonic() + 10
    while True:
        before = first.totals().matched
        other = second.totals().matched
        if first.totals().matched == before or time.monotonic() > deadline:
            return before, other


def _records(diagnostic: DropsDiagnostic, records: list[DropRecord], until: Callable[[], bool]) -> None:
    def done() -> bool:
        records.extend(diagnostic.poll(50))
        return until()

    wait_for(done, 15, "the drops")


def test_inferred_reasons_are_the_kernels_and_marked(pair: Pair) -> None:
    """Two runs on the same drops: one reads the kernel's reason, one ignores it as on 5.4-5.16 and infers
    it from the location. Every reason must agree, and only the second marks its reasons inferred."""
    dropped = _drop_udp_ports(pair.b, 6301)
    netns = PacketFilter(netns=pair.b.inode)
    given = DropsDiagnostic(DropsProgramConfig(packet_filter=netns))
    inferred = DropsDiagnostic(DropsProgramConfig(packet_filter=netns, kernel_reasons=False))
    try:
        given.start()
        inferred.start()
        assert not given.raw.reasons_inferred and inferred.raw.reasons_inferred
        # The namespace drops now and then on its own: one such drop between the two attaches is counted by
        # the first program only, so the totals are compared from a moment both were attached.
        given_before, inferred_before = _matched_at_one_moment(given, inferred)
        udp(pair.a, pair.b4, 6301, count=5)  # the firewall
        udp(pair.a, pair.b4, 6302, count=3)  # no UDP socket, IPv4 and IPv6
        udp(pair.a, pair.b6, 6302, count=3)
        tcp_connect(pair.a, pair.b4, 6303)  # no TCP socket
        ours = {6301, 6302, 6303}
        by_kernel: list[DropRecord] = []
        by_location: list[DropRecord] = []

        def mine(records: list[DropRecord]) -> list[DropRecord]:
            return [record for record in records if record.dport in ours]

        _records(given, by_kernel, lambda: len(mine(by_kernel)) >= 12)
        _records(inferred, by_location, lambda: len(mine(by_location)) >= 12)
        inferred_summary = inferred.summary(interrupted=False)
        # The program did not read the kernel's reason: its groups (and events) carry none.
        assert {group.reason for group in inferred.raw.groups()} == {0}
        assert 0 not in {group.reason for group in given.raw.groups()}
        given_matched, inferred_matched = _matched_at_one_moment(given, inferred)
    finally:
        given.close()
        inferred.close()
    assert dropped() == 5
    assert given_matched - given_before == inferred_matched - inferred_before >= 12
    kernel_reasons = {(r.dport, r.family, r.location, r.reason) for r in mine(by_kernel)}
    inferred_reasons = {(r.dport, r.family, r.location, r.reason) for r in mine(by_location)}
    assert inferred_reasons == kernel_reasons
    assert {reason for *_, reason in inferred_reasons} == {"NETFILTER_DROP", "NO_SOCKET"}
    assert all(r.reason_inferred and r.to_json()["reason_inferred"] is True for r in by_location)
    assert not any(r.reason_inferred or "reason_inferred" in r.to_json() for r in by_kernel)
    # The firewall rule is still named when the reason is inferred (the stack gives the hook).
    firewall = [r for r in mine(by_location) if r.reason == "NETFILTER_DROP"]
    assert firewall and all(r.netfilter and r.netfilter["hook"] == "input" for r in firewall)
    summary = inferred_summary.to_json()
    assert summary["reasons_inferred"] is True
    assert summary["groups"] and all(group["reason_inferred"] is True for group in summary["groups"])
    for group in summary["groups"]:
        assert group["reason"] == infer_reason(group["location"])


def _env(monkeypatch: pytest.MonkeyPatch, fallbacks: str) -> None:
    # TraceRun's `netsleuth` inherits this process's environment.
    monkeypatch.setenv(FALLBACK_ENV, fallbacks)


def test_command_with_every_fallback_forced(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    """`netsleuth drops` as a 5.5 - 5.7 kernel would run it: raw_tp, perf buffers, no reasons, no
    bpf_get_current_task_btf."""
    _env(monkeypatch, "perf-buffer,no-reason,raw-tp,no-task-btf")
    dropped = _drop_udp_ports(pair.b, 6401)
    with TraceRun("drops", "--netns", pair.b.name, "--dport", "6401") as trace:
        trace.wait_ready()
        udp(pair.a, pair.b4, 6401, count=200)
        wait_for(lambda: dropped() == 200, 10, "nftables to count 200 drops")
        trace.wait_records(lambda r: r.get("type") == "drop", count=200)
        assert trace.stop() == 0
        drops = trace.drops()
        summary = trace.summary()
        stderr = trace.stderr()
    assert len(drops) == 200
    assert all(d["reason"] == "NETFILTER_DROP" and d["reason_inferred"] is True for d in drops)
    assert all(d["netfilter"]["hook"] == "input" for d in drops)
    assert summary["attach"] == "raw_tp" and summary["reasons_inferred"] is True
    assert (summary["total"], summary["emitted"], summary["lost"], summary["sampled"]) == (200, 200, 0, 0)
    assert [(g["reason"], g["count"], g["reason_inferred"]) for g in summary["groups"]] == [
        ("NETFILTER_DROP", 200, True)
    ]
    assert "inferred from where each packet was freed" in stderr and "perf buffers" in stderr


def test_text_output_marks_inferred_reasons(pair: Pair, monkeypatch: pytest.MonkeyPatch) -> None:
    _env(monkeypatch, "no-reason")
    dropped = _drop_udp_ports(pair.b, 6501)
    with TraceRun("drops", "--netns", pair.b.name, "--dport", "6501", json_output=False) as trace:
        trace.wait_ready()
        udp(pair.a, pair.b4, 6501, count=2)
        wait_for(lambda: dropped() == 2, 10, "nftables to count 2 drops")
        wait_for(lambda: trace.stdout().count("NETFILTER_DROP (inferred)") >= 2, 10, "2 marked lines")
        assert trace.stop() == 0
        stdout = trace.stdout()
    lines = [line for line in stdout.splitlines() if "NETFILTER_DROP" in line]
    # Two event lines and the summary table's row: never the bare name, always marked.
    assert len(lines) == 3 and all("NETFILTER_DROP (inferred)" in line for line in lines), stdout
    assert "2 drops" in stdout


@pytest.mark.parametrize(
    ("fallbacks", "arguments", "message"),
    [
        ("no-reason", ("--reason", "NETFILTER_DROP"), "--reason and --exclude-reason select the kernel's"),
        ("no-reason", ("--exclude-reason", "NO_SOCKET"), "inferred from where each packet was freed"),
        ("perf-buffer,ringless", (), "unknown fallback 'ringless'"),
    ],
)
def test_bad_combinations_are_one_sentence(
    monkeypatch: pytest.MonkeyPatch, fallbacks: str, arguments: tuple[str, ...], message: str
) -> None:
    _env(monkeypatch, fallbacks)
    result = subprocess.run(
        netsleuth_argv("drops", "--duration", "1", *arguments), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def _attaches_as_two_argument_tracepoint(session: DropsSession) -> bool:
    """Does the loaded raw_tp program attach to skb:consume_skb, whose (skb, location) is exactly
    skb:kfree_skb's prototype before 5.17? The kernel refuses a raw_tp program that reads a context argument
    the tracepoint does not pass (bpf_probe_register: max_ctx_offset > num_args * 8, EINVAL)."""
    fd = session.program_fds()["drops_raw_tp"]
    link = _libbpf.lib().bpf_raw_tracepoint_open(b"consume_skb", fd)
    if link < 0:
        assert ctypes.get_errno() == 22, os.strerror(ctypes.get_errno())  # EINVAL: it reads too far
        return False
    os.close(link)
    return True


def test_without_reasons_the_program_reads_only_what_old_kernels_pass(pair: Pair) -> None:
    netns = PacketFilter(netns=pair.b.inode)
    reasons = load_drop_reasons()
    with DropsSession(DropsProgramConfig(packet_filter=netns, raw_tp_only=True), reasons) as reading:
        reading.start()
        assert not _attaches_as_two_argument_tracepoint(reading)  # it reads reason (and rx_sk)
    config = DropsProgramConfig(packet_filter=netns, raw_tp_only=True, kernel_reasons=False, perf_buffer=True)
    with DropsSession(config, reasons) as old_kernel:
        old_kernel.start()
        assert old_kernel.attach_kind == "raw_tp"
        assert _attaches_as_two_argument_tracepoint(old_kernel)


def _bpftool(*argv: str) -> dict[str, object]:
    result = subprocess.run(["bpftool", "-j", *argv], capture_output=True, text=True, check=True)
    loaded: dict[str, object] = json.loads(result.stdout)
    return loaded


def test_with_perf_buffers_the_loaded_program_uses_no_ring_buffer(pair: Pair) -> None:
    """What a kernel before 5.8 could not create is gone from the loaded program: no ring buffer map."""
    config = DropsProgramConfig(packet_filter=PacketFilter(netns=pair.b.inode), perf_buffer=True)
    with DropsSession(config, load_drop_reasons()) as session:
        session.start()
        fd = session.program_fds()[f"drops_{session.attach_kind}"]
        fdinfo = (Path("/proc/self/fdinfo") / str(fd)).read_text()
        prog_id = next(line.split()[1] for line in fdinfo.splitlines() if line.startswith("prog_id:"))
        map_ids = _bpftool("prog", "show", "id", prog_id)["map_ids"]
        assert isinstance(map_ids, list)
        types = {str(_bpftool("map", "show", "id", str(map_id))["type"]) for map_id in map_ids}
    assert "perf_event_array" in types and "ringbuf" not in types, types


def _xlated(session: DropsSession) -> str:
    fd = session.program_fds()[f"drops_{session.attach_kind}"]
    fdinfo = (Path("/proc/self/fdinfo") / str(fd)).read_text()
    prog_id = next(line.split()[1] for line in fdinfo.splitlines() if line.startswith("prog_id:"))
    return subprocess.run(
        ["bpftool", "prog", "dump", "xlated", "id", prog_id], capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.parametrize("raw_tp", [False, True], ids=["tp_btf", "raw_tp"])
def test_without_task_btf_owners_are_still_told_apart(pair: Pair, raw_tp: bool) -> None:
    """Before 5.11 there is no bpf_get_current_task_btf: the program finds the task with
    bpf_get_current_task and copies its fields, and must still tell a drop in the sender's own syscall
    (OUTPUT: the task owns it) from one in softirq (INPUT: the kernel)."""
    pair.a.run("iptables", "-A", "OUTPUT", "-p", "udp", "--dport", "6701", "-j", "DROP")
    pair.b.run("iptables", "-A", "INPUT", "-p", "udp", "--dport", "6702", "-j", "DROP")
    reasons = load_drop_reasons()
    sessions: dict[int, DropsDiagnostic] = {}
    records: dict[int, list[DropRecord]] = {6701: [], 6702: []}
    try:
        for host, port in ((pair.a, 6701), (pair.b, 6702)):
            packets = PacketFilter(netns=host.inode, dport=port)
            config = DropsProgramConfig(packet_filter=packets, current_task_btf=False, raw_tp_only=raw_tp)
            sessions[port] = diagnostic = DropsDiagnostic(config, reasons=reasons)
            diagnostic.start()
            assert diagnostic.attach_kind == ("raw_tp" if raw_tp else "tp_btf")
            helpers = _xlated(diagnostic.raw)
            assert "bpf_get_current_task#" in helpers and "bpf_get_current_task_btf" not in helpers
        udp(pair.a, pair.b4, 6701, count=2)
        udp(pair.a, pair.b4, 6702, count=2)
        for port, diagnostic in sessions.items():
            _records_of(diagnostic, records[port], 2)
            assert diagnostic.totals().matched == 2
    finally:
        for diagnostic in sessions.values():
            diagnostic.close()
    assert all(r.owner == "task" and r.comm.startswith("python") for r in records[6701])
    assert all(r.owner == "kernel" and r.pid is None for r in records[6702])


def _records_of(diagnostic: DropsDiagnostic, records: list[DropRecord], count: int) -> None:
    _records(diagnostic, records, lambda: len(records) >= count)


def test_by_default_the_program_uses_task_btf_here(pair: Pair) -> None:
    with DropsSession(
        DropsProgramConfig(packet_filter=PacketFilter(netns=pair.b.inode)), load_drop_reasons()
    ) as session:
        session.start()
        assert "bpf_get_current_task_btf" in _xlated(session)
