"""tracefs: found where it is mounted, and a clear sentence where it cannot be (the mount itself is
exercised by tests/privileged/test_snoop.py on the real host)."""

from __future__ import annotations

from pathlib import Path

from netsleuth.kernel.tracefs import TracefsState, ensure_tracefs, trace_event_exists


def test_a_mounted_tracefs_is_used_as_it_is(tmp_path: Path) -> None:
    (tmp_path / "tracing" / "events" / "syscalls" / "sys_exit_openat").mkdir(parents=True)
    state = ensure_tracefs(target=tmp_path / "tracing", legacy=tmp_path / "absent")
    assert state == TracefsState(tmp_path / "tracing" / "events")
    assert state.note is None
    assert trace_event_exists(state.events, "syscalls/sys_exit_openat")
    assert not trace_event_exists(state.events, "syscalls/sys_exit_execve")
    assert not trace_event_exists(None, "syscalls/sys_exit_openat")


def test_a_kernel_before_4_1_has_it_under_debugfs_only(tmp_path: Path) -> None:
    (tmp_path / "debug" / "tracing" / "events" / "syscalls").mkdir(parents=True)
    state = ensure_tracefs(target=tmp_path / "absent", legacy=tmp_path / "debug" / "tracing")
    assert state == TracefsState(tmp_path / "debug" / "tracing" / "events")


def test_without_a_place_to_mount_it_the_problem_is_one_sentence(tmp_path: Path) -> None:
    state = ensure_tracefs(target=tmp_path / "tracing", legacy=tmp_path / "absent")
    assert state.events is None and not state.mounted_now
    assert state.problem == f"this kernel has no {tmp_path / 'tracing'} to mount tracefs on (CONFIG_TRACING)"


def test_the_note_says_what_was_changed() -> None:
    state = TracefsState(Path("/sys/kernel/tracing/events"), mounted_now=True)
    assert state.note == (
        "tracefs was not mounted: netsleuth mounted it on /sys/kernel/tracing (as mount -t tracefs would)"
    )
