"""The fleet wire format: round trips, one-sentence validation errors, Ed25519 over canonical JSON."""

from __future__ import annotations

import base64
import json
import time

import pytest

from netsleuth.fleet.protocol import (
    Budgets,
    Control,
    HostEntry,
    HostStatus,
    PingReply,
    ProtocolError,
    RecordBatch,
    Scope,
    SignedTask,
    Task,
    TaskReply,
    canonical_json,
    decode,
    generate_private_key,
    new_task_id,
    private_key_from_text,
    private_key_to_text,
    public_key_from_text,
    public_key_to_text,
    records_subject,
    status_subject,
    task_subject,
)


def _task(**changes: object) -> Task:
    now = time.time()
    body: dict[str, object] = {
        "id": new_task_id(),
        "session": "s1",
        "host": "client",
        "diagnostic": "drops",
        "config": {"proto": "tcp", "dport": 8080},
        "scope": Scope(netns=("client",)),
        "issued_at": now,
        "expires_at": now + 30,
        "deadline_s": 5.0,
        "budgets": Budgets(),
        "user": "alice",
    }
    body.update(changes)
    return Task(**body)  # type: ignore[arg-type]


def test_subjects() -> None:
    assert task_subject("host-1") == "netsleuth.host.host-1.task"
    assert status_subject("abc", "h") == "netsleuth.session.abc.h.status"
    assert records_subject("abc", "h") == "netsleuth.session.abc.h.records"
    with pytest.raises(ProtocolError, match="host id"):
        task_subject("a.b")
    with pytest.raises(ProtocolError, match="host id"):
        task_subject("*")
    with pytest.raises(ProtocolError, match="session id"):
        status_subject("x>y", "h")


def test_sign_and_verify_round_trip_through_the_wire() -> None:
    key = generate_private_key()
    signed = SignedTask.sign(_task(), key, "controller-1")
    received = SignedTask.from_json(json.loads(signed.encode()))
    received.verify(key.public_key())
    assert received.task == signed.task
    assert received.key_id == "controller-1"


def test_signature_covers_the_task_as_received_not_as_renormalised() -> None:
    # A controller in another language may write 5 where Python writes 5.0: the signature is over the
    # bytes it signed, so verification must use the received object, not our re-serialisation.
    key = generate_private_key()
    raw = _task().to_json()
    raw["deadline_s"] = 5
    signature = base64.b64encode(key.sign(canonical_json(raw))).decode()
    received = SignedTask.from_json({"task": raw, "signature": signature, "key_id": "k"})
    received.verify(key.public_key())


def test_tampered_task_or_other_key_fails() -> None:
    key = generate_private_key()
    wire = json.loads(SignedTask.sign(_task(), key, "k").encode())
    wire["task"]["scope"]["netns"] = ["lb"]
    with pytest.raises(ProtocolError, match="does not verify"):
        SignedTask.from_json(wire).verify(key.public_key())
    good = SignedTask.sign(_task(), key, "k")
    with pytest.raises(ProtocolError, match="does not verify"):
        good.verify(generate_private_key().public_key())
    with pytest.raises(ProtocolError, match="not base64"):
        SignedTask(good.task, "***", "k", good.raw_task).verify(key.public_key())


def test_key_text_round_trip_and_errors() -> None:
    key = generate_private_key()
    text = private_key_to_text(key)
    assert text.startswith("ed25519:")
    again = private_key_from_text(text)
    assert public_key_to_text(again.public_key()) == public_key_to_text(key.public_key())
    public_key_from_text(public_key_to_text(key.public_key()).removeprefix("ed25519:"))
    with pytest.raises(ProtocolError, match="32 bytes"):
        public_key_from_text(base64.b64encode(b"short").decode())
    with pytest.raises(ProtocolError, match="not base64"):
        public_key_from_text("not base64!")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"id": "x"}, "task.id must be 8-64"),
        ({"host": "Bad.Host"}, "host id"),
        ({"expires_at": "soon"}, "task.expires_at must be a number"),
        ({"deadline_s": 0}, "task.deadline_s must be a number of at least 0.001"),
        (
            {"budgets": {"max_events": 1, "max_bytes": 1, "cpu_percent": 500}},
            "cpu_percent must be at most 100",
        ),
        (
            {"budgets": {"max_events": True, "max_bytes": 1, "cpu_percent": 1}},
            "max_events must be an integer",
        ),
        ({"scope": {"netns": "client"}}, "task.scope.netns must be a list"),
        ({"config": []}, "task.config must be a JSON object"),
        ({"v": 2}, "task.v 2 is not supported"),
    ],
)
def test_task_validation_is_one_sentence(change: dict[str, object], message: str) -> None:
    raw = _task().to_json()
    raw.update(change)
    with pytest.raises(ProtocolError, match=message) as caught:
        Task.from_json(raw)
    assert "\n" not in str(caught.value)


def test_expiry_before_issue_is_refused() -> None:
    raw = _task().to_json()
    raw["expires_at"] = raw["issued_at"] - 1
    with pytest.raises(ProtocolError, match="before"):
        Task.from_json(raw)


def test_messages_round_trip() -> None:
    control = Control("s1", "start", 123)
    assert Control.from_json(json.loads(control.encode())) == control
    assert Control.from_json({"session": "s1", "action": "cancel"}) == Control("s1", "cancel")
    with pytest.raises(ProtocolError, match=r"control\.action"):
        Control.from_json({"session": "s1", "action": "explode"})
    with pytest.raises(ProtocolError, match="t0_ns"):
        Control.from_json({"session": "s1", "action": "start"})
    reply = TaskReply(False, "expired", -5)
    assert TaskReply.from_json(json.loads(reply.encode())) == reply
    assert PingReply.from_json(json.loads(PingReply(7).encode())) == PingReply(7)
    status = HostStatus("h", "s1", "ended", "duration", 12, 3, {"total": 4}, 1, 2, 3, 100, "t")
    assert HostStatus.from_json(json.loads(status.encode())) == status
    with pytest.raises(ProtocolError, match=r"status\.state"):
        HostStatus.from_json({**status.to_json(), "state": "happy"})
    batch = RecordBatch("h", "s1", 0, [{"type": "drop", "v": 1}])
    assert RecordBatch.from_json(json.loads(batch.encode())) == batch
    with pytest.raises(ProtocolError, match=r"records\[0\]"):
        RecordBatch.from_json({"host": "h", "session": "s1", "seq": 0, "records": [{"x": 1}]})
    entry = HostEntry(
        host="h",
        hostname="node",
        kernel="6.18",
        features={"tp_btf": True},
        version="0.1.0",
        labels={"role": "lb"},
        namespaces=[{"name": "lb", "inode": 4026532000}],
        containers=[],
        heartbeat="2026-11-23T08:00:00.000Z",
        heartbeat_ns=1,
        diagnostics=("drops",),
        key_id="controller-1",
        offset_ns=-20_661,
    )
    assert HostEntry.from_json(json.loads(entry.encode())) == entry


def test_decode_says_what_is_not_json() -> None:
    with pytest.raises(ProtocolError, match="the task is not valid JSON"):
        decode(b"{nope", "task")
    with pytest.raises(ProtocolError, match="signed task must be a JSON object"):
        SignedTask.from_json([1, 2])


def test_a_batch_from_encoded_lines_is_the_same_message() -> None:
    records = [{"type": "drop", "v": 1, "time": "t", "note": 'u\u00fc "quoted"'}, {"type": "summary", "v": 1}]
    lines = [json.dumps(record, separators=(",", ":")).encode() for record in records]
    data = RecordBatch.encode_lines("h", "s1", 3, lines)
    assert RecordBatch.from_json(json.loads(data)) == RecordBatch("h", "s1", 3, records)
    empty = json.loads(RecordBatch.encode_lines("h", "s1", 0, []))
    assert empty == {"host": "h", "session": "s1", "seq": 0, "records": []}
