"""The reports page's numbers: per-day device-hours, cost, utilisation, quota, waits — and a bounded query count."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from quotas.accounting.records import record_closed_allocations
from quotas.accounting.reports import report_data
from quotas.accounting.statements import close_month
from tests.test_chargeback_harness import at, build_world, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def test_device_hours_are_cut_at_the_policy_clocks_midnights(world) -> None:  # noqa: F811
    # alpha, 2× 910B4 from 2 March 20:00 to 3 March 02:00: 4 h × 2 = 8 on the 2nd, 2 h × 2 = 4 on the 3rd.
    world.job("alpha", "normal", world.b4[:2], at("2025-03-02 20:00"), at("2025-03-03 02:00"))
    # beta, a quarter of a 310P3 for 8 h on the 3rd: 2 device-hours.
    world.job("beta", "low", world.p3[:1], at("2025-03-03 08:00"), at("2025-03-03 16:00"), template=world.vir02)
    record_closed_allocations()
    # Still running (no record yet): 1× 910B4 from 31 March 22:00, counted up to the month's end = 2 h on the 31st.
    world.job("beta", "high", world.b4[3:], at("2025-03-31 22:00"), None)
    data = report_data("2025-03")
    days = data["daily"]["days"]
    assert len(days) == 31 and days[0] == "2025-03-01" and days[-1] == "2025-03-31"
    alpha, beta = data["daily"]["teams"]["alpha"], data["daily"]["teams"]["beta"]
    assert alpha[1] == 8.0 and alpha[2] == 4.0 and sum(alpha) == 12.0
    assert beta[2] == 2.0 and beta[30] == 2.0 and sum(beta) == 4.0


def test_cost_utilisation_and_quota_of_a_closed_month() -> None:
    w = build_world(idle_mode="separate")
    w.job("alpha", "normal", w.b4[:2], at("2025-03-10 00:00"), at("2025-03-14 04:00"))  # 200 h, ¥2400
    w.job("beta", "high", w.b4[2:3], at("2025-03-10 00:00"), at("2025-03-14 04:00"))  # 100 h × 12 × 1.2 = ¥1440
    close_month("2025-03")
    data = report_data("2025-03")
    assert data["closed"] and data["currency"] == "CNY"
    assert data["cost"]["teams"] == {
        "alpha": {"910B4": 2400.0},
        "beta": {"910B4": 1440.0},
        "cluster (idle)": {"310P3": 4464.0, "910B4": 32112.0},  # 1488 × 3; (2976 − 300) × 12
    }
    util = data["utilisation"]
    assert util["chips"] == ["310P3", "910B4"]
    assert util["capacity"] == [1488.0, 2976.0] and util["used"] == [0.0, 300.0] and util["idle"] == [1488.0, 2676.0]
    assert util["utilisation_pct"] == [0.0, 10.1]  # 300 / 2976 = 10.08 %
    quota = data["quota"]
    # Guarantee × 744 h: alpha 3 → 2232, beta 1 → 744.
    assert quota == {
        "teams": ["alpha", "beta"],
        "used": [200.0, 100.0],
        "guaranteed": [2232.0, 744.0],
        "cap": [None, None],
    }


def test_a_lead_gets_only_their_teams_numbers() -> None:
    w = build_world(idle_mode="separate")
    w.job("alpha", "normal", w.b4[:2], at("2025-03-10 00:00"), at("2025-03-14 04:00"))
    w.job("beta", "high", w.b4[2:3], at("2025-03-10 00:00"), at("2025-03-14 04:00"))
    close_month("2025-03")
    data = report_data("2025-03", teams=[w.alpha])
    assert list(data["daily"]["teams"]) == ["alpha"]
    assert list(data["cost"]["teams"]) == ["alpha"]
    assert data["quota"]["teams"] == ["alpha"]


def test_wait_quartiles_per_class(world) -> None:  # noqa: F811
    # Five normal jobs waiting 1, 2, 3, 10 and 60 minutes; one critical job waiting 30 s.
    for i, minutes in enumerate([10, 1, 60, 3, 2]):
        start = at("2025-03-05 10:00") + timedelta(hours=i)
        world.job(
            "alpha",
            "normal",
            world.b4[:1],
            start,
            start + timedelta(minutes=5),
            submitted=start - timedelta(minutes=minutes),
        )
    # Three low jobs waiting 4, 1 and 2 minutes.
    for i, minutes in enumerate([4, 1, 2]):
        start = at("2025-03-07 10:00") + timedelta(hours=i)
        world.job(
            "beta",
            "low",
            world.b4[2:3],
            start,
            start + timedelta(minutes=5),
            submitted=start - timedelta(minutes=minutes),
        )
    start = at("2025-03-06 10:00")
    world.job(
        "beta", "critical", world.b4[1:2], start, start + timedelta(minutes=5), submitted=start - timedelta(seconds=30)
    )
    waits = report_data("2025-03")["waits"]["classes"]
    assert list(waits) == ["critical", "normal", "low"]  # in the policy's class order
    # Nearest rank (value of rank ⌈p·n⌉) on 1, 2, 3, 10, 60: q1 rank 2, median rank 3, q3 rank 4.
    assert waits["normal"] == {"n": 5, "min": 1.0, "q1": 2.0, "median": 3.0, "q3": 10.0, "max": 60.0}
    # On 1, 2, 4: q1 rank ⌈0.75⌉ = 1, median rank ⌈1.5⌉ = 2, q3 rank ⌈2.25⌉ = 3.
    assert waits["low"] == {"n": 3, "min": 1.0, "q1": 1.0, "median": 2.0, "q3": 4.0, "max": 4.0}
    assert waits["critical"] == {"n": 1, "min": 0.5, "q1": 0.5, "median": 0.5, "q3": 0.5, "max": 0.5}


def test_the_number_of_queries_does_not_grow_with_the_records(world) -> None:  # noqa: F811
    def queries() -> int:
        with CaptureQueriesContext(connection) as ctx:
            report_data("2025-03")
        return len(ctx.captured_queries)

    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 01:00"))
    record_closed_allocations()
    few = queries()
    for i in range(40):
        start = at("2025-03-03 00:00") + timedelta(hours=3 * i)
        world.job("beta", "low", world.b4[1:3], start, start + timedelta(hours=2))
    record_closed_allocations()
    assert queries() == few
