"""The storm every drops benchmark sends: bench/udpflood.c built here, run on one CPU inside a lab host, timed
by its own clock. Each sendto() it makes is refused after exactly one NETFILTER_DROP (an iptables OUTPUT DROP
in its namespace), so drops/s = refusals / the sender's seconds.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SENDER_CPU", "TRACER_CPU", "Storm", "build_sender", "storm", "timed_storm"]

REPO = Path(__file__).resolve().parents[1]
# The storm's sender (and so the traced kernel path) on one CPU, every tracer's userspace on the other: the
# comparison is of in-kernel cost and consumer efficiency, not of who wins a shared core.
SENDER_CPU, TRACER_CPU = "1", "0"


@dataclass(frozen=True)
class Storm:
    """A storm as its sender (bench/udpflood.c) reports it."""

    drops: int
    seconds: float  # first to last send, by the sender's clock
    pid: int  # the sender: every drop of the storm happens in its context, so tracers report it as the owner

    @property
    def rate(self) -> float:
        return self.drops / self.seconds


def build_sender(directory: Path) -> str:
    binary = directory / "udpflood"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(REPO / "bench" / "udpflood.c")], check=True)
    return str(binary)


def timed_storm(host_argv: Callable[..., list[str]], sender: str, dst: str, count: int) -> Storm:
    """`count` drops as fast as one CPU sends them, timed by the sender's own clock."""
    argv = host_argv("taskset", "-c", SENDER_CPU, sender, dst, "9", str(count))
    result = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    assert result["refused"] == count, result
    return Storm(int(result["refused"]), float(result["seconds"]), int(result["pid"]))


def storm(host_argv: Callable[..., list[str]], sender: str, dst: str, count: int) -> float:
    return timed_storm(host_argv, sender, dst, count).rate
