"""Feature probes on recorded BTF facts of two real kernels (tests/fixtures/kernel/tracepoints-*.json, made by
record_debian_btf.py from Debian's 6.1 image and from this host's 6.18), and the recording checked against
the live kernel's BTF so it cannot drift from what the probes really read."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from netsleuth.bpf import features
from netsleuth.bpf.btf import VMLINUX_BTF, Btf
from netsleuth.bpf.errors import BpfError, MissingFeature
from netsleuth.errors import EnvironmentProblem

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "kernel"
DEBIAN_6_1 = "6.1.0-56-cloud-amd64"
HOST_6_18 = "6.18.44-fc-v669"


class RecordedTracepoints:
    """A TracepointSource over a recording: the arities `btf_trace_<name>` had on that kernel."""

    def __init__(self, release: str) -> None:
        recorded = json.loads((FIXTURES / f"tracepoints-{release}.json").read_text())
        self.arity: dict[str, int | None] = recorded["arity"]

    def tracepoint_arity(self, tracepoint: str) -> int | None:
        return self.arity.get(tracepoint)


def _without(release: str, *tracepoints: str) -> RecordedTracepoints:
    """A recording with some tracepoints removed, as on a kernel older than the one recorded."""
    recorded = RecordedTracepoints(release)
    for name in tracepoints:
        recorded.arity.pop(name)
    return recorded


PROBES = {
    "drop_reasons": features.drop_reasons,
    "kfree_skb_rx_sk": features.kfree_skb_rx_sk,
    "consume_skb_location": features.consume_skb_location,
    "reset_reasons": features.reset_reasons,
    "retransmit_err": features.retransmit_err,
}
# What each kernel really has (the commits cited in features.py): 6.1 has drop reasons and nothing newer.
EXPECTED = {
    DEBIAN_6_1: {"drop_reasons"},
    HOST_6_18: set(PROBES),
}


@pytest.mark.parametrize("release", sorted(EXPECTED))
def test_probes_on_recorded_kernels(release: str) -> None:
    source = RecordedTracepoints(release)
    assert {name for name, probe in PROBES.items() if probe(source)} == EXPECTED[release]


@pytest.mark.parametrize(
    ("name", "minimum"),
    [
        ("consume_skb_location", "6.3"),
        ("reset_reasons", "6.10"),
        ("kfree_skb_rx_sk", "6.11"),
        ("retransmit_err", "6.11"),
    ],
)
def test_missing_on_6_1_names_the_feature_and_the_first_kernel(name: str, minimum: str) -> None:
    probe = PROBES[name]
    with pytest.raises(MissingFeature) as caught:
        probe.require(RecordedTracepoints(DEBIAN_6_1))
    assert caught.value.minimum_kernel == minimum
    assert caught.value.feature == probe.feature
    assert f"needs Linux {minimum} or newer" in str(caught.value)
    assert probe.tracepoint in str(caught.value)
    # A MissingFeature is an EnvironmentProblem (the CLI turns it into one sentence, exit code 2) and a
    # BpfError (callers that go on without a diagnostic whose programs cannot load catch it as one).
    assert isinstance(caught.value, EnvironmentProblem) and isinstance(caught.value, BpfError)
    assert caught.value.hint == probe.hint


def test_drop_reasons_missing_before_5_17() -> None:
    # 5.15 (Ubuntu 22.04) has skb:kfree_skb(skb, location): arity 2.
    older = RecordedTracepoints(DEBIAN_6_1)
    older.arity["kfree_skb"] = 2
    assert not features.drop_reasons(older)
    with pytest.raises(MissingFeature, match=r"drop reasons in the skb:kfree_skb tracepoint.*Linux 5\.17"):
        features.drop_reasons.require(older)
    features.drop_reasons.require(RecordedTracepoints(DEBIAN_6_1))  # present: no error


def test_tracepoint_presence_and_one_error_for_all_missing() -> None:
    source = _without(DEBIAN_6_1, "inet_sk_error_report", "tcp_send_reset")
    assert features.tracepoint("kfree_skb", source)
    assert not features.tracepoint("inet_sk_error_report", source)
    features.require_tracepoints(["kfree_skb", "tcp_receive_reset"], source)
    with pytest.raises(MissingFeature) as caught:
        features.require_tracepoints(["tcp_send_reset", "kfree_skb", "inet_sk_error_report"], source)
    # One sentence, both names, and the newest of their first kernels (raw_tp 4.17 vs error_report 5.14).
    assert caught.value.feature == "the tracepoints inet_sk_error_report, tcp_send_reset"
    assert caught.value.minimum_kernel == "5.14"
    with pytest.raises(
        MissingFeature, match=r"^this kernel lacks the tracepoint tcp_send_reset \(needs Linux 4\.17"
    ):
        features.require_tracepoints(["tcp_send_reset"], source)


def test_version_ordering_is_numeric() -> None:
    source = _without(HOST_6_18, "inet_sk_error_report")
    source.arity.pop("net_dev_queue")
    features._TRACEPOINT_SINCE["net_dev_queue"] = "5.9"  # compare as numbers: 5.14 > 5.9
    try:
        with pytest.raises(MissingFeature) as caught:
            features.require_tracepoints(["net_dev_queue", "inet_sk_error_report"], source)
        assert caught.value.minimum_kernel == "5.14"
    finally:
        del features._TRACEPOINT_SINCE["net_dev_queue"]


def test_cgroup_v2_path_from_mounts(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text("proc /proc proc rw 0 0\ncgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec 0 0\n")
    assert features._cgroup_v2_path(mounts) == "/sys/fs/cgroup"
    mounts.write_text("cgroup /sys/fs/cgroup/cpu cgroup rw,cpu 0 0\n")
    assert features._cgroup_v2_path(mounts) is False
    assert features._cgroup_v2_path(tmp_path / "absent") is False


# -- against this host: the recording must be what the live BTF says ----------------------------------------


def test_live_kernel_matches_its_recording_or_is_another_kernel() -> None:
    # Needs BTF: in CI the shared conftest turns a skip into a failure.
    if not VMLINUX_BTF.exists():
        pytest.skip("kernel without BTF (/sys/kernel/btf/vmlinux)")
    recorded = RecordedTracepoints(HOST_6_18)
    with Btf.vmlinux() as live:
        if os.uname().release == HOST_6_18:
            assert {name: live.tracepoint_arity(name) for name in recorded.arity} == recorded.arity
        # Whatever kernel this is, the default source (the running kernel) and an explicit one agree.
        for name, probe in PROBES.items():
            assert probe() == probe(live), name


def test_probe_all_reports_every_feature_as_bool_or_path() -> None:
    if not VMLINUX_BTF.exists():
        pytest.skip("kernel without BTF (/sys/kernel/btf/vmlinux)")
    report = features.probe_all()
    assert set(report) >= {
        "btf", "ring_buffer", "tp_btf", "raw_tp", "kprobes", "fentry", "drop_reasons", "reset_reasons",
        "perf_event_profiling", "cgroup_v2", "bpf_stats", "kernel",
    }  # fmt: skip
    assert report["kernel"] == os.uname().release
    assert all(isinstance(value, (bool, str)) for value in report.values())
    assert report["btf"] is True and report["drop_reasons"] == features.drop_reasons()
    if os.geteuid() == 0:
        # What this host can really do (docs/PREAMBLE: tracepoints, tp_btf, raw_tp and ring buffers work;
        # kprobes are not compiled in). fentry is whatever loading + attaching said; it is not asserted.
        assert report["tp_btf"] is True and report["raw_tp"] is True and report["ring_buffer"] is True
        assert report["bpf_stats"] is True and report["perf_event_profiling"] is True
    else:
        assert report["tp_btf"] is False and report["raw_tp"] is False
