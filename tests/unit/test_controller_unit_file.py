"""packaging/netsleuth-controller.service: systemd accepts it, and it runs with no capability at all."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "packaging" / "netsleuth-controller.service"


def test_systemd_accepts_the_controller_unit(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.fail("systemd-analyze is missing (Debian package systemd)")
    netsleuth = Path(sys.executable).parent / "netsleuth"  # verify checks ExecStart's binary exists
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/usr/bin/netsleuth", str(netsleuth)))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""


def test_the_controller_gets_no_privilege() -> None:
    settings: dict[str, list[str]] = {}
    for line in UNIT.read_text().splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    assert settings["CapabilityBoundingSet"] == [""] and settings["AmbientCapabilities"] == [""]
    assert settings["DynamicUser"] == ["yes"] and settings["NoNewPrivileges"] == ["yes"]
    assert settings["ExecStart"] == ["/usr/bin/netsleuth controller --config /etc/netsleuth/controller.toml"]
