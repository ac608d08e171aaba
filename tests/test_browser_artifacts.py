"""Browser tests leave screenshots: a real PNG per test, ``.failed`` when it failed, plus named journey steps.

The proof runs two probe tests in a child pytest (so their teardown really
happens before we look): one that passes and snaps a named step, one that
fails on purpose. The probes only run when the child asks for them, so a
normal run never has a deliberately failing test.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser import ROOT, artifact_stem, artifacts_dir, login, page, requires_chromium, snap  # noqa: F401

PROBE_ENV = "NPUPORTAL_SCREENSHOT_PROBE"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

probe_only = pytest.mark.skipif(not os.environ.get(PROBE_ENV), reason="run by test_every_browser_test_leaves_a_png")


@probe_only
@requires_chromium
@pytest.mark.django_db(transaction=True)
def test_probe_passes(page) -> None:  # noqa: F811
    page.goto("/login/")
    snap(page, "login form")
    page.get_by_label("Username").fill("nobody")


@probe_only
@requires_chromium
@pytest.mark.django_db(transaction=True)
def test_probe_fails(page) -> None:  # noqa: F811
    page.goto("/login/")
    pytest.fail("deliberate: the screenshot must still be saved, marked failed")


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk; fails unless the file starts like a PNG."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC, f"{path} is not a PNG: {data[:8]!r}"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


@requires_chromium
@pytest.mark.browser
@pytest.mark.slow
def test_every_browser_test_leaves_a_png(tmp_path: Path) -> None:
    shots = tmp_path / "shots"
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}  # SQLite: no shared DB
    env.update({"NPUPORTAL_ARTIFACTS_DIR": str(shots), PROBE_ENV: "1", "NPUPORTAL_VAR_DIR": str(tmp_path / "var")})
    here = Path(__file__).relative_to(ROOT).as_posix()
    probes = [f"{here}::test_probe_passes", f"{here}::test_probe_fails"]
    child = subprocess.run(
        [sys.executable, "-m", "pytest", *probes],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 1, child.stdout[-3000:] + child.stderr[-3000:]  # tests failed: the deliberate one

    passed, failed = artifact_stem(probes[0]), artifact_stem(probes[1])
    width, height = png_size(shots / f"{passed}.png")
    assert width == 1366 and height >= 1
    png_size(shots / f"{passed}--01-login_form.png")
    png_size(shots / f"{failed}.failed.png")
    assert not (shots / f"{failed}.png").exists()
    assert sorted(p.name for p in shots.iterdir()) == sorted(
        [f"{passed}.png", f"{passed}--01-login_form.png", f"{failed}.failed.png"]
    )


def test_artifact_names_and_directory(monkeypatch, tmp_path: Path) -> None:
    assert artifact_stem("tests/test_x.py::test_y[a b/c]") == "tests_test_x.py_test_y_a_b_c"
    long_a, long_b = "t.py::test[" + "a" * 300 + "1]", "t.py::test[" + "a" * 300 + "2]"
    assert len(artifact_stem(long_a)) <= 150 and artifact_stem(long_a) != artifact_stem(long_b)
    monkeypatch.delenv("NPUPORTAL_ARTIFACTS_DIR", raising=False)
    assert artifacts_dir() == ROOT / "var" / "test-artifacts" / "screenshots"
    monkeypatch.setenv("NPUPORTAL_ARTIFACTS_DIR", "build/shots")
    assert artifacts_dir() == ROOT / "build" / "shots"
    monkeypatch.setenv("NPUPORTAL_ARTIFACTS_DIR", str(tmp_path))
    assert artifacts_dir() == tmp_path
