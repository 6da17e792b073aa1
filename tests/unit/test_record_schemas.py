"""The record declarations: one for every record type and every registered diagnostic's summary, valid JSON
Schemas, documented in docs/records.md as declared, and strict (an undeclared key is an error)."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import msgspec
import pytest

from netsleuth.diagnostics.record_schemas import markdown, schema_for, typed_record_types
from netsleuth.diagnostics.registry import diagnostic_names, get_diagnostic
from netsleuth.spec.schemas import record_schema
from tests.record_check import check_records

DOCS = Path(__file__).resolve().parents[2] / "docs" / "records.md"


def test_every_registered_diagnostics_records_and_summary_are_declared() -> None:
    typed = typed_record_types()
    assert {"session_start", "session_end"} <= set(typed)
    for name in diagnostic_names():
        spec = get_diagnostic(name)
        assert typed[f"summary:{name}"].record_type() == "summary", name
        for kind in spec.records:
            assert kind.record_type() == "summary" or typed[kind.record_type()] is kind, (name, kind)


@pytest.mark.parametrize("record_type", list(typed_record_types()))
def test_schemas_are_valid_json_schema(record_type: str) -> None:
    kind = typed_record_types()[record_type]
    schema = record_schema(kind)
    jsonschema.Draft202012Validator.check_schema(schema)
    version = next(field.default for field in msgspec.structs.fields(kind) if field.name == "v")
    assert schema["properties"]["v"] == {"const": version}


@pytest.mark.parametrize("record_type", list(typed_record_types()))
def test_a_typed_records_json_starts_with_its_type_and_version(record_type: str) -> None:
    """A reader checks `v` before anything else, so it comes right after `type` (the fields' order is the
    JSON's: a subclass without kw_only=True moves the inherited `v` after its own fields)."""
    kind = typed_record_types()[record_type]
    assert msgspec.structs.fields(kind)[0].name == "v", kind.__name__


def test_docs_are_what_is_declared() -> None:
    assert DOCS.read_text() == markdown(), (
        "docs/records.md is stale: python -m netsleuth.diagnostics.record_schemas docs/records.md"
    )


VERDICT = {
    "type": "verdict",
    "v": 1,
    "rank": 1,
    "severity": "warning",
    "category": "firewall",
    "cause": "a rule dropped it",
    "cause_code": "firewall_drop",
    "evidence": {"drops": 3},
    "fix": ["iptables -D INPUT 1"],
    "absorbed_findings": [],
}


def test_records_are_checked_strictly() -> None:
    check_records([VERDICT])
    failures = [
        ({**VERDICT, "surprise": 1}, "Additional properties"),
        ({key: value for key, value in VERDICT.items() if key != "fix"}, "'fix' is a required property"),
        ({**VERDICT, "rank": "1"}, "is not of type 'integer'"),
        ({**VERDICT, "v": 2}, "1 was expected"),
    ]
    for record, message in failures:
        with pytest.raises(AssertionError, match=message):
            check_records([record])
    with pytest.raises(KeyError, match="no schema is declared for records of type 'summary:nope'"):
        schema_for({"type": "summary", "diagnostic": "nope"})


def test_wall_time_reads_as_datetimes_isoformat() -> None:
    """WallTime.iso's cached second and rounded microseconds give exactly what a datetime per call gave,
    including fractions that round up into the next second and halves (rounded to even, like CPython)."""
    import datetime
    import random

    from netsleuth.spec.records import WallTime

    rng = random.Random(22)
    values = [0.0, 0.5e-6, 1.5e-6, 1_764_200_000.9999995, 1_764_200_000.9999994, 1_764_200_059.9999999]
    values += [rng.uniform(0, 4e9) for _ in range(20_000)]
    values += [1_764_200_000 + rng.randrange(10**9) / 1e9 for _ in range(20_000)]
    for value in values:
        expected = datetime.datetime.fromtimestamp(value, datetime.UTC).isoformat(timespec="microseconds")
        assert WallTime(value).iso() == expected, value
