"""Load a reference copy of the decision core next to the live one (differential tests).

The reference is a directory of engine modules, for instance the engine before
the fast path (commit f41ddd7) or that of the last commit when changing it::

    mkdir -p /tmp/ref && git archive f41ddd7 scheduling/engine | tar -x -C /tmp/ref
    NPUPORTAL_REF_ENGINE=/tmp/ref/scheduling/engine pytest tests/engine/test_engine_differential.py

Its decision modules are imported under a private package name; the data types
(``snapshot``, ``policy`` and what they import) stay the live ones, so both
engines read the same snapshot objects.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

#: Modules of the reference that are loaded from its directory; the rest are shared.
DECISION_MODULES = (
    "backfill",
    "capacity",
    "decide",
    "explain",
    "fairshare",
    "layout",
    "feasibility",
    "placement",
    "preemption",
    "priority",
    "quota",
    "reasons",
    "record",
    "reservations",
    "run_time",
    "starvation",
    "tick_memo",
    "work_lost",
)
PACKAGE = "_npuportal_ref_engine"


class _Loader(importlib.abc.SourceLoader):
    def __init__(self, path: Path) -> None:
        self.path = path

    def get_filename(self, fullname: str) -> str:
        return str(self.path)

    def get_data(self, path: str) -> bytes:
        text = Path(path).read_text()
        # ``from scheduling.engine import a, b``: one line per module, so each is rewritten alone.
        text = re.sub(
            r"^from scheduling\.engine import ([\w, ]+)$",
            lambda m: "\n".join(f"from scheduling.engine import {n.strip()}" for n in m.group(1).split(",")),
            text,
            flags=re.M,
        )
        pattern = r"scheduling\.engine(\.|\s+import\s+)(" + "|".join(DECISION_MODULES) + r")\b"
        text = re.sub(pattern, lambda m: f"{PACKAGE}{m.group(1)}{m.group(2)}", text)
        return text.encode()


def load_reference(directory: str) -> ModuleType:
    """The reference ``decide`` module (its siblings are loaded on demand)."""
    root = Path(directory)
    if PACKAGE in sys.modules and getattr(sys.modules[PACKAGE], "_ref_root", None) == str(root):
        return sys.modules[f"{PACKAGE}.decide"]
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    pkg = ModuleType(PACKAGE)
    pkg.__path__ = []  # type: ignore[attr-defined]
    pkg._ref_root = str(root)  # type: ignore[attr-defined]
    sys.modules[PACKAGE] = pkg

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
            if not fullname.startswith(PACKAGE + "."):
                return None
            mod = fullname[len(PACKAGE) + 1 :]
            file = root / f"{mod}.py"
            if mod not in DECISION_MODULES or not file.exists():
                return None
            return importlib.util.spec_from_loader(fullname, _Loader(file), origin=str(file))

    if not any(getattr(f, "_npuportal_ref", False) for f in sys.meta_path):
        finder = _Finder()
        finder._npuportal_ref = True  # type: ignore[attr-defined]
        sys.meta_path.insert(0, finder)
    else:  # replace the finder (another root)
        sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "_npuportal_ref", False)]
        finder = _Finder()
        finder._npuportal_ref = True  # type: ignore[attr-defined]
        sys.meta_path.insert(0, finder)
    return importlib.import_module(f"{PACKAGE}.decide")
