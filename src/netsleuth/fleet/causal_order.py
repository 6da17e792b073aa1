"""The order hops are told in: happens-before first, clocks only where they are precise enough.

Each host's clock is put on the controller's by its measured offset, which is known only to within half the
round trip it was measured over (a few hundred microseconds on a LAN, milliseconds on a busy one) - while the
events of one flow on different hosts are often microseconds apart. Sorting corrected times alone tells a
client receiving a RST before the server sent it. So (Lamport, "Time, Clocks, and the Ordering of Events in a
Distributed System", 1978) the order is built from what is known to have happened before what:

- on one host, its own clock orders its kernel-stamped events exactly (`exact`); a stamp that may be late
  (`exact=False`: a conntrack event read off a socket) only says "not before";
- across hosts, the caller's causal edges: a packet is received after it is sent (the client's SYN before
  the NAT it creates, a reset sent before it is received), a socket's states change in their own order;
- clocks decide between hosts whose corrected times differ by more than both uncertainties;
- anything else is left concurrent: it is told in time order, and marked as such, never given an order the
  data cannot support.

Kahn's topological sort, always taking the earliest ready hop, gives that order; a cycle (edges that
contradict each other, e.g. clocks off by more than their stated uncertainty) is broken at its earliest hop.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

__all__ = ["Ordered", "Placed", "Relation", "Timed", "causal_order"]

Relation = Literal["first", "causal", "clock", "concurrent"]


class Timed(Protocol):
    """What ordering needs of a hop (flow_verdict.Hop has it): where, when, and whether the stamp is exact."""

    @property
    def host(self) -> str: ...

    @property
    def time_ns(self) -> int | None: ...

    @property
    def exact(self) -> bool: ...


@dataclass(slots=True)
class Placed:
    """One thing to order: where and (corrected) when; time None = before the window (an entry older than
    the session)."""

    host: str
    time_ns: int | None
    exact: bool = True


@dataclass(slots=True)
class Ordered:
    index: int  # into the caller's list
    relation: Relation  # to the hop told before it
    uncertainty_ns: int = 0  # concurrent: how far apart the two could really be, in either direction


def _time(item: Timed) -> int:
    return item.time_ns if item.time_ns is not None else -(1 << 62)


def _host_edges(items: Sequence[Timed]) -> set[tuple[int, int]]:
    """What each host's own clock says: an exact event before a later one; a late stamp before a later
    exact event (its real time is earlier still)."""
    edges: set[tuple[int, int]] = set()
    by_host: dict[str, list[int]] = {}
    for index, item in enumerate(items):
        by_host.setdefault(item.host, []).append(index)
    for indices in by_host.values():
        for a in indices:
            for b in indices:
                first, second = items[a], items[b]
                if a == b or first.time_ns is None or second.time_ns is None:
                    continue
                if second.exact and (first.time_ns, a) < (second.time_ns, b):
                    edges.add((a, b))
    return edges


def _reaches(successors: list[list[int]], start: int, goal: int) -> bool:
    """Is there a path of happened-before edges from `start` to `goal`? (Asked for told neighbours only.)"""
    seen = {start}
    stack = list(successors[start])
    while stack:
        node = stack.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            stack.extend(successors[node])
    return False


def causal_order(
    items: Sequence[Timed], edges: Iterable[tuple[int, int]], uncertainty_ns: Mapping[str, int]
) -> list[Ordered]:
    """`edges`: (a, b) = item a happened before item b. `uncertainty_ns`: per host, how far its corrected
    clock may be from the controller's (half the round trip its offset was measured over)."""
    count = len(items)
    graph = {(a, b) for a, b in edges if a != b} | _host_edges(items)
    waiting = [0] * count
    successors: list[list[int]] = [[] for _ in range(count)]
    for a, b in graph:
        waiting[b] += 1
        successors[a].append(b)
    ready = [(_time(items[i]), i) for i in range(count) if waiting[i] == 0]
    heapq.heapify(ready)
    done: list[int] = []
    placed = [False] * count
    while len(done) < count:
        if not ready:  # a cycle: contradicting edges; break it at the earliest hop left
            stuck = min((i for i in range(count) if not placed[i]), key=lambda i: (_time(items[i]), i))
            heapq.heappush(ready, (_time(items[stuck]), stuck))
            waiting[stuck] = 0
        _, index = heapq.heappop(ready)
        if placed[index]:
            continue
        placed[index] = True
        done.append(index)
        for successor in successors[index]:
            waiting[successor] -= 1
            if waiting[successor] == 0 and not placed[successor]:
                heapq.heappush(ready, (_time(items[successor]), successor))
    ordered = [Ordered(done[0], "first")] if done else []
    for previous, index in itertools.pairwise(done):
        first, second = items[previous], items[index]
        if _reaches(successors, previous, index):
            ordered.append(Ordered(index, "causal"))
            continue
        bound = uncertainty_ns.get(first.host, 0) + uncertainty_ns.get(second.host, 0)
        if first.time_ns is None or second.time_ns is None or abs(second.time_ns - first.time_ns) > bound:
            ordered.append(Ordered(index, "clock"))
        else:
            ordered.append(Ordered(index, "concurrent", bound))
    return ordered
