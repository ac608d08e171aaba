"""Order among waiting jobs: Slurm's multifactor priority.

``priority = sum(weight x factor)`` with every factor in ``[0, 1]``:

* priority class: ``(n - 1 - rank) / (n - 1)`` for ``n`` classes (1 for the
  highest, 0 for the lowest; 1 when there is one class; 0 for a class the
  policy does not know);
* fair share: the user's classic fair-share factor (:mod:`fairshare`);
* age: ``min(waited / max_age, 1)``;
* job size: ``device units / largest node``, capped at 1;
* duration (shorter first): ``1 - ln(1 + d / 1 min) / ln(1 + longJob / 1 min)``,
  clamped to ``[0, 1]``, for the job's expected run time ``d``
  (:func:`run_time.expected`: its estimate, else its maximum; a job with
  neither scores 0). On a log scale because
  runs span seconds to weeks: each tenfold shorter run gains the same. Short
  runs first cut the waits of most jobs; the starvation guard
  (:mod:`starvation`) keeps the long ones from waiting for ever.

Ties go to the earlier submission, then the lower id, so the order is total
and the same on every tick.

:func:`order_pending` is the plain statement of the order. The tick computes
the same order inline on flat lists (``decide.Tick.order``: one float per job,
one sort when no two scores tie); ``tests/engine/test_engine_fastpath.py``
checks the two agree.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from scheduling.engine import run_time
from scheduling.engine.policy import Ordering, Policy
from scheduling.engine.record import Record
from scheduling.engine.snapshot import JobState


@dataclass(frozen=True, slots=True)
class Factors(Record):
    """A job's priority factors, each in [0, 1]."""

    priority_class: float
    fair_share: float
    age: float
    job_size: float
    duration: float = 0.0


def class_factors(policy: Policy) -> dict[str, float]:
    """Class name -> class factor (highest rank 1.0 … lowest 0.0)."""
    n = len(policy.priority_classes)
    if n <= 1:
        return {pc.name: 1.0 for pc in policy.priority_classes}
    return {pc.name: (n - 1 - pc.rank) / (n - 1) for pc in policy.priority_classes}


def age_factor(waited_s: float, max_age_s: float) -> float:
    if max_age_s <= 0:
        return 1.0
    return min(max(waited_s, 0.0) / max_age_s, 1.0)


def size_factor(units: float, largest_node: int) -> float:
    if largest_node <= 0:
        return 0.0
    return min(units / largest_node, 1.0)


#: The duration factor's unit: runs shorter than about a minute all score near 1.
_MINUTE = 60.0


def duration_factor(duration_s: float | None, long_job_s: float) -> float:
    """1 for an instant run, 0 for one of ``long_job_s`` or longer (or of unknown length); log scale between."""
    if duration_s is None or long_job_s <= 0:
        return 0.0
    if duration_s <= 0:
        return 1.0
    return max(0.0, 1.0 - math.log1p(duration_s / _MINUTE) / math.log1p(long_job_s / _MINUTE))


def weighted(factors: Factors, ordering: Ordering) -> dict[str, float]:
    """Each factor times its weight (the sprio columns)."""
    return {
        "priority_class": ordering.weight_priority_class * factors.priority_class,
        "fair_share": ordering.weight_fair_share * factors.fair_share,
        "age": ordering.weight_age * factors.age,
        "job_size": ordering.weight_job_size * factors.job_size,
        "duration": ordering.weight_duration * factors.duration,
    }


def job_factors(
    job: JobState,
    class_f: Mapping[str, float],
    fair_share: float,
    now: float,
    ordering: Ordering,
    units: float,
    largest_node: int,
) -> Factors:
    return Factors(
        class_f.get(job.priority_class, 0.0),
        fair_share,
        age_factor(now - job.submitted_at, ordering.max_age_s),
        size_factor(units, largest_node),
        duration_factor(run_time.expected(job), ordering.long_job_s),
    )


def order_pending(
    pending: Sequence[JobState],
    ordering: Ordering,
    class_f: Mapping[str, float],
    fair_share_of: Callable[[str, str], float],
    now: float,
    size_units: Callable[[JobState], float],
    largest_node: int,
) -> list[JobState]:
    """Pending jobs, highest priority first (ties: earlier submission, lower id)."""
    w_class = ordering.weight_priority_class
    w_fs = ordering.weight_fair_share
    w_age = ordering.weight_age
    w_size = ordering.weight_job_size
    w_dur = ordering.weight_duration
    long_job = ordering.long_job_s
    max_age = ordering.max_age_s
    # Constant part per (team, user, class): one dict probe per job.
    base: dict[tuple[str, str, str], float] = {}
    scores: dict[int, float] = {}
    age_scale = w_age / max_age if max_age > 0 else 0.0
    size_scale = w_size / largest_node if largest_node > 0 else 0.0
    for job in pending:
        key = (job.team, job.user, job.priority_class)
        b = base.get(key)
        if b is None:
            b = base[key] = w_class * class_f.get(job.priority_class, 0.0) + w_fs * fair_share_of(job.team, job.user)
        waited = now - job.submitted_at
        if max_age <= 0 or waited >= max_age:
            score = b + w_age
        elif waited > 0:
            score = b + waited * age_scale
        else:
            score = b
        if size_scale:
            score += min(size_units(job) * size_scale, w_size)
        if w_dur:
            score += w_dur * duration_factor(run_time.expected(job), long_job)
        scores[job.id] = -score
    by_age = sorted(pending, key=_submission_key)
    by_age.sort(key=lambda job: scores[job.id])
    return by_age


def _submission_key(job: JobState) -> tuple[float, int]:
    return (job.submitted_at, job.id)


def priority_score(factors: Factors, ordering: Ordering) -> float:
    return sum(weighted(factors, ordering).values())
