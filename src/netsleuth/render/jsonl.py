"""JSON Lines: one object per line, flushed per batch so a pipe reader sees events as they happen."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

__all__ = ["JsonLinesWriter"]


class JsonLinesWriter:
    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._encode = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode

    def write(self, obj: Mapping[str, Any]) -> None:
        self._stream.write(self._encode(obj) + "\n")

    def write_many(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self._stream.write("".join(self._encode(obj) + "\n" for obj in objects))

    def flush(self) -> None:
        self._stream.flush()
