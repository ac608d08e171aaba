"""``scheduling.transitions`` is the only writer of ``Job.state``, of ``JobEvent`` rows and of ``Allocation.end``.

Read from the source tree (no database): any other module that assigns a job's state (``job.state =``,
``Job.objects....update(state=...)``, ``Job(..., state=...)``), creates an event (``JobEvent(...)``,
``JobEvent.objects.create/bulk_create``) or ends an allocation (``Allocation.objects....update(end=...)``)
fails here, unless it is listed below with the reason it may.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("scheduling", "devices", "quotas", "npuportal", "npuctl")
THE_WRITER = "scheduling/transitions.py"

#: Modules allowed to write what the transitions own, and why.
ALLOWED = {
    # Seeders write finished histories of jobs that never ran (demo data, benchmark databases) in
    # bulk, with the times they choose; no transition is taking place.
    "scheduling/demo.py": "demo seeding writes whole job histories directly",
    "quotas/accounting/demo.py": "chargeback demo seeding writes whole job histories directly",
    "scheduling/bench.py": "benchmark database seeding writes running and pending jobs directly",
}
#: Folders with no ``Job`` of the portal's: the node agent runs standalone (its ``Job`` is its own run
#: record) and the decision core imports no Django (its ``state`` fields are of its own snapshot).
NO_PORTAL_MODELS = ("devices/agent/", "scheduling/engine/")
#: Modules whose ``.state =`` is not a job's.
OTHER_STATES = {
    "devices/services/operations.py": "Node.state (cordon, drain)",
    "devices/services/registration.py": "Node.state (a node registered again is ready)",
    "quotas/policies/requests.py": "QuotaRequest.state (approved, refused)",
}


def _root_name(node: ast.AST) -> str | None:
    """The name a chain like ``Job.objects.filter(...).update`` starts from (``Job``)."""
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node.id if isinstance(node, ast.Name) else None


def violations(source: str, path: str = "<snippet>") -> list[str]:
    """What ``source`` writes that only the transitions may: ``"path:line: what"`` per write."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == "state" and isinstance(t.ctx, ast.Store):
                        if path not in OTHER_STATES:
                            found.append(f"{path}:{node.lineno}: assigns .state")
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        keywords = {k.arg for k in node.keywords}
        root = _root_name(func)
        if isinstance(func, ast.Name) and func.id == "JobEvent":
            found.append(f"{path}:{node.lineno}: builds a JobEvent")
        elif isinstance(func, ast.Name) and func.id == "Job" and "state" in keywords:
            found.append(f"{path}:{node.lineno}: builds a Job with a state")
        elif isinstance(func, ast.Attribute):
            if root == "JobEvent" and func.attr in {"create", "bulk_create", "get_or_create", "update_or_create"}:
                found.append(f"{path}:{node.lineno}: JobEvent.objects.{func.attr}")
            elif func.attr == "events" or (func.attr == "create" and _root_name(func.value) == "events"):
                pass
            elif root == "Job" and func.attr in {"update", "update_or_create"} and "state" in keywords:
                found.append(f"{path}:{node.lineno}: Job update(state=...)")
            elif root == "Job" and func.attr == "bulk_update" and "state" in ast.unparse(node):
                found.append(f"{path}:{node.lineno}: Job bulk_update of state")
            elif root == "Allocation" and func.attr == "update" and "end" in keywords:
                found.append(f"{path}:{node.lineno}: Allocation update(end=...)")
            elif isinstance(func.value, ast.Attribute) and func.value.attr == "events" and func.attr == "create":
                found.append(f"{path}:{node.lineno}: job.events.create")
    return found


def _sources() -> list[Path]:
    return sorted(
        p
        for package in PACKAGES
        for p in (ROOT / package).rglob("*.py")
        if "migrations" not in p.parts and "tests" not in p.parts
    )


def test_only_the_transitions_write_job_states_events_and_allocation_ends() -> None:
    found = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        if rel in (THE_WRITER, *ALLOWED) or rel.startswith(NO_PORTAL_MODELS):
            continue
        found += violations(path.read_text(), rel)
    assert not found, "write these through scheduling.transitions:\n" + "\n".join(found)


def test_the_transitions_module_does_write_them() -> None:
    """The checker sees the writes where they are (it is not vacuous)."""
    found = violations((ROOT / THE_WRITER).read_text(), THE_WRITER)
    kinds = {line.split(": ", 1)[1] for line in found}
    assert {"assigns .state", "builds a JobEvent", "JobEvent.objects.create", "Job update(state=...)"} <= kinds
    assert "Allocation update(end=...)" in kinds


@pytest.mark.parametrize(
    "snippet",
    [
        "job.state = Job.State.FAILED",
        "Job.objects.filter(pk=1).update(state='failed')",
        "Job.objects.filter(pk=1, state='running').select_for_update().update(state='failed', ended_at=now)",
        "JobEvent.objects.create(job=job, reason='x')",
        "JobEvent.objects.bulk_create([JobEvent(job=job)])",
        "events.append(JobEvent(job_id=1))",
        "job.events.create(reason='x')",
        "Allocation.objects.filter(job=job).update(end=now)",
        "Job(team=t, state='running')",
    ],
)
def test_each_kind_of_write_is_caught(snippet: str) -> None:
    assert violations(snippet)


@pytest.mark.parametrize(
    "snippet",
    [
        "Job.objects.filter(state='running').update(launched=True)",
        "Node.objects.filter(pk=1).update(state='drained')",
        "JobEvent.objects.filter(job=job).count()",
        "Job(team=t, name='x')",
    ],
)
def test_reads_and_other_models_are_not_writes(snippet: str) -> None:
    assert not violations(snippet)


def test_the_allowed_modules_exist() -> None:
    """An entry for a module that moved or went away is dropped, not left to allow a newcomer."""
    assert all((ROOT / rel).exists() for rel in (*ALLOWED, *OTHER_STATES))
