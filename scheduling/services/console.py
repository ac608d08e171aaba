"""What the console's job pages show, for the full page and for its live fragment alike.

The live fragments (``/live/...``, polled every few seconds by htmx) call the same functions as
the pages, so a fragment can never show what its page would not, and a fixed handful of queries
builds either (pinned in tests/test_live_partials.py).
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from npuportal.api_pagination import InvalidCursor, Keyset
from scheduling.api.views import JobPagination, visible_jobs
from scheduling.disclosure import Viewer, event_detail, events_of, preempted_for_text
from scheduling.models import Job
from scheduling.reason_text import event_name, exit_reason, reason_text
from scheduling.services.runs import job_runs

#: Rows per page of the console's job list.
JOB_LIST_PAGE = 100
#: Pending and running jobs on the dashboard's queue.
DASHBOARD_ROWS = 100


def job_rows(jobs: Any) -> list[tuple[Job, str]]:
    """Each job with its wait reason in words ('' when it does not wait)."""
    return [(job, reason_text(job.pending_reason) if job.pending_reason else "") for job in jobs]


def dashboard_queue(user: object) -> list[tuple[Job, str]]:
    """The user's pending and running jobs, waiting ones first, oldest first."""
    active = (
        visible_jobs(user)
        .defer("command")  # the rows show no command, and one may be tens of KiB
        .filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
        .order_by("state", "submitted_at")[:DASHBOARD_ROWS]
    )
    return job_rows(active)


def job_list_page(user: object, state: str | None, cursor: str | None) -> dict[str, Any]:
    """Newest jobs first, a page at a time by cursor: one indexed query, never a COUNT of the table."""
    qs: QuerySet[Job] = visible_jobs(user).defer("command")
    if state not in Job.State.values:
        state = None
    if state:
        qs = qs.filter(state=state)
    keyset = Keyset(JobPagination.ordering)
    try:
        page = keyset.page(qs, limit=JOB_LIST_PAGE, cursor=cursor or None)
    except InvalidCursor:
        page = keyset.page(qs, limit=JOB_LIST_PAGE)  # a stale or edited link: start from the newest
    return {
        "rows": job_rows(page.rows),
        "state": state,
        "older": page.next_cursor,
        "newer": page.previous_cursor,
    }


def job_live(job: Job, user: object) -> dict[str, Any]:
    """The parts of a job's page that change while it waits and runs: state, reason, devices, events."""
    viewer = Viewer.of(user)
    events = list(events_of(job))
    last_reason = max(events, key=lambda e: (e.recorded_at, e.pk)).reason if events else None
    allocations = list(job.allocations.select_related("device__node", "vnpu_template"))
    runs = job_runs(job, events, allocations)
    return {
        "job": job,
        "allocations": allocations,
        "events": [(event, event_name(event.reason), event_detail(event, viewer, words=True)) for event in events],
        # Shown once a run was requeued: each run's outcome (node_fail, preempted), as sacct --duplicates.
        "runs": [
            (run, Job.State(run.state).label, event_detail(run.end_event, viewer, words=True) if run.end_event else "")
            for run in runs
        ]
        if len(runs) > 1
        else [],
        "exit_reason": exit_words(job, last_reason),
        "preempted_for": preempted_for_text(job, viewer) if job.preempt_deadline else "",
        "reason": reason_text(job.pending_reason) if job.pending_reason else "",
    }


def exit_words(job: Job, end_reason: str | None) -> str | None:
    """What the job page says after the exit code: ``None`` when the words would only repeat it.

    ``exit_reason`` says ``exit code 0`` for a plain exit; next to the code itself that read
    "0 (exit code 0)". Words that add something (``walltime exceeded``, ``killed by signal SIGKILL``,
    ``no exit status``) stay.
    """
    words = exit_reason(str(job.state), job.exit_code, end_reason)
    if words is not None and job.exit_code is not None and words == f"exit code {job.exit_code}":
        return None
    return words
