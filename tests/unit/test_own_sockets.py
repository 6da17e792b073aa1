"""The hand-over of netsleuth's own netlink sockets from one run to the next (diagnostics/own_sockets.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from netsleuth.diagnostics.own_sockets import recent_own_sockets, remember_own_sockets


def test_a_run_leaves_its_sockets_to_the_next_and_forgets_old_ones(tmp_path: Path) -> None:
    remember_own_sockets([11, 12], tmp_path)
    remember_own_sockets([], tmp_path)  # nothing marked: no file
    assert len(list(tmp_path.iterdir())) == 1
    assert recent_own_sockets(tmp_path) == [11, 12]
    old = next(tmp_path.iterdir())
    os.utime(old, (time.time() - 120, time.time() - 120))
    assert recent_own_sockets(tmp_path) == [] and not old.exists()


def test_the_newest_runs_sockets_are_carried_first_whatever_their_cookies(tmp_path: Path) -> None:
    # The kernel hands cookies out in per-CPU batches (include/linux/cookie.h): a socket the last run opened
    # on one CPU can have a smaller cookie than one a run opened 30 s ago on another. Past the limit it is
    # the oldest runs' sockets that are left out, not the smallest cookies.
    remember_own_sockets([9000, 9001, 9002], tmp_path)
    older = next(tmp_path.iterdir())
    os.utime(older, (time.time() - 30, time.time() - 30))
    remember_own_sockets([5000, 5001], tmp_path)
    assert recent_own_sockets(tmp_path, limit=3) == [5000, 5001, 9000]
