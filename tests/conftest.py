"""Test policy: tests/unit never need root; tests/privileged need root and the real kernel.

Where the suite is meant to be complete - in CI (CI=true) or when run as root, which is how `make test` runs
it - no test may skip: a test that needs tshark, llvm tools, kernel BTF or root and cannot have them FAILS,
with the skip's reason, so a green run means every feature really ran. Elsewhere (a developer without root)
skips stay skips. One hook does this for every test, unit or privileged; a test may skip in strict mode only
if it is listed in ALLOWED_SKIPS with the reason why that is right.
"""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

# nodeid -> why skipping it cannot hide a missing feature. Empty: nothing has needed it yet.
ALLOWED_SKIPS: dict[str, str] = {}


def strict_mode() -> bool:
    """True in CI and as root: every skip is then a failure."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes") or os.geteuid() == 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/privileged/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.privileged)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("privileged") is not None and os.geteuid() != 0:
        pytest.skip("needs root (run `sudo make test`)")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or not strict_mode():
        return
    if item.nodeid in ALLOWED_SKIPS:
        return
    where = "CI" if os.environ.get("CI") else "a root run"
    report.outcome = "failed"
    report.longrepr = (
        f"{item.nodeid} would have skipped ({_skip_reason(report)}), but in {where} every test must run: "
        "install what it needs (`make deps`) instead of letting the suite thin out"
    )
