"""Record types and their schema versions: every JSON object netsleuth emits carries `"type"` and `"v"`.

A consumer in another process or on another host (an agent session's client, the fleet controller) reads
`v` before anything else: a version it does not know is refused, never half-read. A version grows when a
key changes meaning or goes away; adding a key does not change it (readers ignore keys they do not know).
Each type's keys are in docs/records.md, written by `netsleuth.diagnostics.record_schemas` from the JSON
Schemas the tests check real output against.
"""

from __future__ import annotations

__all__ = ["SCHEMA_VERSIONS"]

SCHEMA_VERSIONS: dict[str, int] = {
    "session_start": 1,
    "session_end": 1,
}
