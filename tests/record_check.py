"""Every record a test reads from netsleuth is checked against its declared schema
(netsleuth.diagnostics.record_schemas): the printed JSON and its documentation cannot drift apart."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

import jsonschema

from netsleuth.diagnostics.record_schemas import schema_for

__all__ = ["check_records"]


@functools.cache
def _validator(key: str, schema_text: str) -> jsonschema.protocols.Validator:
    import json

    schema = json.loads(schema_text)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


@functools.cache
def _schema_and_validator(record_type: object, diagnostic: object) -> tuple[dict[str, Any], Any]:
    # Built once per record type: a storm test reads hundreds of thousands of records of one type.
    import json

    schema = schema_for({"type": record_type, "diagnostic": diagnostic})
    return schema, _validator(str(schema["title"]), json.dumps(schema, sort_keys=True))


def _shape(record: Mapping[str, Any], schema: Mapping[str, Any]) -> str | None:
    """What decides the record's validity when its schema asks of `time` only that it is a string: the
    record with its time replaced by the time's type. A storm streams a million drops differing only in
    time, and each is then validated once per shape. A typed record's time says `"format": "date-time"`
    too, which the validator does not assert (it is built without a format checker). None when the schema
    says more about time."""
    import json

    if schema.get("properties", {}).get("time") not in _STRING_TIMES or "time" not in record:
        return None
    return json.dumps({**record, "time": type(record["time"]).__name__}, sort_keys=True, default=repr)


_STRING_TIMES = ({"type": "string"}, {"type": "string", "format": "date-time"})


def check_records(records: Iterable[Mapping[str, Any]]) -> None:
    """Raise AssertionError naming the record and the first key that breaks its schema."""
    valid: set[str] = set()
    for record in records:
        schema, validator = _schema_and_validator(record.get("type"), record.get("diagnostic"))
        shape = _shape(record, schema)
        if shape is not None:
            if shape in valid:
                continue
            valid.add(shape)
        error = jsonschema.exceptions.best_match(validator.iter_errors(record))
        if error is not None:
            where = "/".join(str(part) for part in error.absolute_path) or "(the record)"
            raise AssertionError(f"{schema['title']}: {where}: {error.message}\nrecord: {dict(record)}")
