"""Drops pending in the kernel's per-CPU runs are added to their groups when the groups are read."""

from __future__ import annotations

from collections.abc import Iterable

from netsleuth._generated.drops_abi import DropEvent, DropGroupKey, DropGroupValue, DropRunC, DropsMaps
from netsleuth.bpf.skeleton import MapAttr
from netsleuth.diagnostics.drops.runs import groups_with_runs


def _run(location: int, reason: int, netns: int, count: int, size: int, flushes: int) -> bytes:
    run = DropRunC(count=count, bytes=size, flushes=flushes)
    run.key = DropGroupKey(location=location, reason=reason, netns=netns)
    return bytes(run)


class _Runs:
    def __init__(self, reads: list[list[bytes]]) -> None:
        self.reads = reads

    def lookup_per_cpu(self, key: bytes) -> list[bytes]:
        assert key == bytes(4)
        return self.reads.pop(0) if len(self.reads) > 1 else self.reads[0]


class _Maps:
    def __init__(self, runs: _Runs) -> None:
        self.drop_runs = runs


class _Programs:
    def __init__(self, groups: list[tuple[bytes, bytes]], runs: _Runs) -> None:
        self.started = True
        self.groups = groups
        self.maps = _Maps(runs)
        self.group_reads = 0

    def entries(self, groups_map: MapAttr) -> Iterable[tuple[bytes, bytes]]:
        assert groups_map is DropsMaps.drop_groups
        self.group_reads += 1
        return list(self.groups)


def _group(location: int, reason: int, netns: int, count: int, size: int) -> tuple[bytes, bytes]:
    key = DropGroupKey(location=location, reason=reason, netns=netns)
    return bytes(key), bytes(DropGroupValue(count=count, bytes=size))


def test_pending_runs_of_every_cpu_are_added_to_their_group() -> None:
    cpus = [_run(0x10, 5, 7, 30, 3000, 2), _run(0x10, 5, 7, 12, 1200, 4)]
    programs = _Programs([_group(0x10, 5, 7, 100, 10_000), _group(0x20, 6, 7, 1, 60)], _Runs([cpus]))
    groups = groups_with_runs(programs)
    found = {(key.location, key.reason): (value.count, value.bytes) for key, value in groups}
    assert found == {(0x10, 5): (142, 14_200), (0x20, 6): (1, 60)}
    assert programs.group_reads == 1


def test_a_run_flushed_while_the_groups_were_read_makes_the_read_repeat() -> None:
    # First attempt: CPU 0 flushed between the two reads of its run (flushes 2 -> 4): read again.
    moving = [[_run(0x10, 5, 7, 30, 3000, 2)], [_run(0x10, 5, 7, 0, 0, 4)]]
    settled = [[_run(0x10, 5, 7, 0, 0, 4)]]
    programs = _Programs([_group(0x10, 5, 7, 130, 13_000)], _Runs(moving + settled))
    assert [value.count for _, value in groups_with_runs(programs)] == [130]
    assert programs.group_reads == 2


def test_a_run_caught_mid_flush_is_not_trusted() -> None:
    # An odd count of flushes: the CPU is adding its run to the group right now.
    programs = _Programs(
        [_group(0x10, 5, 7, 100, 0)],
        _Runs([[_run(0x10, 5, 7, 0, 0, 3)], [_run(0x10, 5, 7, 0, 0, 3)], [_run(0x10, 5, 7, 0, 0, 4)]]),
    )
    groups_with_runs(programs)
    assert programs.group_reads == 2


def test_nothing_is_read_before_the_programs_start() -> None:
    programs = _Programs([], _Runs([[]]))
    programs.started = False
    assert groups_with_runs(programs) == []


def test_groups_since_a_window_start_count_only_the_drops_after_it() -> None:
    """A fleet session's T0 (DropsDiagnostic.start_window): each group less its count and bytes then, and a
    group with no drop since left out."""
    from netsleuth.diagnostics.drops.decode import RawDropGroup, decode_event
    from netsleuth.diagnostics.drops.session import groups_since

    example = decode_event(DropEvent())
    now = [
        RawDropGroup(reason=2, location=100, netns=7, count=5, bytes=500, example=example),
        RawDropGroup(reason=2, location=200, netns=7, count=3, bytes=300, example=example),
        RawDropGroup(reason=3, location=100, netns=8, count=4, bytes=160, example=example),
    ]
    base = {(2, 100, 7): (2, 200), (2, 200, 7): (3, 300)}  # the third group began after the window did
    since = {(g.reason, g.location, g.netns): (g.count, g.bytes) for g in groups_since(now, base)}
    assert since == {(2, 100, 7): (3, 300), (3, 100, 8): (4, 160)}
    assert list(groups_since(now, {})) == now  # no window: every drop since attach
