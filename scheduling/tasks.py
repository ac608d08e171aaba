"""Celery tasks of the scheduling app: thin shells over the services."""

from __future__ import annotations

from celery import shared_task

from devices.services import polling
from scheduling.services.tick import run_tick


@shared_task(name="scheduling.tick", ignore_result=True)
def tick() -> dict[str, object]:
    result = run_tick()
    return {"started": len(result.started), "ms": round(result.duration_ms, 1), "policy": result.policy_version}


@shared_task(name="scheduling.launch_job", ignore_result=True, autoretry_for=(ConnectionError,), max_retries=3)
def launch_job(job_id: int) -> bool:
    return polling.launch(job_id)


@shared_task(name="scheduling.stop_job", ignore_result=True)
def stop_job(job_id: int, reason: str = "") -> None:
    polling.stop(job_id)
