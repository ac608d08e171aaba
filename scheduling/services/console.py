"""What the console's job pages show, for the full page and for its live fragment alike.

The live fragments (``/live/...``, polled every few seconds by htmx) call the same functions as
the pages, so a fragment can never show what its page would not, and a fixed handful of queries
builds either (pinned in tests/test_live_partials.py).
"""

from __future__ import annotations

from datetime import date
from typing import Any

from django import forms
from django.http import QueryDict
from django.utils import timezone

from npuportal.api.pagination import InvalidCursor, Keyset
from quotas.tenancy.visibility import is_admin, visible_teams
from scheduling.disclosure import Viewer, event_detail, events_of, preempted_for_text
from scheduling.filters import JOB_ORDERING, JobFilterSet, visible_jobs
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


def filter_params(query: QueryDict) -> QueryDict:
    """The query's filters as the job list reads them: without its page position and its empty values.

    The filter form sends every field, most of them left empty; here empty means "any", as a form's
    blank field does. (The API, asked for an empty date, answers a 400: no script means that.)
    """
    params = QueryDict(mutable=True)
    for key, values in query.lists():
        given = [value for value in values if value != ""]
        if key != "cursor" and given:
            params.setlist(key, given)
    return params


def job_list_page(user: object, query: QueryDict) -> dict[str, Any]:
    """Newest jobs first, a page at a time by cursor: one indexed query, never a COUNT of the table.

    ``query`` is the page's query string: the filters of :class:`~scheduling.filters.JobFilterSet` (the
    API's own, so both lists answer a query string with the same jobs) and ``cursor``. A filter whose
    value cannot be read is left out, and the page says which and why above the list; the rest apply.
    """
    params = filter_params(query)
    filters = JobFilterSet(params, queryset=visible_jobs(user).defer("command"))
    keyset = Keyset(JOB_ORDERING)
    try:
        page = keyset.page(filters.qs, limit=JOB_LIST_PAGE, cursor=query.get("cursor") or None)
    except InvalidCursor:
        page = keyset.page(filters.qs, limit=JOB_LIST_PAGE)  # a stale or edited link: start from the newest
    return {
        "rows": job_rows(page.rows),
        "filters": filters,
        "query": params.urlencode(),
        "older": page.next_cursor,
        "newer": page.previous_cursor,
    }


#: The filters the console's form always shows, in this order. The others (``array_id``, ``ended_*``,
#: and ``team`` for a member of one team) show only when the address sets them, so none applies unseen.
FORM_FILTERS = ("name", "state", "team", "user", "priority_class", "chip_model", "submitted_after", "submitted_before")


def filter_form(filters: JobFilterSet, user: object) -> list[forms.BoundField]:
    """The fields of the filter set's own form to show on ``/jobs/``, with widgets for people.

    States are ticked boxes, the submission dates pick a day, and team, priority class and chip
    model choose from what exists: every team for an admin, a member's own teams (shown when they
    have several), the policy's classes, the inventory's chips. A value the address carries that
    is not among them stays a choice, so the form always shows what filters the list.
    """
    from devices.models import Device
    from quotas.policies.versions import active_policy

    form = filters.form
    fields = form.fields
    given = filters.data

    def choose(name: str, options: list[str]) -> None:
        value = given.get(name, "")
        known = sorted(set(options) | ({value} if value else set()))
        fields[name].widget = forms.Select(choices=[("", "any"), *((o, o) for o in known)])

    fields["state"].widget = forms.CheckboxSelectMultiple(choices=fields["state"].choices)
    fields["name"].widget = forms.TextInput(attrs={"placeholder": "part of the name", "size": 16})
    fields["user"].widget = forms.TextInput(attrs={"placeholder": "user name", "size": 10})
    admin = is_admin(user)
    teams = list(visible_teams(user).order_by("name").values_list("name", flat=True))
    choose("team", teams)
    choose("priority_class", [c.name for c in active_policy().policy.priority_classes])
    chips = Device.objects.filter(node__removed_at__isnull=True).order_by().values_list("chip_model", flat=True)
    choose("chip_model", list(chips.distinct()))
    zone = timezone.get_current_timezone_name()  # the policy's: console pages render in it
    for name in ("submitted_after", "submitted_before"):
        value = given.get(name, "")
        if not value or _is_date(value):
            day = {"type": "date", "title": f"a day on the policy's clock ({zone})"}
            fields[name].widget = forms.DateInput(attrs=day)
    shown = [name for name in FORM_FILTERS if name != "team" or admin or len(teams) > 1]
    shown += [name for name in fields if name not in shown and given.get(name)]
    return [form[name] for name in shown]


def _is_date(value: str) -> bool:
    try:
        date.fromisoformat(value)
    except ValueError:
        return False
    return len(value) == 10


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
