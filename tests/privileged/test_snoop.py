"""`netsleuth snoop exec|open` against real processes in a namespace: a command with its arguments and exit
status, failed execs and opens with their errno, exact counts, the process filters applied in the kernel,
nothing left attached, and bad input."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from netsleuth.kernel.tracefs import TRACEFS
from tests.netlab import run, wait_for
from tests.privileged.conftest import Pair
from tests.tracerun import TraceRun, bpftool_netsleuth_programs, netsleuth_argv

pytestmark = pytest.mark.privileged


def of_type(records: list[dict[str, Any]], record_type: str) -> list[dict[str, Any]]:
    return [record for record in records if record.get("type") == record_type]


def test_exec_in_a_namespace_with_arguments_and_exit_status(pair: Pair) -> None:
    marker = f"ns-{uuid.uuid4().hex[:8]}"
    snoop = TraceRun("snoop", "exec", "--netns", pair.a.name)
    try:
        snoop.wait_ready()
        # Outside the namespace: must not be seen (the netns filter is in the kernel).
        run("sh", "-c", f"exit 0 # {marker}-outside")
        pair.a.run("sh", "-c", f"echo {marker} >/dev/null; exit 7", "argv0-kept", check=False)
        snoop.wait_records(lambda record: record.get("type") == "exit" and record["exit_code"] == 7)
    finally:
        snoop.stop()
    records = snoop.records()
    attempts = [record for record in of_type(records, "exec") if any(marker in arg for arg in record["args"])]
    # `ip netns exec` runs the command with execvp: each PATH entry before the right one is a failed exec.
    assert all(record["error"] == "ENOENT" for record in attempts if record["ret"] != 0)
    execs = [record for record in attempts if record["ret"] == 0]
    assert len(execs) == 1, execs
    (command,) = execs
    assert command["args"] == ["sh", "-c", f"echo {marker} >/dev/null; exit 7", "argv0-kept"]
    assert command["path"] == "/usr/bin/sh" or command["path"].endswith("/sh")
    assert command["ret"] == 0 and command["error"] is None
    assert command["netns_name"] == pair.a.name and command["comm"] == "sh"
    exits = [record for record in of_type(records, "exit") if record["pid"] == command["pid"]]
    assert [(record["exit_code"], record["signal"]) for record in exits] == [(7, None)]
    assert all(record["netns_name"] == pair.a.name for record in of_type(records, "exec"))
    assert not any(f"{marker}-outside" in " ".join(record["args"]) for record in of_type(records, "exec"))


def test_failed_exec_and_exact_counts(pair: Pair, tmp_path: Path) -> None:
    not_executable = tmp_path / "not-executable"
    not_executable.write_text("data\n")
    not_executable.chmod(0o644)
    snoop = TraceRun("snoop", "exec", "--netns", pair.a.name, "--failed", "--summary")
    try:
        snoop.wait_ready()
        # 5 execs of a missing file (ENOENT), 3 of a file that is not executable (EACCES), and a successful
        # command that --failed keeps out (`ip netns exec` adds failed execs of its own: its PATH search).
        script = (
            "import os\n"
            "for _ in range(5):\n"
            "    try: os.execv('/nonexistent/netsleuth-test', ['x'])\n"
            "    except OSError: pass\n"
            "for _ in range(3):\n"
            f"    try: os.execv('{not_executable}', ['y'])\n"
            "    except OSError: pass\n"
        )
        pair.a.run("python3", "-c", script)
        pair.a.run("true")
    finally:
        snoop.stop()
    summary = snoop.records()[-1]
    assert summary["type"] == "summary" and summary["diagnostic"] == "snoop.exec"
    failed = {
        (group["example"]["path"], group["example"]["error"]): group["count"]
        for group in summary["groups"]
        if group["kind"] == "exec"
        and group["example"]["path"] in ("/nonexistent/netsleuth-test", str(not_executable))
    }
    assert failed == {("/nonexistent/netsleuth-test", "ENOENT"): 5, (str(not_executable), "EACCES"): 3}
    assert not any(group["kind"] == "exit" for group in summary["groups"])  # `true` exits 0: not a failure


def test_open_failed_sees_enoent_with_the_process(pair: Pair) -> None:
    missing = f"/tmp/netsleuth-missing-{uuid.uuid4().hex[:8]}"
    snoop = TraceRun("snoop", "open", "--failed", "--netns", pair.a.name)
    try:
        snoop.wait_ready()
        pair.a.run("cat", missing, check=False)
        pair.a.run(
            "python3", "-c", f"open('{missing}-w', 'x').close(); open('{missing}-w', 'x')", check=False
        )
        snoop.wait_records(lambda record: record.get("path", "").startswith(missing), count=2)
    finally:
        snoop.stop()
        run("rm", "-f", f"{missing}-w")
    opens = [record for record in of_type(snoop.records(), "open") if record["path"].startswith(missing)]
    by_path = {record["path"]: record for record in opens}
    assert set(by_path) == {missing, f"{missing}-w"}
    assert by_path[missing]["error"] == "ENOENT" and by_path[missing]["comm"] == "cat"
    assert by_path[missing]["fd"] is None and by_path[missing]["flags"].startswith("O_RDONLY")
    exclusive = by_path[
        f"{missing}-w"
    ]  # the second O_EXCL create fails; the first succeeded and is not shown
    assert (
        exclusive["error"] == "EEXIST" and "O_CREAT" in exclusive["flags"] and "O_EXCL" in exclusive["flags"]
    )
    assert all(record["error"] is not None for record in of_type(snoop.records(), "open"))
    assert all(record["netns_name"] == pair.a.name for record in opens)


def test_open_pid_filter_counts_exactly(pair: Pair) -> None:
    reader = pair.a.popen(
        [
            "python3",
            "-c",
            "import sys, os\nsys.stdin.readline()\n"
            "for i in range(25):\n    os.close(os.open('/etc/hostname', os.O_RDONLY))\n"
            "for i in range(4):\n"
            "    try: os.open('/nonexistent/netsleuth-pid-test', os.O_RDONLY)\n"
            "    except OSError: pass\n",
        ],
        stdin=subprocess.PIPE,
    )
    snoop = TraceRun("snoop", "open", "--pid", str(reader.pid + 0), "--summary")
    try:
        snoop.wait_ready()
        # `ip netns exec` execs python in place: the pid is the reader's.
        assert reader.stdin is not None
        reader.stdin.write(b"go\n")
        reader.stdin.close()
        reader.wait(10)
    finally:
        snoop.stop()
    summary = snoop.records()[-1]
    counts = {
        (group["example"]["path"], group["example"]["error"]): group["count"]
        for group in summary["groups"]
        if group["example"]["path"] in ("/etc/hostname", "/nonexistent/netsleuth-pid-test")
    }
    assert counts == {("/etc/hostname", None): 25, ("/nonexistent/netsleuth-pid-test", "ENOENT"): 4}
    assert all(group["example"]["pid"] == reader.pid for group in summary["groups"])


def _tracefs_mounted() -> bool:
    return any(
        line.split()[1:3] == [str(TRACEFS), "tracefs"]
        for line in Path("/proc/mounts").read_text().splitlines()
    )


def _unmount_tracefs() -> None:
    # MNT_DETACH: gone from the path at once even if something holds a file in it open.
    while _tracefs_mounted():
        subprocess.run(["umount", "-l", str(TRACEFS)], check=True)


def test_a_host_without_tracefs_gets_it_mounted_and_is_told(pair: Pair) -> None:
    """A fresh VM boots without tracefs (snoop's classic tracepoints need it): netsleuth mounts it."""
    was_mounted = _tracefs_mounted()
    _unmount_tracefs()
    try:
        snoop = TraceRun("snoop", "exec", "--netns", pair.a.name)
        try:
            snoop.wait_ready()
            pair.a.run("sh", "-c", "exit 3", check=False)
            snoop.wait_records(lambda record: record.get("type") == "exit" and record["exit_code"] == 3)
        finally:
            assert snoop.stop() == 0
        assert _tracefs_mounted()
        assert f"tracefs was not mounted: netsleuth mounted it on {TRACEFS}" in snoop.stderr()
        # Mounted already: nothing to say.
        again = TraceRun("snoop", "exec", "--netns", pair.a.name)
        again.wait_ready()
        assert again.stop() == 0
        assert "tracefs" not in again.stderr()
    finally:
        if not was_mounted:  # leave the host as it was
            _unmount_tracefs()
        elif not _tracefs_mounted():
            subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)


def test_nothing_stays_attached_after_exit() -> None:
    # By program id: other tracers on the host (a parallel test, a diagnose run) may hold snoop programs too.
    def program_ids() -> set[int]:
        return {int(program["id"]) for program in bpftool_netsleuth_programs("snoop_")}

    before = program_ids()
    trace_run = TraceRun("snoop", "open")
    trace_run.wait_ready()
    ours = program_ids() - before
    assert ours
    assert trace_run.stop() == 0
    # The kernel frees programs once the last fd closes, after an RCU grace period: wait, bounded.
    wait_for(lambda: not ours & program_ids(), 10, "snoop programs released")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["exec", "--dport", "53"], "unrecognized arguments"),
        (["open", "--pid", "abc"], "is not a process id"),
        (["exec", "--comm", "a-name-longer-than-fifteen"], "is not a name of 1 to 15 characters"),
        (["open", "--cgroup", "/no/such/cgroup/here"], "is not a cgroup"),
        (["fork"], "invalid choice"),
    ],
)
def test_bad_input_is_one_sentence_and_exit_2(args: list[str], words: str) -> None:
    result = subprocess.run(netsleuth_argv("snoop", *args), capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    assert words in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
