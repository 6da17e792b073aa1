"""Headless Chromium for the web UI tests and benchmark: Debian's chromium driven by playwright-python.

Playwright's own browser download does not work here (and `make test` must not need it), so the browser is
always the system one, passed as `executable_path`. Every page collects its console errors and uncaught
exceptions: a test fails on any of them, because a broken script is a broken product even when the
asserted text happens to be there.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import os
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from playwright.sync_api import Browser, BrowserContext, Page, sync_playwright

__all__ = [
    "CHROMIUM",
    "SSE_SCRIPT",
    "UI_DIR",
    "BrowserPage",
    "browser",
    "chromium_path",
    "module_page",
    "open_page",
    "run_module",
    "sign_in",
]

CHROMIUM = "/usr/bin/chromium"
UI_DIR = Path(__file__).resolve().parents[1] / "src" / "netsleuth" / "controller" / "ui"


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


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def module_page() -> Iterator[Page]:
    """A page that can import the UI's JavaScript modules without a controller: the ui/ directory served as
    static files (as the controller serves them), the UI's stylesheet loaded (the timeline's scroll box is
    CSS). Fails on any script error the page logged."""
    handler = functools.partial(_Quiet, directory=str(UI_DIR.parent))  # so /ui/... resolves
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with browser() as instance:
            opened = open_page(instance, f"http://127.0.0.1:{server.server_address[1]}")
            # A page of the same origin with the UI's stylesheet.
            opened.page.goto("/ui/vendor/uplot/uPlot.min.css")
            opened.page.evaluate(
                """() => new Promise((resolve, reject) => {
                    document.body.textContent = '';
                    const link = document.createElement('link');
                    link.rel = 'stylesheet';
                    link.href = '/ui/app.css';
                    link.onload = resolve; link.onerror = reject;
                    document.head.append(link);
                })"""
            )
            yield opened.page
            opened.assert_no_errors()
    finally:
        server.shutdown()
        server.server_close()


def run_module(page: Page, script: str, arg: Any = None) -> Any:
    """Run `script` as the body of an async function of `arg` in the page (it may `await import(...)`)."""
    return page.evaluate(f"async (arg) => {{ {script} }}", arg)


# api.js's SSE parser (streamEvents) fed exactly the chunks in `arg`, through a stand-in for fetch: returns
# the events as [name, data, id] and the last event id.
SSE_SCRIPT = """
const { streamEvents } = await import('/ui/js/api.js');
const chunks = arg;
const encoder = new TextEncoder();
// Replace fetch with a stream that delivers exactly these chunks.
const realFetch = window.fetch;
window.fetch = async () => new Response(new ReadableStream({
    start(controller) { for (const c of chunks) controller.enqueue(encoder.encode(c)); controller.close(); }
}), { status: 200, headers: { 'Content-Type': 'text/event-stream' } });
const events = [];
try {
    const lastId = await streamEvents('/x', (name, data, id) => events.push([name, data, id ?? null]));
    return { events, lastId: lastId ?? null };
} finally {
    window.fetch = realFetch;
}
"""
