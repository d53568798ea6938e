"""Pages opened in a real headless Chromium (Debian's, which `make test` installs) through
Playwright: what a page logs as an error, and every request it makes to anywhere but the
place it was served from."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
# Chromium on a machine without a network: no background services to call home.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium (make test installs Debian's as root; else: sudo apt-get install -y "
           "chromium)")


@dataclass
class Visit:
    """An open page, the errors it logged and the requests it made elsewhere."""

    page: Any
    problems: list[str] = field(default_factory=list)
    outside: list[str] = field(default_factory=list)


@contextmanager
def headless_page(local: str) -> Iterator[Visit]:
    """A page in headless Chromium; a request whose URL does not start with ``local`` (the
    server's address, or ``file://``) counts as outside."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            visit = Visit(browser.new_page())
            visit.page.on("console", lambda m: visit.problems.append(m.text)
                          if m.type == "error" else None)
            visit.page.on("pageerror", lambda error: visit.problems.append(str(error)))
            visit.page.on("request", lambda request: None if request.url.startswith(local)
                          else visit.outside.append(request.url))
            yield visit
        finally:
            browser.close()
