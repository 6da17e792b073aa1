"""packaging/netsleuth-agent.service: systemd accepts it; it asks for exactly the documented capabilities."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "netsleuth-agent.service"
DOCS = REPO / "docs" / "agent.md"
CAPABILITIES = {
    "CAP_BPF",
    "CAP_PERFMON",
    "CAP_NET_ADMIN",
    "CAP_SYSLOG",
    "CAP_SYS_PTRACE",
    "CAP_DAC_READ_SEARCH",
}


def unit_settings() -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing (Debian package systemd)")
    # verify also checks that ExecStart's binary exists: point it at this checkout's console script.
    netsleuth = Path(sys.executable).parent / "netsleuth"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/bin/netsleuth", str(netsleuth)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_the_unit_grants_only_the_documented_capabilities() -> None:
    settings = unit_settings()
    assert set(settings["CapabilityBoundingSet"][0].split()) == CAPABILITIES
    assert set(settings["AmbientCapabilities"][0].split()) == CAPABILITIES
    # Settings that would silently take a capability away again must stay out.
    assert "ProtectKernelLogs" not in settings
    documented = set(re.findall(r"`(CAP_[A-Z_]+)`", DOCS.read_text().split("## Running under systemd")[1]))
    assert documented >= CAPABILITIES


def test_the_unit_stops_gracefully_and_notifies() -> None:
    settings = unit_settings()
    assert settings["Type"] == ["notify"] and settings["KillSignal"] == ["SIGTERM"]
    assert settings["ExecStart"][0].startswith("/usr/bin/netsleuth agent --config ")
    pre = settings["ExecStartPre"]
    assert any("kernel.bpf_stats_enabled=1" in line and line.startswith("+") for line in pre)
