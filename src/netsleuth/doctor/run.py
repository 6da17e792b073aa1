"""Measure: snapshot, wait `interval`, snapshot again, judge. The clock and the sleep are parameters so
tests run on recorded pairs without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from netsleuth.doctor.findings import Report
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
) -> Window:
    before = collect_snapshot(root, netns, clock)
    # Sleep what is left of the interval after the first read, so the window is `interval` long.
    remaining = interval - (clock() - before.taken_at)
    if remaining > 0:
        sleep(remaining)
    after = collect_snapshot(root, netns, clock, settings_from=before)
    return Window(before, after)


def run_doctor(
    root: Path = Path("/"),
    netns: str | None = None,
    interval: float = DEFAULT_INTERVAL,
    clock: Clock = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Window, Report]:
    window = measure(root, netns, interval, clock, sleep)
    return window, diagnose(window)
