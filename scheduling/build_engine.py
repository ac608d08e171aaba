"""Compile the decision core with mypyc: ``python -m scheduling.build_engine``.

The build goes to ``build/engine/<digest of the sources>/`` (see
``scheduling/engine/__init__.py``), made in a temporary folder and renamed into
place, so a build interrupted half way is never picked up. An existing build of
the same sources is kept (nothing to do); older builds are removed. Exits
non-zero when compiling fails; the engine then runs as plain Python.
"""

from __future__ import annotations

import argparse
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
    sys_env = os.environ.get("NPUPORTAL_ENGINE")
    # Import the package as plain Python: under NPUPORTAL_ENGINE=compiled (CI) it would refuse to
    # import before the build it is about to get exists.
    os.environ["NPUPORTAL_ENGINE"] = "python"
    try:
        from scheduling import engine
    finally:
        if sys_env is None:
            del os.environ["NPUPORTAL_ENGINE"]
        else:
            os.environ["NPUPORTAL_ENGINE"] = sys_env
    digest = engine.source_digest()
    target = engine.build_dir(digest)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--force", action="store_true", help="build even if a build of these sources exists")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    build(force=args.force, quiet=args.quiet)


if __name__ == "__main__":
    main()
