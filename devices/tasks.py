"""Celery tasks of the devices app: thin shells over the services."""

from __future__ import annotations

from celery import shared_task

from devices.services.polling import poll_all


@shared_task(name="devices.poll_agents", ignore_result=True)
def poll_agents() -> dict[str, int]:
    summary = poll_all()
    return {"polled": summary.polled, "failed": summary.failed, "finished": len(summary.finished)}
