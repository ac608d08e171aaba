"""Model-level guarantees the rest of the system leans on."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from devices.models import Device
from quotas.models import Policy
from scheduling.models import Allocation, Job, JobEvent

pytestmark = pytest.mark.django_db


def test_job_events_are_append_only(demo) -> None:
    event = JobEvent.objects.first()
    event.detail = "rewritten"
    with pytest.raises(ValueError, match="append-only"):
        event.save()


def test_only_one_policy_can_be_active(demo) -> None:
    assert Policy.objects.filter(is_active=True).count() == 1
    with pytest.raises(IntegrityError), transaction.atomic():
        Policy.objects.create(version=99, yaml_text="x", is_active=True)


def test_a_card_cannot_be_held_whole_by_two_open_allocations(demo) -> None:
    device = Device.objects.filter(chip_model="910B4").first()
    jobs = list(Job.objects.all()[:2])
    now = timezone.now()
    Allocation.objects.create(job=jobs[0], device=device, start=now)
    with pytest.raises(IntegrityError), transaction.atomic():
        Allocation.objects.create(job=jobs[1], device=device, start=now)
    # A closed allocation does not count: history may hold many.
    Allocation.objects.filter(device=device).update(end=now)
    Allocation.objects.create(job=jobs[1], device=device, start=now)
