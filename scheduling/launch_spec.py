"""What a placed job's run is told at launch, whatever executor launches it.

Its output file with sbatch's patterns filled in, and its place in its array. Here rather than
in ``scheduling.services`` so an executor (``devices.executors``) can read them without depending
on the portal's use cases.
"""

from __future__ import annotations

import re

from django.db.models import Count, Max, Min

from quotas.models import posix_account
from scheduling.models import Job

_OUTPUT_PATTERN = re.compile(r"%(.)")


def output_file(job: Job, node: str) -> str:
    """The job's ``output`` path for its launch on ``node``, sbatch's patterns filled in.

    ``%j`` the job id, ``%x`` its name, ``%u`` the account it runs as, ``%A`` its array's first
    job id (its own id outside an array), ``%a`` its array index (``0`` outside an array),
    ``%N`` the node, ``%%`` a ``%``. Any other ``%`` is left as written. Each part of a
    multi-node job writes its own node's file when the path holds ``%N``.
    """
    if "%" not in job.output:
        return job.output
    values = {
        "j": str(job.pk),
        "x": job.name.replace("/", "_"),
        "u": posix_account(job.submitter),
        "A": job.array_id.removeprefix("A") if job.array_id else str(job.pk),
        "a": str(job.array_index or 0),
        "N": node,
        "%": "%",
    }
    return _OUTPUT_PATTERN.sub(lambda m: values.get(m.group(1), m.group(0)), job.output)


def array_shape(array_id: str) -> tuple[int, int, int]:
    """``(copies, lowest index, highest index)`` of an array: what each copy is told at launch."""
    found = Job.objects.filter(array_id=array_id).aggregate(
        n=Count("id"), low=Min("array_index"), high=Max("array_index")
    )
    return int(found["n"] or 0), int(found["low"] or 0), int(found["high"] or 0)
