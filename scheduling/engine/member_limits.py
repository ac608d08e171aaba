"""A team lead's limits on one member, inside the team's quota: cards at once, jobs at once.

The caller names, per (team, user), the member's limits (``Snapshot.member_limits``): at most
``max_devices`` whole cards held by their running jobs, at most ``max_jobs`` jobs running. At step 0
of the pipeline (``decide``'s docstring), after the dependencies and array limits, each member may
start pending jobs in the order they were submitted while their running jobs plus these stay within
both limits; the rest wait with ``MemberLimit`` and, like a job waiting for its dependencies, take
no place in the order, hold nothing and block no one (another member's jobs go ahead).

A vNPU slice counts as one job and no cards (its share of a card depends on the chip; the team's own
``max`` still counts it). A job let through that does not start this tick keeps the member's later
ones waiting, as an array's copies do: the member asked for them in that order. Pure functions of
the snapshot; no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduling.engine import reasons
from scheduling.engine.snapshot import JobState, Wait
from scheduling.engine.words import count

#: ``(max whole cards at once or None, max jobs at once or None)`` per ``(team, user)``.
Limits = Mapping[tuple[str, str], tuple[float | None, int | None]]


def cards(job: JobState) -> float:
    """Whole cards a job holds toward a member's limit (a vNPU slice: none)."""
    return 0.0 if job.vnpu_template else float(job.num_devices)


def hold(pending: Iterable[JobState], running: Iterable[JobState], limits: Limits) -> dict[int, Wait]:
    """The pending jobs that wait with ``MemberLimit``, by job id."""
    mine = sorted(
        (job for job in pending if (job.team, job.user) in limits), key=lambda job: (job.submitted_at, job.id)
    )
    if not mine:
        return {}
    held_cards: dict[tuple[str, str], float] = {}
    held_jobs: dict[tuple[str, str], int] = {}
    for job in running:
        key = (job.team, job.user)
        if key in limits:
            held_cards[key] = held_cards.get(key, 0.0) + cards(job)
            held_jobs[key] = held_jobs.get(key, 0) + 1
    full: set[tuple[str, str]] = set()
    waits: dict[int, Wait] = {}
    for job in mine:
        key = (job.team, job.user)
        max_cards, max_jobs = limits[key]
        now_cards, now_jobs = held_cards.get(key, 0.0), held_jobs.get(key, 0)
        over = ""
        if key in full:
            over = "an earlier job of yours waits for room within your limit"
        elif max_jobs is not None and now_jobs + 1 > max_jobs:
            over = f"your team lead lets you run {count(max_jobs, 'job')} at once; {now_jobs} run or go first"
        elif max_cards is not None and now_cards + cards(job) > max_cards + 1e-9:
            over = (
                f"your team lead lets you hold {count(max_cards, 'card')} at once; "
                f"yours hold {now_cards:g} (or go first) and this job asks {cards(job):g}"
            )
        if over:
            full.add(key)
            waits[job.id] = Wait(reasons.MEMBER_LIMIT, over)
            continue
        held_cards[key] = now_cards + cards(job)
        held_jobs[key] = now_jobs + 1
    return waits
