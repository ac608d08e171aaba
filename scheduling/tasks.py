"""Celery tasks of the scheduling app: thin shells over the services."""

from __future__ import annotations

from celery import shared_task

from devices.services import polling
from scheduling.services.tick import run_tick
from scheduling.services.walltime import enforce_walltime as enforce_walltime_now


@shared_task(name="scheduling.tick", ignore_result=True)
def tick() -> dict[str, object]:
    result = run_tick()
    return {"started": len(result.started), "ms": round(result.duration_ms, 1), "policy": result.policy_version}


@shared_task(name="scheduling.launch_job", ignore_result=True)
def launch_job(job_id: int) -> bool:
    """Send a started job to its agents. A failure is recorded (``LaunchFailed``) and retried by the next poll."""
    return polling.launch(job_id)


@shared_task(name="scheduling.stop_job", ignore_result=True)
def stop_job(job_id: int, reason: str = "") -> None:
    """Stop a cancelled or preempted job on its agents; the poll stops whatever this misses."""
    polling.stop(job_id, reason)


@shared_task(name="scheduling.enforce_walltime", ignore_result=True)
def enforce_walltime() -> dict[str, int]:
    """Fail and stop running jobs past their maximum duration (the agents' own limit is the first line)."""
    return {"stopped": len(enforce_walltime_now())}
