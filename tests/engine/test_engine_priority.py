"""Multifactor ordering and explain()."""

from __future__ import annotations

import pytest
from engine_factory import T0, Cluster, job, policy, quota, snapshot

from scheduling.engine import run_time
from scheduling.engine.explain import explain
from scheduling.engine.policy import Ordering
from scheduling.engine.priority import (
    age_factor,
    class_factors,
    duration_factor,
    order_pending,
    size_factor,
)


def test_class_factor_spans_zero_to_one() -> None:
    assert class_factors(policy()) == {"high": 1.0, "normal": 0.5, "low": 0.0}


def test_age_and_size_factors_cap_at_one() -> None:
    assert age_factor(3600, 7200) == 0.5
    assert age_factor(10**9, 7200) == 1.0
    assert age_factor(-5, 7200) == 0.0
    assert size_factor(4, 8) == 0.5
    assert size_factor(16, 8) == 1.0


def test_ties_break_by_submission_then_id() -> None:
    jobs = [job(3, submitted=-10), job(1, submitted=-10), job(2, submitted=-20)]
    ordered = order_pending(jobs, Ordering(weight_age=0), {"normal": 1.0}, lambda t, u: 1.0, T0, lambda j: 1, 8)
    assert [j.id for j in ordered] == [2, 1, 3]


def test_fair_share_orders_users_with_less_usage_first() -> None:
    pol = policy(ordering=Ordering(weight_priority_class=0, weight_age=0))
    cl = Cluster().node("n1", devices=1)
    snap = snapshot(
        pol,
        cl,
        [job(1, team="a", user="heavy"), job(2, team="a", user="light")],
        usage={("a", "heavy"): 100.0, ("a", "light"): 1.0},
    )
    assert explain(snap, 2)["decision"] == "start"
    assert explain(snap, 1)["reason"] == "Resources"


def test_explain_shows_factors_weights_quota_and_reason() -> None:
    pol = policy({"a": quota(max={"devices": 4}, max_jobs=3)})
    cl = Cluster().node("n1", devices=8)
    snap = snapshot(pol, cl, [job(1, n=8, submitted=-7 * 86400 / 2)])
    info = explain(snap, 1)
    assert info["reason"] == "QuotaMaxDevices"
    assert "maximum" in info["reason_text"]
    assert info["factors"]["age"]["factor"] == pytest.approx(0.5)
    assert info["factors"]["priority_class"] == {"factor": 0.5, "weight": 10000.0, "weighted": 5000.0}
    assert info["factors"]["fair_share"]["factor"] == 1.0
    assert info["priority"] == pytest.approx(5000 + 5000 + 500)
    assert info["quota"]["max"] == {"devices": 4}
    assert info["quota"]["schedule"] is None
    with pytest.raises(KeyError):
        explain(snap, 99)


# -- the duration factor (ordering.weights.duration) ----------------------------------


def test_duration_factor_is_one_for_an_instant_run_and_zero_from_long_job_on() -> None:
    week = 7 * 86400.0
    assert duration_factor(0.0, week) == 1.0
    assert duration_factor(week, week) == pytest.approx(0.0)
    assert duration_factor(3 * week, week) == 0.0
    assert duration_factor(None, week) == 0.0  # unknown length: treated as long
    values = [duration_factor(d, week) for d in (60, 600, 3600, 86400, 3 * 86400)]
    assert values == sorted(values, reverse=True) and len(set(values)) == len(values)
    # Log scale: ten times shorter gains about the same at every length well above a minute.
    gain_hours = duration_factor(36_000, week) - duration_factor(360_000, week)
    gain_minutes = duration_factor(3_600, week) - duration_factor(36_000, week)
    assert gain_hours == pytest.approx(gain_minutes, rel=0.01)


def test_shorter_estimate_first_only_with_the_duration_weight() -> None:
    long_first = [job(1, submitted=-600, est=2 * 86400.0), job(2, submitted=-60, est=600.0)]
    size = lambda j: 1.0  # noqa: E731
    plain = order_pending(long_first, Ordering(), {"normal": 1.0}, lambda t, u: 0.5, T0, size, 8)
    assert [j.id for j in plain] == [1, 2]  # age: the earlier one first
    short = order_pending(long_first, Ordering(weight_duration=5000), {"normal": 1.0}, lambda t, u: 0.5, T0, size, 8)
    assert [j.id for j in short] == [2, 1]


def test_duration_factor_reads_the_estimate_then_the_maximum() -> None:
    # A job that names no maximum gets its team's maxJobDuration: the estimate tells jobs apart.
    assert run_time.expected(job(1, est=600.0, max_duration=7 * 86400.0)) == 600.0
    assert run_time.expected(job(1, est=0.0, max_duration=7200.0)) == 7200.0
    assert run_time.expected(job(1, est=0.0)) is None


def test_a_limit_on_run_time_reads_the_maximum_then_the_estimate() -> None:
    # The longest the job may hold its cards: its maximum when it names one.
    assert run_time.limit(job(1, est=600.0, max_duration=7 * 86400.0)) == 7 * 86400.0
    assert run_time.limit(job(1, est=600.0)) == 600.0


def test_explain_shows_the_duration_factor_and_its_weight() -> None:
    pol = policy(ordering=Ordering(weight_duration=4000, long_job_s=86400.0))
    snap = snapshot(pol, Cluster().node("n1", devices=1), [job(1, est=3600.0)])
    factor = explain(snap, 1)["factors"]["duration"]
    assert factor["weight"] == 4000
    assert factor["factor"] == pytest.approx(duration_factor(3600.0, 86400.0))
    assert factor["weighted"] == pytest.approx(4000 * factor["factor"])
