"""The protobuf wire format, just as much of it as the CRI messages netsleuth reads and its tests write.

The CRI API (k8s.io/cri-api, package runtime.v1) is gRPC with protobuf bodies. Rather than vendor its .proto
file and a code generator, the few messages netsleuth needs are spelled out by field number in
netsleuth.kernel.cri from the published definitions, and this module does the encoding
(https://protobuf.dev/programming-guides/encoding/):

- a message is a sequence of fields, each a key `(number << 3) | wire_type` (a varint) and a value;
- wire type 0 is a varint (int32/int64/uint32/bool/enum; a negative int64 is ten bytes of two's complement),
  2 is a length-delimited run (string, bytes, an embedded message, a packed repeated scalar),
  1 and 5 are fixed 64 and 32 bits (no CRI field netsleuth reads has them, but a reader must skip them);
- proto3 writes no field that holds its default (0, "", false, an empty message), so a missing field reads
  as its default;
- `map<K, V>` is a repeated embedded message with the key as field 1 and the value as field 2;
- fields a reader does not know are skipped, so newer runtimes with more fields decode the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["Fields", "WireError", "encode_map", "encode_message", "encode_string", "encode_varint_field"]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_UINT64 = (1 << 64) - 1


class WireError(ValueError):
    """Bytes that are not a well-formed protobuf message."""


def _varint(value: int) -> bytes:
    value &= _UINT64  # negative int32/int64 values are sent as their 64-bit two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _key(number: int, wire_type: int) -> bytes:
    return _varint((number << 3) | wire_type)


def encode_varint_field(number: int, value: int | bool) -> bytes:
    """An int/uint/bool/enum field; nothing for the default 0/false."""
    return _key(number, _VARINT) + _varint(int(value)) if value else b""


def encode_string(number: int, value: str | bytes) -> bytes:
    """A string or bytes field; nothing for the default empty value."""
    data = value.encode() if isinstance(value, str) else value
    return _key(number, _LENGTH) + _varint(len(data)) + data if data else b""


def encode_message(number: int, body: bytes, *, always: bool = False) -> bytes:
    """An embedded message field. An empty body is left out unless `always`: a present-but-empty message and
    an absent one differ for some fields (e.g. a filter on a state whose value is the enum's 0)."""
    if not body and not always:
        return b""
    return _key(number, _LENGTH) + _varint(len(body)) + body


def encode_map(number: int, entries: Mapping[str, str]) -> bytes:
    """A `map<string, string>` field: one entry message (key = 1, value = 2) per item, in key order so the
    same map always encodes to the same bytes."""
    return b"".join(
        encode_message(number, encode_string(1, key) + encode_string(2, value), always=True)
        for key, value in sorted(entries.items())
    )


def _read_varint(data: bytes, offset: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if offset >= len(data):
            raise WireError("truncated varint")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, offset
        shift += 7
        if shift >= 70:
            raise WireError("varint longer than ten bytes")


class Fields:
    """A decoded message: each field number's values in wire order, read by the type its definition gives.

    Repeated fields keep every value; a singular field that appears more than once takes the last (the
    protobuf rule for scalars; for messages the rule is to merge, which no CRI reply netsleuth reads needs).
    """

    __slots__ = ("_values",)

    def __init__(self, data: bytes = b"") -> None:
        values: dict[int, list[int | bytes]] = {}
        offset = 0
        while offset < len(data):
            key, offset = _read_varint(data, offset)
            number, wire_type = key >> 3, key & 7
            value: int | bytes
            if wire_type == _VARINT:
                value, offset = _read_varint(data, offset)
            elif wire_type == _LENGTH:
                length, offset = _read_varint(data, offset)
                if offset + length > len(data):
                    raise WireError(f"field {number} runs past the end of the message")
                value = data[offset : offset + length]
                offset += length
            elif wire_type == _FIXED64:
                value, offset = int.from_bytes(data[offset : offset + 8], "little"), offset + 8
            elif wire_type == _FIXED32:
                value, offset = int.from_bytes(data[offset : offset + 4], "little"), offset + 4
            else:
                raise WireError(f"field {number} has wire type {wire_type}, which proto3 does not use")
            if offset > len(data):
                raise WireError(f"field {number} runs past the end of the message")
            values.setdefault(number, []).append(value)
        self._values = values

    def _last(self, number: int) -> int | bytes | None:
        found = self._values.get(number)
        return found[-1] if found else None

    def integer(self, number: int, *, signed: bool = True) -> int:
        """An int32/int64 (two's complement when `signed`), uint32/uint64, enum or bool field."""
        value = self._last(number)
        if not isinstance(value, int):
            return 0
        if signed and value >= 1 << 63:
            value -= 1 << 64
        return value

    def boolean(self, number: int) -> bool:
        return bool(self.integer(number))

    def string(self, number: int) -> str:
        value = self._last(number)
        return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else ""

    def message(self, number: int) -> Fields:
        """An embedded message; an empty one (every field at its default) when absent."""
        value = self._last(number)
        return Fields(value) if isinstance(value, bytes) else Fields()

    def messages(self, number: int) -> list[Fields]:
        """A repeated embedded message field."""
        return [Fields(value) for value in self._values.get(number, ()) if isinstance(value, bytes)]

    def strings(self, number: int) -> list[str]:
        """A repeated string field."""
        return [value.decode("utf-8", errors="replace") for value in self._bytes(number)]

    def string_map(self, number: int) -> dict[str, str]:
        """A `map<string, string>` field (a later entry with the same key wins, as protobuf says)."""
        entries: dict[str, str] = {}
        for entry in self.messages(number):
            entries[entry.string(1)] = entry.string(2)
        return entries

    def has(self, number: int) -> bool:
        return number in self._values

    def _bytes(self, number: int) -> Iterable[bytes]:
        return (value for value in self._values.get(number, ()) if isinstance(value, bytes))
