"""Nothing that does not exist is accepted silently, on this host's real processes, namespaces and devices:
one sentence and exit 2 from the CLI, the same sentence refusing an agent session, a note where a name may
become valid (an interface that appears), and errors that read as one sentence.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from netsleuth.agent.session_diagnostics import DiagnosticContext, open_session
from netsleuth.errors import UsageError
from netsleuth.kernel.netns import NetnsNames
from netsleuth.kernel.reasons import load_drop_reasons
from tests.netlab import Lab
from tests.tracerun import netsleuth_argv

pytestmark = pytest.mark.privileged


def netsleuth(*args: str, user: list[str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*(user or []), *netsleuth_argv(*args)], capture_output=True, text=True, timeout=120, check=False
    )


def unused_netns_inode() -> int:
    return max(NetnsNames().inodes()) + 1_000_003


def unused_pid() -> int:
    limit = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(pid for pid in range(limit - 1, 1, -1) if not Path(f"/proc/{pid}").exists())


def refused(args: list[str]) -> str:
    """The sentence `netsleuth ARGS` refuses with: exit 2, one line, nothing on stdout."""
    result = netsleuth(*args)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr.removeprefix("netsleuth: ").rstrip("\n")


def test_a_namespace_inode_nothing_holds_is_refused() -> None:
    inode = unused_netns_inode()
    sentence = (
        f"no network namespace has inode {inode} on this host (no `ip netns` name, process or open file "
        "holds one)"
    )
    assert refused(["drops", "--netns", str(inode), "--duration", "1"]) == sentence
    assert refused(["dns", "--netns", str(inode), "--duration", "1"]) == sentence
    assert refused(["diagnose", "--netns", str(inode), "--duration", "1"]) == sentence
    # A namespace that exists, by its inode, is still taken.
    lab = Lab()
    try:
        host = lab.host("n")
        result = netsleuth("drops", "--netns", str(host.inode), "--duration", "0.5", "--summary")
        assert result.returncode == 0, result.stderr
    finally:
        lab.close()


def test_a_pid_that_is_no_process_here_is_refused() -> None:
    pid = unused_pid()
    sentence = f"--pid {pid}: no process has this id on this host"
    assert refused(["profile", "--pid", str(pid), "--duration", "1"]) == sentence
    assert refused(["drops", "--pid", str(pid), "--duration", "1"]) == sentence
    assert refused(["snoop", "exec", "--pid", str(pid), "--duration", "1"]) == sentence


def test_a_threads_id_is_refused_with_its_process() -> None:
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    try:
        thread_id = worker.native_id
        assert thread_id is not None and thread_id != os.getpid()
        sentence = refused(["profile", "--pid", str(thread_id), "--duration", "1"])
    finally:
        stop.set()
        worker.join()
    assert (
        sentence
        == f"--pid {thread_id} is a thread of process {os.getpid()}: give the process id, {os.getpid()}"
    )


def test_an_agent_session_is_refused_with_the_same_sentence() -> None:
    context = DiagnosticContext(load_drop_reasons())
    inode, pid = unused_netns_inode(), unused_pid()
    cases: list[tuple[str, dict[str, Any], str]] = [
        ("drops", {"netns": str(inode)}, f"no network namespace has inode {inode} on this host"),
        ("profile", {"pid": pid}, f"--pid {pid}: no process has this id on this host"),
        ("dns", {"pid": pid}, f"--pid {pid}: no process has this id on this host"),
    ]
    for name, config, sentence in cases:
        with pytest.raises(UsageError) as caught:
            open_session(name, config, context)
        assert str(caught.value).startswith(sentence)
    assert context.symbols.holders == 0


def test_an_interface_that_does_not_exist_is_a_note_said_at_the_start() -> None:
    lab = Lab()
    try:
        host = lab.host("d")
        ready = Path(f"/tmp/netsleuth-bad-input-{os.getpid()}.ready")
        process = subprocess.Popen(
            netsleuth_argv("drops", "--netns", host.name, "--dev", "nosuchdev0", "--ready-file", str(ready)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 30
            while not ready.exists() and process.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert ready.exists(), process.stderr.read() if process.stderr else ""
            # Said before the run ends, while it watches: not only in a closing line.
            process.send_signal(2)
            _, stderr = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
            ready.unlink(missing_ok=True)
        assert process.returncode == 0, stderr
        note = (
            f"netsleuth: no interface is named 'nosuchdev0' in network namespace {host.name} now: its events "
            "will show if one appears"
        )
        assert stderr.splitlines()[0] == note, stderr
        # An agent session says it in its notes.
        session = open_session(
            "drops", {"netns": host.name, "dev": "nosuchdev0"}, DiagnosticContext(load_drop_reasons())
        )
        try:
            assert note.removeprefix("netsleuth: ") in session.notes()
        finally:
            session.close()
        # The interface of the namespace is no note.
        result = netsleuth("drops", "--netns", host.name, "--dev", "lo", "--duration", "0.5")
        assert result.returncode == 0 and "no interface" not in result.stderr, result.stderr
    finally:
        lab.close()


def test_softirq_with_a_task_filter_says_what_the_samples_are() -> None:
    result = netsleuth("profile", "--softirq", "NET_RX", "--pid", "1", "--duration", "1")
    assert result.returncode == 0, result.stderr
    assert (
        "netsleuth: with --softirq NET_RX, --pid select the tasks the NET_RX softirq interrupted (it runs "
        "in whichever task is on the CPU, or in ksoftirqd): these samples are the NET_RX work done in their "
        "time, not the work for their packets\n"
    ) in result.stderr


def test_an_unknown_reason_gets_the_closest_names() -> None:
    sentence = refused(["drops", "--reason", "NOSUCH"])
    assert sentence.startswith("unknown drop reason 'NOSUCH'; did you mean ")
    assert sentence.count("'") == 2 * 4 and "NO_SOCKET" in sentence


def test_not_root_is_one_sentence_naming_netsleuth_once() -> None:
    result = netsleuth(
        "drops", "--duration", "1", user=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    )
    assert result.returncode == 1
    assert result.stderr == (
        "netsleuth: loading BPF programs needs root (or CAP_BPF + CAP_PERFMON + CAP_NET_ADMIN): "
        "run it with sudo\n"
    )
