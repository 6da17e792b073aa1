"""The CRI messages netsleuth reads, decoded from replies a real containerd 1.6.20 sent
(tests/fixtures/cri/*.bin, captured from tests/cri_lab.py: pod team-a/web-1 with label app=web and one
container "app"), and the protobuf wire encoding against bytes written out by hand from the encoding guide."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from netsleuth.kernel.cri import (
    CriClient,
    CriContainer,
    CriSandbox,
    SandboxDetail,
    decode_containers,
    decode_sandbox_status,
    decode_sandboxes,
    find_endpoint,
)
from netsleuth.kernel.cri_wire import (
    Fields,
    WireError,
    encode_map,
    encode_message,
    encode_string,
    encode_varint_field,
)
from netsleuth.kernel.pods import PodIndex

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "cri"
SANDBOX = "41d9a58d20fc26a782baa0990a29da48d20b8f0794b1c6d9c71c3223b7849e86"
CONTAINER = "daf38800f4ff6aa7bad75b2bbd7a44036c3f3ddf04aa2b75f1cb3f38e571a465"
UID = "03b42151-72d1-4b6b-8140-cb744bf9e356"


def _fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def test_list_pod_sandbox_reply() -> None:
    [sandbox] = decode_sandboxes(_fixture("list_pod_sandbox.bin"))
    assert (sandbox.id, sandbox.namespace, sandbox.name, sandbox.uid) == (SANDBOX, "team-a", "web-1", UID)
    assert sandbox.state == "ready" and sandbox.attempt == 0 and sandbox.created_at_ns > 1.7e18
    assert sandbox.labels == {
        "app": "web",
        "io.kubernetes.pod.name": "web-1",
        "io.kubernetes.pod.namespace": "team-a",
    }


def test_pod_sandbox_status_names_the_network_namespace_file() -> None:
    detail = decode_sandbox_status(_fixture("pod_sandbox_status.bin"))
    assert detail == SandboxDetail(
        id=SANDBOX,
        ip="198.19.87.2",
        host_network=False,
        netns_path="/var/run/netns/cni-7dbceb2e-9f70-8493-70c0-7ed70a9c0204",
        pid=8465,
    )


def test_list_containers_reply() -> None:
    [container] = decode_containers(_fixture("list_containers.bin"))
    assert container == CriContainer(
        id=CONTAINER,
        sandbox_id=SANDBOX,
        name="app",
        attempt=0,
        state="running",
        image="netsleuth.test/pause:1",
        labels={},
    )


def test_version_reply() -> None:
    reply = Fields(_fixture("version.bin"))
    assert (reply.string(1), reply.string(2), reply.string(3), reply.string(4)) == (
        "0.1.0",
        "containerd",
        "1.6.20~ds1",
        "v1",
    )


def test_host_network_sandbox_has_no_namespace_of_its_own() -> None:
    # PodSandboxStatus.linux.namespaces.options.network = NODE (2), and an info JSON without a network entry.
    options = encode_varint_field(1, 2)
    status = encode_string(1, "abc") + encode_message(6, encode_message(1, encode_message(2, options)))
    info = encode_map(2, {"info": '{"pid": 42, "runtimeSpec": {"linux": {"namespaces": [{"type": "pid"}]}}}'})
    detail = decode_sandbox_status(encode_message(1, status) + info)
    assert detail == SandboxDetail(id="abc", ip="", host_network=True, netns_path=None, pid=42)


def test_encoding_by_the_wire_format() -> None:
    # PodSandboxMetadata {name "web-1", uid "u", namespace "team-a", attempt 3}: keys 0x0a, 0x12, 0x1a
    # (fields 1-3, length-delimited) and 0x20 (field 4, varint)
    metadata = (
        encode_string(1, "web-1")
        + encode_string(2, "u")
        + encode_string(3, "team-a")
        + encode_varint_field(4, 3)
    )
    assert metadata == b"\n\x05web-1\x12\x01u\x1a\x06team-a \x03"
    # map<string,string> labels = 6 {"a": "b"}: one entry message (key = 1, value = 2)
    assert encode_map(6, {"a": "b"}) == b"2\x06\n\x01a\x12\x01b"
    # int64 -1 is ten bytes of two's complement; defaults are not written
    assert encode_varint_field(2, -1) == b"\x10" + b"\xff" * 9 + b"\x01"
    assert encode_varint_field(2, 0) == encode_string(1, "") == encode_message(1, b"") == b""
    assert Fields(encode_varint_field(2, -1)).integer(2) == -1
    assert Fields(encode_varint_field(2, 300)).integer(2, signed=False) == 300


def test_unknown_fields_and_wire_types_are_skipped() -> None:
    # fixed64 (wire type 1) field 9, fixed32 (wire type 5) field 10, then the string we read
    message = b"\x49" + bytes(8) + b"\x55" + bytes(4) + encode_string(1, "kept")
    assert Fields(message).string(1) == "kept"
    assert Fields(b"").string(1) == "" and Fields(b"").message(3).integer(1) == 0


@pytest.mark.parametrize("broken", [b"\x0a\x05ab", b"\x08", b"\x0b", b"\x08" + b"\xff" * 11])
def test_malformed_messages_are_one_error(broken: bytes) -> None:
    with pytest.raises(WireError):
        Fields(broken)


def test_endpoint_like_crictl(tmp_path: Path) -> None:
    assert find_endpoint({"CONTAINER_RUNTIME_ENDPOINT": "/x/y.sock"}) == "unix:///x/y.sock"
    assert find_endpoint({"CONTAINER_RUNTIME_ENDPOINT": "unix:///x/y.sock"}) == "unix:///x/y.sock"
    socket = tmp_path / "c.sock"
    socket.touch()
    candidates = (f"unix://{tmp_path}/none.sock", f"unix://{socket}")
    assert find_endpoint({}, candidates) == f"unix://{socket}"
    assert find_endpoint({}, candidates[:1]) is None


class _FakeRuntime(CriClient):
    """The runtime's answers without a socket: for the index's refresh rules only."""

    def __init__(self, sandboxes: list[CriSandbox], details: Mapping[str, SandboxDetail]) -> None:
        self.listed = 0
        self.statuses: list[str] = []
        self._sandboxes, self._details = sandboxes, details

    def sandboxes(self) -> list[CriSandbox]:
        self.listed += 1
        return list(self._sandboxes)

    def sandbox_detail(self, sandbox_id: str) -> SandboxDetail:
        self.statuses.append(sandbox_id)
        return self._details[sandbox_id]

    def containers(self, sandbox_id: str = "") -> list[CriContainer]:
        return []

    def close(self) -> None:
        pass


def test_index_refreshes_on_a_miss_at_most_once_per_interval_and_asks_each_sandbox_once(
    tmp_path: Path,
) -> None:
    netns = tmp_path / "netns"
    netns.touch()
    inode = netns.stat().st_ino
    now = [100.0]
    runtime = _FakeRuntime(
        [CriSandbox("s1", "team-a", "web-1", "u1", 0, "ready", 1)],
        {"s1": SandboxDetail("s1", "198.19.0.2", False, str(netns), None)},
    )
    index = PodIndex("unix:///fake.sock", min_refresh_s=1.0, max_age_s=30.0, clock=lambda: now[0],
                     client_factory=lambda endpoint: runtime)  # fmt: skip
    pod = index.pod_of_netns(inode)
    assert pod is not None and pod.ref == "team-a/web-1" and runtime.listed == 1
    for _ in range(100):
        assert index.pod_of_netns(inode + 1) is None  # a miss within the interval asks nothing
    assert runtime.listed == 1
    now[0] += 1.0
    index.pod_of_netns(inode + 1)
    assert runtime.listed == 2 and runtime.statuses == ["s1"]  # the known sandbox's status is not asked again
    now[0] += 30.0
    index.pod_of_netns(inode)  # known, but old
    assert runtime.listed == 3


def test_pod_filters_are_checked_for_form_only_when_meant_for_another_host() -> None:
    """The controller checks a fleet request's --pod / --k8s-namespace without a runtime: the agent resolves
    them on its host when the task arrives."""
    from netsleuth.diagnostics.filters import read_for_another_host
    from netsleuth.errors import UsageError
    from netsleuth.spec.common import PacketConfig
    from netsleuth.spec.configs import Speaker, read_config

    def packet_filter(**values: str) -> Any:
        return read_config(PacketConfig, values, Speaker.CLI).packet_filter()

    with read_for_another_host():
        checked = packet_filter(pod="team-a/web-1")
        assert checked.netns is None and not checked.netns_set
        packet_filter(k8s_namespace="team-b")
        with pytest.raises(UsageError, match="'web-1' is not a pod as NAMESPACE/NAME"):
            packet_filter(pod="web-1")
        with pytest.raises(UsageError, match="each choose the network namespace"):
            packet_filter(pod="a/b", k8s_namespace="a")
