"""Playwright on Debian's chromium, for the console's browser tests.

Every browser test leaves a full-page screenshot of where it ended, so a
reviewer (or CI's artifacts) can see each journey without running it, and a
failure shows the page as it was: ``<node id>.png``, or ``<node id>.failed.png``
when the test failed. Journey steps may add their own with :func:`snap`
(``<node id>--01-<name>.png``, numbered in order). They go to
``$NPUPORTAL_ARTIFACTS_DIR`` (a relative path is read from the project root),
by default ``var/test-artifacts/screenshots/``.

Every wait of a page (an action, a navigation, an ``expect(...)`` assertion) may take up to
:data:`PAGE_WAIT_S` seconds, scaled like every wait of the suite (``tests/waiting.py``): on a busy
machine a page may take seconds to load or update, and Playwright's own defaults (30 s for actions,
5 s for ``expect``) are budgets that fail right tests. Tests leave out ``timeout=`` and get this.
"""

from __future__ import annotations

import hashlib
import os
import re
import warnings
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import ceiling_ms

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS_ENV = "NPUPORTAL_ARTIFACTS_DIR"
DEFAULT_ARTIFACTS_DIR = Path("var") / "test-artifacts" / "screenshots"

#: Each phase's report of a test (``setup``, ``call``), stashed by ``tests/conftest.py`` so a
#: fixture's teardown can tell whether the test failed.
PHASE_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()

requires_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (`make test` installs it as root)"
)

#: The ceiling of each wait of a page, before ``NPUPORTAL_TEST_WAIT_SCALE``.
PAGE_WAIT_S = 60.0

# page -> [file name stem, snapshots taken]; weak so a closed page is forgotten.
_pages: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def artifacts_dir() -> Path:
    """Where screenshots go: ``$NPUPORTAL_ARTIFACTS_DIR``, else ``var/test-artifacts/screenshots/``."""
    path = Path(os.environ.get(ARTIFACTS_ENV) or DEFAULT_ARTIFACTS_DIR)
    return path if path.is_absolute() else ROOT / path


def artifact_stem(text: str) -> str:
    """``text`` (a test node id) as a file name: ``tests/test_x.py::test_y[a b]`` → ``tests_test_x.py_test_y_a_b``.

    Long ids (many parameters) are cut and end in a hash of the whole id, so two never share a file.
    """
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("._") or "test"
    if len(stem) > 150:
        stem = f"{stem[:130]}-{hashlib.sha1(text.encode()).hexdigest()[:10]}"
    return stem


def save_screenshot(page: Any, path: Path) -> Path | None:
    """A full-page PNG of ``page`` at ``path``; a warning, not an error, when the page cannot be shot.

    Screenshots are evidence, not the test: a crashed page must not turn a
    test's own failure into a teardown error that hides it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        page.screenshot(path=str(path), full_page=True)
    except Exception as exc:  # any Playwright failure: reported, never raised
        warnings.warn(f"could not save screenshot {path}: {exc}", stacklevel=2)
        return None
    return path


def snap(page: Any, name: str) -> Path | None:
    """Save a named screenshot of a journey step next to the test's own: ``<node id>--NN-<name>.png``."""
    entry = _pages.setdefault(page, ["adhoc", 0])
    entry[1] += 1
    return save_screenshot(page, artifacts_dir() / f"{entry[0]}--{entry[1]:02d}-{artifact_stem(name)}.png")


def patient(page: Any) -> Any:
    """Give ``page`` (and every ``expect``) the suite's generous ceiling for each wait; returns the page."""
    from playwright.sync_api import expect

    page.set_default_timeout(ceiling_ms(PAGE_WAIT_S))
    expect.set_options(timeout=ceiling_ms(PAGE_WAIT_S))
    return page


def failed_so_far(node: pytest.Item) -> bool:
    """Whether ``node``'s setup or call failed (read in a fixture's teardown)."""
    reports = node.stash.get(PHASE_REPORTS, {})
    return any(report.failed for report in reports.values())


@pytest.fixture
def page(live_server, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh headless page; the ORM may be used from the test while Playwright's loop runs.

    On teardown it saves the full-page screenshot (see the module docstring).
    """
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    from playwright.sync_api import sync_playwright

    stem = artifact_stem(request.node.nodeid)
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
        pg = patient(context.new_page())
        _pages[pg] = [stem, 0]
        try:
            yield pg
        finally:
            failed = failed_so_far(request.node)
            directory = artifacts_dir()
            # One file per test: drop the other outcome's file from an earlier run.
            (directory / f"{stem}{'' if failed else '.failed'}.png").unlink(missing_ok=True)
            save_screenshot(pg, directory / f"{stem}{'.failed' if failed else ''}.png")
            context.close()
            browser.close()


def login(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")
