"""Text helpers shared by the tcp-family records: endpoints and times as the records show them (the context
they are enriched with is netsleuth.kernel.context.KernelContext; owners are diagnostics.attribution's)."""

from __future__ import annotations

import datetime

from netsleuth.diagnostics.attribution import owner_json, owner_text
from netsleuth.packet import endpoint_text as packet_endpoint_text

__all__ = ["endpoint_text", "iso_time", "owner_json", "owner_text"]


def endpoint_text(address: str | None, port: int | None) -> str:
    """A socket's endpoint as packet.endpoint_text writes it, with `*:80` for an unbound (wildcard) address:
    on a socket 0.0.0.0 means "any", which a packet's address never does."""
    if address is not None and port is not None and address in ("0.0.0.0", "::"):
        return f"*:{port}"
    return packet_endpoint_text(address, port)


def iso_time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="microseconds")
