"""A job array's ``%N``: at most N of its copies run at once (Slurm's ``--array=0-15%4``).

The caller names, for each copy (pending or running) of an array submitted with a limit, its array
and the limit (``Snapshot.array_limits``). At step 0 of the pipeline (``decide``'s docstring), after
the dependencies, each such array may start as many pending copies as its limit leaves room for
beside its running ones; these go first by submission time and then id (the lowest index first, as
Slurm starts them) and are scheduled like any job. The others wait with ``JobArrayTaskLimit`` and, like a
job waiting for its dependencies, take no place in the order, hold nothing and block no one.

A copy let through that does not start this tick (no free cards) keeps the rest waiting: the copies
are alike, so a later one would not have started either. Pure functions of the snapshot; no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduling.engine import reasons
from scheduling.engine.snapshot import JobState, Wait


def hold(
    pending: Iterable[JobState], running: Iterable[JobState], limits: Mapping[int, tuple[str, int]]
) -> dict[int, Wait]:
    """The pending copies that wait with ``JobArrayTaskLimit``, by job id."""
    copies = sorted((job for job in pending if job.id in limits), key=lambda job: (job.submitted_at, job.id))
    if not copies:
        return {}
    busy: dict[str, int] = {}
    for job in running:
        found = limits.get(job.id)
        if found is not None:
            busy[found[0]] = busy.get(found[0], 0) + 1
    room: dict[str, int] = {}
    waits: dict[int, Wait] = {}
    shared: dict[str, Wait] = {}
    for job in copies:
        array, limit = limits[job.id]
        left = room.get(array)
        if left is None:
            left = limit - busy.get(array, 0)
        if left > 0:
            room[array] = left - 1
            continue
        room[array] = 0
        wait = shared.get(array)
        if wait is None:
            detail = f"array {array} runs at most {limit} cop{'y' if limit == 1 else 'ies'} at once"
            wait = shared[array] = Wait(reasons.JOB_ARRAY_TASK_LIMIT, detail)
        waits[job.id] = wait
    return waits
