"""The core's dataclasses that write their ``__init__`` out (see ``scheduling/engine/record.py``).

``@dataclass`` does not generate an ``__init__`` a class already has, so a field added
later without a parameter would silently take its default, and ``Record.__reduce__``
(copies, pickles) passes the fields in order: the parameters must be the fields.
"""

from __future__ import annotations

import ast
import copy
import pickle
from pathlib import Path

from scheduling.engine.snapshot import JobState, Slot, Wait

ENGINE = Path(__file__).resolve().parents[2] / "scheduling" / "engine"


def _written_inits() -> list[tuple[str, list[str], list[str]]]:
    found = []
    for path in sorted(ENGINE.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if not isinstance(node, ast.ClassDef) or not any(
                "dataclass" in ast.unparse(d) for d in node.decorator_list
            ):
                continue
            init = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "__init__"), None)
            if init is None:
                continue
            fields = [
                s.target.id
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and "ClassVar" not in ast.unparse(s.annotation)
            ]
            params = [a.arg for a in init.args.args[1:]]
            found.append((f"{path.stem}.{node.name}", fields, params))
    return found


def test_every_written_init_takes_the_fields_in_order() -> None:
    inits = _written_inits()
    assert len(inits) >= 14  # Occupant, Placement, JobState, DeviceState, Wait, ...
    for name, fields, params in inits:
        assert params == fields, f"{name}: __init__ takes {params}, the fields are {fields}"


def test_records_copy_and_pickle_by_their_fields() -> None:
    job = JobState(7, "t", "u", "normal", 2, 100.0, 3600.0, slots=(Slot(3), Slot(4)), preempt_deadline=5.0)
    for twin in (copy.deepcopy(job), pickle.loads(pickle.dumps(job)), copy.copy(job)):
        assert twin == job and twin is not job
    wait = Wait("Resources", "8 cards", 12.0)
    assert copy.deepcopy(wait) == wait and hash(pickle.loads(pickle.dumps(wait))) == hash(wait)
