"""A fleet session's drops go out as the batch's own lines (fleet/diagnostic_source.EncodedRecords): the T0
window and the scope decided per kind of drop give the records, and the withheld count, that the per-record
path gives (each record's JSON object, record_wall_ns, ScopeFilter.keep, json.dumps)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

from netsleuth.diagnostics.drops.batch import DropBatcher
from netsleuth.diagnostics.drops.decode import decode_records
from netsleuth.fleet.diagnostic_source import EncodedRecords
from netsleuth.fleet.scope_filter import ScopeFilter
from netsleuth.fleet.session_runner import record_wall_ns
from netsleuth.spec.records import to_builtins
from netsleuth.spec.scope import Netns, Scope
from tests.unit.test_drop_batch import storm
from tests.unit.test_drops_decode import enricher, make_event

OWN = os.stat("/proc/self/ns/net").st_ino


def with_netns(record: bytes, netns: int) -> bytes:
    # struct drop_event: time_ns, location, sock_ino (u64 each), reason, then netns (u32): at byte 28.
    return record[:28] + netns.to_bytes(4, "little") + record[32:]


def test_the_window_and_the_scope_per_kind_give_the_per_record_paths_records(tmp_path: Path) -> None:
    enrich = enricher(tmp_path)
    kinds = [
        make_event(in_task=1, pid=7, comm=b"inside"),
        with_netns(make_event(in_task=1, pid=8, comm=b"outside"), OWN + 1),
        make_event(in_task=0, sock_ino=5),
    ]
    records = [with_netns(record, OWN) if b"outside" not in record else record for record in kinds]
    raw = storm(random.Random(3), records, 600)
    batch = DropBatcher(decode_records, enrich.enrich_many, lambda: enrich.context.wall_offset_ns).batch(raw)
    typed = list(batch)  # the same drops as typed records, one by one
    plain = [to_builtins(record) for record in typed]  # and as their JSON: the window reads its time text
    walls = sorted(record_wall_ns(record, 0) or 0 for record in plain)
    t0 = walls[len(walls) // 2] + 1  # half the drops before T0
    scope = Scope(False, Netns(OWN, None))

    by_record, by_kind = ScopeFilter(scope), ScopeFilter(scope)
    expected = by_record.keep(
        [record for record, text in zip(typed, plain, strict=True) if (record_wall_ns(text, 0) or 0) >= t0]
    )
    encoded = EncodedRecords(batch).since(t0).keep(by_kind)
    got = [json.loads(line) for line in encoded.lines()]

    assert got == json.loads(json.dumps([to_builtins(record) for record in expected]))
    assert by_kind.withheld_records == by_record.withheld_records > 0
    assert 0 < len(got) < len(plain)
    assert "outside" not in {record["comm"] for record in got}
