"""Wall times as records show them: `iso_time`, and `IsoTimes` for event storms (the same text, with the date
and time of day formatted once per second).

`iso_time` builds a datetime per event; a storm of drops all falls within a
few seconds, so `IsoTimes` keeps the `YYYY-MM-DDTHH:MM:SS` of the last seconds and only appends the
microseconds. The rounding is datetime's own (round half to even of the fraction in microseconds, carrying
into the next second), so the text is identical; tests/unit/test_drops_fast_path.py compares both over many
timestamps.
"""

from __future__ import annotations

import datetime
import math

__all__ = ["IsoTimes", "iso_time"]

_UTC = datetime.UTC
_SUFFIX = "+00:00"


def iso_time(seconds: float) -> str:
    """Seconds since the epoch as ISO 8601 in UTC with microseconds: `2026-11-26T18:25:38.123456+00:00`."""
    return datetime.datetime.fromtimestamp(seconds, _UTC).isoformat(timespec="microseconds")


class IsoTimes:
    """Callable: seconds since the epoch (float) -> ISO 8601 in UTC with microseconds, as iso_time."""

    def __init__(self, limit: int = 4096) -> None:
        self._prefixes: dict[int, str] = {}
        self._limit = limit

    def __call__(self, seconds: float) -> str:
        fraction, whole = math.modf(seconds)
        if fraction < 0:  # before 1970: leave it to datetime (never a kernel timestamp)
            return datetime.datetime.fromtimestamp(seconds, _UTC).isoformat(timespec="microseconds")
        micros = round(fraction * 1e6)
        second = int(whole)
        if micros >= 1_000_000:
            micros -= 1_000_000
            second += 1
        prefix = self._prefixes.get(second)
        if prefix is None:
            if len(self._prefixes) >= self._limit:
                self._prefixes.clear()
            text = datetime.datetime.fromtimestamp(second, _UTC).isoformat(timespec="seconds")
            prefix = text[: -len(_SUFFIX)]
            self._prefixes[second] = prefix
        return f"{prefix}.{micros:06d}{_SUFFIX}"
