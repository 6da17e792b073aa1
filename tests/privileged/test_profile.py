"""`netsleuth profile` against real load: a CPU-burning process in a namespace is the widest frame of its
flame graph (and the SVG parses, the speedscope JSON holds the same samples), the sample counts add up
exactly, `--softirq NET_RX` during a UDP storm shows the receive path, nothing stays attached, bad input."""

from __future__ import annotations

import json
import subprocess
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.netlab import wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, netsleuth_argv

pytestmark = pytest.mark.privileged

BURNER = r"""
#include <stdlib.h>
#include <time.h>
volatile unsigned long sink;
__attribute__((noinline)) void netsleuth_test_burn(double seconds)
{
	struct timespec start, now;
	clock_gettime(CLOCK_MONOTONIC, &start);
	do {
		for (unsigned long i = 0; i < 200000; i++)
			sink += i * i;
		clock_gettime(CLOCK_MONOTONIC, &now);
	} while ((now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
}
int main(int argc, char **argv) { netsleuth_test_burn(atof(argv[1])); return 0; }
"""


@pytest.fixture(scope="module")
def burner(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PIE with frame pointers whose time goes to one named function."""
    directory = tmp_path_factory.mktemp("burner")
    source = directory / "burner.c"
    source.write_text(BURNER)
    binary = directory / "nsburner"
    subprocess.run(
        ["gcc", "-O1", "-fno-omit-frame-pointer", "-pie", "-fPIE", "-o", str(binary), str(source)], check=True
    )
    return str(binary)


def of_type(records: list[dict[str, Any]], record_type: str) -> list[dict[str, Any]]:
    return [record for record in records if record.get("type") == record_type]


def test_cpu_burner_is_the_widest_frame_of_its_flame_graph(pair: Pair, burner: str, tmp_path: Path) -> None:
    svg, folded, speedscope = tmp_path / "p.svg", tmp_path / "p.folded", tmp_path / "p.json"
    trace = TraceRun(
        "profile", "--netns", pair.a.name, "--hz", "199", "--svg", str(svg), "--folded", str(folded),
        "--speedscope", str(speedscope),
    )  # fmt: skip
    try:
        trace.wait_ready()
        pair.a.run(burner, "2.5")
    finally:
        trace.stop()
    records = trace.records()
    summary = records[-1]
    stacks = of_type(records, "stack")
    assert summary["type"] == "summary" and summary["diagnostic"] == "profile"
    # Exact: every sample that matched is in a stack (none lost to a full table), and the files hold them all.
    assert summary["counted"] == summary["matched"] - summary["uncounted"] == sum(s["count"] for s in stacks)
    assert summary["uncounted"] == 0
    burning = [stack for stack in stacks if stack["comm"] == "nsburner"]
    burned = sum(stack["count"] for stack in burning)
    assert burned >= 50, summary  # 2.5 s at 199 Hz, even on a loaded machine
    in_function = sum(stack["count"] for stack in burning if "netsleuth_test_burn" in stack["frames"])
    assert in_function >= 0.9 * burned
    # Only the namespace's tasks: the burner and what `ip netns exec` ran before it.
    assert {stack["comm"] for stack in stacks} <= {"nsburner", "ip"}

    lines = folded.read_text().splitlines()
    assert sum(int(line.rsplit(" ", 1)[1]) for line in lines) == summary["counted"]
    assert any(line.startswith("nsburner;") and ";netsleuth_test_burn" in line for line in lines)

    # The SVG parses, and below the process frame the burner's function is the widest frame.
    tree = ElementTree.parse(svg)
    frames = [
        (group.get("data-n"), float(group.get("data-w") or 0), int(group.get("data-d") or 0))
        for group in tree.iter("{http://www.w3.org/2000/svg}g")
        if group.get("class") == "f"
    ]
    below_process = [frame for frame in frames if frame[2] >= 2 and frame[0] != "nsburner"]
    widest = max(below_process, key=lambda frame: frame[1])
    deepest_wide = max((frame for frame in below_process if frame[1] >= widest[1] * 0.9), key=lambda f: f[2])
    assert deepest_wide[0] == "netsleuth_test_burn", sorted(below_process, key=lambda f: -f[1])[:5]
    assert tree.getroot().find("{http://www.w3.org/2000/svg}script") is not None

    document = json.loads(speedscope.read_text())
    assert document["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    (profile,) = document["profiles"]
    assert sum(profile["weights"]) == summary["counted"] and profile["endValue"] == summary["counted"]
    names = [frame["name"] for frame in document["shared"]["frames"]]
    assert "netsleuth_test_burn" in names


def test_netns_samples_the_named_namespaces_tasks_only_while_both_burn(pair: Pair, burner: str) -> None:
    """`profile --netns` is the kernel's filter (bpf/filter_maps.bpf.h, on the sampled task's namespace): a
    burner in each of two namespaces at once, and every sample counted is the named one's burner's - none of
    the other's, none of the host's - while the exact totals still add up."""
    trace = TraceRun("profile", "--netns", pair.a.name, "--hz", "199")
    burners: list[subprocess.Popen[bytes]] = []
    try:
        trace.wait_ready()
        # `ip netns exec` enters the namespace and execs the burner: the pid is the burner's.
        burners = [host.popen([burner, "2.5"]) for host in (pair.a, pair.b)]
        for process in burners:
            assert process.wait(60) == 0
    finally:
        for process in burners:
            if process.poll() is None:
                process.kill()
                process.wait()
        trace.stop()
    named, other = (process.pid for process in burners)
    records = trace.records()
    summary = records[-1]
    stacks = of_type(records, "stack")
    assert summary["counted"] == summary["matched"] - summary["uncounted"] == sum(s["count"] for s in stacks)
    by_pid: dict[int, int] = {}
    for stack in stacks:
        by_pid[stack["pid"]] = by_pid.get(stack["pid"], 0) + stack["count"]
    assert by_pid.get(named, 0) >= 50, (by_pid, summary)  # 2.5 s at 199 Hz, even on a loaded machine
    assert other not in by_pid, by_pid  # the other namespace's burner burned as long: not one sample
    assert set(by_pid) == {named}, by_pid  # nothing else runs in the named namespace


def test_a_pinned_burner_gets_no_more_samples_than_the_window_holds(burner: str) -> None:
    """One thread on one CPU at 99 Hz: that CPU's clock fires at most hz x window + 1 times while the events
    are enabled, so the burner's samples cannot exceed it when the window is the sampling window (the events
    enabled only once everything is ready, stamped then, and disabled before the stacks are read); and
    counted = matched - uncounted exactly, from one read of a stopped profile."""
    hz = 99
    process = subprocess.Popen(["taskset", "-c", "0", burner, "60"])
    try:
        for _ in range(3):
            trace = TraceRun("profile", "--pid", str(process.pid), "--hz", str(hz), "--duration", "5")
            try:
                trace.wait_ready()
                assert trace.finish(60) == 0, trace.stderr()
                records = trace.records()
            finally:
                trace.stop()
            summary = records[-1]
            stacks = of_type(records, "stack")
            assert (
                summary["counted"]
                == summary["matched"] - summary["uncounted"]
                == sum(stack["count"] for stack in stacks)
            )
            assert {stack["pid"] for stack in stacks} <= {process.pid}
            most = int(hz * summary["seconds"]) + 1
            assert summary["matched"] <= most, (summary["matched"], summary["seconds"], most)
            assert summary["matched"] > 0, summary
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def storm_pair(pair: Pair, udpflood: str) -> Iterator[Pair]:
    pair.b.run("ethtool", "-K", "veth0", "gro", "on")
    pair.a.run("ethtool", "-K", "veth0", "tso", "off")
    yield pair


def test_softirq_net_rx_shows_the_receive_path_of_a_udp_storm(storm_pair: Pair, udpflood: str) -> None:
    pair = storm_pair
    trace = TraceRun("profile", "--softirq", "NET_RX", "--hz", "999")
    try:
        trace.wait_ready()
        pair.a.run(udpflood, pair.b4, "9", "150000")
    finally:
        trace.stop()
    records = trace.records()
    summary = records[-1]
    stacks = of_type(records, "stack")
    assert summary["softirq"] == "NET_RX" and summary["matched"] > 0
    assert summary["counted"] == sum(stack["count"] for stack in stacks)
    # Every sample ran inside the NET_RX handler, whichever task it interrupted; kernel frames only.
    assert all(stack["in_softirq"] for stack in stacks)
    counted = sum(stack["count"] for stack in stacks)
    receive = sum(
        stack["count"]
        for stack in stacks
        if any(frame.startswith("net_rx_action") for frame in stack["frames"])
    )
    assert receive >= 0.8 * counted
    assert any("veth_poll_[k]" in stack["frames"] for stack in stacks)
    assert all(
        all(frame.endswith("_[k]") or frame.startswith("[") for frame in stack["frames"][1:])
        for stack in stacks
    )


def test_nothing_stays_attached_after_exit() -> None:
    def program_ids() -> set[int]:
        return {int(program["id"]) for program in bpftool_netsleuth_programs("profile_")}

    before = program_ids()
    trace = TraceRun("profile", "--hz", "49")
    trace.wait_ready()
    ours = program_ids() - before
    assert ours
    assert trace.stop() == 0
    wait_for(lambda: not ours & program_ids(), 10, "profile programs released")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--hz", "0"], "--hz must be a whole number from 1 to 10000"),
        (["--hz", "fast"], "--hz must be a whole number"),
        (["--softirq", "NET_RXX"], "is not a softirq of this kernel"),
        (["--svg", "/nonexistent-dir/x.svg"], "does not exist"),
        (["--comm", "a-name-longer-than-fifteen"], "is not a name of 1 to 15 characters"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("profile", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
