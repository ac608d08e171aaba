"""``make run`` never waits for the engine's compiler (``python -m scheduling.build_engine --background``).

Without a build of these sources the run serves on the plain-Python core and the build runs in a
detached, lowest-priority process; with one, the run takes it. The command says which on stderr and
prints the ``NPUPORTAL_ENGINE`` to start with on stdout. Each test gives it its own (empty) build and
var folders, and stops the build it started, by the pid the build writes in its lock file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def folders(tmp_path: Path) -> Iterator[dict[str, Path]]:
    found = {"build": tmp_path / "build", "var": tmp_path / "var"}
    yield found
    lock = found["var"] / "engine-build.lock"
    text = lock.read_text().strip() if lock.exists() else ""
    if text.isdigit():  # the build this test started: stop it and what it runs (its own session)
        try:
            os.killpg(int(text), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _background(folders: dict[str, Path], engine: str | None = None) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NPUPORTAL_ENGINE"}
    env.update(NPUPORTAL_ENGINE_BUILD_DIR=str(folders["build"]), NPUPORTAL_VAR_DIR=str(folders["var"]))
    if engine is not None:
        env["NPUPORTAL_ENGINE"] = engine
    done = subprocess.run(
        [sys.executable, "-m", "scheduling.build_engine", "--background"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip(), done.stderr.strip()


def _building_pid(folders: dict[str, Path], timeout: float = 60) -> int:
    """The pid of the background build, once it holds its lock."""
    lock = folders["var"] / "engine-build.lock"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = lock.read_text().strip() if lock.exists() else ""
        if text.isdigit():
            return int(text)
        time.sleep(0.2)
    raise AssertionError(f"no build took the lock: {(folders['var'] / 'engine-build.log').read_text()!r}")


def test_without_a_build_the_run_serves_on_plain_python_and_the_build_starts_in_the_background(folders) -> None:
    began = time.monotonic()
    engine, said = _background(folders)
    assert time.monotonic() - began < 60, "it does not wait for the compiler"
    assert engine == "python"
    assert "serving on the plain-Python core for this run" in said
    assert f"building in the background ({folders['var'] / 'engine-build.log'})" in said
    assert "used from the next start" in said
    pid = _building_pid(folders)
    assert os.getpriority(os.PRIO_PROCESS, pid) == 19, "the build yields to the run"
    assert f"building the compiled engine (pid {pid})" in (folders["var"] / "engine-build.log").read_text()

    engine, said = _background(folders)  # a second start while it builds: no second build
    assert engine == "python" and "still building" in said
    assert _building_pid(folders) == pid


def test_with_a_build_of_these_sources_the_run_takes_it(folders) -> None:
    env_build = {"NPUPORTAL_ENGINE_BUILD_DIR": str(folders["build"])}
    digest = subprocess.run(
        [sys.executable, "-c", "from scheduling import engine; print(engine.source_digest())"],
        cwd=ROOT,
        env={**os.environ, **env_build, "NPUPORTAL_ENGINE": "python"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (folders["build"] / digest).mkdir(parents=True)  # builds are renamed into place whole: a folder is a build
    engine, said = _background(folders)
    assert engine == "auto" and said == f"engine: the compiled core (build {digest})"
    assert not (folders["var"] / "engine-build.lock").exists(), "nothing to build"


def test_an_engine_named_in_the_environment_is_obeyed(folders) -> None:
    engine, said = _background(folders, "python")
    assert engine == "python" and said == "engine: the plain-Python core (NPUPORTAL_ENGINE=python)"
    assert not (folders["var"] / "engine-build.lock").exists()
