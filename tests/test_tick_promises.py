"""Promises through the database: cards freed for a reclaim reach that job, tick after tick."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from devices.models import Device
from npuportal.display_time import as_shown
from quotas.policies.versions import create_version
from scheduling.models import Job, JobPromise
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: promises}
spec:
  timezone: UTC
  priorityClasses:
    - {name: high, preempts: [low]}
    - {name: normal, default: true}
    - {name: low}
  preemption: {gracePeriod: 60s, onPreempt: requeue}
  teams:
    - {name: research, shares: 1, quota: {guaranteed: {devices: 8}, max: {devices: 8}}}
    - {name: training, shares: 1, quota: {max: {devices: 28}}}
"""


def _submit(api, user, cls: str) -> int:
    body = {"name": cls, "command": "sleep 1", "estimated_duration_s": 3600, "num_devices": 8}
    resp = api(user).post("/api/v1/jobs/", {**body, "chip_model": "910A", "priority_class": cls}, format="json")
    assert resp.status_code == 201, resp.json()
    return resp.json()["id"]


def _reclaiming(api, user_factory):
    """A low job of training on the 910A server, then research's reclaim of it (preempted at t0 + 5 s).

    Returns both leads, t0, the borrower's and the reclaim's job ids.
    """
    create_version(POLICY, author=None, comment="test")
    trainer = user_factory("tina", team="training", role="lead")
    researcher = user_factory("rick", team="research", role="lead")
    t0 = timezone.now().replace(microsecond=0) + timedelta(seconds=5)
    borrower = _submit(api, trainer, "low")
    assert borrower in run_tick(t0).started
    reclaim = _submit(api, researcher, "normal")
    assert run_tick(t0 + timedelta(seconds=5)).preempted == [borrower]
    return trainer, researcher, t0, borrower, reclaim


@pytest.mark.parametrize("handed_back", [True, False], ids=["promise-kept", "promise-lost"])
def test_cards_freed_for_a_reclaim_go_to_it_not_to_a_higher_class_borrower(
    demo, api, user_factory, handed_back: bool
) -> None:
    trainer, _, t0, borrower, reclaim = _reclaiming(api, user_factory)
    cards = set(Device.objects.filter(allocations__job_id=borrower).values_list("id", flat=True))
    promise = JobPromise.objects.get(job_id=reclaim)
    assert set(promise.devices) == cards and len(cards) == 8
    assert promise.until == t0 + timedelta(seconds=65)
    assert Job.objects.get(pk=reclaim).pending_reason == "PreemptionGrace"

    rival = _submit(api, trainer, "high")  # ranks above the reclaim, may preempt "low"
    result = run_tick(t0 + timedelta(seconds=30))
    assert result.started == [] and result.preempted == []
    assert Job.objects.get(pk=rival).pending_reason == "Resources"
    assert set(JobPromise.objects.get(job_id=reclaim).devices) == cards

    if not handed_back:
        JobPromise.objects.filter(job_id=reclaim).delete()
    result = run_tick(t0 + timedelta(seconds=66))
    assert result.evicted == [borrower]
    if handed_back:
        assert result.started == [reclaim]
        assert Job.objects.get(pk=reclaim).state == "running"
        assert not JobPromise.objects.filter(job_id=reclaim).exists()
        assert Job.objects.get(pk=rival).state == "pending"
    else:  # what the promise prevents: the rival takes the cards, the reclaim starts over
        assert result.started == [rival]
        assert Job.objects.get(pk=reclaim).state == "pending"


def test_persisting_promises_writes_new_and_changed_ones_and_deletes_ended_ones(demo, api, user_factory) -> None:
    from scheduling.engine.snapshot import Decisions, Promise
    from scheduling.services.snapshot import LoadedState
    from scheduling.services.tick import _persist_promises

    researcher = user_factory("rita", team="research", role="lead")
    kept, changed, ended, new = (_submit(api, researcher, "normal") for _ in range(4))
    until = (timezone.now() + timedelta(seconds=60)).replace(microsecond=0).timestamp()
    old = {j: Promise(j, (1, 2), until) for j in (kept, changed, ended)}
    for p in old.values():
        JobPromise.objects.create(job_id=p.job_id, devices=list(p.devices), until=timezone.now())
    loaded = LoadedState(promises=old)
    out = Decisions(
        promises={kept: old[kept], changed: Promise(changed, (3, 4), until), new: Promise(new, (5,), until + 1)}
    )
    _persist_promises(loaded, out)
    rows = {p.job_id: (p.devices, p.until.timestamp()) for p in JobPromise.objects.all()}
    assert set(rows) == {kept, changed, new}
    assert rows[changed] == ([3, 4], until) and rows[new] == ([5], until + 1)
    assert rows[kept][0] == [1, 2]  # unchanged: not written again (its stored time is the one created above)
    assert rows[kept][1] != until


def test_a_preemption_whose_job_was_cancelled_is_called_off_at_its_deadline(demo, api, user_factory, client) -> None:
    from scheduling.models import JobEvent
    from scheduling.services.jobs import cancel_job

    trainer, researcher, t0, borrower, reclaim = _reclaiming(api, user_factory)
    victim = Job.objects.get(pk=borrower)
    assert victim.preempted_for == reclaim and victim.preempt_deadline == t0 + timedelta(seconds=65)
    # The victim's team sees it coming, in the list and on the job's page.
    client.force_login(trainer)
    stops = as_shown(victim.preempt_deadline, "time")  # "00:17:59 UTC" on the policy's clock, labelled
    assert f"preempted: stops at {stops}" in client.get("/jobs/").content.decode()
    assert 'id="job-preemption"' in client.get(f"/jobs/{borrower}/").content.decode()

    cancel_job(reclaim, actor=researcher)  # the reclaim is no longer wanted
    assert run_tick(t0 + timedelta(seconds=30)).called_off == []  # not before the deadline
    result = run_tick(t0 + timedelta(seconds=66))
    assert result.evicted == [] and result.called_off == [borrower]
    victim.refresh_from_db()
    assert victim.state == "running" and victim.preempt_deadline is None and victim.preempted_for is None
    assert JobEvent.objects.filter(job_id=borrower, reason="PreemptionCalledOff").count() == 1
    assert run_tick(t0 + timedelta(seconds=70)).evicted == []  # and it keeps running
    assert 'id="job-preemption"' not in client.get(f"/jobs/{borrower}/").content.decode()
