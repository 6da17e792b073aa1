"""A record for scripted diagnostics in tests: its JSON is given, as a real record's `to_json()` would be."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class JsonRecord:
    data: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.data
