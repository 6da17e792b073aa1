"""Python's cyclic garbage collector held off while a tracing command starts, and back on once it is attached.

Starting `netsleuth drops` imports about a hundred modules and defines their classes: tens of thousands of
objects that live as long as the process, and next to no garbage cycles. The collector's passes over them
(about thirty on the way to attaching) find nothing and cost several milliseconds of the time from exec to
attached. The run loop resumes collection as soon as the probes are attached (commands/_runloop.py), and the
CLI resumes it whatever happens when the command returns, so a long run always collects.
"""

from __future__ import annotations

import gc

__all__ = ["pause_collection", "paused", "resume_collection"]

_paused = False


def pause_collection() -> None:
    """Stop automatic collection until `resume_collection`; a no-op if something else already turned it off
    (that owner decides when it comes back)."""
    global _paused
    if gc.isenabled():
        gc.disable()
        _paused = True


def resume_collection() -> None:
    """Collection back on if `pause_collection` turned it off; safe to call any number of times."""
    global _paused
    if _paused:
        _paused = False
        gc.enable()


def paused() -> bool:
    return _paused
