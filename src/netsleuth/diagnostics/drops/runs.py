"""The drops still pending in the kernel's per-CPU runs (bpf/drops.h struct drop_run), added to the groups
when they are read: the storm path counts a repeated kind of drop without touching the group hash map, and
the groups userspace reports stay exact.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from netsleuth._generated.drops_abi import DropGroupKey, DropGroupValue, DropRunC, DropsMaps
from netsleuth.bpf.skeleton import MapAttr

__all__ = ["groups_with_runs"]

_ATTEMPTS = 4


class _PerCpuMap(Protocol):
    def lookup_per_cpu(self, key: bytes) -> list[bytes]: ...


class _Maps(Protocol):
    @property
    def drop_runs(self) -> _PerCpuMap: ...


class _Programs(Protocol):
    """What is read of a running drops object (netsleuth.bpf.program_session.ProgramSession)."""

    @property
    def started(self) -> bool: ...

    @property
    def maps(self) -> _Maps: ...

    def entries(self, groups_map: MapAttr) -> Iterable[tuple[bytes, bytes]]: ...


def _runs(programs: _Programs) -> list[DropRunC]:
    per_cpu = programs.maps.drop_runs.lookup_per_cpu((0).to_bytes(4, "little"))
    return [DropRunC.from_buffer_copy(value) for value in per_cpu]


def groups_with_runs(programs: _Programs) -> list[tuple[DropGroupKey, DropGroupValue]]:
    """Every group with the runs not yet added to it. A run added while the groups were read (its CPU's
    `flushes` changed, or was odd: mid-flush) would count twice or not at all, so the read is repeated; a
    storm that flushes all the time on every attempt leaves the last read, off by at most one run per CPU
    until the storm ends (once the programs are quiet, every read is exact)."""
    if not programs.started:
        return []
    for _ in range(_ATTEMPTS):
        before = [run.flushes for run in _runs(programs)]
        entries = list(programs.entries(DropsMaps.drop_groups))
        runs = _runs(programs)
        if before == [run.flushes for run in runs] and all(run.flushes % 2 == 0 for run in runs):
            break
    pending: dict[tuple[int, int, int], tuple[int, int]] = {}
    for run in runs:
        if run.count:
            kind = (run.key.location, run.key.reason, run.key.netns)
            count, size = pending.get(kind, (0, 0))
            pending[kind] = (count + run.count, size + run.bytes)
    groups = []
    for key_bytes, value_bytes in entries:
        key = DropGroupKey.from_buffer_copy(key_bytes)
        value = DropGroupValue.from_buffer_copy(value_bytes)
        count, size = pending.get((key.location, key.reason, key.netns), (0, 0))
        value.count += count
        value.bytes += size
        groups.append((key, value))
    return groups
