"""The tick keeps each job's time at its own team's limits, and the starvation guard leaves it out.

A team at its own ``max`` has chosen that wait: the guard (scheduling/engine/starvation.py) bounds
the wait other teams cause. The database keeps the count across ticks (``Job.own_limits_s`` and the
stretch running now, ``own_limits_since``); the snapshot hands it to the engine.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from quotas.models import Team
from quotas.policies.versions import active_policy
from scheduling.engine import reasons
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.snapshot import load_snapshot
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

H = timedelta(hours=1)


def test_the_tick_counts_the_time_a_job_waits_at_its_teams_own_max(demo, user_factory) -> None:
    lead = user_factory("rita", team="research", role="lead")
    research = Team.objects.get(name="research")  # may hold 12 devices (the demo policy)
    first = job_service.submit_job(
        team=research,
        user=lead,
        spec=job_service.JobSpec(name="first", command="sleep 60", num_devices=8, chip_model="910A"),
    )
    t0 = timezone.now() + timedelta(minutes=1)
    run_tick(now=t0)
    assert Job.objects.get(pk=first.pk).state == Job.State.RUNNING
    second = job_service.submit_job(
        team=research,
        user=lead,
        spec=job_service.JobSpec(name="second", command="sleep 60", num_devices=8, chip_model="910A"),
    )
    run_tick(now=t0)
    waiting = Job.objects.get(pk=second.pk)
    assert waiting.pending_reason == reasons.QUOTA_MAX_DEVICES
    assert waiting.own_limits_since == t0 and waiting.own_limits_s == 0.0
    assert waiting.pending_detail.startswith("your team is at its maximum of 12 devices")

    run_tick(now=t0 + 2 * H)  # still at its max: the stretch runs on, nothing written
    assert Job.objects.get(pk=second.pk).own_limits_since == t0
    snapshot, _ = load_snapshot(t0 + 3 * H, active_policy().policy)
    (state,) = [j for j in snapshot.pending if j.id == second.pk]
    assert state.own_limits_s == pytest.approx(3 * 3600.0), "the stretch running now counts"

    job_service.cancel_job(first.pk, actor=lead)
    run_tick(now=t0 + 4 * H)
    done = Job.objects.get(pk=second.pk)
    assert done.state == Job.State.RUNNING
    assert done.own_limits_since is None and done.own_limits_s == pytest.approx(4 * 3600.0)
