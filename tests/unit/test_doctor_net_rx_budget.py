"""doctor's NET_RX budget finding, measured and inferred, on a window recorded from a REAL storm
(tests/fixtures/doctor/measured/net-rx-budget, made by record_net_rx_budget.py: netdev_budget = 8, UDP
flood into a veth with GRO, `doctor --netns b --record`). The same two snapshots are judged with the BPF
measurement (napi.json) and without it, so the two paths are compared on one real window."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from netsleuth.doctor.findings import Finding, Report
from netsleuth.doctor.model import DeviceSysfs, Snapshot
from netsleuth.doctor.napi_measure import CpuNetRx, DeviceNapi, NapiMeasurement, between, bpf_unusable
from netsleuth.doctor.rules import diagnose
from netsleuth.doctor.window import Window
from tests.fixtures.doctor import FIXTURES, scenario_window

RECORDING = FIXTURES / "measured" / "net-rx-budget"


def _window(measured: bool = True, problem: str | None = None) -> Window:
    before, after = (
        Snapshot.from_json(json.loads((RECORDING / f"{phase}.json").read_text()))
        for phase in ("before", "after")
    )
    napi = NapiMeasurement.from_json(json.loads((RECORDING / "napi.json").read_text())) if measured else None
    return Window(before, after, napi=napi, napi_problem=problem)


def _squeeze(report: Report) -> Finding:
    finding = report.finding("time-squeeze")
    assert finding is not None, [f.id for f in report.findings]
    return finding


def test_recorded_storm_measured_names_the_packet_budget_and_the_full_device() -> None:
    window = _window()
    assert window.napi is not None
    netns = window.after.netns
    assert netns is not None
    report = diagnose(window)
    finding = _squeeze(report)
    evidence = finding.evidence
    assert evidence["method"] == "measured" and evidence["budget_ran_out"] == "packets"
    assert finding.title.endswith(f"(measured over {window.napi.seconds:.1f} s)")
    assert evidence["netdev_budget"] == 8 and evidence["netdev_budget_usecs"] == 8000
    # The recorded counts, as the kernel counted them: 449 + 169 runs stopped on 8 packets, none on time;
    # softnet_stat's time_squeeze read at the same moments says 449 and 170.
    assert evidence["budget_runs_by_cpu"] == {"0": 449, "1": 169}
    assert evidence["time_runs_by_cpu"] == {"0": 0, "1": 0}
    assert evidence["kernel_time_squeeze_by_cpu"] == {"0": 449, "1": 170}
    assert evidence["exhausted_polls_by_device"] == {"veth0": 60}
    assert evidence["stopped_runs_per_s"] == pytest.approx(618 / window.napi.seconds, abs=0.1)
    assert "618 of 59543 NET_RX runs stopped after handling netdev_budget = 8 packets" in finding.explanation
    assert "veth0 60 of 61174 polls (weight 64)" in finding.explanation
    # Host-wide sysctl: typed as is even for a namespace; the apply line names the namespace.
    assert finding.fix_commands == ("sysctl -w net.core.netdev_budget=16",)
    assert finding.apply_command == f"netsleuth doctor --netns {netns} --fix time-squeeze --yes"
    payload = report.to_json()
    assert payload["napi_measurement"]["cpus"][0]["budget_runs"] == 449
    assert payload["napi_not_measured"] is None
    assert any("measured with BPF (tp_btf)" in note for note in report.notes)


def test_same_recorded_window_without_bpf_is_inferred_and_says_why() -> None:
    report = diagnose(_window(measured=False, problem="--no-bpf"))
    finding = _squeeze(report)
    assert finding.evidence["method"] == "inferred"
    assert finding.title.endswith("(inferred from time_squeeze)")
    assert "BPF not used: --no-bpf" in finding.explanation
    # The budgets are the host's (read outside the namespace), not the defaults: a namespace has no
    # net.core.netdev_budget of its own.
    assert finding.evidence["netdev_budget"] == 8 and finding.evidence["netdev_budget_usecs"] == 8000
    # What the inference cannot see: averaged over all runs, ~1 packet per run looks like the time limit,
    # while the measurement above shows every stopped run stopped on the packet budget.
    assert finding.fix_commands == ("sysctl -w net.core.netdev_budget_usecs=16000",)
    assert report.to_json()["napi_measurement"] is None
    assert report.to_json()["napi_not_measured"] == "--no-bpf"


def test_synthetic_squeeze_without_a_reason_says_not_measured(tmp_path: Path) -> None:
    finding = _squeeze(diagnose(scenario_window("budget-squeeze", tmp_path)))
    assert finding.evidence["method"] == "inferred"
    assert "not measured in this window" in finding.explanation


def _time_bound(napi: NapiMeasurement) -> NapiMeasurement:
    return dataclasses.replace(
        napi,
        cpus=tuple(
            dataclasses.replace(cpu, budget_runs=0, time_runs=cpu.budget_runs + 1) for cpu in napi.cpus
        ),
    )


def test_runs_stopped_on_time_blame_netdev_budget_usecs() -> None:
    window = _window()
    assert window.napi is not None
    finding = _squeeze(diagnose(dataclasses.replace(window, napi=_time_bound(window.napi))))
    assert finding.evidence["budget_ran_out"] == "time"
    assert finding.fix_commands == ("sysctl -w net.core.netdev_budget_usecs=16000",)
    assert "raising netdev_budget would change nothing" in finding.explanation


def test_quiet_measured_window_is_all_good_and_says_measured() -> None:
    window = _window()
    assert window.napi is not None
    quiet = dataclasses.replace(
        window.napi,
        cpus=tuple(dataclasses.replace(cpu, budget_runs=0, time_runs=0) for cpu in window.napi.cpus),
    )
    report = diagnose(dataclasses.replace(window, napi=quiet))
    assert report.finding("time-squeeze") is None
    assert any(
        "0 stopped on netdev_budget" in line and "measured with BPF" in line for line in report.all_good
    )


def _one_cpu_window(rps: tuple[int, ...], channels: bool = True) -> Window:
    """All stopped runs on CPU 0, all of veth0's polls there, in the measured namespace. `channels`: keep
    the recorded veth0 channels (1 RX queue of 2 possible), else a device that reports none."""
    window = _window()
    assert window.napi is not None
    cpus = (
        CpuNetRx(cpu=0, runs=5000, packets=40000, budget_runs=900, time_runs=0, exhausted_polls=80),
        CpuNetRx(cpu=1, runs=100, packets=100, budget_runs=0, time_runs=0, exhausted_polls=0),
    )
    veth = dataclasses.replace(window.napi.devices[0], polls_by_cpu={"0": 61174}, exhausted_polls=80)
    ethtool = window.after.ethtool
    if not channels:
        ethtool = {**ethtool, "veth0": dataclasses.replace(ethtool["veth0"], channels=None)}
    after = dataclasses.replace(
        window.after,
        devices={**window.after.devices, "veth0": DeviceSysfs(rps_cpus={"rx-0": rps})},
        ethtool=ethtool,
    )
    return dataclasses.replace(
        window, after=after, napi=dataclasses.replace(window.napi, cpus=cpus, devices=(veth,))
    )


def test_one_cpu_doing_it_all_gets_spreading_advice_in_the_devices_namespace() -> None:
    window = _one_cpu_window(rps=())
    netns = window.after.netns
    finding = _squeeze(diagnose(window))
    assert finding.evidence["one_cpu"] == 0
    assert "CPU 0 does 900 of the 900 stopped runs" in finding.explanation
    # The recorded veth0 has 1 of 2 possible RX queues: more queues first.
    assert f"(ip netns exec {netns} ethtool -L veth0 rx 2)" in finding.explanation
    # A device without more queues: RPS on its one queue, the command placed in its namespace.
    single = _squeeze(diagnose(_one_cpu_window(rps=(), channels=False)))
    rps_command = f"ip netns exec {netns} sh -c 'echo 3 > /sys/class/net/veth0/queues/rx-0/rps_cpus'"
    assert rps_command in single.explanation
    # RPS already on: no command to turn it on again.
    with_rps = _squeeze(diagnose(_one_cpu_window(rps=(0, 1), channels=False)))
    assert "RPS is on for veth0" in with_rps.explanation and "rps_cpus'" not in with_rps.explanation


def test_device_in_another_namespace_is_labelled_and_placed_there() -> None:
    window = _one_cpu_window(rps=())
    assert window.napi is not None
    elsewhere = dataclasses.replace(
        window.napi.devices[0], netns=1, netns_name="other", in_measured_netns=False, in_own_netns=False
    )
    napi = dataclasses.replace(window.napi, devices=(elsewhere,))
    finding = _squeeze(diagnose(dataclasses.replace(window, napi=napi)))
    assert finding.evidence["exhausted_polls_by_device"] == {"veth0 (netns other)": 80}
    # Its queues are not in this namespace's snapshot: RPS, typed for the device's own namespace.
    rps_command = "ip netns exec other sh -c 'echo 3 > /sys/class/net/veth0/queues/rx-0/rps_cpus'"
    assert rps_command in finding.explanation


def test_between_subtracts_two_reads_of_the_counters() -> None:
    device = DeviceNapi(
        dev="veth0", netns=7, netns_name="b", in_measured_netns=True, in_own_netns=False, instances=1,
        weight=64, polls=100, packets=300, exhausted_polls=2, polls_by_cpu={"0": 60, "1": 40},
    )  # fmt: skip
    idle = DeviceNapi(
        dev="lo0", netns=7, netns_name="b", in_measured_netns=True, in_own_netns=False, instances=1,
        weight=64, polls=5, packets=5, exhausted_polls=0, polls_by_cpu={"0": 5},
    )  # fmt: skip
    first = NapiMeasurement(
        seconds=1.0, netdev_budget=8, netdev_budget_usecs=8000, attach="tp_btf",
        cpus=(CpuNetRx(0, 10, 20, 1, 0, 0, 1),), devices=(device, idle),
    )  # fmt: skip
    second = dataclasses.replace(
        first,
        seconds=3.5,
        cpus=(CpuNetRx(0, 110, 520, 41, 2, 5, 44), CpuNetRx(1, 3, 3, 0, 0, 0, 0)),
        devices=(
            dataclasses.replace(
                device, polls=250, packets=900, exhausted_polls=7, polls_by_cpu={"0": 60, "1": 190}
            ),
            idle,
        ),
    )
    delta = between(first, second)
    assert delta.seconds == 2.5
    assert delta.cpus == (CpuNetRx(0, 100, 500, 40, 2, 5, 43), CpuNetRx(1, 3, 3, 0, 0, 0, 0))
    (veth,) = delta.devices  # lo0 had no poll in the window
    assert (veth.polls, veth.packets, veth.exhausted_polls, veth.polls_by_cpu) == (150, 600, 5, {"1": 150})
    assert NapiMeasurement.from_json(json.loads(json.dumps(delta.to_json()))) == delta


def test_bpf_is_not_tried_on_a_recorded_root_or_with_no_bpf() -> None:
    assert bpf_unusable(Path("/"), no_bpf=False) is None
    assert bpf_unusable(Path("/"), no_bpf=True) == "--no-bpf"
    assert "not from this running kernel" in (bpf_unusable(FIXTURES / "vm-quiet", no_bpf=False) or "")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netsleuth", "doctor", *argv], capture_output=True, text=True, timeout=60
    )


def test_cli_replay_judges_the_recorded_measurement(tmp_path: Path) -> None:
    measured = json.loads(_cli("--replay", str(RECORDING), "--json").stdout)
    assert measured["napi_measurement"]["netdev_budget"] == 8
    (finding,) = [f for f in measured["findings"] if f["id"] == "time-squeeze"]
    assert finding["evidence"]["method"] == "measured"
    # Without napi.json (a recording made with --no-bpf or as non-root), the replay infers and says why.
    for phase in ("before", "after"):
        (tmp_path / f"{phase}.json").write_text((RECORDING / f"{phase}.json").read_text())
    inferred = json.loads(_cli("--replay", str(tmp_path), "--json").stdout)
    assert inferred["napi_measurement"] is None and "holds no napi.json" in inferred["napi_not_measured"]


def test_cli_replay_of_a_broken_measurement_is_one_sentence_and_exit_2(tmp_path: Path) -> None:
    for phase in ("before", "after"):
        (tmp_path / f"{phase}.json").write_text((RECORDING / f"{phase}.json").read_text())
    (tmp_path / "napi.json").write_text('{"seconds": 1}')
    result = _cli("--replay", str(tmp_path))
    assert result.returncode == 2, result.stderr
    assert "cannot replay" in result.stderr and len(result.stderr.strip().splitlines()) == 1
