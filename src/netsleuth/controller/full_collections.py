"""Python's full garbage collections held off while a large fleet session runs in the controller.

A 10,000-host session keeps millions of objects alive for its whole length (the hosts' views, every record
batch merged, the registry's entries beside them), and CPython runs a full collection each time the
long-lived objects grow by a quarter: every one walks all of them, held the event loop for up to 2.45 s
in bench/fleet_scale.py's 10,000-host run, and added up to 27.9 s of the session's 146 s (the controller's
/metrics: netsleuth_controller_gc_pause_seconds). Meanwhile nothing is read from NATS - the servers count
the controller a slow consumer, lease renewals and acks time out. Those collections find next to nothing
(the session's objects are alive until it ends), so while a large session runs only the young generations
are collected (a cycle of short-lived objects is still freed within a few thousand allocations); when the
last large session ends the thresholds are what they were, and the next full collection collects whatever
cycles reached the old generation meanwhile.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["held"]

_HELD_THRESHOLD = 1_000_000  # young-generation collections before a full one: never, for a session's length
_holders = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Full collections off while any holder is inside (sessions overlap: the last one out restores)."""
    global _holders, _saved
    if _holders == 0:
        _saved = gc.get_threshold()
        gc.set_threshold(_saved[0], _saved[1], _HELD_THRESHOLD)
    _holders += 1
    try:
        yield
    finally:
        _holders -= 1
        if _holders == 0 and _saved is not None:
            gc.set_threshold(*_saved)
            _saved = None
