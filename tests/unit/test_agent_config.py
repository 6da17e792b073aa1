"""The agent's TOML configuration: defaults, the documented example, and one clear sentence per mistake."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from netsleuth.agent.config import AgentConfig, ListenAddress, load_config, parse_config
from netsleuth.errors import UsageError

EXAMPLE = Path(__file__).parents[1] / "fixtures" / "agent" / "agent.toml"


def test_no_file_means_every_default() -> None:
    config = load_config(None)
    assert config.listen == ListenAddress("127.0.0.1", 9478)
    assert config.socket == Path("/run/netsleuth/agent.sock") and config.socket_mode == 0o660
    assert config.exporter.drops.netns_series == 50 and config.exporter.drops.location_series == 100
    assert config.sessions.max_concurrent == 4 and config.sessions.max_duration == 300
    assert config.sessions.token_file is None and config.token() is None


def test_the_documented_example_parses_to_the_defaults_plus_its_example() -> None:
    config = load_config(EXAMPLE)
    defaults = parse_config({})
    assert config.exporter.nic.exclude_devices == "^(cali|lxc)"
    assert config.sessions == defaults.sessions
    assert config.exporter.drops == defaults.exporter.drops
    assert (config.listen, config.socket, config.socket_mode) == (defaults.listen, defaults.socket, 0o660)


def test_values_are_read() -> None:
    config = parse_config(
        {
            "agent": {"listen": "[::1]:0", "socket": "", "socket_mode": "0600", "bpf_stats": False},
            "exporter": {"drops": {"netns_series": 3}, "conntrack": {"enabled": False}},
            "sessions": {"max_duration": 10, "default_duration": 2.5, "cpu_budget_percent": 0.5},
        }
    )
    assert config.listen == ListenAddress("::1", 0) and str(config.listen) == "[::1]:0"
    assert config.socket is None and config.socket_mode == 0o600 and not config.bpf_stats
    assert config.exporter.drops.netns_series == 3 and not config.exporter.conntrack
    assert config.sessions.default_duration == 2.5 and config.sessions.cpu_budget_percent == 0.5


BAD: list[tuple[dict[str, object], str]] = [
    ({"agent": {"listen": "localhost:9478"}}, "agent.listen"),
    ({"agent": {"listen": "127.0.0.1:99999"}}, "agent.listen"),
    ({"agent": {"socket_mode": "0999"}}, "agent.socket_mode"),
    ({"agent": {"bpf_stats": "yes"}}, "agent.bpf_stats"),
    ({"agent": {"listne": "127.0.0.1:1"}}, "agent.listne"),
    ({"exporter": {"drops": {"netns_series": 0}}}, "exporter.drops.netns_series"),
    ({"exporter": {"drops": {"netns_series": True}}}, "exporter.drops.netns_series"),
    ({"exporter": {"nic": {"exclude_devices": "("}}}, "exporter.nic.exclude_devices"),
    ({"exporter": {"nic": 3}}, "exporter.nic"),
    ({"exporter": {"drop": {}}}, "exporter.drop"),
    ({"sessions": {"max_duration": -3}}, "sessions.max_duration"),
    ({"sessions": {"max_duration": 10, "default_duration": 20}}, "sessions.default_duration"),
    ({"sessions": {"max_concurrent": 1000}}, "sessions.max_concurrent"),
    ({"sessions": {"cpu_budget_percent": 0}}, "sessions.cpu_budget_percent"),
    ({"sessions": {"token_file": "/nonexistent/token"}}, "sessions.token_file"),
    ({"session": {}}, "session"),
]


@pytest.mark.parametrize(("raw", "key"), BAD, ids=[key for _, key in BAD])
def test_a_bad_value_is_one_sentence_naming_its_key(raw: dict[str, object], key: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_config(raw, "agent.toml")
    message = str(caught.value)
    assert key in message and "\n" not in message


def _token_file(tmp_path: Path, text: str, mode: int) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    os.chmod(path, mode)
    return path


def test_token_file_must_be_private_and_long_enough(tmp_path: Path) -> None:
    readable = _token_file(tmp_path, "a" * 32, 0o644)
    with pytest.raises(UsageError, match="readable by other users"):
        parse_config({"sessions": {"token_file": str(readable)}})
    short = _token_file(tmp_path, "abc", 0o600)
    with pytest.raises(UsageError, match="at least 16"):
        parse_config({"sessions": {"token_file": str(short)}})
    good = _token_file(tmp_path, "s3cret-token-0123456789\n", 0o600)
    config: AgentConfig = parse_config({"sessions": {"token_file": str(good)}})
    assert config.token() == "s3cret-token-0123456789"


def _agent_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "netsleuth", "agent", *args], capture_output=True, text=True, timeout=60
    )


def test_cli_bad_config_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text("[sessions]\nmax_duration = -1\n")
    result = _agent_cli("--config", str(config))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "sessions.max_duration" in result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    ("text", "expected"),
    [("[agent\nlisten=1\n", "not valid TOML"), (None, "cannot read config")],
    ids=["syntax", "missing"],
)
def test_cli_unreadable_config_exits_2(tmp_path: Path, text: str | None, expected: str) -> None:
    config = tmp_path / "agent.toml"
    if text is not None:
        config.write_text(text)
    result = _agent_cli("--config", str(config))
    assert result.returncode == 2 and expected in result.stderr and result.stderr.count("\n") == 1


def test_cli_check_validates_without_starting() -> None:
    result = _agent_cli("--config", str(EXAMPLE), "--check")
    assert result.returncode == 0 and result.stdout == f"config {EXAMPLE}: OK\n"
