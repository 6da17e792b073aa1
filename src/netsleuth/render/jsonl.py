"""JSON Lines: one object per line, flushed per batch so a pipe reader sees events as they happen.

Encoding is orjson's (a drop storm is hundreds of thousands of lines a second; the standard library's
encoder was a large part of the consumer's time), with output byte for byte what the standard library
gives with compact separators and `ensure_ascii=False`, which this module used before and `encode_line`
falls back to when the two could differ:
- orjson writes floats below 1e-4 as `1e-6`/`0.00001` where Python writes `1e-06`/`1e-05`: a line with
  such a number (or anything that looks like it, inside a string) is re-encoded by the standard library;
- what orjson refuses (integers beyond 64 bits, keys that are not strings) or is told to pass through
  (dataclasses, datetimes, which the standard library refuses too) goes to the standard library as well,
  which gives its own answer or error.
NaN and infinities are not JSON (orjson writes null, Python `NaN`); no record holds them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any, NoReturn, TextIO

import orjson
from msgspec import Struct as _Struct

__all__ = ["JsonLinesWriter", "encode_line", "record_blob", "record_lines"]

_stdlib_encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_dumps = orjson.dumps
_OPTIONS = orjson.OPT_APPEND_NEWLINE | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
# A float orjson formats unlike Python: a one-digit negative exponent (1e-6) or four zeros after the point
# (0.00001; Python switches to an exponent below 1e-4, so it never writes `0.0000`). Substring tests first:
# they cost a tenth of the regular expression, which only runs on lines that hold an "e-" at all.
_ONE_DIGIT_EXPONENT = re.compile(rb"e-[0-9](?![0-9])").search


def _refuse(value: object) -> NoReturn:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def encode_line(obj: Mapping[str, Any]) -> bytes:
    """`obj` as one UTF-8 line (newline-terminated), identical to the standard library's compact JSON."""
    try:
        line = _dumps(obj, _refuse, _OPTIONS)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return (_stdlib_encode(obj) + "\n").encode()
    if b"0.0000" in line or (b"e-" in line and _ONE_DIGIT_EXPONENT(line) is not None):
        return (_stdlib_encode(obj) + "\n").encode()
    return line


def _record_line(record: Any) -> bytes:
    """A typed record's line: a msgspec record encodes itself (netsleuth.spec.records); a record that
    still writes its own `to_json` goes through `encode_line`."""
    if isinstance(record, _Struct):
        from netsleuth.spec.records import encode

        return encode(record) + b"\n"
    return encode_line(record.to_json())


def record_lines(records: Sequence[Any]) -> Iterable[bytes]:
    """The line of each record; a batch that builds its own lines (one encoding per kind of record, e.g.
    netsleuth.diagnostics.drop_batch) gives them directly."""
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
