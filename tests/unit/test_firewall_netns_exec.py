"""run_in_netns without root: this process's own namespace, and the errors a user can meet."""

from __future__ import annotations

from pathlib import Path

import pytest

from netsleuth.errors import EnvironmentProblem, UsageError
from netsleuth.kernel.netns_exec import CommandFailed, read_file_in_netns, run_in_netns


def test_runs_and_returns_stdout() -> None:
    assert run_in_netns(["sh", "-c", "echo $LC_ALL"], None) == "C\n"


def test_own_namespace_needs_no_setns() -> None:
    # Entering the namespace we are already in is skipped, so it works without CAP_SYS_ADMIN.
    assert run_in_netns(["echo", "same"], "/proc/self/ns/net") == "same\n"


def test_missing_binary_is_one_sentence() -> None:
    with pytest.raises(
        EnvironmentProblem, match=r"^netsleuth-no-such-tool is not installed \(or not on PATH\)$"
    ):
        run_in_netns(["netsleuth-no-such-tool", "-c"], None)


def test_failing_command_carries_its_stderr() -> None:
    with pytest.raises(CommandFailed, match=r"sh failed \(exit 3\): went wrong") as raised:
        run_in_netns(["sh", "-c", "echo went wrong >&2; exit 3"], None)
    assert raised.value.returncode == 3
    assert isinstance(raised.value, EnvironmentProblem)


def test_missing_namespace_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="network namespace /run/netns/netsleuth-nope does not exist"):
        run_in_netns(["true"], "/run/netns/netsleuth-nope")


def test_timeout() -> None:
    with pytest.raises(EnvironmentProblem, match="did not finish"):
        run_in_netns(["sleep", "5"], None, timeout=0.1)


def test_read_file(tmp_path: Path) -> None:
    names = tmp_path / "ip_tables_names"
    names.write_text("filter\n")
    assert read_file_in_netns(str(names), None) == "filter\n"
    assert read_file_in_netns(str(tmp_path / "missing"), None) is None
    assert read_file_in_netns(str(names), "/proc/self/ns/net") == "filter\n"
    assert read_file_in_netns(str(tmp_path / "missing"), "/proc/self/ns/net") is None
