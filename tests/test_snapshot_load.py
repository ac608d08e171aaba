"""The snapshot the tick builds from the database: times, slots, usage."""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from devices.models import Device
from quotas.models import Team
from scheduling.engine.policy import parse_policy
from scheduling.models import Allocation, Job
from scheduling.services.snapshot import _usage, load_snapshot

pytestmark = pytest.mark.django_db

HOURLY = parse_policy(
    "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nmetadata: {name: t}\n"
    "spec: {timezone: UTC, ordering: {usageHalfLife: 1h}}\n"
)


def _job(user, team: str, state: str, **kw) -> Job:
    now = timezone.now()
    return Job.objects.create(
        team=Team.objects.get(name=team),
        submitter=user,
        name="x",
        command="true",
        priority_class="normal",
        state=state,
        submitted_at=kw.pop("submitted_at", now),
        **kw,
    )


def test_usage_integrates_the_decay_exactly_over_each_interval(demo, user_factory) -> None:
    user = user_factory("u1", team="research")
    Allocation.objects.all().delete()
    now = timezone.now().replace(day=15, hour=12, minute=0, second=0, microsecond=0)
    job = _job(user, "research", "completed", num_devices=2)
    for device in Device.objects.filter(chip_model="910A")[:2]:
        Allocation.objects.create(job=job, device=device, start=now - timedelta(hours=2), end=now - timedelta(hours=1))
    usage, month = _usage(now, HOURLY)
    # 2 cards × ∫ 2^(-(now-t)/1h) dt over [now-2h, now-1h] = 2 × (1/ln 2) × (1/2 - 1/4) hours
    assert usage[("research", "u1")] == pytest.approx(2 * 0.25 / math.log(2), rel=1e-6)
    assert month["research"] == pytest.approx(2.0, rel=1e-6)


def test_running_allocations_count_up_to_now_and_month_starts_are_respected(demo, user_factory) -> None:
    user = user_factory("u2", team="training")
    Allocation.objects.all().delete()
    now = timezone.now().replace(day=1, hour=3, minute=0, second=0, microsecond=0)
    job = _job(user, "training", "running", num_devices=1, started_at=now - timedelta(hours=5))
    Allocation.objects.create(
        job=job, device=Device.objects.filter(chip_model="910B4").first(), start=now - timedelta(hours=5)
    )
    usage, month = _usage(now, HOURLY)
    assert month["training"] == pytest.approx(3.0, rel=1e-6)  # only the hours since 00:00 on the 1st (UTC)
    expected = (1 - 2**-5) / math.log(2)
    assert usage[("training", "u2")] == pytest.approx(expected, rel=1e-6)


def test_snapshot_carries_epoch_times_slots_and_templates(demo, user_factory) -> None:
    user = user_factory("u3", team="inference")
    now = timezone.now().replace(microsecond=0)
    pending = _job(
        user,
        "inference",
        "pending",
        submitted_at=now - timedelta(minutes=3),
        chip_model="910B4",
        num_devices=1,
        estimated_start=now + timedelta(minutes=7),
        pending_reason="Resources",
    )
    running = _job(
        user,
        "inference",
        "running",
        started_at=now - timedelta(minutes=1),
        num_devices=1,
        preempt_deadline=now + timedelta(seconds=90),
        checkpoint_interval_s=600,
    )
    device = Device.objects.filter(chip_model="310P3").first()
    Allocation.objects.create(job=running, device=device, start=now - timedelta(minutes=1))
    snap, loaded = load_snapshot(now, HOURLY)
    p = next(j for j in snap.pending if j.id == pending.pk)
    assert p.submitted_at == pytest.approx((now - timedelta(minutes=3)).timestamp(), abs=1e-3)
    assert p.chip_model == "910B4"
    r = next(j for j in snap.running if j.id == running.pk)
    assert r.started_at == pytest.approx((now - timedelta(minutes=1)).timestamp(), abs=1e-3)
    assert r.preempt_deadline == pytest.approx((now + timedelta(seconds=90)).timestamp(), abs=1e-3)
    assert [s.device_id for s in r.slots] == [device.pk]
    assert r.checkpoint_interval_s == 600.0 and p.checkpoint_interval_s is None
    assert loaded.waiting[pending.pk] == ("Resources", "", round((now + timedelta(minutes=7)).timestamp()))
    assert ("310P3", "vir02") in snap.templates
    assert sum(len(n.devices) for n in snap.nodes) == 28


def test_inventory_values_change_with_every_value_the_layout_is_built_from(demo) -> None:
    """``Snapshot.inventory_values`` stands for the nodes and devices: equal only while they are."""
    from devices.models import Node
    from scheduling.engine.capacity import Layout
    from scheduling.engine.decide import decide

    now = timezone.now()
    first, _ = load_snapshot(now, HOURLY)
    again, _ = load_snapshot(now, HOURLY)
    assert first.inventory_values is not again.inventory_values
    assert first.inventory_values == again.inventory_values  # nothing changed: the layout is kept
    Layout._idle.clear()
    decide(first)
    (kept,) = Layout._idle
    decide(again)
    assert Layout._idle[0] is kept

    device = Device.objects.order_by("id").first()
    assert device is not None
    device.health = "critical"
    device.save(update_fields=["health"])
    sick, _ = load_snapshot(now, HOURLY)
    assert sick.inventory_values != first.inventory_values
    assert not next(d for n in sick.nodes for d in n.devices if d.id == device.id).usable
    decide(sick)
    assert Layout._idle[0] is not kept  # a new layout, without the sick card

    node = Node.objects.order_by("id").first()
    assert node is not None
    node.state = Node.State.CORDONED
    node.save(update_fields=["state"])
    cordoned, _ = load_snapshot(now, HOURLY)
    assert cordoned.inventory_values != sick.inventory_values
