"""The walltime backstop: running jobs past ``started_at + max_duration_s`` are failed and stopped.

Agents enforce a job's maximum duration themselves (the launch sends the time left), and the poll
records such a kill with reason ``Walltime``. This periodic check (``scheduling.enforce_walltime``)
covers what an agent cannot: a launch that never reached it, an agent that restarted without the
limit, a node that is cut off. The job fails with reason ``Walltime``, its allocations end now, and
its run is stopped on every agent that can be reached; a poll stops anything missed.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from devices.executors import EVICT_GRACE_S, get_executor
from npuportal.cluster_lock import lock_cluster
from npuportal.display_time import clock_text
from scheduling import transitions
from scheduling.models import Job

log = logging.getLogger(__name__)


def overdue(now: datetime) -> list[int]:
    """Running jobs whose maximum duration is over at ``now``."""
    rows = Job.objects.filter(
        state=Job.State.RUNNING, max_duration_s__isnull=False, started_at__isnull=False
    ).values_list("pk", "started_at", "max_duration_s")
    return sorted(pk for pk, started, limit in rows if started + timedelta(seconds=limit) <= now)


def enforce_walltime(now: datetime | None = None) -> list[int]:
    """Fail and stop every running job past its maximum duration; returns their ids."""
    now = now or timezone.now()
    ended: list[int] = []
    stops: list[int] = []
    for job_id in overdue(now):
        with transaction.atomic():
            lock_cluster()
            job = Job.objects.select_for_update().filter(pk=job_id).first()
            if job is None or job.state != Job.State.RUNNING or not job.max_duration_s or not job.started_at:
                continue
            deadline = job.started_at + timedelta(seconds=job.max_duration_s)
            if deadline > now:
                continue
            sent = bool(job.agent_job_id or job.launched)
            transitions.time_out(
                job_id,
                at=now,
                detail=f"ran past its maximum duration of {job.max_duration_s} s "
                f"(limit reached {clock_text(deadline, 's')}); stopped by the portal",
            )
        ended.append(job_id)
        if sent:
            stops.append(job_id)
        log.warning(
            "job %s passed its maximum duration of %s s; failed with reason Walltime", job_id, job.max_duration_s
        )
    executor = get_executor()
    for job_id in stops:  # after the transactions: these are calls to the executor
        executor.stop(job_id, grace_s=EVICT_GRACE_S, cause="walltime")
    return ended
