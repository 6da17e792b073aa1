"""`conn` as text: a connection's timeline and its verdict."""

from __future__ import annotations

from collections.abc import Callable

from netsleuth.diagnostics.conn import ConnReport
from netsleuth.diagnostics.tcp.records import endpoint_text
from netsleuth.diagnostics.tcp.view import clock_text

__all__ = ["conn_block"]


def conn_block(report: ConnReport, netns_name: Callable[[int], str | None], timeline: bool = True) -> str:
    """A connection's timeline, oldest first, then its verdict."""
    conn = report.connection

    def netns(inode: int) -> str:
        return f"netns {netns_name(inode) or inode}"

    sides = [f"client {netns(conn.client_netns)}"] if conn.client_netns else []
    if conn.server_netns:
        sides.append(f"server {netns(conn.server_netns)}")
    head = f"connection {endpoint_text(*conn.client)} → {endpoint_text(*conn.server)}"
    if sides:
        head += f" ({', '.join(sides)})"
    lines = [head]
    if timeline:
        for entry in sorted(conn.entries, key=lambda e: e.time):
            lines.append(f"  {clock_text(entry.time)}  {entry.netns:<12}  {entry.event:<17}  {entry.text}")
    lines.append(f"  verdict: {report.verdict}")
    return "\n".join(lines)
