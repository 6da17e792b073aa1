"""Headless Chromium for the web UI tests and benchmark: Debian's chromium driven by playwright-python.

Playwright's own browser download does not work here (and `make test` must not need it), so the browser is
always the system one, passed as `executable_path`. Every page collects its console errors and uncaught
exceptions: a test fails on any of them, because a broken script is a broken product even when the
asserted text happens to be there.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

__all__ = ["CHROMIUM", "BrowserPage", "browser", "chromium_path", "open_page", "sign_in"]

CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str:
    """The system Chromium, or a sentence saying how to get it (raised, so a test fails with it)."""
    path = os.environ.get("NETSLEUTH_CHROMIUM") or shutil.which("chromium") or CHROMIUM
    if not Path(path).exists():
        raise RuntimeError("Chromium is not installed: run `apt-get install -y chromium` (or `make deps`).")
    return path


@contextlib.contextmanager
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        instance = playwright.chromium.launch(
            executable_path=chromium_path(),
            headless=True,
            # --no-sandbox: tests run as root, where Chromium refuses its sandbox.
            args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
        )
        try:
            yield instance
        finally:
            instance.close()


@dataclass
class BrowserPage:
    context: BrowserContext
    page: Page
    errors: list[str] = field(default_factory=list)

    def assert_no_errors(self) -> None:
        assert not self.errors, f"the page logged errors: {self.errors}"


def open_page(instance: Browser, base_url: str, width: int = 1280, height: int = 900) -> BrowserPage:
    context = instance.new_context(base_url=base_url, viewport={"width": width, "height": height})
    page = context.new_page()
    result = BrowserPage(context, page)
    page.on("pageerror", lambda exc: result.errors.append(f"uncaught: {exc}"))

    def on_console(message: object) -> None:
        text = getattr(message, "text", "")
        # Refusals the test provokes on purpose show up as failed fetches; they are not script errors.
        if getattr(message, "type", "") == "error" and "Failed to load resource" not in text:
            result.errors.append(text)

    page.on("console", on_console)
    return result


def sign_in(page: Page, token: str, timeout_ms: float = 10_000) -> None:
    """Sign in through the form, as a person would, and wait for the hosts page."""
    page.goto("/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_role("heading", name="Hosts").wait_for(timeout=timeout_ms)
