"""The demo's closed month balances, and no card is charged for hours before it joined the inventory.

Seeded on the 1st of a month (the close runs minutes after the month ended) and on the 15th, each on
its own policy clock. The demo's nodes join the inventory before their first jobs (``seed`` registers
them at the start of the month it makes history for); before the close, the test adds a node the site
registered on the 4th of that month, with no job on it, so "from the day it joined" is tested too.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
import time_machine
from django.db.models import Min

from devices.models import Device, InventoryEvent
from devices.services import inventory
from quotas.accounting import demo as accounting_demo
from quotas.accounting.rates import device_hours, line_amount
from quotas.accounting.records import seconds_of
from quotas.accounting.statements import compute_month, previous_month
from quotas.models import Statement
from quotas.policies.versions import active_policy
from scheduling.models import Allocation
from scheduling.services.usage import month_of

pytestmark = [pytest.mark.django_db, pytest.mark.clock]

ONE = Decimal(1)


def _late_node(label: str) -> None:
    """A node a site added on the 4th of the month closed next, with no job on it (see the module docstring)."""
    from devices.models import Node

    month = month_of(active_policy().policy, datetime.now(ZoneInfo("UTC")), label)
    joined = month.start + timedelta(days=3)
    node = Node.objects.create(name="ascend-late-01")
    Node.objects.filter(pk=node.pk).update(created=joined)
    for index in range(2):
        Device.objects.create(node=node, index=index, chip_model="910A", hbm_mb=32768, ai_cores=32)
    inventory.record(Device.objects.filter(node=node).select_related("node"), at=joined, cause="node added")


def _seed(instant: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduling.demo import DEMO_POLICY, seed

    real_close = accounting_demo.close_month

    def close_with_history(label: str, **kwargs: object) -> object:
        _late_node(label)
        return real_close(label, **kwargs)

    monkeypatch.setattr(accounting_demo, "close_month", close_with_history)
    zone = instant.split()[1]
    text = re.sub(r"(?m)^(\s*timezone:\s*).*$", lambda m: m.group(1) + zone, DEMO_POLICY.read_text(), count=1)
    seed(with_agents=False, policy_text=text)


@pytest.mark.parametrize("instant", ["2027-03-01T00:30 Asia/Shanghai", "2027-03-15T14:00 America/New_York"])
def test_the_demo_closed_month_balances_and_counts_cards_from_when_they_joined(instant, monkeypatch) -> None:
    text, zone = instant.split()
    when = datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(zone))
    with time_machine.travel(when, tick=False):
        _seed(instant, monkeypatch)
        label = previous_month()
        month = month_of(active_policy().policy, when, label)
        statements = list(Statement.objects.filter(month=label))
        cluster = next(s for s in statements if s.team_id is None)
        assert cluster.is_closed and cluster.balance, "last month is closed with its balance"

        # No job ran on a card before the card joined the inventory.
        first_event = dict(
            InventoryEvent.objects.values("device_id").annotate(first=Min("at")).values_list("device_id", "first")
        )
        for device_id, start in Allocation.objects.values_list("device_id", "start"):
            assert device_id in first_event and first_event[device_id] <= start, "a job before its card joined"
        assert not [w for w in compute_month(label, live=False).warnings if "joined" in w or "provisioned" in w]

        # Provisioned = each card from when it joined (or the month's start) to the month's end (none removed).
        expected: dict[str, Decimal] = {}
        for device in Device.objects.all():
            joined = max(first_event[device.pk], month.start)
            if joined < month.end:
                expected[device.chip_model] = expected.get(device.chip_model, Decimal(0)) + seconds_of(
                    month.end - joined
                )
        assert {c: b["provisioned_hours"] for c, b in cluster.balance.items()} == {
            c: str(device_hours(s)) for c, s in expected.items()
        }
        full_month = seconds_of(month.end - month.start)
        assert any(s < full_month * Device.objects.filter(chip_model=c).count() for c, s in expected.items()), (
            "some card joined during the month: its hours before are not charged"
        )

        # The balance, per chip and for the month: charged + not charged = provisioned × rate + what
        # class multipliers and template rates add to usage.
        for chip, b in cluster.balance.items():
            hours = Decimal(b["provisioned_hours"])
            assert Decimal(b["amount"]) == line_amount(hours, Decimal(b["rate"]), ONE), chip
            assert Decimal(b["charged"]) + Decimal(b["not_charged"]) == Decimal(b["amount"]) + Decimal(
                b["pricing_difference"]
            ), chip
            parts = sum(
                Decimal(b[k]) for k in ("used_hours", "reserved_unused_hours", "unavailable_hours", "idle_hours")
            )
            assert abs(parts - hours) <= Decimal("0.000004"), chip  # four 6-place roundings of exact seconds
        charged = sum((s.total for s in statements), Decimal("0.00"))
        amount = sum((Decimal(b["amount"]) for b in cluster.balance.values()), Decimal("0.00"))
        difference = sum((Decimal(b["pricing_difference"]) for b in cluster.balance.values()), Decimal("0.00"))
        not_charged = sum((Decimal(b["not_charged"]) for b in cluster.balance.values()), Decimal("0.00"))
        assert charged + not_charged == amount + difference
