"""What `make run` and `make test` install on a fresh machine: the Makefile's own recipes run with a `dpkg`
that knows no package and an `apt-get` that records what it is asked for, so the lists checked are the ones
a fresh Debian 12 would really get (nothing is installed or removed here)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# What only the tests, benchmarks and the web UI need; a five-second `netsleuth diagnose` needs none of it.
TEST_ONLY = {"chromium", "prometheus", "nats-server", "bpftrace", "tshark", "clang", "podman", "mmdebstrap"}


def apt_installs(tmp_path: Path, target: str, kubectl: bool = True) -> set[str]:
    """The packages `make <target>` asks apt-get to install on a machine that has none."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir(parents=True)
    log = tmp_path / "apt.log"
    scripts = {
        "dpkg": "exit 1",  # `dpkg -s NAME`: not installed
        "apt-get": f'[ "$1" = install ] && echo "$@" >> {log}; exit 0',
        "sudo": 'exec "$@"',
    }
    for name, body in scripts.items():
        (fake_bin / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake_bin / name).chmod(0o755)
    subprocess.run(
        ["make", "-s", "-C", str(REPO), target, *([] if kubectl else ["KUBECTL=no-such-kubectl"])],
        env={**os.environ, "PATH": f"{fake_bin}:{os.environ['PATH']}"},
        check=True,
        capture_output=True,
        text=True,
    )
    words = log.read_text().split() if log.exists() else []
    return {word for word in words if not word.startswith("-") and word != "install"}


def test_make_run_installs_no_browser_and_nothing_only_tests_need(tmp_path: Path) -> None:
    run = apt_installs(tmp_path, "deps-run")
    assert "libbpf1" in run and "python3-venv" in run
    assert not run & TEST_ONLY, run & TEST_ONLY


def test_make_test_installs_the_rest(tmp_path: Path) -> None:
    everything = apt_installs(tmp_path, "deps")
    assert TEST_ONLY | apt_installs(tmp_path / "run", "deps-run") <= everything


def test_kubectl_comes_from_debian_when_no_package_provides_it(tmp_path: Path) -> None:
    assert "kubernetes-client" in apt_installs(tmp_path, "deps", kubectl=False)
    assert "kubernetes-client" not in apt_installs(tmp_path / "run", "deps", kubectl=True)


def test_make_run_installs_netsleuth_without_extras() -> None:
    # -B: every recipe, as on a fresh clone; -n: printed, not run.
    recipes = subprocess.run(
        ["make", "-n", "-B", "-C", str(REPO), "run"], check=True, capture_output=True, text=True
    ).stdout
    installs = [line for line in recipes.splitlines() if "pip install" in line and " -e " in line]
    assert installs and all("[" not in line for line in installs), installs
