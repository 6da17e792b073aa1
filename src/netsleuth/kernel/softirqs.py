"""The softirq vectors of this kernel, by the names /proc/softirqs gives them (softirq_to_name[]): read at run
time rather than kept in a table: a kernel's enums are read from that kernel, never copied."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path

from netsleuth.errors import UsageError

__all__ = ["softirq_names", "softirq_vector"]


def softirq_names(proc_softirqs: Path = Path("/proc/softirqs")) -> list[str]:
    """The vectors' names in vector order, as this kernel prints them: HI, TIMER, NET_TX, NET_RX, ... (a
    vector's number is its place here); [] when the file cannot be read."""
    try:
        lines = proc_softirqs.read_text().splitlines()
    except OSError:
        return []
    return [line.split(":", 1)[0].strip() for line in lines[1:] if ":" in line]


def softirq_vector(name: str, option: str, known: Sequence[str]) -> str:
    """`name` as this kernel names the vector (upper case); a UsageError naming the closest when it has none
    of that name (`option` is how the user gave it)."""
    upper = name.upper()
    if known and upper not in known:
        close = difflib.get_close_matches(upper, known, n=1)
        hint = f"did you mean {close[0]}?" if close else f"it has {', '.join(known)}"
        raise UsageError(f"{option} {name!r} is not a softirq of this kernel; {hint}")
    return upper
