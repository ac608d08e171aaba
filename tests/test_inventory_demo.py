"""The demo's inventory history agrees with its past jobs: no job ran on a card before the card existed.

Marked ``clock``: ``make test`` seeds the demo at each instant of ``tests/clock.py`` (the 1st of a
month, the last day, 1 January, DST change days), where "last month" starts on another day of UTC.
"""

from __future__ import annotations

from datetime import UTC

import pytest
from django.db.models import Min
from django.utils import timezone

from devices.models import InventoryEvent, Node
from devices.services import inventory
from quotas.accounting.statements import previous_month
from quotas.policies.versions import active_policy
from scheduling.demo import registration_time
from scheduling.models import Allocation
from scheduling.services.usage import month_of

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def test_every_allocation_starts_after_its_card_joined_and_none_overlaps_a_removal(demo) -> None:
    now = timezone.now()
    firsts = InventoryEvent.objects.values("device_id").annotate(first=Min("at"))
    joined = dict(firsts.values_list("device_id", "first"))
    allocations = list(Allocation.objects.values_list("device_id", "start", "end"))
    assert allocations, "the demo has a past"
    for device_id, start, _ in allocations:
        assert device_id in joined, f"device {device_id} ran a job but never joined the inventory"
        assert start >= joined[device_id], f"device {device_id}: job from {start}, joined {joined[device_id]}"

    removed_at = {}
    for event in InventoryEvent.objects.order_by("device_id", "at", "id"):
        if event.status == InventoryEvent.Status.REMOVED:
            removed_at.setdefault(event.device_id, []).append(event.at)
    for device_id, start, end in allocations:
        for at in removed_at.get(device_id, []):
            assert not start <= at < (end or now), f"device {device_id} removed at {at} during a job"

    # The nodes were registered at the start of last month on the policy's clock, before its first job.
    last = month_of(active_policy().policy, now, previous_month(now))
    assert registration_time(now) == last.start
    assert set(Node.objects.values_list("created", flat=True)) == {last.start}
    assert set(joined.values()) == {last.start}
    first_job = Allocation.objects.aggregate(first=Min("start"))["first"]
    assert first_job >= last.start

    # Every card counts from its join: stretches of last month cover the whole month per card.
    stretches = inventory.stretches(last.start, last.end)
    per_card: dict[int, float] = {}
    for s in stretches:
        per_card[s.device_id] = per_card.get(s.device_id, 0.0) + s.seconds
    month_s = (last.end.astimezone(UTC) - last.start.astimezone(UTC)).total_seconds()  # real hours, DST included
    assert set(per_card.values()) == {month_s}


def test_seeding_again_writes_no_history(demo) -> None:
    from scheduling.demo import seed

    before = InventoryEvent.objects.count()
    seed(with_agents=False)
    assert InventoryEvent.objects.count() == before


def test_stretches_count_real_hours_across_a_dst_change(db) -> None:
    """March 2027 in New York has 743 hours: a card in the inventory all month has 743 h of stretches."""
    from datetime import datetime
    from zoneinfo import ZoneInfo

    from devices.models import Device

    node = Node.objects.create(name="dst-node")
    card = Device.objects.create(node=node, index=0, chip_model="910B4")
    inventory.record([card], at=datetime(2027, 2, 1, tzinfo=UTC))
    tz = ZoneInfo("America/New_York")
    found = inventory.stretches(datetime(2027, 3, 1, tzinfo=tz), datetime(2027, 4, 1, tzinfo=tz))
    assert [s.seconds / 3600 for s in found] == [743.0]
