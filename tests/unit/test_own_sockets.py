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
    assert recent_own_sockets(tmp_path) == {11, 12}
    old = next(tmp_path.iterdir())
    os.utime(old, (time.time() - 120, time.time() - 120))
    assert recent_own_sockets(tmp_path) == set() and not old.exists()
