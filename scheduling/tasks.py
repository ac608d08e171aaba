"""Celery tasks of the scheduling app: thin shells over the services."""

from __future__ import annotations

from celery import shared_task

from scheduling.executor_tasks import launch_job as launch_job  # registered there, named here as before
from scheduling.executor_tasks import stop_job as stop_job
from scheduling.services.tick import run_tick
from scheduling.services.walltime import enforce_walltime as enforce_walltime_now


@shared_task(name="scheduling.tick", ignore_result=True)
def tick() -> dict[str, object]:
    result = run_tick()
    return {"started": len(result.started), "ms": round(result.duration_ms, 1), "policy": result.policy_version}


@shared_task(name="scheduling.enforce_walltime", ignore_result=True)
def enforce_walltime() -> dict[str, int]:
    """Fail and stop running jobs past their maximum duration (the agents' own limit is the first line)."""
    return {"stopped": len(enforce_walltime_now())}
