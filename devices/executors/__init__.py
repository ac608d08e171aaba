"""The executors: what runs the portal's jobs, selected by ``settings.NPUPORTAL_EXECUTOR``.

``get_executor()`` is the only way in; each executor is found by its dotted path in
:data:`EXECUTORS`, so this package imports none of them and an executor may use the
transitions (``scheduling.transitions``) that call it without an import circle.
"""

from __future__ import annotations

from functools import cache

from django.conf import settings
from django.utils.module_loading import import_string

from devices.executors.base import CANCEL_GRACE_S, EVICT_GRACE_S, Executor, Observation, ServedNode

__all__ = ["CANCEL_GRACE_S", "EVICT_GRACE_S", "EXECUTORS", "Executor", "Observation", "ServedNode", "get_executor"]

#: ``NPUPORTAL_EXECUTOR`` value → the executor's class.
EXECUTORS = {
    "agents": "devices.executors.agents.AgentExecutor",
    "slurm": "devices.executors.slurm.SlurmExecutor",
}


def get_executor() -> Executor:
    """The executor the settings name (``NPUPORTAL_EXECUTOR``, default ``agents``)."""
    return _executor(getattr(settings, "NPUPORTAL_EXECUTOR", "agents") or "agents")


@cache
def _executor(name: str) -> Executor:
    if name not in EXECUTORS:
        raise ValueError(f"NPUPORTAL_EXECUTOR={name!r}: unknown executor; one of {', '.join(sorted(EXECUTORS))}")
    executor: Executor = import_string(EXECUTORS[name])()
    return executor
