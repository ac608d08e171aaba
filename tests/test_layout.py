"""Where things live: one job filter set, API plumbing in ``npuportal/api/``, views imported by URLs only.

These read the source tree (no database), so a module that grows back into the wrong folder fails
here with its path, rather than in a later change that trips over it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APPS = ("devices", "npuportal", "quotas", "scheduling", "npuctl")


def _modules() -> Iterator[tuple[str, ast.Module]]:
    for app in APPS:
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            yield str(path.relative_to(ROOT)), ast.parse(path.read_text(encoding="utf-8"))


def _imports(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            for alias in node.names:
                yield f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def test_one_job_filter_set_for_the_api_and_the_console() -> None:
    defined = [
        path
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef) and node.name.endswith("FilterSet") and "Job" in node.name
    ]
    assert defined == ["scheduling/filters.py"]


def test_only_url_modules_import_api_views() -> None:
    """Services, console views and commands call services; an API view is reached through a URL only."""
    offenders = [
        path
        for path, tree in _modules()
        if not path.endswith(("urls.py", "/api/views.py"))
        for name in _imports(tree)
        if name.split(".")[1:3] == ["api", "views"]
    ]
    assert offenders == []


def test_the_api_plumbing_lives_in_npuportal_api() -> None:
    gone = ("quotas.api.errors", "quotas.api.authentication", "quotas.api.permissions", "quotas.api.token_throttle")
    offenders = [
        (path, name)
        for path, tree in _modules()
        for name in _imports(tree)
        if name.startswith(gone) or name.startswith("npuportal.api_")
    ]
    assert offenders == []


#: What stays at the root of ``quotas/``: Django's own entry points and a benchmark documented as
#: ``python -m quotas.bench_reports_browser``. Everything else belongs to a domain package.
QUOTAS_ROOT = {"__init__.py", "admin.py", "apps.py", "bench_reports_browser.py"}
QUOTAS_DOMAINS = {
    "access",
    "accounting",
    "api",
    "directory",
    "management",
    "migrations",
    "models",
    "policies",
    "tenancy",
}


def test_quotas_is_grouped_by_domain() -> None:
    root = ROOT / "quotas"
    assert {p.name for p in root.glob("*.py")} == QUOTAS_ROOT
    assert {p.name for p in root.iterdir() if p.is_dir() and p.name != "__pycache__"} == QUOTAS_DOMAINS


def test_celery_finds_the_moved_tasks_under_their_registered_names() -> None:
    """Beat entries and queued messages name ``quotas.record_usage`` and ``quotas.close_month``."""
    from npuportal.celery import app

    app.loader.import_default_modules()
    assert {"quotas.record_usage", "quotas.close_month"} <= set(app.tasks)
