"""Compile the decision core with mypyc: ``python -m scheduling.build_engine``.

The build goes to ``build/engine/<digest of the sources>/`` (see
``scheduling/engine/__init__.py``), made in a temporary folder and renamed into
place, so a build interrupted half way is never picked up. An existing build of
the same sources is kept (nothing to do); older builds are removed. Exits
non-zero when compiling fails; the engine then runs as plain Python.

``--background`` is for ``make run``, which must not keep a newcomer waiting for the compiler
(a minute or two on a 2-core machine): with a build of these sources it prints ``auto`` (the
processes take the build); without one it starts the build in a detached, lowest-priority
process (its output in ``var/engine-build.log``), prints ``python`` — the run serves on the
plain-Python core, which decides exactly the same — and the next start takes the build. It says
which on stderr. ``NPUPORTAL_ENGINE=python`` or ``compiled`` in the environment is obeyed as
given (``compiled`` builds first, in the foreground, as before).
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Run in a child process: mypyc's setuptools build, told where to put its output.
_BUILD = """
import sys
from setuptools import setup
from mypyc.build import mypycify

out, temp, *paths = sys.argv[1:]
setup(
    name="npuportal-engine",
    ext_modules=mypycify(paths, opt_level="3", multi_file=True, target_dir=temp + "/c", verbose=False),
    script_args=["build_ext", "--build-lib", out, "--build-temp", temp, "--parallel", "2", "--quiet"],
)
"""


def build(force: bool = False, quiet: bool = False) -> Path:
    """Compile the engine unless a build of these sources exists; returns its folder."""
    env = dict(os.environ, NPUPORTAL_ENGINE="python")
    # Read as plain Python: under NPUPORTAL_ENGINE=compiled (CI) the package would refuse to
    # import before the build it is about to get exists.
    digest, target = _digest_and_target()
    from scheduling import engine

    if target.exists() and not force:
        if not quiet:
            print(f"engine build {digest} is up to date ({target})")
        return target
    engine.BUILD_ROOT.mkdir(parents=True, exist_ok=True)
    paths = [f"scheduling/engine/{name}.py" for name in engine.COMPILED]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=".building-", dir=engine.BUILD_ROOT) as tmp:
        out = Path(tmp) / "out"
        result = subprocess.run(
            [sys.executable, "-c", _BUILD, str(out), str(Path(tmp) / "temp"), *paths],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
            raise SystemExit(f"engine build failed (exit {result.returncode}); the engine runs as plain Python")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    for old in engine.BUILD_ROOT.iterdir():
        if old.is_dir() and old != target and not old.name.startswith(".building-"):
            shutil.rmtree(old, ignore_errors=True)
    if not quiet:
        print(f"engine build {digest}: {len(paths)} modules compiled in {time.monotonic() - started:.0f} s ({target})")
    return target


def _digest_and_target() -> tuple[str, Path]:
    """The digest of these sources and the folder of their build, read with the plain-Python package."""
    saved = os.environ.get("NPUPORTAL_ENGINE")
    os.environ["NPUPORTAL_ENGINE"] = "python"
    try:
        from scheduling import engine
    finally:
        if saved is None:
            del os.environ["NPUPORTAL_ENGINE"]
        else:
            os.environ["NPUPORTAL_ENGINE"] = saved
    digest = engine.source_digest()
    return digest, engine.build_dir(digest)


def var_dir() -> Path:
    """Where ``make run`` keeps its state (``NPUPORTAL_VAR_DIR``, as the settings read it), for the build's log."""
    return Path(os.environ.get("NPUPORTAL_VAR_DIR") or ROOT / "var")


def for_run() -> str:
    """The ``NPUPORTAL_ENGINE`` a ``make run`` should start with; builds in the background when needed.

    Prints what it decided on stderr, for the run's log.
    """
    asked = (os.environ.get("NPUPORTAL_ENGINE") or "auto").strip().lower()
    if asked == "python":
        _say("engine: the plain-Python core (NPUPORTAL_ENGINE=python)")
        return "python"
    if asked == "compiled":
        build(quiet=True)
        _say("engine: the compiled core (NPUPORTAL_ENGINE=compiled)")
        return "compiled"
    digest, target = _digest_and_target()
    if target.exists():
        _say(f"engine: the compiled core (build {digest})")
        return "auto"
    log = var_dir() / "engine-build.log"
    if start_background_build(log):
        _say(
            "engine: serving on the plain-Python core for this run (it decides the same); the compiled core is "
            f"building in the background ({log}) and is used from the next start"
        )
    else:
        _say(f"engine: serving on the plain-Python core; the compiled core is still building ({log})")
    return "python"


def start_background_build(log: Path) -> bool:
    """Start ``python -m scheduling.build_engine`` detached, at the lowest priority; False if one is running.

    A lock file beside the log, held by the building process, keeps two starts from compiling twice.
    """
    log.parent.mkdir(parents=True, exist_ok=True)
    lock = log.with_suffix(".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return False
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    with log.open("ab") as out:
        subprocess.Popen(
            [sys.executable, "-m", "scheduling.build_engine", "--lock", str(lock)],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not stopped by the run's Ctrl-C: the next start wants the build
            preexec_fn=lambda: os.nice(19),  # the run being started comes first
        )
    return True


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="build even if a build of these sources exists")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument(
        "--background",
        action="store_true",
        help="for make run: print the NPUPORTAL_ENGINE to start with, building in the background if needed",
    )
    parser.add_argument("--lock", type=Path, help=argparse.SUPPRESS)  # held while building (--background's child)
    args = parser.parse_args(argv)
    if args.background:
        print(for_run(), flush=True)
        return
    if args.lock is not None:
        fd = os.open(args.lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("another build of the engine is running", flush=True)
            return
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())  # who holds it, for whoever must stop it
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} building the compiled engine (pid {os.getpid()})", flush=True)
    build(force=args.force, quiet=args.quiet)


if __name__ == "__main__":
    main()
