"""A fleet task's scope on the agent, without a kernel: admission decides what may run and how narrow, the
typed config is narrowed before it opens, and the last-line filter withholds (and counts) every record or
part of one from outside the scope - through the session runner, up to the `ended` status."""

from __future__ import annotations

import ipaddress
import json
import os
import re
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import pytest

from netsleuth.agent.config import SessionLimits
from netsleuth.agent.programs import ProgramLedger
from netsleuth.bpf.stats import ProgramStats
from netsleuth.diagnostics.conn.records import ConnRecord, FlowPart, NatHopPart, TimelineEntry
from netsleuth.diagnostics.registry import get_diagnostic
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.fleet.admission import AcceptedTask, TaskAdmission, TaskRefused
from netsleuth.fleet.diagnostic_source import for_the_fleet
from netsleuth.fleet.protocol import (
    Budgets,
    HostStatus,
    RecordBatch,
    Scope,
    SignedTask,
    Task,
    generate_private_key,
)
from netsleuth.fleet.scope_filter import ScopeFilter
from netsleuth.fleet.session_runner import FleetSession
from netsleuth.spec.parts import PodRef
from netsleuth.spec.records import Record, WallTime, encode
from netsleuth.spec.scope import AddressField, Netns, NetnsField
from netsleuth.spec.scope import Scope as HeldScope
from netsleuth.spec.summary import ClockPart, Summary, TotalsPart
from tests.unit.fleet_fakes import DB, OWN_NETNS, WEB, FakeNamespaces

KEY = generate_private_key()
NOW = 1_800_000_000.0
RUN = "run-0001"  # the run id of the agent under test (its registry entry's)
HOST_NETNS = "/proc/self/ns/net"
OWN = os.stat(HOST_NETNS).st_ino  # the scope's namespace in these tests: the one the test runs in
OTHER = OWN + 7
SCOPE = HeldScope(False, Netns(OWN, "web"))  # held to the test's own namespace, named "web"


def _filter(networks: tuple[str, ...] = ()) -> ScopeFilter:
    return ScopeFilter(HeldScope(False, SCOPE.netns, tuple(ipaddress.ip_network(n) for n in networks)))


class _Drop(Record, frozen=True, kw_only=True, tag="drop"):
    """A record that says where it happened as a drop does: its namespace and both addresses."""

    netns: NetnsField
    netns_name: str | None
    saddr: AddressField
    daddr: AddressField


class _Stack(Record, frozen=True, kw_only=True, tag="stack"):
    """A record that says neither its namespace nor an address (a profile stack)."""

    pid: int
    frames: tuple[str, ...]


def _drop(netns: int, name: str | None, saddr: str = "198.18.0.5", daddr: str = "198.18.2.7") -> _Drop:
    return _Drop(netns=netns, netns_name=name, saddr=saddr, daddr=daddr)


def _where(record: Any) -> tuple[str, object]:
    """(type, netns) of a typed record or a conntrack record (a dict)."""
    if isinstance(record, dict):
        return record["type"], record.get("netns")
    return record.record_type(), record.netns


def _entry(event: str, netns: str, text: str) -> TimelineEntry:
    return TimelineEntry(time=WallTime(NOW), event=event, netns=netns, text=text)


def _hop(where: str) -> NatHopPart:
    flow = FlowPart(src="198.18.0.5", sport=40000, dst="198.18.1.10", dport=80)
    return NatHopPart(kind="DNAT", where=where, before=flow, after=flow, state=None, status=())


def _conn(**changes: Any) -> ConnRecord:
    """A `conn` report as the tracker writes one when it joined another namespace's NAT and drop."""
    record = ConnRecord(
        client="198.18.0.5:40000", server="198.18.1.10:80", family=4,
        saddr="198.18.0.5", sport=40000, daddr="198.18.1.10", dport=80,
        client_netns="web", server_netns=None,
        established=False, connect_latency_ms=None, duration_s=1.0,
        syn_retransmits=1, synack_retransmits=0, retransmits={}, drops=2, resets=0, errno=None,
        bytes_sent=None, bytes_received=None,
        nat=(_hop("netns web"), _hop("netns db")),
        outcome="timeout",
        verdict='timeout: dropped in netns db by "-A INPUT -p tcp -m tcp --dport 8080 -j DROP"',
        timeline=(
            _entry("state", "web", "SYN_SENT"),
            _entry("nat", "web", "DNAT in netns web"),
            _entry("nat", "db", "DNAT in netns db"),
            _entry("drop", "web", "dropped by client's OUTPUT"),
            _entry("drop", str(OTHER), "dropped by db's INPUT"),
        ),
    )  # fmt: skip
    return msgspec.structs.replace(record, **changes)


# -- the last-line filter ------------------------------------------------------------------------------------
def test_records_of_other_namespaces_are_withheld_and_counted() -> None:
    scope = _filter()
    kept = scope.keep(
        [
            _drop(OWN, None),  # by inode
            _drop(OTHER, "db"),
            _drop(0, "web"),  # the kernel could not tell its namespace: not the scope's to show
            {"type": "conntrack", "netns": "host", "orig": {"src": "198.18.0.5"}},  # the agent's own label
            {"type": "conntrack", "netns": "web", "orig": {"src": "198.18.0.5"}},  # by its name
            {"type": "conntrack", "netns": "db", "orig": {"src": "198.18.0.5"}},
            {"type": "conntrack_stats", "netns": "db", "invalid": 2},
            {"type": "session_start", "netns": "web"},  # no other record travels untyped
            _Stack(pid=1, frames=("x",)),  # says neither namespace nor address
        ]
    )
    assert [_where(r) for r in kept] == [("drop", OWN), ("conntrack", "host"), ("conntrack", "web")]
    assert scope.withheld_records == 6 and scope.withheld == 6
    assert scope.note() == "withheld 6 out-of-scope (6 record(s); scope: netns web)"


def test_a_conn_report_keeps_only_its_entries_inside_the_scope() -> None:
    scope = _filter()
    (kept,) = scope.keep([_conn()])
    assert isinstance(kept, ConnRecord)
    assert [e.netns for e in kept.timeline] == ["web", "web", "web"]
    assert [hop.where for hop in kept.nat] == ["netns web"]
    assert kept.drops == 1  # the other namespace's drop is not counted either
    assert b"db" not in encode(kept)  # the verdict named it: replaced
    assert kept.verdict.startswith("timeout (as seen inside this task's scope; 3 out-of-scope")
    assert scope.withheld_entries == 3 and scope.withheld_records == 0
    # A connection none of whose sockets is in the scope goes entirely; one by its inode stays.
    assert scope.keep([_conn(client_netns="db")]) == []
    assert scope.withheld_records == 1
    assert [r.client_netns for r in scope.keep([_conn(client_netns=OWN, server_netns=OTHER)])] == [OWN]
    # Under an address scope, a connection with neither end inside goes too.
    assert _filter(("192.0.2.0/24",)).keep([_conn()]) == []


def test_verdicts_outside_the_scope_are_withheld() -> None:
    from netsleuth.spec.verdict import Severity, Verdict

    def verdict(netns: int | None) -> Verdict:
        return Verdict(
            severity=Severity.WARNING, category="firewall", cause="a rule dropped it",
            cause_code="firewall_drop", evidence={}, fix=(), netns=netns,
        )  # fmt: skip

    scope = _filter()
    # Its namespace's; another's; the whole machine's (a CPU's NET_RX budget): not this task's to see.
    verdicts = [verdict(OWN), verdict(OTHER), verdict(None)]
    assert scope.keep(verdicts) == verdicts[:1] and scope.withheld == 2


def test_diagnoses_summary_always_leaves() -> None:
    """diagnose's summary is not a spec.summary.Summary and names no namespace: withheld, a scoped fleet
    session of diagnose failed on every host ('not enough values to unpack')."""
    from netsleuth.diagnose.records import DiagnoseSummary

    totals = TotalsPart(seen=3, total=3, emitted=3, sampled=0, lost=0, ungrouped=0)
    summary = DiagnoseSummary(
        seconds=6.0, watched="netns web", verdicts=1, drops=totals, own_drops=0, all_good=(), problems=(),
        attach="tp_btf", interrupted=False, clock=ClockPart(monotonic_ns=1, wall_ns=2, offset_ns=1),
    )  # fmt: skip
    scope = _filter()
    assert scope.keep([summary]) == [summary] and scope.withheld == 0


def test_an_address_scope_keeps_either_address_inside() -> None:
    scope = _filter(("198.18.0.0/24",))
    kept = scope.keep(
        [
            _drop(OWN, None, saddr="198.18.0.5", daddr="198.18.2.7"),
            _drop(OWN, None, saddr="198.18.2.7", daddr="198.18.0.5"),
            _drop(OWN, None, saddr="198.18.2.7", daddr="198.18.1.10"),
            {
                "type": "conntrack",
                "netns": "host",
                "orig": {"src": "198.18.3.1"},
                "reply": {"dst": "198.18.0.9"},
            },
            {"type": "conntrack", "netns": "host", "orig": {"src": "198.18.3.1", "dst": "198.18.4.1"}},
        ]
    )
    assert len(kept) == 3 and scope.withheld_records == 2


def test_a_host_wide_scope_withholds_nothing() -> None:
    scope = ScopeFilter(HeldScope(True))
    records = [_drop(OTHER, "db"), _Stack(pid=1, frames=()), _conn()]
    assert scope.keep(records) == records and scope.withheld == 0 and scope.note() is None


# -- admission -----------------------------------------------------------------------------------------------
def _task(**changes: Any) -> Task:
    body: dict[str, Any] = {
        "id": os.urandom(8).hex(),
        "session": "s1",
        "host": "node-a",
        "diagnostic": "drops",
        "config": {},
        "scope": Scope(netns=("web",)),
        "issued_at": NOW,
        "expires_at": NOW + 30,
        "deadline_s": 5.0,
        "budgets": Budgets(),
        "user": "alice",
        "run_id": RUN,
    }
    body.update(changes)
    return Task(**body)


def _admit(task: Task, host_netns: str = "") -> AcceptedTask:
    admission = TaskAdmission(
        host_id="node-a",
        run_id=RUN,
        controller_key=KEY.public_key(),
        catalogue=lambda: ("drops", "conn", "softirq", "profile", "snoop.exec"),
        limits=SessionLimits(),
        host_netns=host_netns,
        namespaces=FakeNamespaces(),
        clock=lambda: NOW,
    )
    return admission.admit(SignedTask.sign(task, KEY, "k").encode())


def test_the_accepted_task_carries_the_scope_it_is_held_to() -> None:
    accepted = _admit(_task(scope=Scope(netns=("web",), addresses=("198.18.0.0/24",))))
    assert accepted.scope.netns == WEB and not accepted.scope.host_wide
    assert [str(n) for n in accepted.scope.networks] == ["198.18.0.0/24"]
    assert _admit(_task(scope=Scope())).scope == HeldScope(False, OWN_NETNS)


@pytest.mark.parametrize("diagnostic", ["softirq", "profile"])
def test_diagnostics_that_cannot_say_their_namespace_need_a_host_wide_scope(diagnostic: str) -> None:
    for scope in (Scope(netns=("web",)), Scope()):
        with pytest.raises(TaskRefused, match="needs a host-wide scope"):
            _admit(_task(diagnostic=diagnostic, scope=scope))
    accepted = _admit(_task(diagnostic=diagnostic, scope=Scope(netns=("*",)), config={"netns": "*"}))
    assert accepted.scope.host_wide and accepted.config_json.get("netns") is None


def test_host_wide_scope_rules() -> None:
    assert _admit(_task(scope=Scope(netns=("*",)), config={"netns": "db"})).config_json["netns"] == str(
        DB.inode
    )
    with pytest.raises(TaskRefused, match="outside this host"):
        _admit(_task(scope=Scope(netns=("*",))), host_netns="lab-client")  # an agent confined to one netns
    with pytest.raises(TaskRefused, match="cannot be combined"):
        _admit(_task(scope=Scope(netns=("*",), addresses=("198.18.0.0/24",))))
    with pytest.raises(TaskRefused, match="--netns 'nope' is not a network namespace on this host"):
        _admit(_task(scope=Scope(netns=("*",)), config={"netns": "nope"}))


def test_an_address_scope_needs_a_diagnostic_with_an_address_filter() -> None:
    with pytest.raises(TaskRefused, match=r"snoop\.exec has no address filter"):
        _admit(_task(diagnostic="snoop.exec", scope=Scope(netns=("web",), addresses=("198.18.0.0/24",))))


# -- the typed config narrowed before it opens ---------------------------------------------------------------
def test_conn_is_confined_to_the_scope_in_its_drop_filter_and_nat_join() -> None:
    from netsleuth.diagnostics.conn.session import conn_plan

    spec = get_diagnostic("conn")
    assert spec.scope.narrow is not None
    config = spec.config_from_json({"netns": HOST_NETNS, "proto": "tcp"})
    plan = conn_plan(config)
    assert plan.drops_filter.netns is None and plan.conntrack_namespaces is None  # every namespace
    narrowed = conn_plan(spec.scope.narrow(config, HeldScope(False, Netns(OWN, None))))
    assert narrowed.tcp_filter.netns == OWN and narrowed.drops_filter.netns == OWN
    assert narrowed.conntrack_namespaces == (HOST_NETNS,)
    # An address scope: admission made it the `host` filter; the drop program gets it too.
    scoped = spec.config_from_json({"netns": HOST_NETNS, "host": ["198.18.0.0/24"]})
    networks = (ipaddress.ip_network("198.18.0.0/24"),)
    narrowed = conn_plan(spec.scope.narrow(scoped, HeldScope(False, Netns(OWN, None), networks)))
    assert narrowed.drops_filter.hosts == networks and narrowed.tcp_filter.hosts == networks


# -- through the session runner, up to the ended status ------------------------------------------------
class _MixedDiagnostic:
    """Emits, once started, records inside and outside the scope."""

    attach_kind = "fake"

    def __init__(self) -> None:
        self._pending = [_drop(OWN, "web"), _drop(OTHER, "db"), _conn(), _Stack(pid=1, frames=())]

    def start(self) -> None:
        pass

    def poll(self, timeout_ms: int) -> list[Any]:
        time.sleep(timeout_ms / 1000 / 10)
        return []

    def drain(self) -> list[Any]:
        records, self._pending = self._pending, []
        return records

    def summary(self, interrupted: bool) -> _Summary:
        groups = tuple(
            _Group(count=1, example=_Lookup(netns=inode, dst="198.18.0.9")) for inode in (OWN, OTHER)
        )
        return _Summary(
            diagnostic="mixed", seen=4, total=4, emitted=4, sampled=0, lost=0, ungrouped=0, attach="fake",
            interrupted=interrupted, clock=ClockPart(monotonic_ns=0, wall_ns=0, offset_ns=0), groups=groups,
        )  # fmt: skip

    def totals(self) -> EventTotals:
        return EventTotals(matched=4, emitted=4)

    def start_window(self) -> None:
        pass

    def program_fds(self) -> dict[str, int]:
        return {}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        pass


def test_the_ended_status_reports_what_was_withheld(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("netsleuth.fleet.session_runner.ScopeFilter", lambda scope: ScopeFilter(scope))
    published: list[tuple[str, bytes]] = []
    ended = threading.Event()
    accepted = AcceptedTask(_task(deadline_s=0.2), {}, Budgets(), 0.2, SCOPE)
    session = FleetSession(
        accepted,
        "node-a",
        _MixedDiagnostic,
        lambda subject, data, *_: published.append((subject, data)),
        ProgramLedger(stats_of=lambda fd: ProgramStats(run_count=0, run_time_ns=0)),
        lambda: 0,
        lambda _: ended.set(),
    )
    session.begin()
    deadline = time.monotonic() + 10
    while session.state != "ready" and time.monotonic() < deadline:
        time.sleep(0.005)
    session.start_at(time.time_ns())
    assert ended.wait(10)
    statuses = [
        HostStatus.from_json(json.loads(d)) for s, d in published if s.endswith((".status", ".progress"))
    ]
    records = [
        r
        for s, d in published
        if s.endswith(".records")
        for r in RecordBatch.from_json(json.loads(d)).records
    ]
    assert [r["type"] for r in records] == ["drop", "conn", "summary"]
    assert [group["example"]["netns"] for group in records[-1]["groups"]] == [OWN]
    end = statuses[-1]
    # Withheld: db's drop and the stack (records); 3 parts of the conn report and 1 summary group (entries).
    assert end.state == "ended" and end.withheld == 6 and end.totals["withheld"] == 6
    assert end.events == 2  # what was sent, not what was withheld
    assert "withheld 6 out-of-scope (2 record(s) and 4 entr(ies) of kept records" in end.notes[-1]


# -- a host's own share of a flow whose socket is elsewhere ---------------------------------------------
def test_a_fleet_conn_reports_the_drops_no_connection_here_claimed(tmp_path: Path) -> None:
    """The server's namespace has the drop but not the client's socket: confined to its scope, its tracker
    joins the drop to nothing, so a fleet session sends the drop itself for the controller to join."""
    from netsleuth.diagnostics.conn.tracker import ConnSelector, ConnTracker
    from tests.unit.tcp_fakes import FakeClock, drop_record, fake_context

    config = get_diagnostic("conn").config_from_json({"proto": "tcp"})
    assert not config.report_unclaimed and for_the_fleet(config).report_unclaimed
    for keep in (False, True):
        clock = FakeClock()
        tracker = ConnTracker(ConnSelector(), fake_context(tmp_path), clock=clock)
        tracker.keep_unclaimed = keep
        drop = drop_record(("198.18.0.5", 40000), ("198.18.2.7", 8080), 0x02, netns=OTHER, time=1.0)
        tracker.add_drop(drop)
        assert tracker.ready() == [] and tracker.take_unclaimed() == []  # still waiting for its connection
        assert tracker.flush() == []
        assert tracker.take_unclaimed() == ([drop] if keep else [])


# -- a typed diagnostic: the scope is one typed value, narrowed on its traits' fields ---------------------
A1, A2, B1 = Netns(4026532201, "cni-a1"), Netns(4026532202, "cni-a2"), Netns(4026532203, "cni-b1")
PODS = {"team-a/web-1": A1, "team-a/web-2": A2, "team-b/db-0": B1}


def _admit_typed(task: Task, namespaces: FakeNamespaces | None = None) -> AcceptedTask:
    admission = TaskAdmission(
        host_id="node-a",
        run_id=RUN,
        controller_key=KEY.public_key(),
        catalogue=lambda: ("route", "snoop.exec"),
        limits=SessionLimits(),
        host_netns="",
        namespaces=namespaces or FakeNamespaces(pods=PODS),
        clock=lambda: NOW,
    )
    return admission.admit(SignedTask.sign(task, KEY, "k").encode())


def test_a_typed_config_is_narrowed_on_the_fields_its_traits_name() -> None:
    from netsleuth.diagnostics.route.records import RouteConfig

    accepted = _admit_typed(
        _task(diagnostic="route", scope=Scope(netns=("web",), addresses=("198.18.0.0/24",)), config={})
    )
    config = accepted.config
    assert isinstance(config, RouteConfig)
    # The namespace as the inode resolved at admission; the address scope as the "either address" filter.
    assert config.netns == str(WEB.inode) and [str(n) for n in config.host] == ["198.18.0.0/24"]
    assert accepted.scope == HeldScope(False, WEB, (ipaddress.ip_network("198.18.0.0/24"),))
    # A user's own filters inside the scope stay theirs (their netns named by its inode).
    inside = _admit_typed(
        _task(
            diagnostic="route",
            scope=Scope(netns=("web",), addresses=("198.18.0.0/16",)),
            config={"netns": "web", "host": ["198.18.0.7"], "dport": 53},
        )
    ).config
    assert inside.netns == str(WEB.inode) and [str(n) for n in inside.host] == ["198.18.0.7/32"]
    assert inside.dport == 53
    for config, words in (
        ({"netns": "db"}, "config.netns 'db' is outside the task's scope (netns web and 198.18.0.0/24)"),
        ({"host": ["192.0.2.1"]}, "config.host '192.0.2.1/32' is outside the task's address scope"),
        ({"pod": "team-b/db-0"}, "config.pod 'team-b/db-0' is outside the task's scope"),
        ({"dport": 99999}, "invalid config for route: dport 99999 is not a port"),
        ({"family": 6}, "config.family contradicts the IPv4 address 198.18.0.0/24: drop one of them (with"),
    ):
        task = _task(
            diagnostic="route", scope=Scope(netns=("web",), addresses=("198.18.0.0/24",)), config=config
        )
        with pytest.raises(TaskRefused, match=re.escape(words)):
            _admit_typed(task)


def test_a_kubernetes_namespace_scope_is_its_pods_namespaces_resolved_at_task_time() -> None:
    scope = Scope(k8s_namespaces=("team-a",))
    accepted = _admit_typed(_task(diagnostic="route", scope=scope, config={}))
    assert accepted.scope.k8s_namespace == "team-a" and accepted.scope.pod_netns == (A1, A2)
    assert accepted.config.k8s_namespace == "team-a"  # the kernel filters the set of its pods' namespaces
    assert accepted.namespace_files == ("cni-a1", "cni-a2")  # conntrack is read in those alone
    # One of its pods, or its namespace by name: inside. Another team's pod or namespace: refused.
    assert _admit_typed(_task(diagnostic="route", scope=scope, config={"pod": "team-a/web-2"})).config.pod
    assert _admit_typed(_task(diagnostic="route", scope=scope, config={"netns": "cni-a1"}))
    for config in ({"pod": "team-b/db-0"}, {"k8s_namespace": "team-b"}, {"netns": "web"}):
        with pytest.raises(TaskRefused, match="is outside the task's scope"):
            _admit_typed(_task(diagnostic="route", scope=scope, config=config))
    # A namespace with no pod here is refused, never run with an empty (no) filter.
    with pytest.raises(TaskRefused, match="no pod of Kubernetes namespace team-c runs on this host"):
        _admit_typed(_task(diagnostic="route", scope=Scope(k8s_namespaces=("team-c",))))
    # snoop's kernel filter holds one namespace: a namespace whose pods have one here, but not two.
    only = _admit_typed(_task(diagnostic="snoop.exec", scope=Scope(k8s_namespaces=("team-b",)), config={}))
    assert only.config.netns == str(B1.inode)
    with pytest.raises(TaskRefused, match=r"snoop\.exec's kernel filter takes one network namespace"):
        _admit_typed(_task(diagnostic="snoop.exec", scope=scope, config={}))
    with pytest.raises(TaskRefused, match="not both"):
        _admit_typed(_task(diagnostic="route", scope=Scope(netns=("web",), k8s_namespaces=("team-a",))))


def test_the_narrowing_hook_reaches_what_the_fields_do_not() -> None:
    from netsleuth.diagnostics.route.records import RouteConfig
    from netsleuth.fleet.admission import narrow_config
    from netsleuth.spec.scope import ScopeTraits

    seen: list[HeldScope] = []

    def narrow(config: RouteConfig, scope: HeldScope) -> RouteConfig:
        seen.append(scope)
        return msgspec.structs.replace(config, dport=53)  # e.g. a second program's own filter

    traits = ScopeTraits(narrow=narrow)
    held = HeldScope(False, WEB)
    narrowed = narrow_config(RouteConfig(), held, traits, FakeNamespaces(), "route")
    assert narrowed.netns == str(WEB.inode) and narrowed.dport == 53 and seen == [held]
    # A trait naming a field the config lacks cannot hold a namespace scope: refused, never left open.
    with pytest.raises(UsageError, match="has no network namespace filter"):
        narrow_config(RouteConfig(), held, ScopeTraits(netns_field="nsid"), FakeNamespaces(), "route")


class _Lookup(Record, frozen=True, tag="lookup"):
    netns: NetnsField
    dst: AddressField
    pod: PodRef | msgspec.UnsetType = msgspec.UNSET


class _Group(msgspec.Struct, frozen=True, kw_only=True):
    count: int
    example: _Lookup


class _Summary(Summary, frozen=True, tag="summary"):
    groups: tuple[_Group, ...]


def test_typed_records_are_checked_by_their_field_types_and_a_summary_keeps_its_groups_inside() -> None:
    def lookup(netns: Netns, pod: str | None = None) -> _Lookup:
        ref = PodRef(namespace=pod, name="x", uid="u") if pod else msgspec.UNSET
        return _Lookup(netns=netns.inode, dst="198.18.0.9", pod=ref)

    held = HeldScope(False, networks=(), k8s_namespace="team-a", pod_netns=(A1, A2))
    scope = ScopeFilter(held)
    # Its pods' namespaces: in; another's; a pod of another Kubernetes namespace, whatever its netns says.
    records = [lookup(A1, "team-a"), lookup(B1, "team-b"), lookup(A2, "team-b"), lookup(A2)]
    assert scope.keep(records) == [records[0], records[3]] and scope.withheld_records == 2
    groups = tuple(_Group(count=1, example=record) for record in records)
    summary = _Summary(
        diagnostic="lookups", seen=4, total=4, emitted=4, sampled=0, lost=0, ungrouped=0, attach="tp_btf",
        interrupted=False, clock=ClockPart(monotonic_ns=0, wall_ns=0, offset_ns=0), groups=groups,
    )  # fmt: skip
    (kept,) = scope.keep([summary])
    assert kept.groups == (groups[0], groups[3]) and kept.total == 4  # a summary's totals stay exact
    assert scope.withheld_entries == 2
    assert "withheld 4 out-of-scope (2 record(s) and 2 entr(ies)" in (scope.note() or "")
    assert "Kubernetes namespace team-a" in (scope.note() or "")


def test_the_flow_diagnostics_ship_conntrack_entries() -> None:
    """A fleet session of a flow diagnostic ships each host's conntrack entries of its flows: the merge joins
    the hops across a NAT with them (drops lost it when it became typed, and the lb's DNAT went unseen)."""
    from netsleuth.fleet.conntrack_records import joins_conntrack

    assert [name for name in ("conn", "drops", "resets", "diagnose") if not joins_conntrack(name)] == []
    assert not joins_conntrack("snoop.open") and not joins_conntrack("softirq")
