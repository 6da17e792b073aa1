"""The last-line scope check on typed records: fields marked NetnsField / AddressField, at any depth."""

from __future__ import annotations

import ipaddress

from netsleuth.diagnostics.snoop.records import ExecRecord, SnoopGroup, SnoopSummary
from netsleuth.spec.records import Record, WallTime
from netsleuth.spec.scope import AddressField, Netns, NetnsField, RecordScope, Scope, scoped_values
from netsleuth.spec.summary import ClockPart


def _exec(netns: int) -> ExecRecord:
    return ExecRecord(
        time=WallTime(1.0), pid=1, tid=1, ppid=0, uid=0, comm="sh", netns=netns, netns_name=None,
        container=None, path="/bin/sh", args=("sh",), args_truncated=False, ret=0, error=None,
        duration_us=1.0,
    )  # fmt: skip


class Flow(Record, frozen=True, tag="flow"):
    netns: NetnsField
    saddr: AddressField
    daddr: AddressField


class Stack(Record, frozen=True, tag="stack"):
    frames: tuple[str, ...]


SCOPE = Scope(False, Netns(4026532000, "team-a"), (ipaddress.ip_network("198.18.0.0/24"),))


def test_a_record_is_inside_when_its_namespace_and_one_address_are() -> None:
    check = RecordScope(SCOPE)
    assert check.allows(Flow(netns=4026532000, saddr="198.18.0.5", daddr="198.18.9.9"))
    assert not check.allows(Flow(netns=4026532001, saddr="198.18.0.5", daddr="198.18.0.6"))
    assert not check.allows(Flow(netns=4026532000, saddr="198.18.9.5", daddr="198.18.9.6"))


def test_a_record_without_namespace_or_address_passes_only_host_wide() -> None:
    stack = Stack(frames=("f",))
    assert not RecordScope(SCOPE).allows(stack)
    assert RecordScope(Scope(True)).allows(stack)


def test_nested_records_are_read_at_any_depth() -> None:
    summary = SnoopSummary(
        diagnostic="snoop.exec", seen=2, total=2, emitted=2, sampled=0, lost=0, ungrouped=0,
        attach="tracepoint", interrupted=False, by_kind={},
        clock=ClockPart(monotonic_ns=0, wall_ns=0, offset_ns=0),
        groups=(SnoopGroup(kind="exec", count=1, example=_exec(4026532000)),
                SnoopGroup(kind="exec", count=1, example=_exec(4026532999))),
    )  # fmt: skip
    assert list(scoped_values(summary, "netns")) == [4026532000, 4026532999]
    scope = Scope(False, Netns(4026532000, "team-a"))
    assert not RecordScope(scope).allows(summary)
    assert RecordScope(scope).allows(_exec(4026532000))
