"""Why a job is where it is: the engine's priority breakdown, in the units its readers use.

The console's job page and ``GET /api/v1/jobs/{id}/explain/`` both show it. The
engine speaks in epoch seconds (it has no clock of its own); people and API
clients get a datetime, like every other time the API returns, and the
starvation limit also as a duration ("24h").
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.utils import timezone

from quotas.policies.versions import active_policy
from scheduling.engine.durations import format_duration
from scheduling.engine.explain import explain
from scheduling.models import Job
from scheduling.services.snapshot import load_snapshot


def explain_job(job: Job) -> dict[str, Any]:
    """The breakdown of a pending or running ``job`` at this moment under the active policy.

    ``estimated_start`` is an aware datetime (or ``None``). Raises ``KeyError`` when
    the job is neither pending nor running in the snapshot (it ended meanwhile).
    """
    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    info = explain(snapshot, job.pk)
    starvation = info.get("starvation")
    if starvation is not None:
        after = starvation["after_s"]
        starvation["after"] = None if after is None else format_duration(after)
    at = info.get("estimated_start")
    # Whole seconds: an estimate means nothing finer, and float sums leave microseconds behind.
    info["estimated_start"] = None if at is None else datetime.fromtimestamp(round(at), UTC)
    return info
