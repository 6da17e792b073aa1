"""Typed records: one msgspec Struct per record type, whose JSON, JSON Schema and docs are derived from it.

Every record a diagnostic yields subclasses `Record` with `tag="<type>"`: its JSON object carries
`"type": "<type>"` and `"v"`, the schema version of that type (a version grows when a key changes meaning
or goes away; adding a key does not change it, readers ignore keys they do not know). Consumers read the
attributes; JSON is made at the edge (`encode`, `encode_lines`), read back at the edge (`decode`).

A key that a record carries only sometimes (a firewall reset's `netfilter`) is a field typed
`X | msgspec.UnsetType = msgspec.UNSET`: while unset it is left out of the JSON (and docs/records.md says
"not always"); a key that is always there but may be empty is `X | None` instead.

`WallTime` is seconds since the epoch (a float, so rules subtract and sort them) that reads as ISO 8601
UTC text with microseconds in JSON, the form every netsleuth record has always had.
"""

from __future__ import annotations

import datetime
import functools
import ipaddress
from collections.abc import Iterable
from typing import Any, TypeVar

import msgspec

from netsleuth.spec.options import NETWORK_TYPES

__all__ = [
    "Record",
    "WallTime",
    "decode",
    "encode",
    "encode_lines",
    "iso_second",
    "schema_hook",
    "to_builtins",
]

R = TypeVar("R")


class WallTime(float):
    """Seconds since the epoch; JSON: "2026-11-26T18:25:38.123456+00:00"."""

    __slots__ = ()

    def iso(self) -> str:
        # What datetime.fromtimestamp(self, UTC).isoformat(timespec="microseconds") gives - the fraction
        # rounded half to even, as CPython's fromtimestamp does - with the text up to the second cached: a
        # storm's records fall within a few seconds, and a new kind of drop is encoded, and its time cut out,
        # once each (a datetime per call was 9 % of a port scan's instructions per event).
        if self < 0:
            return datetime.datetime.fromtimestamp(self, datetime.UTC).isoformat(timespec="microseconds")
        second = int(self)
        micro = round((self - second) * 1e6)
        if micro >= 1_000_000:
            second, micro = second + 1, micro - 1_000_000
        return f"{iso_second(second)}.{micro:06d}+00:00"


@functools.lru_cache(maxsize=1024)
def iso_second(second: int) -> str:
    """`2026-11-26T18:25:38` for these seconds since the epoch (UTC)."""
    text = datetime.datetime.fromtimestamp(second, datetime.UTC).isoformat(timespec="seconds")
    return text[: -len("+00:00")]


class Record(msgspec.Struct, frozen=True, kw_only=True, tag_field="type", omit_defaults=False):
    """Base of every record type. Subclasses: `class DropRecord(Record, tag="drop")`; a new schema version
    is `v: int = 2` in the subclass."""

    v: int = 1

    @classmethod
    def record_type(cls) -> str:
        tag = cls.__struct_config__.tag
        assert isinstance(tag, str), f"{cls.__name__} has no tag"
        return tag

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready builtins (for consumers that still take dicts)."""
        built: dict[str, Any] = to_builtins(self)
        return built


def _enc_hook(value: Any) -> Any:
    if isinstance(value, WallTime):
        return value.iso()
    if isinstance(
        value, ipaddress.IPv4Network | ipaddress.IPv6Network | ipaddress.IPv4Address | ipaddress.IPv6Address
    ):
        return str(value)
    raise NotImplementedError(f"cannot encode {type(value).__name__}")


def _dec_hook(kind: type, value: Any) -> Any:
    if kind is WallTime and isinstance(value, str):
        return WallTime(datetime.datetime.fromisoformat(value).timestamp())
    if kind in NETWORK_TYPES and isinstance(value, str):
        return ipaddress.ip_network(value, strict=False)
    raise NotImplementedError


def schema_hook(kind: type) -> dict[str, Any]:
    if kind is WallTime:
        return {"type": "string", "format": "date-time"}
    if kind in NETWORK_TYPES:
        return {"type": "string", "format": "ip-network"}
    raise NotImplementedError


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode(record: Any) -> bytes:
    return _ENCODER.encode(record)


def encode_lines(records: Iterable[Any]) -> bytes:
    """JSON Lines of many records in one call (msgspec's batch encoder)."""
    return _ENCODER.encode_lines(records)


def to_builtins(record: Any) -> Any:
    return msgspec.to_builtins(record, enc_hook=_enc_hook)


def decode(data: bytes | str, kind: type[R]) -> R:
    """JSON from another process or host, as the typed record(s) `kind` (a Record type or a union of them);
    msgspec.ValidationError when it is not one."""
    return msgspec.json.decode(data, type=kind, dec_hook=_dec_hook)
