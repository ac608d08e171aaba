"""Idle capacity and unused reservations, each mode with its numbers worked out by hand.

March 2025 = 744 h. Capacity: 4× 910B4 = 2976 device-hours (¥12), 2× 310P3 = 1488 (¥3).
Guarantees in the policy: alpha 3 devices, beta 1.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from devices.models import InventoryEvent
from quotas.accounting.statements import close_month, compute_month
from quotas.models import RateCard, Statement
from tests.test_chargeback_harness import at, build_world, lines_of, total_of

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def _usage(world) -> None:
    # alpha, normal, 2× 910B4 for 100 h = 200 device-hours → 200 × ¥12 = ¥2400.00
    world.job("alpha", "normal", world.b4[:2], at("2025-03-10 00:00"), at("2025-03-14 04:00"))
    # beta, normal, 1× 910B4 for 100 h = 100 device-hours → ¥1200.00
    world.job("beta", "normal", world.b4[2:3], at("2025-03-10 00:00"), at("2025-03-14 04:00"))
    # Idle: 910B4 2976 − 300 = 2676 device-hours (× ¥12 = ¥32112.00); 310P3 unused: 1488 (× ¥3 = ¥4464.00).


USAGE_ALPHA = ("usage", "910B4", "", "normal", "200.000000", "12.0000", "1.000", "2400.00")
USAGE_BETA = ("usage", "910B4", "", "normal", "100.000000", "12.0000", "1.000", "1200.00")


def test_idle_hidden() -> None:
    world = build_world(idle_mode="hide")
    _usage(world)
    close_month("2025-03")
    assert lines_of("alpha", "2025-03") == [USAGE_ALPHA]
    assert lines_of("beta", "2025-03") == [USAGE_BETA]
    assert lines_of(None, "2025-03") == [] and total_of(None, "2025-03") == "0.00"
    assert Statement.objects.get(team__name="alpha", month="2025-03").idle_mode == "hide"


def test_idle_separate_is_a_line_on_the_cluster_statement() -> None:
    world = build_world(idle_mode="separate")
    _usage(world)
    close_month("2025-03")
    assert lines_of("alpha", "2025-03") == [USAGE_ALPHA]
    assert lines_of(None, "2025-03") == [
        ("idle", "310P3", "", "", "1488.000000", "3.0000", "1.000", "4464.00"),
        ("idle", "910B4", "", "", "2676.000000", "12.0000", "1.000", "32112.00"),
    ]
    assert total_of(None, "2025-03") == "36576.00"  # 4464 + 32112


def test_idle_shared_by_usage() -> None:
    world = build_world(idle_mode="share-by-usage")
    _usage(world)
    close_month("2025-03")
    # 910B4 idle 2676 h split by use of 910B4, 200 : 100 → alpha 1784 h (¥21408.00), beta 892 h (¥10704.00).
    # Nobody used 310P3: its 1488 idle hours are split by use of all chips, 2 : 1
    # → alpha 992 h (¥2976.00), beta 496 h (¥1488.00).
    assert lines_of("alpha", "2025-03") == [
        USAGE_ALPHA,
        ("idle", "310P3", "", "", "992.000000", "3.0000", "1.000", "2976.00"),
        ("idle", "910B4", "", "", "1784.000000", "12.0000", "1.000", "21408.00"),
    ]
    assert lines_of("beta", "2025-03") == [
        USAGE_BETA,
        ("idle", "310P3", "", "", "496.000000", "3.0000", "1.000", "1488.00"),
        ("idle", "910B4", "", "", "892.000000", "12.0000", "1.000", "10704.00"),
    ]
    assert total_of("alpha", "2025-03") == "26784.00"  # 2400 + 2976 + 21408
    assert total_of("beta", "2025-03") == "13392.00"  # 1200 + 1488 + 10704
    assert total_of(None, "2025-03") == "0.00"
    # Everything is charged once: 26784 + 13392 = 40176 = usage 3600 + idle 36576.


def test_idle_shared_by_guarantee() -> None:
    world = build_world(idle_mode="share-by-guarantee")
    _usage(world)
    close_month("2025-03")
    # Guarantees 3 : 1. 910B4 2676 h → alpha 2007 h (¥24084.00), beta 669 h (¥8028.00);
    # 310P3 1488 h → alpha 1116 h (¥3348.00), beta 372 h (¥1116.00).
    assert lines_of("alpha", "2025-03") == [
        USAGE_ALPHA,
        ("idle", "310P3", "", "", "1116.000000", "3.0000", "1.000", "3348.00"),
        ("idle", "910B4", "", "", "2007.000000", "12.0000", "1.000", "24084.00"),
    ]
    assert total_of("alpha", "2025-03") == "29832.00"  # 2400 + 3348 + 24084
    assert total_of("beta", "2025-03") == "10344.00"  # 1200 + 1116 + 8028


def test_idle_share_that_does_not_divide_evenly_still_adds_up_exactly() -> None:
    world = build_world(idle_mode="share-by-usage")
    # alpha uses a 310P3 for 2 h, beta the other one for 1 h.
    world.job("alpha", "normal", world.p3[:1], at("2025-03-01 00:00"), at("2025-03-01 02:00"))
    world.job("beta", "normal", world.p3[1:], at("2025-03-01 00:00"), at("2025-03-01 01:00"))
    close_month("2025-03")
    # 310P3 idle = 1488 − 3 = 1485 h, split 2 : 1 = 990 : 495 (exact).
    # 910B4: 2976 h split by all use, 2 : 1 = 1984 : 992.
    idle = [ln for ln in lines_of("alpha", "2025-03") + lines_of("beta", "2025-03") if ln[0] == "idle"]
    assert sum(Decimal(ln[4]) for ln in idle) == Decimal(1485 + 2976)


def test_failed_time_is_unavailable_not_idle() -> None:
    world = build_world(idle_mode="separate")
    # One 310P3 failed from 10 March 00:00 to 11 March 00:00 (its inventory history): 24 device-hours
    # paid for but not usable — its own line, not idle.
    card = world.p3[0]
    for when, status, cause in (("2025-03-10 00:00", "unhealthy", "failed"), ("2025-03-11 00:00", "usable", "")):
        InventoryEvent.objects.create(
            device=card, node_name=card.node.name, chip_model="310P3", at=at(when), status=status, cause=cause
        )
    close_month("2025-03")
    # 310P3: unavailable 24 × ¥3 = ¥72.00, idle 1488 − 24 = 1464 × ¥3 = ¥4392.00; 910B4 all idle: 2976 × ¥12.
    assert lines_of(None, "2025-03") == [
        ("unavailable", "310P3", "", "", "24.000000", "3.0000", "1.000", "72.00"),
        ("idle", "310P3", "", "", "1464.000000", "3.0000", "1.000", "4392.00"),
        ("idle", "910B4", "", "", "2976.000000", "12.0000", "1.000", "35712.00"),
    ]


# -- unused reservations: 25% of 910B4 held for `critical` -----------------------------------


def _reserved_usage(world) -> None:
    # alpha, critical, 1× 910B4 for 100 h = 100 device-hours → 100 × ¥12 × 1.5 = ¥1800.00
    world.job("alpha", "critical", world.b4[:1], at("2025-03-05 00:00"), at("2025-03-09 04:00"))
    # beta, normal, 3× 910B4 for 100 h = 300 device-hours → ¥3600.00
    world.job("beta", "normal", world.b4[1:], at("2025-03-05 00:00"), at("2025-03-09 04:00"))
    # 910B4: used 400, idle 2976 − 400 = 2576. Reserved 25% × 2976 = 744; critical used 100 → 644 unused.


def test_unused_reservation_hidden_stays_idle() -> None:
    world = build_world(idle_mode="separate", reserved_mode="hide", reservation=True)
    _reserved_usage(world)
    close_month("2025-03")
    assert total_of("alpha", "2025-03") == "1800.00" and total_of("beta", "2025-03") == "3600.00"
    # 2576 idle 910B4 hours × ¥12 = ¥30912.00, plus 1488 × ¥3 = ¥4464.00 for 310P3.
    assert lines_of(None, "2025-03") == [
        ("idle", "310P3", "", "", "1488.000000", "3.0000", "1.000", "4464.00"),
        ("idle", "910B4", "", "", "2576.000000", "12.0000", "1.000", "30912.00"),
    ]


def test_unused_reservation_charged_to_the_reserved_class_users() -> None:
    world = build_world(idle_mode="separate", reserved_mode="to-class-users", reservation=True)
    _reserved_usage(world)
    close_month("2025-03")
    # alpha is the only critical user: 644 h × ¥12 = ¥7728.00 on top of its ¥1800.00 usage.
    assert lines_of("alpha", "2025-03") == [
        ("usage", "910B4", "", "critical", "100.000000", "12.0000", "1.500", "1800.00"),
        ("reserved", "910B4", "", "", "644.000000", "12.0000", "1.000", "7728.00"),
    ]
    assert total_of("alpha", "2025-03") == "9528.00"
    assert total_of("beta", "2025-03") == "3600.00"
    # What is left idle: 2576 − 644 = 1932 h × ¥12 = ¥23184.00
    assert ("idle", "910B4", "", "", "1932.000000", "12.0000", "1.000", "23184.00") in lines_of(None, "2025-03")


def test_unused_reservation_shared_by_use_of_the_chip() -> None:
    world = build_world(idle_mode="separate", reserved_mode="share-by-usage", reservation=True)
    _reserved_usage(world)
    close_month("2025-03")
    # 644 h split by use of 910B4, 100 : 300 → alpha 161 h (¥1932.00), beta 483 h (¥5796.00).
    assert ("reserved", "910B4", "", "", "161.000000", "12.0000", "1.000", "1932.00") in lines_of("alpha", "2025-03")
    assert ("reserved", "910B4", "", "", "483.000000", "12.0000", "1.000", "5796.00") in lines_of("beta", "2025-03")
    assert total_of("alpha", "2025-03") == "3732.00"  # 1800 + 1932
    assert total_of("beta", "2025-03") == "9396.00"  # 3600 + 5796


def test_a_reservation_nobody_of_its_classes_used_stays_idle() -> None:
    world = build_world(idle_mode="separate", reserved_mode="to-class-users", reservation=True)
    world.job("beta", "normal", world.b4[1:], at("2025-03-05 00:00"), at("2025-03-09 04:00"))  # 300 device-hours
    close_month("2025-03")
    assert all(ln[0] != "reserved" for s in ("alpha", "beta") for ln in lines_of(s, "2025-03"))
    # 2976 − 300 = 2676 idle hours, all on the cluster statement: ¥32112.00
    assert ("idle", "910B4", "", "", "2676.000000", "12.0000", "1.000", "32112.00") in lines_of(None, "2025-03")


def test_the_modes_of_the_card_in_force_at_the_month_start_are_stored_on_the_statement() -> None:
    world = build_world(idle_mode="separate")
    _usage(world)
    later = RateCard.objects.create(effective_from="2025-03-20", currency="CNY", idle_mode="share-by-usage")
    later.rates.create(chip_model="910B4", price_per_device_hour=12)
    later.rates.create(chip_model="310P3", price_per_device_hour=3)
    bill = compute_month("2025-03", live=True)
    assert bill.idle_mode == "separate" and bill.card_ids == [world.card.pk, later.pk]
    close_month("2025-03")
    assert set(Statement.objects.filter(month="2025-03").values_list("idle_mode", flat=True)) == {"separate"}
