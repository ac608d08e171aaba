"""The tick end to end on the configured database: submit → tick → allocations."""

from __future__ import annotations

from collections import Counter

import pytest

from devices.models import Device
from scheduling.models import Allocation, Job, JobEvent, TickRecord
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def _submit(api, user, **body):
    payload = {"name": "job", "command": "sleep 1", "estimated_duration_s": 600, **body}
    resp = api(user).post("/api/v1/jobs/", payload, format="json")
    assert resp.status_code == 201, resp.json()
    return resp.json()


def test_job_submitted_through_the_api_is_started_by_the_tick(demo, api, user_factory) -> None:
    lead = user_factory("alice", team="training", role="lead")
    job = _submit(api, lead, num_devices=4, chip_model="910A")
    assert job["state"] == "pending"
    result = run_tick()
    assert job["id"] in result.started
    stored = Job.objects.get(pk=job["id"])
    assert stored.state == "running" and stored.started_at is not None
    devices = Device.objects.filter(allocations__job=stored, allocations__end__isnull=True)
    assert devices.count() == 4
    assert {d.chip_model for d in devices} == {"910A"}
    assert list(JobEvent.objects.filter(job=stored).values_list("to_state", flat=True)) == ["pending", "running"]
    record = TickRecord.objects.first()
    assert record.policy_version == 1 and record.starts >= 1


def test_ticks_never_give_a_device_twice_and_record_reasons(demo, api, user_factory) -> None:
    lead = user_factory("bob", team="research", role="lead")
    for _ in range(6):
        _submit(api, lead, num_devices=2, chip_model="910A")
    run_tick()
    run_tick()
    open_allocs = Allocation.objects.filter(end__isnull=True)
    per_device = Counter(open_allocs.values_list("device_id", flat=True))
    assert per_device and max(per_device.values()) == 1
    running = Job.objects.filter(state="running", chip_model="910A").count()
    assert running == 4  # 8 cards of 910A, 2 each
    waiting = Job.objects.filter(state="pending", team__name="research")
    assert waiting.count() == 2
    assert all(j.pending_reason and j.pending_reason != "Submitted" for j in waiting)


def test_cancel_frees_the_devices_for_the_next_tick(demo, api, user_factory) -> None:
    lead = user_factory("carol", team="training", role="lead")
    first = _submit(api, lead, num_devices=8, chip_model="910A")
    second = _submit(api, lead, num_devices=8, chip_model="910A")
    run_tick()
    assert Job.objects.get(pk=first["id"]).state == "running"
    assert Job.objects.get(pk=second["id"]).state == "pending"
    resp = api(lead).post(f"/api/v1/jobs/{first['id']}/cancel/")
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    assert not Allocation.objects.filter(job_id=first["id"], end__isnull=True).exists()
    run_tick()
    assert Job.objects.get(pk=second["id"]).state == "running"


def test_job_added_in_the_django_admin_is_started_by_the_tick(demo, user_factory) -> None:
    from django.test import Client
    from django.utils import timezone

    from quotas.models import Team

    admin = user_factory("boss", staff=True)
    admin.is_superuser = True
    admin.save()
    client = Client()
    client.force_login(admin)
    now = timezone.now()
    form = {
        "team": Team.objects.get(name="research").pk,
        "submitter": admin.pk,
        "name": "from-admin",
        "command": "sleep 1",
        "priority_class": "normal",
        "num_devices": 1,
        "chip_model": "310P3",
        "estimated_duration_s": 60,
        "submitted_at_0": now.strftime("%Y-%m-%d"),
        "submitted_at_1": now.strftime("%H:%M:%S"),
        "array_id": "",
        "allocations-TOTAL_FORMS": 0,
        "allocations-INITIAL_FORMS": 0,
        "events-TOTAL_FORMS": 0,
        "events-INITIAL_FORMS": 0,
    }
    resp = client.post("/admin/scheduling/job/add/", form)
    assert resp.status_code == 302, resp.content.decode()[:3000]
    job = Job.objects.get(name="from-admin")
    assert job.events.get().to_state == "pending"
    run_tick()
    job.refresh_from_db()
    assert job.state == "running"
    assert job.allocations.get().device.chip_model == "310P3"
