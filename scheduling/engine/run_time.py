"""A job's run time, two rules named apart: the limit and the expectation.

A job carries two figures: ``max_duration_s`` (optional; the run is stopped there)
and ``estimated_duration_s`` (its submitter's guess, never more than the maximum:
submission checks that). Which one a rule reads depends on what it asks:

* :func:`limit` — *how long may this run go on?* The maximum, else the estimate.
  A limit on run time (the team's ``maxJobDuration``, the never-runnable check)
  judges the longest the job may hold its cards.
* :func:`expected` — *how long will this run take?* The estimate, else the
  maximum, else unknown (``None``). The order's duration factor, shadow times,
  backfill and estimated starts read it: the estimate is the job's own figure,
  while the maximum is often the team's ``maxJobDuration`` given to every job
  that names none, so it tells jobs apart less.

Every rule of the engine that needs a job's run time calls one of these two.
"""

from __future__ import annotations

from scheduling.engine.snapshot import JobState


def limit(job: JobState) -> float:
    """The longest ``job`` may run: its ``max_duration_s``, else its estimate (0: neither)."""
    return limit_of(job.max_duration_s, job.estimated_duration_s)


def limit_of(max_duration_s: float | None, estimated_duration_s: float) -> float:
    """:func:`limit` for a job that is not in a snapshot yet (a submission being checked)."""
    return max_duration_s or estimated_duration_s


def expected(job: JobState) -> float | None:
    """How long ``job`` is expected to run: its estimate, else its maximum, else ``None``."""
    return job.estimated_duration_s or job.max_duration_s or None
