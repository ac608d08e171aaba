"""Celery tasks of the devices app: thin shells over the services."""

from __future__ import annotations

import logging

from celery import shared_task
from django.conf import settings
from django.core.cache import cache

from devices.executors import get_executor

log = logging.getLogger(__name__)

#: Cache key held while a poll runs, so a slow poll and the next beat never poll the same agents twice.
POLL_LOCK = "devices.poll_agents.running"


@shared_task(name="devices.poll_agents", ignore_result=True)
def poll_agents() -> dict[str, object]:
    # Held at most a few poll intervals: a worker killed mid-poll must not stop polls for long.
    ttl = max(10, int(settings.AGENT_POLL_INTERVAL_S * 3 + settings.AGENT_TIMEOUT_S * 2))
    if not cache.add(POLL_LOCK, 1, timeout=ttl):
        log.info("an agent poll is still running; skipping this one")
        return {"skipped": True}
    try:
        summary = get_executor().observe()  # the agents: poll them all
    finally:
        cache.delete(POLL_LOCK)
    return {
        "polled": summary.polled,
        "failed": summary.failed,
        "finished": len(summary.finished),
        "requeued": len(summary.requeued),
        "relaunched": len(summary.relaunched),
        "stale_stopped": len(summary.stale_stopped),
    }
