"""Test policy: tests/unit never need root; tests/privileged need root and the real kernel.

In CI (CI=true) a privileged test that cannot run is a failure, never a skip: a green run must mean the
feature really worked on a kernel.
"""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/privileged/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.privileged)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("privileged") is None or os.geteuid() == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("privileged test needs root in CI; refusing to skip")
    pytest.skip("needs root (run `sudo make test`)")
