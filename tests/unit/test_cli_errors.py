"""Bad input never shows a traceback: one line on stderr and exit code 2."""

from __future__ import annotations

import subprocess
import sys

import pytest

BAD_INPUT = [
    ["drops", "--host", "10.0.0.0/99"],
    ["drops", "--port", "70000"],
    ["drops", "--reason", "NOT_A_REASON"],
    ["drops", "--netns", "no-such-ns-xyz"],
    ["drops", "--duration", "-1"],
    ["drops", "--snaplen", "64"],
    ["drops", "--summary", "--pcap", "/tmp/x.pcapng"],
    ["drops", "--vmlinux", "/nonexistent/vmlinux"],
    ["drops", "--no-such-option"],
    ["no-such-command"],
]


@pytest.mark.parametrize("argv", BAD_INPUT, ids=[" ".join(argv) for argv in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2(argv: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", *argv], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_unknown_reason_lists_valid_names() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "drops", "--reason", "NOPE"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "NETFILTER_DROP" in result.stderr and "NO_SOCKET" in result.stderr
