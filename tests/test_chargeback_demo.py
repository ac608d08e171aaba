"""The demo (``make run``) shows last month's closed statements and this month's live usage."""

from __future__ import annotations

from decimal import Decimal
from itertools import pairwise

import pytest

from quotas.accounting.statements import compute_month, previous_month
from quotas.models import RateCard, Statement, UsageRecord
from scheduling.models import Job

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def test_the_demo_closes_last_month_with_the_default_rate_card(demo) -> None:
    card = RateCard.objects.get()
    assert card.currency == "CNY"
    assert {r.chip_model: r.price_per_device_hour for r in card.rates.all()} == {
        "910B4": Decimal("12.0000"),
        "910A": Decimal("9.0000"),
        "310P3": Decimal("3.0000"),
    }
    assert {m.priority_class: m.multiplier for m in card.multipliers.all()} == {
        "critical": Decimal("1.500"),
        "high": Decimal("1.200"),
        "normal": Decimal("1.000"),
        "low": Decimal("0.500"),
    }
    last = previous_month()
    statements = Statement.objects.filter(month=last)
    assert sorted(s.team.name if s.team_id else "@cluster" for s in statements) == [
        "@cluster",
        "inference",
        "research",
        "training",
    ]
    for s in statements:
        assert s.is_closed and s.total == s.lines_total()
        if s.team_id:
            assert s.total > 0
    # inference ran vNPU slices of the 310P3: priced by share.
    assert Statement.objects.get(month=last, team__name="inference").lines.filter(vnpu_template="vir02").exists()
    # A job ran across midnight of the 1st: charged to both months.
    long_job = Job.objects.get(name="llama-pretrain-long")
    assert sorted(UsageRecord.objects.filter(job=long_job).values_list("month", flat=True).distinct())[0] == last
    # This month is live, not stored.
    bill = compute_month(None)
    assert not Statement.objects.filter(month=bill.month.label).exists()
    assert any(line.kind == "usage" for line in bill.lines)


def test_seeding_again_changes_nothing(demo) -> None:
    from scheduling.demo import seed

    counts = (Job.objects.count(), UsageRecord.objects.count(), Statement.objects.count(), RateCard.objects.count())
    seed(with_agents=False)
    assert (
        Job.objects.count(),
        UsageRecord.objects.count(),
        Statement.objects.count(),
        RateCard.objects.count(),
    ) == counts


def test_the_demo_history_is_coherent_whenever_it_is_seeded(demo) -> None:
    """Whatever the day and hour: one job per card at a time, nothing in the future, every team in both months."""
    from django.utils import timezone

    from quotas.models import Team
    from quotas.policies.versions import active_policy
    from scheduling.models import Allocation
    from scheduling.services.usage import month_of, team_usage

    now = timezone.now()
    by_device: dict[int, list[tuple[object, object]]] = {}
    for device_id, start, end in Allocation.objects.values_list("device_id", "start", "end"):
        assert end is not None and start < end <= now
        by_device.setdefault(device_id, []).append((start, end))
    for spans in by_device.values():
        spans.sort()
        for (_, first_end), (second_start, _) in pairwise(spans):
            assert first_end <= second_start, "two demo jobs on one card at once"
    for job in Job.objects.exclude(started_at=None):
        assert job.submitted_at <= job.started_at <= job.ended_at <= now
    policy = active_policy().policy
    last = previous_month(now)
    for team in Team.objects.all():
        assert team_usage(team, policy, month=last, now=now).total_device_hours > 0, team.name
    # This month, on the policy's clock, has usage as soon as it has begun (a job ran across midnight).
    this = month_of(policy, now)
    assert Allocation.objects.filter(end__gt=this.start).exists()
