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

:func:`rank` is the one place the scores are summed and sorted (one float per
job, one sort when no two scores tie). :func:`order_pending` feeds it job by
job; the tick (``decide.Tick.order``) feeds it the terms it works out once per
group of jobs; ``tests/engine/test_engine_fastpath.py`` checks the two agree.
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
    """Pending jobs, highest priority first (ties: earlier submission, lower id).

    The plain statement of the order, job by job; :func:`rank` does the sums and the sort.
    """
    jobs = list(pending)
    w_class = ordering.weight_priority_class
    w_fs = ordering.weight_fair_share
    w_size = ordering.weight_job_size
    scale = size_scale(ordering, largest_node)
    fixed = [w_class * class_f.get(job.priority_class, 0.0) + w_fs * fair_share_of(job.team, job.user) for job in jobs]
    size = [min(size_units(job) * scale, w_size) for job in jobs] if scale else None
    return [jobs[i] for i in rank(jobs, fixed, size, ordering, now)]


def size_scale(ordering: Ordering, largest_node: int) -> float:
    """The job-size term per device unit (0: the term is off): ``min(units x scale, weight)``."""
    return ordering.weight_job_size / largest_node if largest_node > 0 else 0.0


def rank(
    pending: list[JobState], fixed: list[float], size: list[float] | None, ordering: Ordering, now: float
) -> list[int]:
    """The order: indices into ``pending``, highest priority first (ties: earlier submission, lower id).

    The one place the priority is summed and sorted. ``fixed[i]``: job ``i``'s class
    term plus its fair-share term (the same per team, user and class, so the caller
    works them out once per group); ``size[i]``: its job-size term (``None``: the
    term is off). The age and duration terms are the job's own. The sums run in
    this order for every caller, so equal inputs give equal floats and equal ties.
    """
    n = len(pending)
    w_age = ordering.weight_age
    w_dur = ordering.weight_duration
    long_job = ordering.long_job_s
    max_age = ordering.max_age_s
    age_scale = w_age / max_age if max_age > 0 else 0.0
    neg = [0.0] * n
    for i in range(n):
        job = pending[i]
        b = fixed[i]
        if max_age <= 0:
            b = b + w_age
        else:
            w = now - job.submitted_at
            if w >= max_age:
                b = b + w_age
            elif w > 0:
                b = b + w * age_scale
        if size is not None:
            b = b + size[i]
        if w_dur:
            b = b + w_dur * duration_factor(run_time.expected(job), long_job)
        neg[i] = -b
    idx = sorted(range(n), key=neg.__getitem__)
    if n < 2:
        return idx
    last = neg[idx[0]]
    for i in range(1, n):
        score = neg[idx[i]]
        if score == last:  # ties: earlier submission, then lower id (one sort when none tie)
            ids = [j.id for j in pending]
            subs = [j.submitted_at for j in pending]
            idx = sorted(range(n), key=ids.__getitem__)
            idx.sort(key=subs.__getitem__)
            idx.sort(key=neg.__getitem__)
            break
        last = score
    return idx


def priority_score(factors: Factors, ordering: Ordering) -> float:
    return sum(weighted(factors, ordering).values())
