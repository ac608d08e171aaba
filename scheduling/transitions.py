"""A job's life: every change of ``Job.state``, its ``JobEvent`` and its allocations' end, here only.

One function per transition, as Saleor's ``order/actions.py`` has one per order change: each writes
the state, records the event and closes the allocations the same way, and queues the executor calls
it implies (a stop, a launch) to run after the commit, so a rolled-back transition sends nothing.
The tick's transitions come in bulk forms (``*_many``) that add their events to a list the tick
writes in one insert; the rest each record their own event.

Nothing else assigns ``Job.state`` or creates a ``JobEvent`` (``tests/test_transitions_only_writer.py``
reads the source tree to keep it so). The use cases around a transition (who may cancel, which run
an agent reports ended, when a job is past its walltime) stay with their callers; what a transition
writes is decided here.

An allocation ends at the transition's time but never before its own start: a failure time an agent
reports may be earlier than a start the portal recorded a moment later.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F, Value
from django.db.models.functions import Greatest
from django.utils import timezone

from devices.services.draining import mark_drained
from scheduling import executor_tasks
from scheduling.models import Allocation, Job, JobEvent

log = logging.getLogger(__name__)

#: Launch failures or lost jobs tolerated before a job is failed for good.
RETRY_BUDGET = 3

#: The state a run's end gives its job, by the end's event reason, when it is not a success or a
#: plain failure: Slurm's TIMEOUT and OUT_OF_MEMORY. Any other reason but ``Completed`` fails it.
END_STATES = {
    "Walltime": Job.State.TIMEOUT,
    "OutOfMemory": Job.State.OUT_OF_MEMORY,
}
#: What a run the portal took off its nodes and queued again ended as, by the requeue's reason:
#: the run's own outcome (``scheduling.services.runs``); the job itself is ``pending`` again. When
#: the retry budget is used up, ``node_fail`` ends the job (Slurm's NODE_FAIL without requeue).
REQUEUE_OUTCOMES = {
    "Preempted": Job.State.PREEMPTED,
    "NodeFail": Job.State.NODE_FAIL,
    "NodeUnreachable": Job.State.NODE_FAIL,
    "LostOnAgent": Job.State.NODE_FAIL,
    "DeviceFailed": Job.State.NODE_FAIL,
    "LaunchFailed": Job.State.NODE_FAIL,
}


def close_allocations(job_ids: Iterable[int], at: datetime) -> None:
    """End the open allocations of ``job_ids`` at ``at``, never before each one's start."""
    Allocation.objects.filter(job_id__in=list(job_ids), end__isnull=True).update(end=Greatest(F("start"), Value(at)))


# --------------------------------------------------------------------------------------------------
# submission


def submitted_event(job: Job, *, actor: AbstractBaseUser | None) -> JobEvent:
    """The ``Submitted`` event of a new job, unsaved: the submission writes it with its job (``job_insert``)."""
    return JobEvent(
        job=job,
        at=job.submitted_at or timezone.now(),
        from_state="",
        to_state=Job.State.PENDING,
        reason="Submitted",
        actor=actor,
    )


def record_submission(job: Job, *, actor: AbstractBaseUser | None) -> None:
    """Record the ``Submitted`` event of a job saved another way (the admin's add form)."""
    submitted_event(job, actor=actor).save()


def record_submissions(jobs: Sequence[Job], *, actor: AbstractBaseUser | None) -> None:
    """The ``Submitted`` events of an array's copies, in one insert."""
    JobEvent.objects.bulk_create(submitted_event(job, actor=actor) for job in jobs)


# --------------------------------------------------------------------------------------------------
# out of running, one job at a time (agents' reports, the walltime backstop, a user's cancel)


def _end(
    job: Job,
    state: str,
    now: datetime,
    *,
    reason: str,
    detail: str = "",
    actor: AbstractBaseUser | None = None,
    exit_code: int | None = None,
    reported_at: datetime | None = None,
) -> None:
    """End ``job`` (locked by the caller) in the final ``state`` at ``now``."""
    old = job.state
    close_allocations([job.pk], now)
    mark_drained()  # the last job of a draining node ends: the node is drained
    job.state = state
    job.ended_at = now
    job.pending_reason = ""
    job.pending_detail = ""
    job.estimated_start = None
    job.preempt_deadline = None
    job.preempted_for = None
    if exit_code is not None:
        job.exit_code = exit_code
    job.save(
        update_fields=[
            "state",
            "ended_at",
            "pending_reason",
            "pending_detail",
            "estimated_start",
            "preempt_deadline",
            "preempted_for",
            "exit_code",
        ]
    )
    JobEvent.objects.create(
        job=job,
        at=now,
        reported_at=reported_at,
        from_state=old,
        to_state=state,
        reason=reason,
        detail=detail[:500],
        actor=actor,
    )


def _failure_time(job: Job, at: datetime | None) -> datetime:
    """``at`` (default now), never in the future nor before the job started."""
    now = timezone.now()
    at = min(at or now, now)
    if job.started_at is not None:
        at = max(at, job.started_at)
    return at


@transaction.atomic
def finish(
    job_id: int,
    *,
    exit_code: int | None,
    ended_at: datetime | None = None,
    detail: str = "",
    reason: str | None = None,
) -> Job | None:
    """A running job's run ended as its executor reports it. Idempotent; returns the job (``None``: no such job).

    Exit code 0 completes the job; anything else (a non-zero status, a negative
    one for a signal, none at all) fails it. ``reason`` overrides the event's
    reason (``Walltime``, ``Killed``): ``Walltime`` ends the job ``timeout``,
    ``OutOfMemory`` ``out_of_memory`` (:data:`END_STATES`), any other reason but
    ``Completed`` fails it.

    The event is recorded now, after whatever the portal did while the end was on
    its way (a preemption scheduled, say), so the timeline keeps that order; the
    executor's end time is its ``reported_at``, and ``at`` (where usage stops) is that
    time, never in the future nor before the start.
    """
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state != Job.State.RUNNING:
        return job
    reason = reason or ("Completed" if exit_code == 0 else "NonZeroExit")
    if exit_code == 0 and reason == "Completed":
        state = Job.State.COMPLETED
    else:
        state = END_STATES.get(reason, Job.State.FAILED)
    now = min(ended_at or timezone.now(), timezone.now())
    _end(
        job,
        state,
        max(now, job.started_at or now),
        reason=reason,
        detail=detail or f"exit code {exit_code}",
        exit_code=exit_code,
        reported_at=ended_at,
    )
    return job


def time_out(job_id: int, *, at: datetime, detail: str) -> Job | None:
    """The portal ends a running job at its maximum duration (``timeout``, reason ``Walltime``).

    The caller stops its run on the executor (``scheduling.services.walltime``): the stop is
    awaited there with the others of the same pass.
    """
    return finish(job_id, exit_code=None, ended_at=at, reason="Walltime", detail=detail)


@transaction.atomic
def fail(job_id: int, *, reason: str, detail: str, at: datetime | None = None) -> Job | None:
    """Fail a running job for good, with ``reason`` and ``detail`` in its event: no retry, no requeue.

    For what no retry can change, such as a launch its agent refuses as too large:
    requeued, it would only be refused again on every node it lands on.
    """
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state != Job.State.RUNNING:
        return job
    _end(job, Job.State.FAILED, _failure_time(job, at), reason=reason, detail=detail)
    return job


@transaction.atomic
def requeue(
    job_id: int,
    *,
    reason: str,
    detail: str = "",
    count_retry: bool = True,
    at: datetime | None = None,
    reported_at: datetime | None = None,
) -> Job | None:
    """Take a running job off its devices and queue it again, keeping its submit time.

    Usage is charged only up to ``at`` (the failure time; default now, never
    before the job started): the allocations close there. A job that has used
    up its retry budget ends instead, so a broken job cannot loop forever: as
    ``node_fail`` for a node's fault (:data:`REQUEUE_OUTCOMES`), else ``failed``.
    ``count_retry=False`` is for a run the system ended, not the job: it costs the
    job no retry. ``reported_at`` is the time an executor gave for the failure, kept on the event.
    """
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if job is None or job.state != Job.State.RUNNING:
        return job
    at = _failure_time(job, at)
    if count_retry and job.retries >= RETRY_BUDGET:
        _end(
            job,
            Job.State.NODE_FAIL if REQUEUE_OUTCOMES.get(reason) == Job.State.NODE_FAIL else Job.State.FAILED,
            at,
            reason=reason,
            detail=f"{detail}; retry budget ({RETRY_BUDGET}) used up",
            reported_at=reported_at,
        )
        return job
    close_allocations([job.pk], at)
    mark_drained()
    job.state = Job.State.PENDING
    job.started_at = None
    job.launched = False
    job.preempt_deadline = None
    job.preempted_for = None
    job.pending_reason = reason
    job.pending_detail = detail[:300]
    if count_retry:
        job.retries += 1
    job.save(
        update_fields=[
            "state",
            "started_at",
            "launched",
            "preempt_deadline",
            "preempted_for",
            "pending_reason",
            "pending_detail",
            "retries",
        ]
    )
    JobEvent.objects.create(
        job=job,
        at=at,
        reported_at=reported_at,
        from_state=Job.State.RUNNING,
        to_state=Job.State.PENDING,
        reason=reason,
        detail=detail[:500],
    )
    return job


def cancel(job: Job, *, actor: AbstractBaseUser | None, detail: str) -> None:
    """Cancel ``job`` (pending or running, locked by the caller); a running one is stopped after the commit.

    Its devices are free at the next tick. The stop is queued once, without retries: with the
    broker down this runs inside the API call, which must answer at once (the executor's next
    observation stops a cancelled job that still runs anyway).
    """
    was_running = job.state == Job.State.RUNNING
    _end(job, Job.State.CANCELLED, timezone.now(), reason="Cancelled", detail=detail, actor=actor)
    if was_running:
        job_id = job.pk
        transaction.on_commit(lambda: executor_tasks.queue_stop(job_id, "Cancelled"))


def record_launch_failure(job: Job, *, at: datetime, detail: str, other_job_id: int | None = None) -> int:
    """A launch of ``job``'s current run was refused, to be tried again; returns the refusals since it started.

    The job stays running (the event goes from ``running`` to ``running``); past
    :data:`RETRY_BUDGET` refusals the caller requeues it (:func:`requeue`).
    """
    JobEvent.objects.create(
        job=job,
        at=at,
        from_state=Job.State.RUNNING,
        to_state=Job.State.RUNNING,
        reason="LaunchFailed",
        detail=detail[:500],
        other_job_id=other_job_id,
    )
    since = job.started_at or at - timedelta(days=1)
    return JobEvent.objects.filter(job=job, reason="LaunchFailed", at__gte=since).count()


# --------------------------------------------------------------------------------------------------
# the tick's transitions, in bulk: each adds its events to ``events``, which the tick writes at once


@dataclass(frozen=True)
class Start:
    """A waiting job the tick starts on ``allocations`` (unsaved, ``start`` at the tick's time)."""

    job_id: int
    allocations: Sequence[Allocation]
    backfilled: bool = False


@dataclass(frozen=True)
class Preemption:
    """A running job the tick asks to give its devices back by ``deadline``, for ``for_job``."""

    job_id: int
    deadline: datetime | None
    for_job: int | None
    reason: str


def evict_many(
    job_ids: Sequence[int], now: datetime, *, requeue: bool, version: int | None, events: list[JobEvent]
) -> None:
    """Running jobs whose preemption grace is over leave their devices: queued again, or ended ``preempted``.

    Their runs are stopped after the commit, before any launch the same tick queues.
    """
    if not job_ids:
        return
    close_allocations(job_ids, now)
    new_state = Job.State.PENDING if requeue else Job.State.PREEMPTED
    Job.objects.filter(id__in=job_ids, state=Job.State.RUNNING).update(
        state=new_state,
        started_at=None if requeue else now,
        ended_at=None if requeue else now,
        preempt_deadline=None,
        preempted_for=None,
        launched=False,
        pending_reason="Preempted" if requeue else "",
        pending_detail="requeued after preemption" if requeue else "",
    )
    events += _running_events(job_ids, now, new_state, "Preempted", "grace period over", version)
    stopped = list(job_ids)
    transaction.on_commit(lambda: executor_tasks.queue_stops(stopped, "Preempted"))


def call_off_many(job_ids: Sequence[int], now: datetime, *, version: int | None, events: list[JobEvent]) -> None:
    """Running jobs whose preemption is called off at its deadline (no waiting job needs them) keep running."""
    if not job_ids:
        return
    Job.objects.filter(id__in=job_ids, state=Job.State.RUNNING).update(preempt_deadline=None, preempted_for=None)
    events += _running_events(
        job_ids,
        now,
        Job.State.RUNNING,
        "PreemptionCalledOff",
        "the job it was preempted for no longer waits, and no other job needs its devices",
        version,
    )


def start_many(starts: Sequence[Start], now: datetime, *, version: int | None, events: list[JobEvent]) -> None:
    """Waiting jobs the tick placed start now on their allocations; their launches are queued after the commit."""
    if not starts:
        return
    allocations: list[Allocation] = []
    for start in starts:
        allocations.extend(start.allocations)
        events.append(
            JobEvent(
                job_id=start.job_id,
                at=now,
                from_state=Job.State.PENDING,
                to_state=Job.State.RUNNING,
                reason="Scheduled",
                detail="backfilled" if start.backfilled else "",
                policy_version=version,
            )
        )
    Allocation.objects.bulk_create(allocations)
    started = [s.job_id for s in starts]
    Job.objects.filter(id__in=started, state=Job.State.PENDING).update(
        state=Job.State.RUNNING,
        started_at=now,
        pending_reason="",
        pending_detail="",
        estimated_start=None,
        launched=False,
    )
    transaction.on_commit(lambda: executor_tasks.queue_launches(started))


def schedule_preemptions(
    preemptions: Sequence[Preemption], now: datetime, *, version: int | None, events: list[JobEvent]
) -> None:
    """Running jobs the tick will take devices from once their grace is over: the deadline is set, the job runs on."""
    for pre in preemptions:
        Job.objects.filter(id=pre.job_id, state=Job.State.RUNNING, preempt_deadline__isnull=True).update(
            preempt_deadline=pre.deadline, preempted_for=pre.for_job
        )
        # The job it is for is stored, not written into the detail: who may read which job
        # it is depends on who reads (``scheduling.disclosure``).
        events.append(
            JobEvent(
                job_id=pre.job_id,
                at=now,
                from_state=Job.State.RUNNING,
                to_state=Job.State.RUNNING,
                reason="PreemptionScheduled",
                detail=pre.reason[:500],
                other_job_id=pre.for_job,
                policy_version=version,
            )
        )


def cancel_waiting_many(
    cancels: dict[int, str], now: datetime, *, reason: str, version: int | None = None
) -> list[int]:
    """Cancel waiting jobs the scheduler gave up on, each with its detail; returns their ids.

    For the tick, inside its transaction: a job whose dependencies can never be satisfied is
    cancelled with reason ``DependencyNeverSatisfied`` (Slurm's ``kill_invalid_depend``). A waiting
    job holds no devices, so nothing is stopped; one that is no longer waiting is left alone.
    Its events are written at once, before the tick's others.
    """
    ids = list(Job.objects.filter(pk__in=list(cancels), state=Job.State.PENDING).values_list("pk", flat=True))
    if not ids:
        return []
    Job.objects.filter(pk__in=ids, state=Job.State.PENDING).update(
        state=Job.State.CANCELLED,
        ended_at=now,
        pending_reason="",
        pending_detail="",
        estimated_start=None,
    )
    JobEvent.objects.bulk_create(
        JobEvent(
            job_id=pk,
            at=now,
            from_state=Job.State.PENDING,
            to_state=Job.State.CANCELLED,
            reason=reason,
            detail=cancels[pk][:500],
            policy_version=version,
        )
        for pk in ids
    )
    return ids


def record_events(events: list[JobEvent]) -> None:
    """Write the events the bulk transitions collected, in one insert."""
    if events:
        JobEvent.objects.bulk_create(events)


def _running_events(
    job_ids: Sequence[int], now: datetime, to_state: str, reason: str, detail: str, version: int | None
) -> list[JobEvent]:
    """One event per running job the tick moved (to ``to_state``: evicted, or called off)."""
    return [
        JobEvent(
            job_id=job_id,
            at=now,
            from_state=Job.State.RUNNING,
            to_state=to_state,
            reason=reason,
            detail=detail,
            policy_version=version,
        )
        for job_id in job_ids
    ]
