"""This host's wall clock against the fleet's reference clock: the NATS server's.

Every host, and the controller, can measure itself against the one server it already talks to, with no
extra service: the agent times a heartbeat write to the registry (t1 before, t2 after the JetStream ack)
and reads back the server's own timestamp of that write (the `Nats-Time-Stamp` header of a direct get).
The server stamped it between t1 and t2, so offset = (t1 + t2) / 2 - server_time, within +-(t2 - t1) / 2.
The estimate kept is the one with the smallest round trip of the last few (NTP's clock filter, RFC 5905
section 10), so one slow heartbeat does not move it.
"""

from __future__ import annotations

import datetime
import re
from collections import deque
from dataclasses import dataclass

__all__ = ["ClockSample", "OffsetEstimator", "parse_nats_time"]

_RFC3339 = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?(Z|[+-]\d\d:\d\d)")


def parse_nats_time(text: str) -> int:
    """An RFC 3339 time with up to nanoseconds (Go's RFC3339Nano) -> unix ns; ValueError if not one."""
    match = _RFC3339.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    seconds, fraction, zone = match.groups()
    stamp = datetime.datetime.fromisoformat(seconds + ("+00:00" if zone == "Z" else zone))
    return int(stamp.timestamp()) * 1_000_000_000 + int((fraction or "0").ljust(9, "0"))


@dataclass(frozen=True)
class ClockSample:
    offset_ns: int  # this host's wall clock minus the server's
    round_trip_ns: int


class OffsetEstimator:
    def __init__(self, keep: int = 8) -> None:
        self._samples: deque[ClockSample] = deque(maxlen=keep)

    def add(self, sent_ns: int, received_ns: int, server_ns: int) -> ClockSample:
        sample = ClockSample((sent_ns + received_ns) // 2 - server_ns, received_ns - sent_ns)
        self._samples.append(sample)
        return sample

    def best(self) -> ClockSample | None:
        return min(self._samples, key=lambda sample: sample.round_trip_ns, default=None)

    @property
    def offset_ns(self) -> int:
        best = self.best()
        return best.offset_ns if best is not None else 0
