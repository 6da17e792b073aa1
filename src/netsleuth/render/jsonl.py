"""JSON Lines: one object per line, flushed per batch so a pipe reader sees events as they happen.

A typed record (a msgspec Struct, netsleuth.spec.records) encodes itself with msgspec; a batch that builds
its own lines (one encoding per kind of record: a drop storm, netsleuth.diagnostics.drops.batch) gives them
as they are. The few objects that are still plain dicts (an agent session's start and end, the records of a
diagnostic not typed yet) are encoded by the standard library, compact and with `ensure_ascii=False`: none
of them comes in storms.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, TextIO

from msgspec import Struct as _Struct

__all__ = ["JsonLinesWriter", "encode_line", "record_blob", "record_lines"]

_stdlib_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """`obj` as one UTF-8 line (newline-terminated): the standard library's compact JSON."""
    return (_stdlib_encode(obj) + "\n").encode()


def _record_line(record: Any) -> bytes:
    """A typed record's line: a msgspec record encodes itself (netsleuth.spec.records); a record that
    still writes its own `to_json` goes through `encode_line`."""
    if isinstance(record, _Struct):
        from netsleuth.spec.records import encode

        return encode(record) + b"\n"
    return encode_line(record.to_json())


def record_lines(records: Sequence[Any]) -> Iterable[bytes]:
    """The line of each record; a batch that builds its own lines (one encoding per kind of record, e.g.
    netsleuth.diagnostics.drops.batch) gives them directly."""
    build = getattr(records, "json_lines", None)
    if build is not None:
        lines: list[bytes] = build()
        return lines
    return (_record_line(record) for record in records)


def record_blob(records: Sequence[Any]) -> bytes:
    """Every line of `record_lines`, joined."""
    build = getattr(records, "json_blob", None)
    if build is not None:
        blob: bytes = build()
        return blob
    return b"".join(_record_line(record) for record in records)


class JsonLinesWriter:
    """Writes lines to a text stream; to its binary buffer when it has one (stdout, files), so a batch is
    one `bytes` join and one write, without decoding and re-encoding through the text layer."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._binary: IO[bytes] | None = getattr(stream, "buffer", None)

    def _write(self, data: bytes) -> None:
        if self._binary is not None:
            self._stream.flush()  # text written before (by anyone) goes first
            self._binary.write(data)
        else:
            self._stream.write(data.decode())

    def write(self, obj: Mapping[str, Any]) -> None:
        self._write(encode_line(obj))

    def write_records(self, records: Sequence[Any]) -> None:
        """Records (each with `to_json`) as lines, in one write."""
        self._write(record_blob(records))

    def flush(self) -> None:
        if self._binary is not None:
            self._stream.flush()
            self._binary.flush()
        else:
            self._stream.flush()
