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


def test_unknown_reason_names_the_closest_ones() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", "drops", "--reason", "NETFILTER_DRP"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stderr.startswith(
        "netsleuth: unknown drop reason 'NETFILTER_DRP'; did you mean 'NETFILTER_DROP'"
    ), result.stderr
    assert "XDP" not in result.stderr  # not every reason of the kernel (130 on 6.18)


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (["drops", "--duration", "-1"], "--duration '-1' is not a positive number of seconds"),
        (["drops", "-4", "--duration", "-0.5"], "--duration '-0.5' is not a positive number of seconds"),
        (
            ["diagnose", "--duration", "0"],
            "--duration '0' is not a number of seconds over 0 and at most 3600",
        ),
    ],
)
def test_negative_and_zero_durations_get_a_sentence_about_the_duration(
    argv: list[str], sentence: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "netsleuth", *argv], capture_output=True, text=True, timeout=60
    )
    assert (result.returncode, result.stderr) == (2, f"netsleuth: {sentence}\n")
