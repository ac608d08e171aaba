"""Usage records and monthly statements, with every expected number computed by hand in the comments.

The cluster is tests/test_chargeback_harness.py's: 4× 910B4 at ¥12/device-hour, 2× 310P3 at ¥3,
multipliers critical ×1.5, high ×1.2, normal ×1.0, low ×0.5; months on Asia/Shanghai (UTC+8).
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from quotas.accounting import records
from quotas.accounting.records import record_closed_allocations
from quotas.accounting.statements import close_month, compute_month
from quotas.models import Rate, Statement, UsageRecord
from quotas.policies.versions import active_policy
from scheduling.models import Allocation, Job
from scheduling.services.jobs import finish_job, requeue_job
from tests.test_chargeback_harness import at, lines_of, make_card, total_of, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def test_a_job_across_midnight_of_the_1st_is_charged_to_both_months(world) -> None:  # noqa: F811
    # alpha, normal, 2× 910B4 from 31 March 20:00 to 1 April 06:00 (policy clock).
    world.job("alpha", "normal", world.b4[:2], at("2025-03-31 20:00"), at("2025-04-01 06:00"))
    assert record_closed_allocations() == 4  # 2 allocations × 2 months
    months = sorted(UsageRecord.objects.values_list("month", "start", "end"))
    assert [m for m, _, _ in months] == ["2025-03", "2025-03", "2025-04", "2025-04"]
    assert months[0][2] == at("2025-04-01 00:00") and months[2][1] == at("2025-04-01 00:00")

    close_month("2025-03")
    close_month("2025-04")
    # March: 20:00 → 24:00 = 4 h × 2 cards = 8 device-hours × ¥12 × 1.0 = ¥96.00
    assert lines_of("alpha", "2025-03") == [("usage", "910B4", "", "normal", "8.000000", "12.0000", "1.000", "96.00")]
    # April: 00:00 → 06:00 = 6 h × 2 cards = 12 device-hours × ¥12 = ¥144.00
    assert lines_of("alpha", "2025-04") == [("usage", "910B4", "", "normal", "12.000000", "12.0000", "1.000", "144.00")]
    assert total_of("alpha", "2025-03") == "96.00" and total_of("alpha", "2025-04") == "144.00"
    assert total_of("beta", "2025-03") == "0.00"


def test_a_preempted_job_pays_for_both_runs_and_not_for_the_wait_between(world) -> None:  # noqa: F811
    # beta, low, 1× 910B4: runs 10:00–13:30, is preempted (requeued), runs again 14:00–16:00.
    job = world.job("beta", "low", world.b4[:1], at("2025-03-10 10:00"), None)
    requeue_job(job.pk, reason="Preempted", detail="by a critical job", count_retry=False, at=at("2025-03-10 13:30"))
    job.refresh_from_db()
    assert job.state == Job.State.PENDING
    Job.objects.filter(pk=job.pk).update(state=Job.State.RUNNING, started_at=at("2025-03-10 14:00"))
    Allocation.objects.create(job=job, device=world.b4[1], start=at("2025-03-10 14:00"))
    finish_job(job.pk, exit_code=0, ended_at=at("2025-03-10 16:00"))

    close_month("2025-03")
    # 3.5 h + 2 h = 5.5 device-hours × ¥12 × 0.5 (low) = ¥33.00
    assert lines_of("beta", "2025-03") == [("usage", "910B4", "", "low", "5.500000", "12.0000", "0.500", "33.00")]


def test_a_vnpu_job_pays_its_share_of_the_card(world) -> None:  # noqa: F811
    # alpha, high, one vir02 slice (2 of 8 AI cores = 0.25 card) of a 310P3 for 8 h.
    world.job("alpha", "high", world.p3[:1], at("2025-03-05 00:00"), at("2025-03-05 08:00"), template=world.vir02)
    record_closed_allocations()
    assert UsageRecord.objects.get().device_share == Decimal("0.250000")
    close_month("2025-03")
    # 8 h × 0.25 = 2 device-hours × ¥3 × 1.2 = ¥7.20
    assert lines_of("alpha", "2025-03") == [("usage", "310P3", "vir02", "high", "2.000000", "3.0000", "1.200", "7.20")]


def test_a_template_rate_prices_the_slice_instead_of_the_card_rate(world) -> None:  # noqa: F811
    Rate.objects.create(rate_card=world.card, chip_model="310P3", vnpu_template="vir02", price_per_device_hour=4)
    world.job("alpha", "normal", world.p3[:1], at("2025-03-05 00:00"), at("2025-03-05 08:00"), template=world.vir02)
    close_month("2025-03")
    # 2 device-hours × ¥4 (vir02's own rate) × 1.0 = ¥8.00
    expected = ("usage", "310P3", "vir02", "normal", "2.000000", "4.0000", "1.000", "8.00")
    assert lines_of("alpha", "2025-03") == [expected]


def test_class_multipliers(world) -> None:  # noqa: F811
    for i, pclass in enumerate(["critical", "high", "normal", "low"]):
        world.job("alpha", pclass, world.b4[i : i + 1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))
    close_month("2025-03")
    # 10 device-hours × ¥12 = ¥120, times the class multiplier:
    assert lines_of("alpha", "2025-03") == [
        ("usage", "910B4", "", "critical", "10.000000", "12.0000", "1.500", "180.00"),  # × 1.5
        ("usage", "910B4", "", "high", "10.000000", "12.0000", "1.200", "144.00"),  # × 1.2
        ("usage", "910B4", "", "low", "10.000000", "12.0000", "0.500", "60.00"),  # × 0.5
        ("usage", "910B4", "", "normal", "10.000000", "12.0000", "1.000", "120.00"),  # × 1.0
    ]
    assert total_of("alpha", "2025-03") == "504.00"  # 180 + 144 + 60 + 120


def test_amounts_round_half_up_to_the_cent(world) -> None:  # noqa: F811
    # beta, normal, a whole 310P3 for 54 s = 0.015 device-hours × ¥3 = ¥0.045 → ¥0.05 (half up; half-even gives 0.04)
    world.job("beta", "normal", world.p3[:1], at("2025-03-03 12:00:00"), at("2025-03-03 12:00:54"))
    # alpha, low, 1× 910B4 for 1 s = 0.000277777… → 0.000278 device-hours × ¥12 × 0.5 = ¥0.001668 → ¥0.00
    world.job("alpha", "low", world.b4[:1], at("2025-03-03 12:00:00"), at("2025-03-03 12:00:01"))
    close_month("2025-03")
    assert lines_of("beta", "2025-03") == [("usage", "310P3", "", "normal", "0.015000", "3.0000", "1.000", "0.05")]
    assert lines_of("alpha", "2025-03") == [("usage", "910B4", "", "low", "0.000278", "12.0000", "0.500", "0.00")]


def test_a_rate_change_mid_month_prices_each_side_by_its_card(world) -> None:  # noqa: F811
    new = make_card("2025-03-16", b4="15.00")
    # alpha, normal, 1× 910B4 from 15 March 20:00 to 16 March 04:00: the new card starts at 16 March 00:00.
    world.job("alpha", "normal", world.b4[:1], at("2025-03-15 20:00"), at("2025-03-16 04:00"))
    close_month("2025-03")
    # 4 h at ¥12 = ¥48.00, then 4 h at ¥15 = ¥60.00: ¥108.00
    assert lines_of("alpha", "2025-03") == [
        ("usage", "910B4", "", "normal", "4.000000", "12.0000", "1.000", "48.00"),
        ("usage", "910B4", "", "normal", "4.000000", "15.0000", "1.000", "60.00"),
    ]
    statement = Statement.objects.get(team__name="alpha", month="2025-03")
    assert statement.total == Decimal("108.00")
    assert statement.rate_card_ids == [world.card.pk, new.pk]
    assert list(statement.lines.values_list("rate_card_id", flat=True)) == [world.card.pk, new.pk]


def test_a_retried_sweep_never_counts_an_interval_twice(world) -> None:  # noqa: F811
    world.job("alpha", "normal", world.b4[:2], at("2025-03-31 20:00"), at("2025-04-01 06:00"))
    world.job("beta", "high", world.b4[2:3], at("2025-03-12 08:00"), at("2025-03-12 09:30"))
    assert record_closed_allocations() == 5  # 2 × 2 months + 1
    assert record_closed_allocations() == 0  # nothing left to do
    # A retry that re-selects the same allocations (a task run twice, or two workers at once) writes nothing:
    # the unique (allocation, month) key drops every duplicate.
    policy = active_policy().policy
    records._write(policy, Allocation.objects.all())
    records._write(policy, Allocation.objects.all())
    assert UsageRecord.objects.count() == 5
    from quotas.accounting.tasks import record_usage

    record_usage()
    record_usage()
    assert UsageRecord.objects.count() == 5
    close_month("2025-03")
    assert total_of("alpha", "2025-03") == "96.00"  # 4 h × 2 cards × ¥12, once
    assert total_of("beta", "2025-03") == "21.60"  # 1.5 h × ¥12 × 1.2


def test_a_job_still_running_at_the_close_is_charged_up_to_the_month_end_then_the_rest_later(world) -> None:  # noqa: F811
    job = world.job("alpha", "normal", world.b4[:1], at("2025-03-31 22:00"), None)
    close_month("2025-03")
    # 22:00 → 24:00 = 2 device-hours × ¥12 = ¥24.00
    assert total_of("alpha", "2025-03") == "24.00"
    finish_job(job.pk, exit_code=0, ended_at=at("2025-04-01 03:00"))
    record_closed_allocations()
    assert sorted(UsageRecord.objects.values_list("month", flat=True)) == ["2025-03", "2025-04"]
    close_month("2025-04")
    # 00:00 → 03:00 = 3 device-hours × ¥12 = ¥36.00; March is not counted again.
    assert total_of("alpha", "2025-04") == "36.00"
    assert total_of("alpha", "2025-03") == "24.00"


def test_the_same_month_priced_twice_gives_the_same_statement_to_the_cent(world) -> None:  # noqa: F811
    world.job("alpha", "critical", world.b4[:2], at("2025-03-03 01:17:13"), at("2025-03-04 05:02:59"))
    world.job("beta", "low", world.p3[:1], at("2025-03-20 10:00:07"), at("2025-03-21 00:00:00"), template=world.vir02)
    world.job("beta", "normal", world.b4[3:], at("2025-03-31 23:59:30"), at("2025-04-02 00:00:00"))
    now = timezone.now()
    before = compute_month("2025-03", now=now, live=True)
    again = compute_month("2025-03", now=now, live=True)
    assert [(ln.team_id, ln.kind, ln.amount, ln.device_hours) for ln in before.lines] == [
        (ln.team_id, ln.kind, ln.amount, ln.device_hours) for ln in again.lines
    ]
    close_month("2025-03", now=now)
    stored = {
        (s.team_id, ln.kind, ln.chip_model, ln.priority_class, ln.amount, ln.device_hours)
        for s in Statement.objects.filter(month="2025-03")
        for ln in s.lines.all()
    }
    assert stored == {
        (ln.team_id, ln.kind, ln.chip_model, ln.priority_class, ln.amount, ln.device_hours) for ln in before.lines
    }
    # And priced from the stored records alone, after the close, it is still the same.
    after = compute_month("2025-03", now=now, live=False)
    assert [ln.amount for ln in after.lines] == [ln.amount for ln in before.lines]
    # alpha: 3 March 01:17:13 → 4 March 05:02:59 = 27 h 45 min 46 s = 99946 s; × 2 cards = 199892 s
    # = 55.5255555… → 55.525556 device-hours × ¥12 × 1.5 = 999.460008 → ¥999.46
    assert lines_of("alpha", "2025-03") == [
        ("usage", "910B4", "", "critical", "55.525556", "12.0000", "1.500", "999.46")
    ]


def test_the_lines_of_a_month_add_up_to_the_device_time_the_cluster_allocated(world) -> None:  # noqa: F811
    """Reconciliation: Σ usage lines = Σ allocations clipped to the month; usage + idle = capacity."""
    import random

    from quotas.models import RateCard

    RateCard.objects.filter(pk=world.card.pk).update(idle_mode="separate")
    rng = random.Random(7)
    month_start, month_end = at("2025-03-01 00:00"), at("2025-04-01 00:00")
    expected = Decimal(0)
    devices = [*world.b4, *world.p3]
    for i in range(60):
        device = devices[i % len(devices)]
        # Durations in whole multiples of 36 s (0.01 h) and shares of 1 or ¼ keep every line exact at 6 places.
        start = at("2025-02-25 00:00") + timedelta(seconds=36 * rng.randrange(0, 36 * 24 * 30))
        end = start + timedelta(seconds=36 * rng.randrange(1, 100 * 20))
        template = world.vir02 if device.chip_model == "310P3" and i % 2 else None
        team, pclass = rng.choice([("alpha", "normal"), ("alpha", "critical"), ("beta", "low"), ("beta", "high")])
        world.job(team, pclass, [device], start, end, template=template)
        share = Decimal("0.25") if template else Decimal(1)
        lo, hi = max(start, month_start), min(end, month_end)
        if hi > lo:
            expected += Decimal((hi - lo).total_seconds()) / 3600 * share
    close_month("2025-03")
    usage = Decimal(0)
    idle = Decimal(0)
    for s in Statement.objects.filter(month="2025-03"):
        usage += sum((ln.device_hours for ln in s.lines.filter(kind="usage")), Decimal(0))
        idle += sum((ln.device_hours for ln in s.lines.filter(kind="idle")), Decimal(0))
    assert expected > 100
    assert usage == expected  # exact, to the millionth of a device-hour
    # 4 × 744 + 2 × 744 = 4464 device-hours of capacity: used + idle (the separate mode's cluster lines).
    assert usage + idle == Decimal(4464)
