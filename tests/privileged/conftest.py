"""Fixtures for privileged tests: a two-host lab, the C flood sender compiled once per session,
kernel.bpf_stats_enabled set for a test and restored, and a container runtime of the test's own with the pod
image built once per session (tests/cri_lab.py)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cri_lab import CriLab, build_pause_image, runtime_for_tests
from tests.netlab import Host, Lab

REPO = Path(__file__).resolve().parents[2]
BPF_STATS = Path("/proc/sys/kernel/bpf_stats_enabled")


@dataclass
class Pair:
    """Two hosts on one veth: a = 198.18.0.1 / 2001:db8::1, b = 198.18.0.2 / 2001:db8::2."""

    lab: Lab
    a: Host
    b: Host
    a4: str = "198.18.0.1"
    b4: str = "198.18.0.2"
    a6: str = "2001:db8::1"
    b6: str = "2001:db8::2"


@pytest.fixture
def pair() -> Iterator[Pair]:
    lab = Lab()
    try:
        a, b = lab.host("a"), lab.host("b")
        lab.link(a, b, ["198.18.0.1/24", "2001:db8::1/64"], ["198.18.0.2/24", "2001:db8::2/64"])
        yield Pair(lab, a, b)
    finally:
        lab.close()


@pytest.fixture(scope="session")
def udpflood(tmp_path_factory: pytest.TempPathFactory) -> str:
    binary = tmp_path_factory.mktemp("bin") / "udpflood"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(REPO / "bench" / "udpflood.c")], check=True)
    return str(binary)


@pytest.fixture
def bpf_stats_sysctl() -> Iterator[Callable[[str], None]]:
    """Set kernel.bpf_stats_enabled as the agent unit's ExecStartPre does; the original value is restored."""
    original = BPF_STATS.read_text().strip()

    def set_to(value: str) -> None:
        BPF_STATS.write_text(value)

    try:
        yield set_to
    finally:
        BPF_STATS.write_text(original)


@pytest.fixture(scope="session")
def pause_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_pause_image(tmp_path_factory.mktemp("pause-image"))


@pytest.fixture(scope="module")
def cri(pause_image: Path) -> Iterator[CriLab]:
    with runtime_for_tests(pause_image) as lab:
        yield lab
