"""The suite cannot quietly thin out: tests/conftest.py turns a skip into a failure in CI and as root.

Runs pytest on a throw-away test file with tests/conftest.py loaded as a plugin, so the real hook decides.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SAMPLE = """
import shutil

import pytest

@pytest.mark.skipif(shutil.which("no-such-tool-netsleuth") is None, reason="no-such-tool is not installed")
def test_needs_a_tool():
    pass

def test_skips_inside():
    pytest.skip("kernel without BTF")

@pytest.mark.xfail(reason="known", strict=True)
def test_expected_failure():
    assert False

def test_plain():
    pass
"""


def _run(ci: str | None, as_user: bool = False) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="netsleuth-skip-policy-") as scratch:
        return _run_in(Path(scratch), ci, as_user)


def _run_in(tmp_path: Path, ci: str | None, as_user: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    # As root, drop to `nobody` to see the non-strict behaviour (a developer's run without root); the
    # scratch directory is a fresh one under /tmp that `nobody` may write into.
    drop = (
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
        if as_user and os.geteuid() == 0
        else []
    )
    tmp_path.chmod(0o777)
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [*drop, sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
         "-rfEs", "--rootdir", str(tmp_path), str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120,
    )  # fmt: skip


def test_ci_turns_every_skip_into_a_failure_with_its_reason() -> None:
    result = _run("true")
    assert result.returncode == 1, result.stdout
    # A skipif fires in setup (reported as an error), pytest.skip() in the call (a failure): neither passes.
    assert "1 failed, 1 passed, 1 xfailed, 1 error" in result.stdout, result.stdout
    assert "would have skipped (no-such-tool is not installed)" in result.stdout
    assert "would have skipped (kernel without BTF)" in result.stdout
    assert "test_expected_failure" not in result.stdout  # xfail is not a skip


def test_outside_ci_without_root_skips_stay_skips() -> None:
    result = _run("false", as_user=True)
    assert result.returncode == 0, result.stdout
    assert "2 skipped" in result.stdout
