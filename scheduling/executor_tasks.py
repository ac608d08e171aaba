"""The Celery tasks that carry the portal's decisions to whatever runs jobs (``devices.executors``).

The transitions (``scheduling.transitions``) queue them after their commit; they are thin shells over
the executor ``get_executor()`` returns, so nothing here knows whether node agents or another
backend run the jobs. ``scheduling.tasks`` re-exports them under their registered names.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery import shared_task

from devices.executors import CANCEL_GRACE_S, EVICT_GRACE_S, get_executor

log = logging.getLogger(__name__)


@shared_task(name="scheduling.launch_job", ignore_result=True)
def launch_job(job_id: int) -> bool:
    """Send a started job to its executor. A failure is recorded (``LaunchFailed``) and retried by the next poll."""
    return get_executor().launch([job_id]).get(job_id, False)


@shared_task(name="scheduling.stop_job", ignore_result=True)
def stop_job(job_id: int, reason: str = "") -> None:
    """Stop a cancelled or preempted job on its executor; the next observation stops whatever this misses."""
    get_executor().stop(job_id, grace_s=CANCEL_GRACE_S if reason == "Cancelled" else EVICT_GRACE_S, cause=reason)


def queue_stop(job_id: int, reason: str) -> None:
    """Queue one stop, one try and no retries; best effort, the transition itself is committed.

    With the broker down this runs inside the API call, which must answer at once (the
    executor's next observation stops a job that still runs anyway).
    """
    try:
        stop_job.apply_async((job_id, reason), retry=False)
    except Exception:
        log.warning("could not queue stop of job %s; the agent poll will stop it", job_id, exc_info=True)


def queue_stops(job_ids: Sequence[int], reason: str) -> None:
    """Queue the stops of a tick's evictions; a broker that is down loses nothing (the poll stops them)."""
    try:
        for job_id in job_ids:
            stop_job.delay(job_id, reason)
    except Exception:
        log.warning("could not queue agent calls; the agent poll will retry", exc_info=True)


def queue_launches(job_ids: Sequence[int]) -> None:
    """Queue the launches of a tick's starts; the poll re-sends a launch that never reached its executor.

    A launch does not count on the stops queued before it: before it is sent, whatever still
    runs on its devices is stopped and awaited by the executor, since workers run these tasks in
    any order.
    """
    try:
        for job_id in job_ids:
            launch_job.delay(job_id)
    except Exception:
        log.warning("could not queue agent calls; the agent poll will retry", exc_info=True)
