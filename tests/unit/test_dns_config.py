"""`dns` configs read alike from CLI flags and JSON; bad input is one sentence (UsageError)."""

from __future__ import annotations

import pytest

from netsleuth.diagnostics.dns import DIAGNOSTIC
from netsleuth.diagnostics.dns.records import DnsConfig
from netsleuth.diagnostics.dns.session import cgroup2_root
from netsleuth.errors import EnvironmentProblem, UsageError


def test_json_config_reads_like_the_flags() -> None:
    config = DIAGNOSTIC.config_from_json(
        {"name": ["Example.COM."], "rcode": ["nxdomain", "TIMEOUT"], "slow": 25, "timeout": 2, "dport": 53}
    )
    assert isinstance(config, DnsConfig)
    assert config.names() == ("example.com",)
    assert config.rcode_numbers() == frozenset({3}) and config.keep_timeouts and config.filter_rcodes
    assert config.slow == 25.0 and config.timeout == 2.0
    assert config.packet_filter().dport == 53
    assert config.name_wanted("www.example.com") and config.name_wanted("example.com")
    assert not config.name_wanted("badexample.com") and not config.name_wanted(None)


def test_defaults() -> None:
    config = DIAGNOSTIC.config_from_json({})
    assert config.timeout == 5.0 and config.dns_port == 53 and config.keep_timeouts
    assert not config.filter_rcodes and config.name_wanted("anything")


def test_rcode_filter_without_timeout_hides_timeouts() -> None:
    assert not DIAGNOSTIC.config_from_json({"rcode": ["SERVFAIL"]}).keep_timeouts
    assert DIAGNOSTIC.config_from_json({"rcode": [2, 5]}).rcode_numbers() == frozenset({2, 5})


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"rcode": ["NOPE"]}, "rcode 'NOPE' is not a DNS response code"),
        ({"rcode": [16]}, "rcode must be text or a whole number from 0 to 15"),
        ({"slow": -1}, "slow -1 is not a number of milliseconds, 0 or more"),
        ({"timeout": 0}, "timeout 0 is not a number of seconds over 0 and up to 3600"),
        ({"name": ["a..b"]}, "name 'a..b' is not a DNS name"),
        ({"dns_port": 0}, "dns_port 0 is not a port"),
        ({"bogus": 1}, "bogus is not an option of dns"),
        ({"slow": "fast"}, "slow 'fast' is not a number of milliseconds"),
        # A process trace's filter means nothing here: not an option of dns at all.
        ({"cgroup": "/x"}, "cgroup is not an option of dns"),
    ],
)
def test_bad_input_is_one_sentence(data: dict[str, object], words: str) -> None:
    with pytest.raises(UsageError) as raised:
        DIAGNOSTIC.config_from_json(data)
    assert words in str(raised.value)
    assert "\n" not in str(raised.value)


def test_cgroup2_root_from_mountinfo(tmp_path: object) -> None:
    from pathlib import Path

    hybrid = Path(str(tmp_path)) / "mountinfo"
    hybrid.write_text(
        "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
        "35 25 0:31 / /sys/fs/cgroup/unified rw,relatime shared:14 - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_root(str(hybrid)) == "/sys/fs/cgroup/unified"
    none = Path(str(tmp_path)) / "none"
    none.write_text("30 25 0:26 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n")
    with pytest.raises(EnvironmentProblem, match="no cgroup v2 hierarchy"):
        cgroup2_root(str(none))
