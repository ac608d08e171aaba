"""Django system checks of the devices app: settings that would otherwise fail only at first use.

``NPUPORTAL_EXECUTOR`` picks what runs jobs (``devices.executors.EXECUTORS``). A misspelt value used
to surface only when the first job was launched or the worker first polled, as a ``ValueError`` in a
Celery log; ``manage.py check``, ``runserver``, ``migrate`` and the worker's start-up run the system
checks, so the mistake is named at start-up instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, register

#: The check's id, as ``SILENCED_SYSTEM_CHECKS`` and the output name it.
UNKNOWN_EXECUTOR = "devices.E001"


@register("npuportal")
def check_executor(app_configs: Sequence[AppConfig] | None = None, **kwargs: Any) -> list[CheckMessage]:
    """An ``NPUPORTAL_EXECUTOR`` that names no executor is an error, with the values that would work."""
    from devices.executors import EXECUTORS

    name = getattr(settings, "NPUPORTAL_EXECUTOR", "agents") or "agents"
    if name in EXECUTORS:
        return []
    return [
        Error(
            f"NPUPORTAL_EXECUTOR={name!r} names no executor",
            hint=f"set NPUPORTAL_EXECUTOR to one of: {', '.join(sorted(EXECUTORS))} (default agents)",
            id=UNKNOWN_EXECUTOR,
        )
    ]
