"""The decision core: a snapshot of the cluster goes in, decisions come out.

Nothing in this package imports Django. The Celery tick, the trace simulator, the
dry run and the benchmarks all call the same functions, so a behaviour seen in one
of them is the behaviour of all of them.

The same source runs two ways. As plain Python, always; and compiled to a C
extension by mypyc from its type annotations (``python -m scheduling.build_engine``,
which ``make`` runs), about 1.5x faster on the tick. A build is made for one
version of the sources and lives in ``build/engine/<digest of the sources>/``;
this package takes it only while the sources still hash to its digest, so an
edited module is never shadowed by an old build: it runs as plain Python until
the next build. ``NPUPORTAL_ENGINE`` chooses: ``auto`` (the default: the build if
there is one for these sources), ``python`` (never the build) or ``compiled``
(the build, or an ImportError: for CI and benchmarks that must not fall back
silently). :data:`BUILD` says which one this process runs.
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
from pathlib import Path

#: The modules compiled together (one mypyc group, so calls between them are native).
#: The rest (parsing and printing policies, the benchmark) run as plain Python either way;
#: the simulator lives outside the package (:mod:`scheduling.sim`), ``simulator`` and
#: ``traces`` here only re-export it.
COMPILED = (
    "array_throttle",
    "backfill",
    "capacity",
    "decide",
    "dependency",
    "durations",
    "estimate",
    "fairshare",
    "layout",
    "member_limits",
    "placement",
    "policy",
    "policy_model",
    "preemption",
    "priority",
    "quota",
    "reasons",
    "record",
    "reservations",
    "run_time",
    "schedules",
    "snapshot",
    "starvation",
    "tick_memo",
    "work_lost",
)

_HERE = Path(__file__).resolve().parent

#: Where builds live, one folder per source digest.
BUILD_ROOT = Path(os.environ.get("NPUPORTAL_ENGINE_BUILD_DIR") or _HERE.parent.parent / "build" / "engine")


def source_digest() -> str:
    """Digest of the compiled modules' sources (and the interpreter's ABI): names a build."""
    h = hashlib.sha256(importlib.machinery.EXTENSION_SUFFIXES[0].encode())
    for name in COMPILED:
        h.update(b"\0" + name.encode() + b"\0")
        h.update((_HERE / f"{name}.py").read_bytes())
    return h.hexdigest()[:20]


def build_dir(digest: str | None = None) -> Path:
    """The folder of the build of these sources (it may not exist)."""
    return BUILD_ROOT / (digest or source_digest())


class EngineChoiceError(ImportError):
    """``NPUPORTAL_ENGINE`` asks for what cannot be had; ``manage.py`` prints it as one line (exit 78)."""


def _use_build() -> str:
    """Put the build of these sources, if any, in front of the package's own files."""
    choice = os.environ.get("NPUPORTAL_ENGINE", "auto").strip().lower() or "auto"
    if choice not in ("auto", "python", "compiled"):
        raise EngineChoiceError(f"NPUPORTAL_ENGINE={choice!r}: expected auto, python or compiled")
    if choice == "python":
        return "python"
    folder = build_dir()
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    complete = all((folder / "scheduling" / "engine" / f"{name}{suffix}").exists() for name in COMPILED)
    if not complete:
        if choice == "compiled":
            raise EngineChoiceError(
                f"NPUPORTAL_ENGINE=compiled but no build of these sources in {folder} "
                "(run: python -m scheduling.build_engine)"
            )
        return "python"
    __path__.insert(0, str(folder / "scheduling" / "engine"))
    if str(folder) not in sys.path:
        sys.path.append(str(folder))  # the group's shared library is a top-level module
    return "compiled"


#: ``"compiled"`` or ``"python"``: how this process runs the modules in :data:`COMPILED`.
BUILD = _use_build()
