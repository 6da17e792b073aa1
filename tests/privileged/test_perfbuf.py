"""PerfBuffer (the fallback for kernels without ring buffers) against the real kernel: records arrive intact,
and a full per-CPU buffer loses exactly what the program counted as lost, which is also exactly what the
kernel's PERF_RECORD_LOST reports to the consumer.

The program (tests/privileged/bpf/perf_emit.bpf.c) is compiled here (bpf_sources.py) and run with
BPF_PROG_TEST_RUN on CPU 0, so the test decides how many records are produced and where, with no traffic
and no waiting.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pytest

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import last_errno_error
from netsleuth.bpf.object import BpfObject, _map_type
from netsleuth.bpf.perfbuf import PerfBuffer, retire_ring_buffer_map
from netsleuth.bpf.ringbuf import RingBuffer
from tests.privileged.bpf_sources import compile_test_programs

RECORD_BYTES = 248  # struct record
EMITTED, LOST = 0, 1
_BPF_F_TEST_RUN_ON_CPU = 1


class _TestRunOpts(ctypes.Structure):
    # struct bpf_test_run_opts (libbpf bpf.h, 1.0+)
    _fields_ = (
        ("sz", ctypes.c_size_t),
        ("data_in", ctypes.c_void_p),
        ("data_out", ctypes.c_void_p),
        ("data_size_in", ctypes.c_uint32),
        ("data_size_out", ctypes.c_uint32),
        ("ctx_in", ctypes.c_void_p),
        ("ctx_out", ctypes.c_void_p),
        ("ctx_size_in", ctypes.c_uint32),
        ("ctx_size_out", ctypes.c_uint32),
        ("retval", ctypes.c_uint32),
        ("repeat", ctypes.c_int),
        ("duration", ctypes.c_uint32),
        ("flags", ctypes.c_uint32),
        ("cpu", ctypes.c_uint32),
        ("batch_size", ctypes.c_uint32),
    )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return compile_test_programs(tmp_path_factory.mktemp("bpf"))


@pytest.fixture
def loaded(compiled: dict[str, Path]) -> Iterator[BpfObject]:
    with BpfObject(compiled["perf_emit"]) as bpf_object:
        bpf_object.load(["perf_emit"])
        yield bpf_object


def _run_on_cpu0(bpf_object: BpfObject, sequence: int, program: str = "perf_emit") -> None:
    """One run of `program` on CPU 0 with args[0] = sequence: one record offered to CPU 0's buffer."""
    args = (ctypes.c_uint64 * 1)(sequence)
    opts = _TestRunOpts(sz=ctypes.sizeof(_TestRunOpts), flags=_BPF_F_TEST_RUN_ON_CPU, cpu=0)
    opts.ctx_in = ctypes.addressof(args)
    opts.ctx_size_in = ctypes.sizeof(args)
    if _libbpf.lib().bpf_prog_test_run_opts(bpf_object.program_fd(program), ctypes.byref(opts)) != 0:
        raise last_errno_error("BPF_PROG_TEST_RUN failed")


def _count(bpf_object: BpfObject, which: int) -> int:
    value = bpf_object.map("counts").lookup(which.to_bytes(4, "little"))
    assert value is not None
    return int.from_bytes(value, "little")


def _sequence(record: bytes) -> int:
    return int.from_bytes(record[:8], "little")


def test_records_arrive_whole_and_in_order(loaded: BpfObject) -> None:
    with PerfBuffer(loaded.map("events").fd) as perf:
        for sequence in range(200):
            _run_on_cpu0(loaded, sequence)
        records = perf.poll(1000) + perf.drain()
    assert [_sequence(record) for record in records] == list(range(200))
    # perf pads the raw data so that its u32 size plus the data is a multiple of 8 (perf_prepare_sample):
    # 4 + 248 -> 256, so each record carries 4 trailing bytes the decoder must ignore (perfbuf.py).
    assert {len(record) for record in records} == {RECORD_BYTES + 4}
    assert all(record[8] == 0xAB for record in records)
    assert (_count(loaded, EMITTED), _count(loaded, LOST), perf.lost) == (200, 0, 0)


def test_a_full_buffer_loses_what_the_program_counted(loaded: BpfObject) -> None:
    offered = 100
    # One page per CPU holds 15 records of 248 + 8 (perf header) bytes, not 100.
    with PerfBuffer(loaded.map("events").fd, pages_per_cpu=1) as perf:
        for sequence in range(offered):
            _run_on_cpu0(loaded, sequence)
        first = perf.poll(1000) + perf.drain()
        emitted, lost = _count(loaded, EMITTED), _count(loaded, LOST)
        assert 0 < len(first) < offered
        assert emitted == len(first) and emitted + lost == offered
        assert [_sequence(record) for record in first] == list(range(len(first)))
        # The kernel reports its own loss count in a PERF_RECORD_LOST written before the next record that
        # fits; it must equal what the program counted, event for event.
        _run_on_cpu0(loaded, offered)
        last = perf.poll(1000) + perf.drain()
    assert [_sequence(record) for record in last] == [offered]
    assert perf.lost == lost and perf.lost_by_cpu == {0: lost}


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="power of two"):
        PerfBuffer(0, pages_per_cpu=3)
    with pytest.raises(Exception, match="cannot open the BPF perf buffers"):
        PerfBuffer(-1)


class _UsePerf(ctypes.Structure):
    _fields_ = (("value", ctypes.c_uint8),)


@pytest.mark.parametrize("use_perf", [False, True], ids=["ring-buffer", "perf-buffer-forced"])
def test_one_object_loads_with_either_buffer(compiled: dict[str, Path], use_perf: bool) -> None:
    with BpfObject(compiled["ring_or_perf"]) as bpf_object:
        bpf_object.set_rodata("use_perf", _UsePerf(int(use_perf)))
        if use_perf:
            retire_ring_buffer_map(bpf_object)
        bpf_object.load(["ring_or_perf"])
        # BPF_MAP_TYPE_ARRAY when retired: no ring buffer was created, as on a kernel without them.
        assert _map_type(bpf_object.map("events").fd) == (2 if use_perf else 27)
        consumer: PerfBuffer | RingBuffer = (
            PerfBuffer(bpf_object.map("events_perf").fd)
            if use_perf
            else RingBuffer(bpf_object.map("events").fd)
        )
        try:
            for sequence in range(50):
                _run_on_cpu0(bpf_object, sequence, "ring_or_perf")
            records = consumer.poll(1000) + consumer.drain()
        finally:
            consumer.close()
        assert [_sequence(record) for record in records] == list(range(50))
        assert all(int.from_bytes(record[8:16], "little") == 0x6E6574736C657568 for record in records)
        assert (_count(bpf_object, EMITTED), _count(bpf_object, LOST)) == (50, 0)
        with pytest.raises(Exception, match="before load"):
            retire_ring_buffer_map(bpf_object)
