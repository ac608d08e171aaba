"""Estimated starts for the whole queue through the database tick (``ESTIMATE_*`` settings)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from npuportal.display_time import as_shown
from quotas.policies.versions import create_version
from scheduling.models import Job, TickRecord
from scheduling.services.jobs import cancel_job
from scheduling.services.tick import adapt, run_tick

pytestmark = pytest.mark.django_db

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: estimates}
spec:
  timezone: UTC
  teams:
    - {name: training, shares: 1, quota: {max: {devices: 28}}}
"""


def _submit(client, n: int, seconds: int) -> int:
    body = {"name": f"{n}x{seconds}", "command": "sleep 1", "estimated_duration_s": seconds, "num_devices": n}
    resp = client.post("/api/v1/jobs/", {**body, "chip_model": "910A"}, format="json")
    assert resp.status_code == 201, resp.json()
    return resp.json()["id"]


def _estimate(job_id: int):
    return Job.objects.get(pk=job_id).estimated_start


def _training(api, user_factory):
    """The test policy in force, a lead of ``training`` with an API client, and a whole minute ahead."""
    create_version(POLICY, author=None, comment="test")
    lead = user_factory("tina", team="training", role="lead")
    return api(lead), lead, timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=1)


def test_jobs_behind_the_first_blocked_one_get_an_estimate_every_interval(demo, api, user_factory, settings) -> None:
    settings.ESTIMATE_INTERVAL_S = 30
    settings.ESTIMATE_MAX_JOBS = 100
    client, lead, t0 = _training(api, user_factory)
    first = _submit(client, 8, 3600)  # the whole 910A server
    assert run_tick(t0).started == [first]

    second = _submit(client, 8, 1800)
    ring_a = _submit(client, 4, 600)
    ring_b = _submit(client, 4, 600)
    run_tick(t0 + timedelta(seconds=30))  # the pass ran at t0 (nothing waited), and runs again
    # The first blocked job: decide's shadow time. Behind it, the plan: both rings once it ends.
    assert _estimate(second) == t0 + timedelta(seconds=3600)
    assert _estimate(ring_a) == t0 + timedelta(seconds=5400)
    assert _estimate(ring_b) == t0 + timedelta(seconds=5400)
    api_view = client.get(f"/api/v1/jobs/{ring_a}/").json()
    assert api_view["pending_reason"] == "Resources" and api_view["estimated_start"] is not None

    # Within the interval the pass does not run and the stored estimates stay.
    cancel_job(second, actor=lead)
    run_tick(t0 + timedelta(seconds=40))
    ticks = list(TickRecord.objects.order_by("started_at").values_list("estimate_ms", flat=True))
    assert ticks[0] is not None and ticks[1] is not None and ticks[2] is None
    assert _estimate(ring_b) == t0 + timedelta(seconds=5400)

    # The next pass sees the cancelled job gone: both rings when the first job ends.
    run_tick(t0 + timedelta(seconds=60))
    assert TickRecord.objects.order_by("-started_at").first().estimate_ms is not None
    assert _estimate(ring_a) == t0 + timedelta(seconds=3600)
    assert _estimate(ring_b) == t0 + timedelta(seconds=3600)


def test_no_pass_without_a_budget_and_turning_it_off_clears_what_it_stored(demo, api, user_factory, settings) -> None:
    settings.ESTIMATE_MAX_JOBS = 0
    client, _, t0 = _training(api, user_factory)
    first = _submit(client, 8, 3600)
    assert run_tick(t0).started == [first]
    second, third = _submit(client, 8, 1800), _submit(client, 8, 600)
    run_tick(t0 + timedelta(seconds=10))
    assert _estimate(second) == t0 + timedelta(seconds=3600)  # decide's own
    assert _estimate(third) is None
    assert TickRecord.objects.filter(estimate_ms__isnull=False).count() == 0

    settings.ESTIMATE_MAX_JOBS = 100
    run_tick(t0 + timedelta(seconds=20))
    assert _estimate(third) == t0 + timedelta(seconds=5400)
    settings.ESTIMATE_MAX_JOBS = 0
    run_tick(t0 + timedelta(seconds=30))
    assert _estimate(second) == t0 + timedelta(seconds=3600)
    assert _estimate(third) is None


def test_waits_are_written_in_batches_with_every_value_in_its_row(demo, user_factory) -> None:
    """More rows than one statement takes (1,000 on PostgreSQL): each row gets its own values."""
    from datetime import UTC, datetime

    from quotas.models import Team
    from scheduling.services.tick import _write_waits

    user = user_factory("tina", team="training")
    now = timezone.now()
    jobs = Job.objects.bulk_create(
        Job(team=Team.objects.get(name="training"), submitter=user, name="x", command="true",
            priority_class="normal", submitted_at=now)
        for _ in range(2100)
    )  # fmt: skip
    base = 1_800_000_000
    rows = [
        (
            "Resources" if i % 2 else "Priority",
            f"detail 'quoted' {i}",
            datetime.fromtimestamp(base + 60 * i, tz=UTC),
            j.id,
        )
        for i, j in enumerate(jobs)
    ]
    rows[7] = ("Resources", "", None, jobs[7].id)
    _write_waits([(r, d, adapt(e), jid) for r, d, e, jid in rows])
    stored = {j.id: (j.pending_reason, j.pending_detail, j.estimated_start) for j in Job.objects.filter(name="x")}
    assert stored == {jid: (r, d, e) for r, d, e, jid in rows}


def test_the_console_queue_shows_the_day_and_time_of_an_estimate(demo, api, user_factory, client) -> None:
    """An estimate can be days away: the job list shows its date, not only the time of day."""
    rest, lead, t0 = _training(api, user_factory)
    first = _submit(rest, 8, 3 * 86400)  # three days on the whole 910A server
    assert run_tick(t0).started == [first]
    second = _submit(rest, 8, 600)
    behind = _submit(rest, 4, 600)
    run_tick(t0 + timedelta(seconds=40))
    when = t0 + timedelta(days=3, seconds=600)
    assert _estimate(behind) == when
    client.force_login(lead)
    page = client.get("/jobs/").content.decode()
    assert f"estimated start {as_shown(when)}" in page  # "2026-12-05 00:10 CST": the date, not only the time
    assert _estimate(second) == t0 + timedelta(days=3)


def test_a_fault_in_the_planning_pass_does_not_stop_the_tick(demo, api, user_factory, monkeypatch, caplog) -> None:
    """Estimates change no decision: if the pass fails, jobs still start and stored estimates stay."""
    from scheduling.services import tick

    client, _, t0 = _training(api, user_factory)
    first = _submit(client, 8, 3600)
    second, third, fourth = _submit(client, 8, 1800), _submit(client, 8, 600), _submit(client, 8, 60)
    run_tick(t0)
    assert _estimate(fourth) == t0 + timedelta(seconds=6000)

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the planner")

    monkeypatch.setattr(tick, "estimate_starts", broken)
    cancel_job(first, actor=None)
    result = run_tick(t0 + timedelta(seconds=60))
    assert result.started == [second]
    assert "planning pass of estimated starts failed" in caplog.text
    assert _estimate(third) == t0 + timedelta(seconds=1860)  # decide's own: the first blocked job now
    assert _estimate(fourth) == t0 + timedelta(seconds=6000)  # the pass's, kept, not cleared
    assert TickRecord.objects.order_by("-started_at").first().estimate_ms is None


def test_a_tick_survives_a_pool_that_never_frees(demo, api, user_factory) -> None:
    """A running job with no duration at all (estimate set to 0 by hand) holds its cards forever."""
    client, _, t0 = _training(api, user_factory)
    first = _submit(client, 8, 3600)
    assert run_tick(t0).started == [first]
    Job.objects.filter(pk=first).update(estimated_duration_s=0, max_duration_s=None)
    second = _submit(client, 8, 600)
    run_tick(t0 + timedelta(seconds=30))
    job = Job.objects.get(pk=second)
    assert job.pending_reason == "Resources" and job.estimated_start is None


def test_a_job_waiting_for_its_teams_own_jobs_gets_an_estimate(demo, api, user_factory, settings) -> None:
    settings.ESTIMATE_INTERVAL_S = 30
    settings.ESTIMATE_MAX_JOBS = 100
    create_version(POLICY.replace("devices: 28", "devices: 8"), author=None, comment="test")
    lead = user_factory("tina", team="training", role="lead")
    client = api(lead)
    t0 = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    first = _submit(client, 8, 3600)
    assert run_tick(t0).started == [first]
    body = {"name": "more", "command": "sleep 1", "estimated_duration_s": 600, "num_devices": 4}
    resp = client.post("/api/v1/jobs/", body, format="json")  # any chip model: other servers are free
    assert resp.status_code == 201, resp.json()
    second = resp.json()["id"]
    run_tick(t0 + timedelta(seconds=30))
    view = client.get(f"/api/v1/jobs/{second}/").json()
    assert view["pending_reason"] == "QuotaMaxDevices"
    # Not the cards: the team's max, until its own 8-card job ends.
    assert _estimate(second) == t0 + timedelta(seconds=3600)
    assert view["estimated_start"] is not None


def test_explain_gives_the_estimated_start_as_the_job_shows_it(demo, api, user_factory) -> None:
    """``/explain/`` answers times as the rest of the API does (an ISO datetime), not epoch seconds."""
    client, _, t0 = _training(api, user_factory)
    first = _submit(client, 8, 3600)  # the whole 910A server
    assert run_tick(t0).started == [first]
    second = _submit(client, 8, 1800)
    run_tick(t0 + timedelta(seconds=30))
    shown = client.get(f"/api/v1/jobs/{second}/").json()["estimated_start"]
    body = client.get(f"/api/v1/jobs/{second}/explain/").json()
    assert body["decision"] == "wait" and body["reason"] == "Resources"
    assert body["estimated_start"] == shown
    assert _estimate(second) == t0 + timedelta(seconds=3600)
