"""What one reader may be told about another job: the one place such text is written.

Events and reasons are stored without naming other jobs (``JobEvent.other_job``,
``Job.preempted_for`` hold the id), and worded here, at read time, for whoever reads
them: admins see the job and its team, a member of that job's team sees the job, and
everyone else reads "a job of another team" — a preempted job's lead must not learn
which job, user or team took the devices. The API's serializers, the console and
``npuctl`` (which prints what the API answers) all come through :func:`other_job_text`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from quotas.tenancy.visibility import visible_team_ids
from scheduling.models import Job, JobEvent

#: What a reader who may not know the other job reads.
ANOTHER_TEAM = "a job of another team"


@dataclass(frozen=True)
class Viewer:
    """Who reads: an admin (staff, as everywhere in the portal), or a member of ``team_ids``."""

    is_admin: bool
    team_ids: frozenset[int]

    @classmethod
    def of(cls, user: object) -> Viewer:
        ids = visible_team_ids(user)
        return cls(True, frozenset()) if ids is None else cls(False, ids)

    def may_know(self, team_id: int) -> bool:
        return self.is_admin or team_id in self.team_ids


def other_job_text(viewer: Viewer, job_id: int | None, team_id: int | None, team_name: str = "") -> str:
    """``job #19 (team training)`` for an admin, ``job #19`` for its team, else ``a job of another team``."""
    if job_id is None:
        return ""
    if team_id is None or not viewer.may_know(team_id):
        return ANOTHER_TEAM
    if viewer.is_admin and team_name:
        return f"job #{job_id} (team {team_name})"
    return f"job #{job_id}"


def event_detail(event: JobEvent, viewer: Viewer, *, words: bool = False) -> str:
    """The event's detail as ``viewer`` may read it: ``GuaranteeReclaim for a job of another team``.

    A refused launch names the job whose run held the device the same way (``...; held by job #6``).
    ``words``: for a person (the console): a preemption's cause in a sentence instead of its code
    (``Your team was borrowing devices ... back — for a job of another team``); the API keeps the code.

    Reads ``event.other_job.team``: load events with ``select_related("other_job__team")``.
    """
    detail = event.detail
    preemption = event.reason == "PreemptionScheduled"
    if words and preemption and detail:
        from scheduling.reason_text import preemption_cause

        detail = preemption_cause(detail)
    if event.other_job_id is None:
        return detail
    other = event.other_job
    text = other_job_text(viewer, event.other_job_id, other.team_id, other.team.name)
    if not preemption:  # a launch refused: the job whose run held the device
        return f"{detail}; held by {text}"
    if not detail:
        return f"for {text}"
    return f"{detail} — for {text}" if words else f"{detail} for {text}"


def events_of(job: Job) -> Iterable[JobEvent]:
    """A job's timeline, in the order it was written, ready for :func:`event_detail`."""
    return job.events.select_related("other_job__team").order_by("recorded_at", "id")


def preempted_for_text(job: Job, viewer: Viewer) -> str:
    """Which waiting job a running job is being preempted for, as ``viewer`` may know it ('' if none)."""
    if job.preempted_for is None:
        return ""
    row = Job.objects.filter(pk=job.preempted_for).values_list("team_id", "team__name").first()
    if row is None:
        return ""
    return other_job_text(viewer, job.preempted_for, row[0], row[1])
