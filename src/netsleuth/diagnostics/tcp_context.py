"""Text helpers shared by the tcp-family records: endpoints and times as the records show them (the context
they are enriched with is netsleuth.kernel.context.KernelContext; owners are diagnostics.attribution's)."""

from __future__ import annotations

import datetime

from netsleuth.diagnostics.attribution import owner_json, owner_text

__all__ = ["endpoint_text", "iso_time", "owner_json", "owner_text"]


def endpoint_text(address: str | None, port: int | None) -> str:
    """`198.18.0.1:80`, `[2001:db8::1]:80`, `*:80` for an unbound address."""
    if address is None:
        return "?" if port is None else f"?:{port}"
    if port is None:
        return address
    shown = "*" if address in ("0.0.0.0", "::") else address
    return f"[{shown}]:{port}" if ":" in shown else f"{shown}:{port}"


def iso_time(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).isoformat(timespec="microseconds")
