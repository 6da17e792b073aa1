"""libbpf's warnings belong to the call that caused them: captured per thread, so concurrent sessions (agent
sessions load in threads) never clear or read each other's explanation."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from netsleuth.bpf import _libbpf
from netsleuth.bpf.errors import BpfError
from netsleuth.bpf.object import BpfObject

ROUNDS = 300


def _open_failure(path: Path) -> BpfError:
    with pytest.raises(BpfError) as caught:
        BpfObject(path)
    return caught.value


def test_error_carries_libbpf_warning() -> None:
    error = _open_failure(Path("/nonexistent/netsleuth-a.bpf.o"))
    assert "No such file or directory" in str(error)
    assert error.details == [
        "libbpf: elf: failed to open /nonexistent/netsleuth-a.bpf.o: No such file or directory"
    ]


def test_concurrent_failures_each_carry_only_their_own_messages() -> None:
    # Two threads fail to open different objects as fast as they can, in lock step: with one process-global
    # list, one thread's capture would hold the other's line or have been cleared by it.
    barrier = threading.Barrier(2)
    mixed: list[str] = []

    def worker(name: str) -> None:
        for round_number in range(ROUNDS):
            barrier.wait()
            path = Path(f"/nonexistent/{name}-{round_number}.bpf.o")
            error = _open_failure(path)
            if error.details != [f"libbpf: elf: failed to open {path}: No such file or directory"]:
                mixed.append(f"{name} round {round_number}: {error.details}")

    threads = [threading.Thread(target=worker, args=(name,)) for name in ("left", "right")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads)
    assert mixed == []


def test_captures_nest_and_nothing_is_kept_outside_one() -> None:
    with _libbpf.capture_messages() as outer:
        with _libbpf.capture_messages() as inner:
            _open_failure(Path("/nonexistent/inner.bpf.o"))
        # BpfObject opened its own capture inside `inner`: the message went there, not to the enclosing ones.
        assert inner == [] and outer == []
        _libbpf.lib().bpf_object__open_file(b"/nonexistent/direct.bpf.o", None)
    assert outer == ["libbpf: elf: failed to open /nonexistent/direct.bpf.o: No such file or directory"]
    # With no capture open the callback drops the line (nobody would report it) instead of growing a list.
    _libbpf.lib().bpf_object__open_file(b"/nonexistent/nobody.bpf.o", None)
    assert _libbpf._captures.stack == []
