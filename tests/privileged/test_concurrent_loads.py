"""Two sessions loading at the same time each get their own libbpf messages: the verifier refuses the same
program from two differently named copies, in two threads, round after round, and every error must name
only its own object (libbpf's "failed to load object '<path>'"), never the other's, never nothing."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import pytest

from netsleuth.bpf.errors import VerifierError
from netsleuth.bpf.object import BpfObject
from tests.privileged.bpf_sources import compile_test_programs

ROUNDS = 40


def test_concurrent_failing_loads_keep_their_own_messages(tmp_path: Path) -> None:
    refused = compile_test_programs(tmp_path)["refused"]
    copies = {name: tmp_path / f"{name}.bpf.o" for name in ("left", "right")}
    for copy in copies.values():
        shutil.copy(refused, copy)
    barrier = threading.Barrier(len(copies))
    problems: list[str] = []

    def worker(name: str) -> None:
        own, other = str(copies[name]), str(copies["right" if name == "left" else "left"])
        for round_number in range(ROUNDS):
            barrier.wait()
            with BpfObject(copies[name]) as bpf_object, pytest.raises(VerifierError) as caught:
                bpf_object.load(["refused"])
            text = "\n".join(caught.value.details)
            if own not in text or other in text:
                problems.append(f"{name} round {round_number}: {caught.value.details}")
            if "invalid mem access" not in caught.value.log:
                problems.append(f"{name} round {round_number}: verifier log {caught.value.log[-200:]!r}")

    threads = [threading.Thread(target=worker, args=(name,)) for name in copies]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not any(thread.is_alive() for thread in threads)
    assert problems == []
