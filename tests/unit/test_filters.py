"""Filter parsing: every bad value is one sentence and a UsageError (exit 2)."""

from __future__ import annotations

import argparse
import ipaddress

import pytest

from netsleuth.diagnostics.filters import add_filter_arguments, packet_filter_from_args
from netsleuth.errors import UsageError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_filter_arguments(parser)
    return parser.parse_args(argv)


def test_all_filters_parse() -> None:
    packet_filter = packet_filter_from_args(
        parse(
            "--proto",
            "udp",
            "--host",
            "2001:db8::/32",
            "--src",
            "2001:db8::1",
            "--dst",
            "2001:db8::2",
            "--port",
            "53",
            "--sport",
            "1024",
            "--dport",
            "80",
            "--pid",
            "42",
            "--comm",
            "nginx",
            "--dev",
            "eth0",
            "-6",
        )
    )
    assert packet_filter.proto == 17
    assert packet_filter.hosts == (ipaddress.ip_network("2001:db8::/32"),)
    assert packet_filter.sources == (ipaddress.ip_network("2001:db8::1/128"),)
    assert packet_filter.destinations == (ipaddress.ip_network("2001:db8::2/128"),)
    assert (packet_filter.port, packet_filter.sport, packet_filter.dport) == (53, 1024, 80)
    assert (packet_filter.pid, packet_filter.comm, packet_filter.dev, packet_filter.family) == (
        42,
        "nginx",
        "eth0",
        6,
    )
    assert packet_filter.filters_owner


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--host", "198.18.0.0/33"], "not an IP address or CIDR"),
        (["--src", "nonsense"], "not an IP address or CIDR"),
        (["--port", "70000"], "not a port"),
        (["--dport", "0"], "not a port"),
        (["--sport", "http"], "not a port"),
        (["--proto", "quic"], "unknown protocol"),
        (["--pid=-3"], "not a process id"),
        (["--pid", "abc"], "not a process id"),
        (["--comm", "a-very-long-process-name"], "1 to 15 characters"),
        (["--netns", "no-such-namespace-xyz"], "unknown network namespace"),
        (["-6", "--dst", "198.18.0.0/15"], "-6 contradicts the IPv4 address 198.18.0.0/15"),
        (["-4", "--host", "2001:db8::1"], "-4 contradicts the IPv6 address 2001:db8::1/128"),
    ],
)
def test_bad_filters_are_usage_errors(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        packet_filter_from_args(parse(*argv))
