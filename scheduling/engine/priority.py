"""Order among waiting jobs: Slurm's multifactor priority.

``priority = sum(weight x factor)`` with every factor in ``[0, 1]``:

* priority class: ``(n - 1 - rank) / (n - 1)`` for ``n`` classes (1 for the
  highest, 0 for the lowest; 1 when there is one class; 0 for a class the
  policy does not know);
* fair share: the user's classic fair-share factor (:mod:`fairshare`);
* age: ``min(waited / max_age, 1)``;
* job size: ``device units / largest node``, capped at 1.

Ties go to the earlier submission, then the lower id, so the order is total
and the same on every tick.

:func:`order_pending` is the plain statement of the order. The tick computes
the same order inline on flat lists (``decide.Tick.order``: one float per job,
one sort when no two scores tie); ``tests/engine/test_engine_fastpath.py``
checks the two agree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

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


def weighted(factors: Factors, ordering: Ordering) -> dict[str, float]:
    """Each factor times its weight (the sprio columns)."""
    return {
        "priority_class": ordering.weight_priority_class * factors.priority_class,
        "fair_share": ordering.weight_fair_share * factors.fair_share,
        "age": ordering.weight_age * factors.age,
        "job_size": ordering.weight_job_size * factors.job_size,
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
        scores[job.id] = -score
    by_age = sorted(pending, key=_submission_key)
    by_age.sort(key=lambda job: scores[job.id])
    return by_age


def _submission_key(job: JobState) -> tuple[float, int]:
    return (job.submitted_at, job.id)


def priority_score(factors: Factors, ordering: Ordering) -> float:
    return sum(weighted(factors, ordering).values())
