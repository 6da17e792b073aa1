"""The event and byte caps of one session, shared by the agent's local sessions (sessions.py) and the fleet
sessions (fleet/session_runner.py): the same rule wherever the records go.

Records are offered already encoded and lazily (a generator), so nothing past the cap is even encoded.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["take_within_caps"]


def take_within_caps(
    lines: Iterable[bytes], events: int, sent_bytes: int, max_events: int, max_bytes: int
) -> tuple[list[bytes], tuple[str, str] | None]:
    """The lines that fit after `events` records and `sent_bytes` bytes, and why it stopped if it did:
    ("max_events", detail) once the cap is reached, ("max_bytes", detail) before a line would pass it."""
    taken: list[bytes] = []
    pending = 0
    for line in lines:
        if events + len(taken) >= max_events:
            return taken, ("max_events", f"reached the cap of {max_events} events")
        if sent_bytes + pending + len(line) > max_bytes:
            return taken, ("max_bytes", f"the next event would pass the cap of {max_bytes} bytes")
        taken.append(line)
        pending += len(line)
    if events + len(taken) >= max_events:
        return taken, ("max_events", f"reached the cap of {max_events} events")
    return taken, None
