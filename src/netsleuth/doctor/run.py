"""Measure: snapshot, wait `interval`, snapshot again, judge. The clock and the sleep are parameters so
tests run on recorded pairs without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from netsleuth.doctor.findings import Report
from netsleuth.doctor.napi_measure import NapiProbe, between, bpf_unusable
from netsleuth.doctor.rules import diagnose
from netsleuth.doctor.snapshot import Clock, collect_snapshot
from netsleuth.doctor.window import Window

__all__ = ["DEFAULT_INTERVAL", "measure", "run_doctor"]

DEFAULT_INTERVAL = 3.0


def measure(
    root: Path = Path("/"),
    netns: str | None = None,
    interval: float = DEFAULT_INTERVAL,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    bpf: bool = True,
) -> Window:
    """With `bpf`, NET_RX runs and NAPI polls are also measured in the kernel (when this process may load
    BPF and `root` is the running machine). The programs are attached first (about 0.25 s) and their
    counters read right before each snapshot, so the measurement covers the snapshots' window; it carries
    its own length and the kernel's time_squeeze read at the same moments."""
    problem = bpf_unusable(root, no_bpf=not bpf)
    probe = NapiProbe(netns) if problem is None else None
    napi = None
    try:
        if probe is not None:
            probe.start()
        first = probe.read() if probe is not None else None
        before = collect_snapshot(root, netns, clock)
        # Sleep what is left of the interval after the first read, so the window is `interval` long.
        remaining = interval - (clock() - before.taken_at)
        if remaining > 0:
            sleep(remaining)
        second = probe.read() if probe is not None else None
        after = collect_snapshot(root, netns, clock, settings_from=before)
        if first is not None and second is not None:
            napi = between(first, second)
    finally:
        if probe is not None:
            probe.close()
            problem = probe.problem
    return Window(before, after, napi=napi, napi_problem=problem)


def run_doctor(
    root: Path = Path("/"),
    netns: str | None = None,
    interval: float = DEFAULT_INTERVAL,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    bpf: bool = True,
) -> tuple[Window, Report]:
    window = measure(root, netns, interval, clock, sleep, bpf)
    return window, diagnose(window)
