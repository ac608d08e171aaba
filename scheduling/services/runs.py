"""A job's runs and how each ended, as ``sacct --duplicates`` lists a requeued job's attempts.

Each start of a job is a run (``attempt`` 1, 2, …). A run ends the job (``completed``, ``timeout``,
``cancelled``...) or is requeued: the system ended it, not the job, and that run's outcome is
``node_fail`` (its node failed or stopped it, a device failed, the launch never took) or ``preempted``
(``scheduling.services.jobs.REQUEUE_OUTCOMES``), while the job is ``pending`` again.

Read from what is already stored, no table of its own: the job's events (a ``pending → running``
event starts a run, the next event out of ``running`` ends it) and its allocations (the nodes, one
group per start). Given a job whose events and allocations are prefetched, it reads nothing more.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from scheduling.models import Allocation, Job, JobEvent
from scheduling.reason_text import exit_reason
from scheduling.services.jobs import REQUEUE_OUTCOMES


@dataclass(frozen=True)
class JobRun:
    attempt: int
    started_at: datetime
    #: ``None`` while it runs.
    ended_at: datetime | None
    #: ``running``, the job's final state for its last run, or ``node_fail``/``preempted`` for a requeued one.
    state: str
    #: The code of the event that ended it ('' while it runs).
    reason: str
    #: That event (its detail is worded per reader: ``scheduling.disclosure.event_detail``).
    end_event: JobEvent | None
    #: Node names, sorted.
    nodes: tuple[str, ...]
    #: The job's exit code, on the run that ended it; ``None`` on the others.
    exit_code: int | None
    #: How it ended in words (``time limit reached``, ``node lost``), ``None`` while it runs.
    exit_reason: str | None


def job_runs(
    job: Job, events: Iterable[JobEvent] | None = None, allocations: Iterable[Allocation] | None = None
) -> list[JobRun]:
    """Every run of ``job``, first first. ``events``/``allocations`` default to the job's (prefetched or read)."""
    timeline = sorted(job.events.all() if events is None else events, key=lambda e: (e.recorded_at, e.pk or 0))
    holds = list(job.allocations.all() if allocations is None else allocations)
    nodes_by_start: dict[datetime, set[str]] = {}
    for alloc in sorted(holds, key=lambda a: a.start):
        nodes_by_start.setdefault(alloc.start, set()).add(alloc.device.node.name)
    node_groups = [tuple(sorted(names)) for names in nodes_by_start.values()]
    runs: list[JobRun] = []
    started: JobEvent | None = None
    for event in timeline:
        if event.from_state == Job.State.PENDING and event.to_state == Job.State.RUNNING:
            started = event
            continue
        if started is None or event.from_state != Job.State.RUNNING or event.to_state == Job.State.RUNNING:
            continue
        final = event.to_state in Job.FINAL_STATES
        state = event.to_state if final else REQUEUE_OUTCOMES.get(event.reason, Job.State.NODE_FAIL)
        code = job.exit_code if final and event.to_state == job.state else None
        runs.append(_run(len(runs) + 1, started, event, str(state), code, node_groups))
        started = None
    if started is not None:
        runs.append(_run(len(runs) + 1, started, None, Job.State.RUNNING, None, node_groups))
    return runs


def _run(
    attempt: int,
    started: JobEvent,
    ended: JobEvent | None,
    state: str,
    exit_code: int | None,
    node_groups: list[tuple[str, ...]],
) -> JobRun:
    nodes = node_groups[attempt - 1] if attempt <= len(node_groups) else ()
    return JobRun(
        attempt=attempt,
        started_at=started.at,
        ended_at=ended.at if ended is not None else None,
        state=state,
        reason=ended.reason if ended is not None else "",
        end_event=ended,
        nodes=nodes,
        exit_code=exit_code,
        exit_reason=exit_reason(state, exit_code, ended.reason) if ended is not None else None,
    )
