"""The fleet agent without a kernel or a server: admission, scope pushdown, the session runner's T0 window,
caps and deadline on a fake diagnostic, clock offsets, conntrack matching, config, packaging."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netsleuth.agent.config import SessionLimits, parse_config
from netsleuth.agent.programs import ProgramLedger
from netsleuth.bpf.stats import ProgramStats
from netsleuth.diagnostics.nat_join import ConntrackEntry, FlowTuple
from netsleuth.diagnostics.totals import EventTotals
from netsleuth.errors import UsageError
from netsleuth.fleet.admission import AcceptedTask, ReplayGuard, TaskAdmission, TaskRefused
from netsleuth.fleet.clock import OffsetEstimator, parse_nats_time
from netsleuth.fleet.conntrack_records import entry_matches
from netsleuth.fleet.nats_config import example_cluster_configs, example_server_config
from netsleuth.fleet.protocol import (
    Budgets,
    HostStatus,
    RecordBatch,
    Scope,
    SignedTask,
    Task,
    generate_private_key,
    new_task_id,
    public_key_to_text,
)
from netsleuth.fleet.session_runner import FleetSession, record_wall_ns
from netsleuth.spec.scope import Netns
from netsleuth.spec.scope import Scope as HeldScope
from tests.unit.fleet_fakes import DB, OWN, WEB, FakeNamespaces

REPO = Path(__file__).resolve().parents[2]
KEY = generate_private_key()
NOW = 1_800_000_000.0
RUN = "run-0001"  # the run id of the agent under test (its registry entry's)
LAB = Netns(4026532199, "lab-client")  # the one namespace of an agent confined to it (fleet.netns)


def _task(**changes: Any) -> Task:
    body: dict[str, Any] = {
        "id": new_task_id(),
        "session": "s1",
        "host": "node-a",
        "diagnostic": "drops",
        "config": {"proto": "tcp"},
        "scope": Scope(netns=("web",)),
        "issued_at": NOW,
        "expires_at": NOW + 30,
        "deadline_s": 5.0,
        "budgets": Budgets(max_events=10, max_bytes=10_000, cpu_percent=50),
        "user": "alice",
        "run_id": RUN,
    }
    body.update(changes)
    return Task(**body)


def _admission(host_netns: str = "", clock: list[float] | None = None) -> TaskAdmission:
    now = clock or [NOW]
    return TaskAdmission(
        host_id="node-a",
        run_id=RUN,
        controller_key=KEY.public_key(),
        catalogue=lambda: ("drops", "conn"),
        limits=SessionLimits(max_events=5, max_duration=60, cpu_budget_percent=2),
        host_netns=host_netns,
        namespaces=FakeNamespaces((WEB, DB, LAB)),
        clock=lambda: now[0],
    )


def _signed(task: Task) -> bytes:
    return SignedTask.sign(task, KEY, "k").encode()


# -- admission -------------------------------------------------------------------------------------------
def test_accepted_task_has_scope_pushed_into_its_config_and_budgets_capped() -> None:
    accepted = _admission().admit(_signed(_task(scope=Scope(netns=("web",), addresses=("198.18.0.0/16",)))))
    # The namespace as the inode resolved at admission: a name re-pointed later changes nothing.
    config = accepted.config
    assert (config.proto, config.netns) == ("tcp", str(WEB.inode))
    assert config.host == (ipaddress.ip_network("198.18.0.0/16"),)
    assert accepted.budgets == Budgets(max_events=5, max_bytes=10_000, cpu_percent=2)


def test_empty_scope_means_the_hosts_own_namespace() -> None:
    assert _admission().admit(_signed(_task(scope=Scope()))).config.netns == str(OWN)
    with pytest.raises(TaskRefused, match="outside the task's scope"):
        _admission().admit(_signed(_task(scope=Scope(), config={"netns": "web"})))


def test_a_namespaced_agent_forces_its_namespace() -> None:
    admission = _admission(host_netns="lab-client")
    assert admission.admit(_signed(_task(scope=Scope()))).config.netns == str(LAB.inode)
    with pytest.raises(TaskRefused, match="outside this host"):
        admission.admit(_signed(_task(scope=Scope(netns=("web",)))))


@pytest.mark.parametrize(
    ("task", "reason"),
    [
        (_task(host="node-b"), "is for host 'node-b'"),
        (_task(run_id="run-0000"), "earlier run of this agent"),
        (_task(run_id=""), r"earlier run of this agent \(run none"),
        (_task(issued_at=NOW - 60, expires_at=NOW - 1), "expired"),
        (_task(issued_at=NOW + 120, expires_at=NOW + 130), "in this agent's future"),
        (_task(expires_at=NOW + 3000), "over this agent's maximum"),
        (_task(diagnostic="tcpdump"), "unknown diagnostic 'tcpdump'"),
        (_task(deadline_s=600), "sessions.max_duration"),
        (_task(scope=Scope(netns=("web", "db"))), "one network namespace"),
        (_task(scope=Scope(netns=("nope",))), "does not exist"),
        (_task(scope=Scope(netns=("web",), cgroups=("/x",))), "cgroup"),
        (_task(config={"netns": "db"}), "outside the task's scope"),
        (
            _task(scope=Scope(netns=("web",), addresses=("10.0.0.0/8",)), config={"host": ["192.0.2.1"]}),
            "outside",
        ),
    ],
)
def test_refusals(task: Task, reason: str) -> None:
    with pytest.raises(TaskRefused, match=reason) as refused:
        _admission().admit(_signed(task))
    assert refused.value.task == task  # the controller can audit which task was refused


def test_config_is_validated_by_the_diagnostic_before_acceptance() -> None:
    # drops' typed config checks it (the same sentence as its CLI flag's), before anything is accepted.
    admission = TaskAdmission(
        host_id="node-a",
        run_id=RUN,
        controller_key=KEY.public_key(),
        catalogue=lambda: ("drops",),
        limits=SessionLimits(),
        host_netns="lab-client",
        namespaces=FakeNamespaces((LAB,)),
        clock=lambda: NOW,
    )
    assert admission.admit(_signed(_task(scope=Scope(), config={"dport": 80}))).config.dport == 80
    with pytest.raises(
        TaskRefused,
        match=r"^invalid config for drops: dport 'http' is not a port: give a number from 1 to 65535$",
    ):
        admission.admit(_signed(_task(scope=Scope(), config={"dport": "http"})))


def test_forged_and_malformed_and_replayed() -> None:
    admission = _admission()
    forged = SignedTask.sign(_task(), generate_private_key(), "k").encode()
    with pytest.raises(TaskRefused, match="does not verify"):
        admission.admit(forged)
    with pytest.raises(TaskRefused, match="malformed task") as malformed:
        admission.admit(b'{"task": 1}')
    assert malformed.value.task is None
    once = _signed(_task())
    admission.admit(once)
    with pytest.raises(TaskRefused, match="replay"):
        admission.admit(once)


def test_refusals_before_the_signature_verifies_are_marked_unsigned() -> None:
    with pytest.raises(TaskRefused) as forged:
        _admission().admit(SignedTask.sign(_task(), generate_private_key(), "k").encode())
    assert forged.value.task is not None and not forged.value.signed
    with pytest.raises(TaskRefused) as foreign:
        _admission().admit(_signed(_task(host="node-b")))
    assert foreign.value.signed


def test_refusal_records_are_bounded_in_size_and_rate() -> None:
    from netsleuth.fleet.protocol import AGENT_AUDIT_MAX_RECORD
    from netsleuth.fleet.refusal_audit import RefusalAudit

    clock = [0.0]
    audit = RefusalAudit("node-a", rate=8, burst=3, clock=lambda: clock[0])  # 1 token each 0.125 s
    huge = {"action": "task.rejected", "reason": "x" * 50_000, "scope": {"netns": ["n" * 200] * 1024}}
    written = [audit.admit(huge) for _ in range(5)]
    assert [data is not None for data in written] == [True, True, True, False, False]
    first = json.loads(written[0] or b"")
    assert len(written[0] or b"") <= AGENT_AUDIT_MAX_RECORD and "1024 entries" in first["scope"]["omitted"]
    assert first["reason"].endswith("(48000 characters cut)")
    assert audit.summary() is None and audit.pending == 2  # no token yet: the summary waits
    clock[0] = 0.125  # one token back
    summary = json.loads(audit.summary() or b"")
    assert summary["action"] == "refusals.left_out" and summary["count"] == 2 and audit.pending == 0
    clock[0] = 0.25
    audit.admit({"action": "a"})
    assert audit.admit({"action": "b"}) is None
    clock[0] = 0.375
    assert json.loads(audit.admit({"action": "c"}) or b"")["left_out_before"] == 1
    assert (audit.written, audit.left_out) == (6, 3)


def test_replay_memory_is_bounded_and_forgets_expired_ids() -> None:
    clock = [NOW]
    guard = ReplayGuard(clock=lambda: clock[0], capacity=2)
    assert guard.remember("task-0001", NOW + 1) and guard.remember("task-0002", NOW + 100)
    assert not guard.remember("task-0001", NOW + 1)  # a replay
    with pytest.raises(TaskRefused, match="2 unexpired task ids"):
        guard.remember("task-0003", NOW + 100)  # full, nothing expired yet: refuse rather than forget
    clock[0] = NOW + 2
    assert guard.remember("task-0003", NOW + 100)  # task-0001 expired: its id is let go
    assert len(guard) == 2


# -- the session runner on a fake diagnostic -------------------------------------------------------------
class FakeDiagnostic:
    """Events at given offsets from T0 (negative: before it), read by poll once they have happened."""

    attach_kind = "fake"

    def __init__(self, offsets_ms: list[float]) -> None:
        self._offsets_ns = sorted(int(offset * 1e6) for offset in offsets_ms)
        self.t0_ns: int | None = None  # set by the test when it sends the start
        self._read = 0
        self.polled = 0
        self.closed = False

    def _happened(self) -> list[int]:
        if self.t0_ns is None:
            return []
        now = time.time_ns()
        return [self.t0_ns + offset for offset in self._offsets_ns if self.t0_ns + offset <= now]

    def start(self) -> None:
        pass

    def poll(self, timeout_ms: int) -> list[dict[str, Any]]:
        happened = self._happened()
        due = happened[self._read :]
        self._read = len(happened)
        if not due:
            time.sleep(min(timeout_ms, 5) / 1000)
        self.polled += len(due)
        return [
            {"type": "drop", "v": 1, "monotonic_ns": t - (time.time_ns() - time.monotonic_ns())} for t in due
        ]

    def drain(self) -> list[dict[str, Any]]:
        return self.poll(0)

    def summary(self, interrupted: bool) -> dict[str, Any]:
        # Like drops' summary, it declares top-level totals (from attach): the runner replaces them.
        return {"type": "summary", "interrupted": interrupted, **EventTotals().to_json()}

    def totals(self) -> EventTotals:
        # Like the kernel's counters: an event counts when it happens, whether or not it was read yet.
        happened = len(self._happened())
        return EventTotals(matched=happened, emitted=happened)

    def start_window(self) -> None:
        pass

    def program_fds(self) -> dict[str, int]:
        return {"fake": 7}

    def notes(self) -> list[str]:
        return []

    def close(self) -> None:
        self.closed = True


class GroupedFakeDiagnostic(FakeDiagnostic):
    """Like drops: its summary holds one in-kernel group, which counts every event since attach unless the
    session is told where its window starts."""

    def __init__(self, offsets_ms: list[float]) -> None:
        super().__init__(offsets_ms)
        self._window_start = 0

    def start_window(self) -> None:
        self._window_start = len(self._happened())

    def summary(self, interrupted: bool) -> dict[str, Any]:
        counted = len(self._happened()) - self._window_start
        return {**super().summary(interrupted), "groups": [{"reason": "NETFILTER_DROP", "count": counted}]}


def _idle_ledger() -> ProgramLedger:
    return ProgramLedger(stats_of=lambda fd: ProgramStats(run_count=0, run_time_ns=0))


def _busy_ledger() -> ProgramLedger:
    """Programs that run half of every wall-clock second: far over any small CPU budget."""
    start = time.monotonic()
    return ProgramLedger(
        stats_of=lambda fd: ProgramStats(run_count=1, run_time_ns=int((time.monotonic() - start) * 0.5e9))
    )


def _run_session(
    diagnostic: FakeDiagnostic,
    budgets: Budgets,
    deadline_s: float,
    start_in_s: float | None,
    ledger: ProgramLedger | None = None,
    **task: Any,
) -> tuple[list[HostStatus], list[dict[str, Any]], FleetSession]:
    published: list[tuple[str, bytes]] = []
    ended = threading.Event()
    # Host-wide: these sessions test the window and the caps, not the scope (test_fleet_scope.py does).
    accepted = AcceptedTask(_task(deadline_s=deadline_s, **task), {}, budgets, deadline_s, HeldScope(True))
    session = FleetSession(
        accepted,
        "node-a",
        lambda: diagnostic,
        lambda subject, data, *_: published.append((subject, data)),
        ledger or _idle_ledger(),
        lambda: 1234,
        lambda _: ended.set(),
    )
    session.begin()
    if start_in_s is not None:
        # Like the controller: the start goes out once the host is ready.
        deadline = time.monotonic() + 10
        while session.state != "ready" and time.monotonic() < deadline:
            time.sleep(0.005)
        diagnostic.t0_ns = time.time_ns() + int(start_in_s * 1e9)
        session.start_at(diagnostic.t0_ns)
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
    return statuses, records, session


def test_records_before_t0_are_discarded_and_totals_are_the_windows() -> None:
    diagnostic = FakeDiagnostic([-200, 150, 150.001])
    statuses, records, _ = _run_session(diagnostic, Budgets(), deadline_s=0.5, start_in_s=0.25)
    assert [s.state for s in statuses] == ["preparing", "ready", "running", "ended"]
    assert all(s.offset_ns == 1234 for s in statuses)
    running, end = statuses[2], statuses[3]
    assert running.start_skew_ns is not None and 0 <= running.start_skew_ns < 50_000_000
    assert end.reason.startswith("duration")
    drops = [r for r in records if r["type"] == "drop"]
    assert len(drops) == 2 and end.events == 2
    assert end.totals["total"] == 2  # the event before T0 is not in the window's totals either
    assert records[-1]["type"] == "summary" and records[-1]["total"] == 2
    assert diagnostic.closed


def test_summary_groups_count_the_same_window_as_its_totals() -> None:
    """Drops between attach and T0 are in neither the summary's total nor its groups: one count, the
    window's (they disagreed when the groups were counted from attach)."""
    diagnostic = GroupedFakeDiagnostic([-200, -100, 150, 150.001, 150.002])
    _, records, _ = _run_session(diagnostic, Budgets(), deadline_s=0.5, start_in_s=0.25)
    summary = records[-1]
    assert summary["type"] == "summary" and summary["total"] == 3
    assert sum(group["count"] for group in summary["groups"]) == summary["total"]


def test_event_cap_ends_the_session() -> None:
    diagnostic = FakeDiagnostic([100 + i / 1000 for i in range(5)])
    statuses, records, _ = _run_session(diagnostic, Budgets(max_events=3), deadline_s=5, start_in_s=0.1)
    assert statuses[-1].reason.startswith("max_events") and statuses[-1].events == 3
    assert len([r for r in records if r["type"] == "drop"]) == 3


def test_byte_cap_ends_the_session_before_the_record_that_would_pass_it() -> None:
    diagnostic = FakeDiagnostic([100 + i / 1000 for i in range(5)])
    statuses, records, _ = _run_session(diagnostic, Budgets(max_bytes=120), deadline_s=5, start_in_s=0.1)
    end = statuses[-1]
    assert end.reason.startswith("max_bytes") and 0 < end.sent_bytes <= 120
    assert end.events == len([r for r in records if r["type"] == "drop"]) < 5


def test_cpu_budget_ends_the_session() -> None:
    statuses, _, _ = _run_session(
        FakeDiagnostic([]), Budgets(cpu_percent=1), deadline_s=10, start_in_s=0.1, ledger=_busy_ledger()
    )
    assert statuses[-1].reason.startswith("cpu_budget"), statuses[-1].reason
    assert "over the budget of 1%" in statuses[-1].reason


def test_no_start_ends_at_the_tasks_expiry() -> None:
    statuses, records, _ = _run_session(
        FakeDiagnostic([]), Budgets(), deadline_s=5, start_in_s=None, issued_at=time.time(),
        expires_at=time.time() + 0.3,
    )  # fmt: skip
    assert statuses[-1].state == "ended" and statuses[-1].reason.startswith("start_timeout")
    assert records == []  # nothing was started: no window, no summary


def test_record_wall_time_from_monotonic_or_iso() -> None:
    assert record_wall_ns({"monotonic_ns": 10}, 5) == 15
    assert record_wall_ns({"time": "2026-11-23T08:00:00.000001+00:00"}, 0) == 1_795_420_800_000_001_000
    assert record_wall_ns({"type": "x"}, 0) is None


# -- clock -----------------------------------------------------------------------------------------------
def test_nats_time_and_min_rtt_offset() -> None:
    assert parse_nats_time("2026-11-23T08:46:32.158726472Z") == 1_795_423_592_158_726_472
    assert parse_nats_time("2026-11-23T08:46:32Z") == 1_795_423_592_000_000_000
    with pytest.raises(ValueError):
        parse_nats_time("yesterday")
    estimator = OffsetEstimator()
    assert estimator.offset_ns == 0
    estimator.add(1000, 3000, 1500)  # rtt 2000, offset +500
    estimator.add(1000, 1200, 1000)  # rtt 200, offset +100: the better sample wins
    estimator.add(1000, 9000, 0)
    assert estimator.offset_ns == 100


# -- conntrack matching ----------------------------------------------------------------------------------
def test_a_dnat_entry_matches_before_and_after_the_nat() -> None:
    entry = ConntrackEntry(
        "lb",
        FlowTuple("tcp", ("198.18.0.5", 40312), ("198.18.1.10", 80)),
        FlowTuple("tcp", ("198.18.2.7", 8080), ("198.18.0.5", 40312)),
    )
    assert entry_matches(entry, {"proto": "tcp", "dport": 80})
    assert entry_matches(entry, {"proto": "tcp", "dport": 8080})
    assert entry_matches(entry, {"host": ["198.18.2.7"]})
    assert not entry_matches(entry, {"dport": 443})
    assert not entry_matches(entry, {"proto": "udp"})


# -- config and packaging --------------------------------------------------------------------------------
def test_fleet_section(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    key = public_key_to_text(KEY.public_key())
    fleet: dict[str, Any] = {
        "url": "nats://n:4222",
        "host_id": "node-a",
        "user": "agent-node-a",
        "password_file": str(secret),
        "controller_key": key,
        "labels": {"zone": "a"},
    }
    config = parse_config({"fleet": fleet}).fleet
    assert config is not None and config.password() == "s3cret" and config.labels == (("zone", "a"),)
    assert parse_config({}).fleet is None
    bad: list[tuple[dict[str, Any], str]] = [
        ({"url": "http://x"}, "fleet.url"),
        ({"host_id": "Node_A"}, "fleet.host_id"),
        ({"controller_key": "abc"}, "fleet.controller_key"),
        ({"heartbeat_seconds": 0}, "fleet.heartbeat_seconds"),
        ({"colour": "red"}, "fleet.colour is not a known setting"),
        ({"creds_file": "/etc/x.creds"}, "takes one of"),
    ]
    for change, message in bad:
        with pytest.raises(UsageError, match=message):
            parse_config({"fleet": {**fleet, **change}})
    secret.chmod(0o644)
    with pytest.raises(UsageError, match="readable by other users"):
        parse_config({"fleet": fleet})


def test_fleet_creds_file(tmp_path: Path) -> None:
    """A .creds file holds the user's JWT and seed: owner-only, and a NATS .creds file, checked at load."""
    good = tmp_path / "a.creds"
    good.write_text("-----BEGIN NATS USER JWT-----\neyJ0.e30.c2ln\n------END NATS USER JWT------\n")
    good.chmod(0o600)
    fleet: dict[str, Any] = {
        "url": "nats://n:4222",
        "host_id": "node-a",
        "creds_file": str(good),
        "controller_key": public_key_to_text(KEY.public_key()),
    }
    config = parse_config({"fleet": fleet}).fleet
    assert config is not None and config.creds_file == good
    wrong = tmp_path / "b.creds"
    wrong.write_text("user:password\n")
    wrong.chmod(0o600)
    with pytest.raises(UsageError, match=r"fleet.creds_file .*b.creds is not a NATS .creds file"):
        parse_config({"fleet": {**fleet, "creds_file": str(wrong)}})
    good.chmod(0o644)
    with pytest.raises(UsageError, match="readable by other users"):
        parse_config({"fleet": fleet})


def test_fleet_nkey_seed_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed is checked when the config is read (a private key: owner-only, and a user seed), so a bad
    file is one sentence at start-up, not a retry loop or a traceback in the fleet thread."""
    import importlib.util

    import nkeys

    def seed_file(name: str, text: bytes, mode: int = 0o600) -> str:
        path = tmp_path / name
        path.write_bytes(text)
        path.chmod(mode)
        return str(path)

    user_seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    fleet: dict[str, Any] = {
        "url": "nats://n:4222",
        "host_id": "node-a",
        "nkey_seed_file": seed_file("a.nk", user_seed + b"\n"),
        "controller_key": public_key_to_text(KEY.public_key()),
    }
    config = parse_config({"fleet": fleet}).fleet
    assert config is not None and config.nkey_seed_file == tmp_path / "a.nk" and config.password() is None
    account_seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT)
    bad: list[tuple[str, str]] = [
        (str(tmp_path / "missing.nk"), "fleet.nkey_seed_file .*missing.nk: No such file or directory"),
        (seed_file("open.nk", user_seed, 0o644), "readable by other users: chmod 600 it"),
        (seed_file("empty.nk", b""), "is empty"),
        (seed_file("junk.nk", b"not-a-seed"), "does not hold an nkey seed"),
        (seed_file("acct.nk", account_seed), "seed of an nkey of kind account, not of a user"),
    ]
    for path, message in bad:
        with pytest.raises(UsageError, match=message) as raised:
            parse_config({"fleet": {**fleet, "nkey_seed_file": path}})
        assert "\n" not in str(raised.value)
    with pytest.raises(UsageError, match="takes one of"):
        parse_config({"fleet": {**fleet, "creds_file": "/etc/x.creds"}})
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *rest: None if name == "nkeys" else real_find_spec(name, *rest),
    )
    with pytest.raises(
        UsageError, match=r"fleet.nkey_seed_file needs the Python package nkeys, from the 'fleet'"
    ):
        parse_config({"fleet": fleet})


def test_nats_login_refusals_and_lone_resets_are_told_apart() -> None:
    """What the agent and the controller log while NATS refuses their login: the refusal, not the resets
    that come with it (the server closes with the client's PING unread)."""
    from nats.errors import AuthorizationError
    from nats.errors import Error as NatsError

    from netsleuth.fleet.link_config import login_refused, lone_reset

    refusal = NatsError("nats: 'Authorization Violation'")  # as nats-py raises it on a first connect
    reset = ConnectionResetError(104, "Connection reset by peer")
    assert login_refused(refusal) and login_refused(AuthorizationError())
    assert not login_refused(reset) and not login_refused(ConnectionRefusedError(111, "refused"))
    assert lone_reset(reset, None) and lone_reset(reset, refusal)
    assert not lone_reset(reset, reset)  # a server that only resets is reported
    assert not lone_reset(ConnectionRefusedError(111, "refused"), None)


def test_packaged_nats_config_is_the_generated_one_and_valid() -> None:
    packaged = REPO / "packaging" / "nats-server.conf"
    assert packaged.read_text() == example_server_config()
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed (make deps installs it)")
    check = subprocess.run(["nats-server", "-c", str(packaged), "-t"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_packaged_nats_cluster_configs_are_the_generated_ones_and_valid() -> None:
    """packaging/nats-cluster/: three servers, each with its name and routes to all three, sharing users."""
    folder = REPO / "packaging" / "nats-cluster"
    generated = example_cluster_configs()
    assert sorted(path.name for path in folder.iterdir()) == sorted(generated)
    for name, text in generated.items():
        assert (folder / name).read_text() == text, name
    if shutil.which("nats-server") is None:
        pytest.skip("nats-server is not installed (make deps installs it)")
    for index in (1, 2, 3):
        config = folder / f"nats-{index}.conf"
        assert f'server_name: "nats-{index}"' in config.read_text()
        check = subprocess.run(["nats-server", "-c", str(config), "-t"], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_systemd_accepts_the_fleet_drop_in_and_it_adds_no_capability(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing (Debian package systemd)")
    drop_in = (REPO / "packaging" / "netsleuth-agent-fleet.conf").read_text()
    settings = [line.split("=", 1)[0] for line in drop_in.splitlines() if "=" in line and line[0] not in "#;"]
    assert not {"CapabilityBoundingSet", "AmbientCapabilities", "User"} & set(settings)
    netsleuth = Path(sys.executable).parent / "netsleuth"
    unit = tmp_path / "netsleuth-agent.service"
    unit.write_text(
        (REPO / "packaging" / "netsleuth-agent.service")
        .read_text()
        .replace("/usr/bin/netsleuth", str(netsleuth))
    )
    (tmp_path / "netsleuth-agent.service.d").mkdir()
    (tmp_path / "netsleuth-agent.service.d" / "fleet.conf").write_text(drop_in)
    # The drop-in is read from the unit path (an unknown key in it would be reported on stderr).
    env = {**os.environ, "SYSTEMD_UNIT_PATH": f"{tmp_path}:"}
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60, env=env
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_fleet_metrics() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from netsleuth.fleet.metrics import FleetCollector
    from netsleuth.fleet.outbox import OutboxCounts
    from netsleuth.fleet.refusal_audit import RefusalAudit

    class Link:
        is_connected = True
        registrations = 7
        accepted = 2
        refused = 3
        active_sessions = 1
        clock_offset_ns: int | None = -20_661
        withheld = 4
        audit = RefusalAudit("node-a")
        outbox = OutboxCounts(stored=40, resent=3, dropped=1)

    Link.audit.written, Link.audit.left_out = 5, 2
    registry = CollectorRegistry()
    registry.register(FleetCollector(Link()))
    text = generate_latest(registry).decode()
    assert "netsleuth_fleet_connected 1.0" in text
    assert "netsleuth_fleet_registrations_total 7.0" in text
    assert 'netsleuth_fleet_tasks_total{decision="refused"} 3.0' in text
    assert "netsleuth_fleet_sessions_active 1.0" in text
    assert "netsleuth_fleet_clock_offset_seconds -2.0661e-05" in text
    assert "netsleuth_fleet_records_withheld_total 4.0" in text
    assert 'netsleuth_fleet_audit_records_total{outcome="left_out"} 2.0' in text
    assert 'netsleuth_fleet_session_messages_total{outcome="resent"} 3.0' in text


def test_credentials_generator(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from netsleuth.fleet.credentials import main

    key = public_key_to_text(KEY.public_key())
    argv = ["node-a", "--url", "nats://n:4222", "--controller-key", key, "--out", str(tmp_path)]
    assert main(argv) == 0
    secret = tmp_path / "node-a.fleet.password"
    assert secret.stat().st_mode & 0o777 == 0o600
    out = capsys.readouterr().out
    server_entry = json.loads(out.split("then reload:\n", 1)[1].split("\n# 2.", 1)[0])
    assert server_entry["user"] == "agent-node-a" and server_entry["password"] == secret.read_text().strip()
    assert server_entry["permissions"]["subscribe"]["allow"] == ["netsleuth.host.node-a.>", "_INBOX_node-a.>"]
    # The printed [fleet] section is one the agent accepts as is.
    fleet_toml = out.split("[fleet]\n", 1)[1]
    import tomllib

    config = parse_config({"fleet": tomllib.loads(fleet_toml)}).fleet
    assert config is not None and config.host_id == "node-a" and config.password() == server_entry["password"]
    assert main(argv) == 2  # never overwrites: rotation is explicit
    assert "exists" in capsys.readouterr().err
    assert main(["Node.A", "--controller-key", key, "--out", str(tmp_path)]) == 2
    assert main(["node-b", "--controller-key", "nonsense", "--out", str(tmp_path)]) == 2
