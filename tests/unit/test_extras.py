"""The core install runs the single-host CLI and the agent's exporter without the fleet and controller
packages; a command that needs an extra that is missing says so in one sentence naming it (exit 2).

Each run below is a real `netsleuth` process in which the extras' packages cannot be imported and their
distributions are not found in the metadata, as in a `pip install netsleuth` without extras.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from importlib import metadata
from pathlib import Path

import pytest

from netsleuth.extras import extra_requirements

FLEET = {"nats-py", "nkeys", "cryptography", "httpx"}
CONTROLLER = FLEET | {"fastapi", "uvicorn", "pyjwt"}
CORE = {"pyroute2", "rich", "prometheus_client", "dnspython", "orjson", "pyelftools", "msgspec"}
# The import names of the extras' packages (and of what they bring: starlette with fastapi...).
EXTRA_MODULES = ("nats", "nkeys", "cryptography", "httpx", "fastapi", "starlette", "uvicorn", "jwt")

# Runs netsleuth as if only the core were installed: an import of an extra's module fails like a missing
# package, and the metadata knows no distribution of the extras.
_CORE_ONLY = textwrap.dedent(
    """
    import sys
    from importlib import abc, metadata
    BLOCKED = {blocked!r}
    MISSING = {missing!r}

    class _Absent(abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
            return None

    sys.meta_path.insert(0, _Absent())
    _distribution = metadata.distribution

    def _core_only(name):
        if name.lower() in MISSING:
            raise metadata.PackageNotFoundError(name)
        return _distribution(name)

    metadata.distribution = _core_only
    sys.argv = ["netsleuth", *sys.argv[1:]]
    from netsleuth.__main__ import main
    sys.exit(main())
    """
)


def run_core_only(*argv: str) -> subprocess.CompletedProcess[str]:
    program = _CORE_ONLY.format(blocked=set(EXTRA_MODULES), missing=CONTROLLER)
    return subprocess.run([sys.executable, "-c", program, *argv], capture_output=True, text=True, timeout=60)


def test_the_core_requirements_are_the_cli_and_the_exporter() -> None:
    requirements = metadata.requires("netsleuth") or []
    core = {
        line.split(";")[0].split(">")[0].split("[")[0].strip() for line in requirements if ";" not in line
    }
    assert core == CORE


def test_each_extra_names_its_packages_and_controller_includes_fleet() -> None:
    requirements = metadata.requires("netsleuth") or []
    assert set(extra_requirements("fleet", requirements)) == FLEET
    assert set(extra_requirements("controller", requirements)) == CONTROLLER
    assert set(extra_requirements("cri", requirements)) == {"grpcio"}
    dev = set(extra_requirements("dev", requirements))
    assert dev >= CONTROLLER | {"grpcio", "pytest", "kubernetes-validate"}


def test_an_agent_without_fleet_runs_on_the_core(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[agent]\nlisten = "127.0.0.1:0"\nsocket = ""\n')
    result = run_core_only("agent", "--config", str(config), "--check")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout == f"config {config}: OK\n"


@pytest.mark.parametrize("command", ["drops", "diagnose", "doctor", "dns", "profile", "tcp", "agent"])
def test_core_commands_parse_on_the_core(command: str) -> None:
    result = run_core_only(command, "--help")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


@pytest.mark.parametrize(
    ("argv", "sentence"),
    [
        (
            ("controller", "check", "--config", "/nonexistent.toml"),
            "netsleuth controller needs the 'controller' extra (fastapi, uvicorn, pyjwt, nats-py, nkeys, "
            "cryptography, httpx are not installed): pip install 'netsleuth[controller]'",
        ),
        (
            ("controller", "new-key", "--out", "/nonexistent/key"),
            "netsleuth controller needs the 'controller' extra",
        ),
        (
            ("fleet", "hosts"),
            "netsleuth fleet needs the 'fleet' extra (nats-py, nkeys, cryptography, httpx are not "
            "installed): pip install 'netsleuth[fleet]'",
        ),
    ],
)
def test_a_command_needing_a_missing_extra_says_which_in_one_sentence(
    argv: tuple[str, ...], sentence: str
) -> None:
    result = run_core_only(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"netsleuth: {sentence}")
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_an_agent_with_a_fleet_section_needs_the_fleet_extra(tmp_path: Path) -> None:
    config = tmp_path / "agent.toml"
    config.write_text('[fleet]\nurl = "nats://127.0.0.1:4222"\nhost_id = "node-a"\n')
    result = run_core_only("agent", "--config", str(config), "--check")
    assert result.returncode == 2
    assert result.stderr == (
        "netsleuth: the agent's [fleet] section needs the 'fleet' extra (nats-py, nkeys, cryptography, httpx "
        "are not installed): pip install 'netsleuth[fleet]'\n"
    )
