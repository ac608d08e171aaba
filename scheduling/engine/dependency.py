"""Job dependencies: a job waits until the jobs it depends on have ended as it asked (Slurm's ``--dependency``).

A job may depend on others ending: ``afterok`` (they completed), ``afterany`` (they ended, however),
``afternotok`` (they ended without completing). The caller reads the jobs depended on and tells the
core, per waiting job whose dependencies are not all satisfied, where they stand
(``Snapshot.dependencies``): not yet, or never (an ``afterok`` on a job that failed, an
``afternotok`` on one that completed), with what it waits for in words. A job absent from that
mapping has none left to wait for and is scheduled like any other.

The rule, at step 0 of the pipeline (``decide``'s docstring is the one place that says how the
rules combine):

* a job whose dependencies are **not yet** satisfied waits with ``Dependency``, the caller's words
  as its detail. It is not eligible: it takes no place in the priority order, holds no cards,
  blocks no job behind it and gets no estimated start, as Slurm leaves such a job out of
  scheduling until its dependency is met;
* a job whose dependencies can **never** be satisfied is cancelled (``Decisions.cancelled``, reason
  ``DependencyNeverSatisfied``), as Slurm's ``kill_invalid_depend`` does; otherwise it would wait
  for ever with a reason that reads as temporary.

Pure functions of the snapshot; no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduling.engine import reasons
from scheduling.engine.snapshot import Dependencies, JobState, Wait


def hold(
    pending: Iterable[JobState], dependencies: Mapping[int, Dependencies]
) -> tuple[dict[int, Wait], dict[int, str]]:
    """``(waits, cancels)``: the pending jobs that wait with ``Dependency``, and those to cancel with their detail."""
    waits: dict[int, Wait] = {}
    cancels: dict[int, str] = {}
    shared: dict[str, Wait] = {}  # the copies of an array waiting on the same job share one wait
    for job in pending:
        found = dependencies.get(job.id)
        if found is None:
            continue
        if found.never:
            cancels[job.id] = found.detail
            continue
        wait = shared.get(found.detail)
        if wait is None:
            wait = shared[found.detail] = Wait(reasons.DEPENDENCY, found.detail)
        waits[job.id] = wait
    return waits, cancels
