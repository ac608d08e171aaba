"""Playwright on Debian's chromium, for the console's browser tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")

requires_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (`make test` installs it as root)"
)


@pytest.fixture
def page(live_server) -> Iterator[object]:
    """A fresh headless page; the ORM may be used from the test while Playwright's loop runs."""
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--no-first-run",
                "--disable-sync",
            ],
        )
        context = browser.new_context(base_url=live_server.url, viewport={"width": 1366, "height": 900})
        pg = context.new_page()
        pg.set_default_timeout(15000)
        try:
            yield pg
        finally:
            context.close()
            browser.close()


def login(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
