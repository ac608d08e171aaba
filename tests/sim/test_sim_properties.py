"""Invariants of any replay, on random small traces (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_support import make_cluster, make_policy, row

from scheduling.sim import DEFAULT_START, DecayedMeter, Meter, Simulation, prepare_jobs

CLUSTER = make_cluster(2, 4, group_size=2)  # 8 cards on 2 nodes, 2-card groups
POLICY = make_policy(
    [
        {"name": "a", "shares": 2, "quota": {"guaranteed": {"devices": 2}, "max": {"devices": 6}}},
        {"name": "b", "shares": 1, "quota": {"max": {"devices": 4}}},
    ],
    defaults={"shares": 1, "quota": {"max": {"devices": 3}}},
)

jobs_strategy = st.lists(
    st.tuples(
        st.integers(0, 500),  # submit
        st.integers(1, 300),  # duration
        st.sampled_from([1, 1, 1, 2, 4, 8]),  # devices
        st.sampled_from(["a", "b", "c"]),  # tenant
        st.sampled_from(["high", "normal", "low"]),
        st.sampled_from([None, None, 20, 60]),  # checkpoint interval
    ),
    min_size=1,
    max_size=25,
)


def _replay(raw, *, fifo: bool) -> tuple[Simulation, dict]:
    rows = [
        row(f"j{i}", s, d, n, tenant=t, priority_class=c, checkpoint_interval_s=k)
        for i, (s, d, n, t, c, k) in enumerate(raw)
    ]
    rows.sort(key=lambda r: r.submit_time_s)
    jobs, _ = prepare_jobs(rows, CLUSTER, POLICY, DEFAULT_START.timestamp())
    sim = Simulation(jobs, CLUSTER, POLICY, fifo=fifo)
    return sim, sim.run()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy)
def test_strict_fifo_starts_in_submission_order_and_finishes_everything(raw) -> None:
    sim, m = _replay(raw, fifo=True)
    starts = [j.first_start for j in sim.jobs]
    assert None not in starts
    assert starts == sorted(starts)  # nobody overtakes
    assert m["jobs"]["completed"] == len(sim.jobs)
    expected = sum(j.units * j.duration for j in sim.jobs) / 3600
    assert m["devices"]["busy_device_hours"] == pytest.approx(expected, abs=1e-3)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs_strategy)
def test_the_core_never_overruns_quotas_and_accounts_for_all_work(raw) -> None:
    sim, m = _replay(raw, fifo=False)  # the Occupancy raises on any double-booked card
    assert m["quota"]["overrun_device_s"] == 0 and m["quota"]["violations"] == 0
    jobs = m["jobs"]
    assert jobs["started"] + jobs["never_started"] == jobs["eligible"]
    assert jobs["completed"] + jobs["requeued_not_restarted"] + jobs["cancelled"] <= jobs["started"]
    done = [j for j in sim.jobs if j.status == "completed"]
    # A victim that checkpoints resumes: its whole duration once, plus the work it lost.
    lost = m["preemption"]["device_hours_lost"]
    busy = sum(j.units * j.duration for j in done) / 3600 + lost
    assert sum(m["preemption"]["device_hours_lost_by_team"].values()) == pytest.approx(lost, abs=1e-2)
    assert sum(m["preemption"]["device_hours_lost_by_class"].values()) == pytest.approx(lost, abs=1e-2)
    running_left = sum(1 for j in sim.jobs if j.status == "running")
    assert running_left == 0
    assert m["devices"]["busy_device_hours"] == pytest.approx(busy, abs=1e-3)
    assert 0 <= m["devices"]["utilisation"] <= 1 + 1e-9


def test_meter_integrates_piecewise_constant_rates() -> None:
    m = Meter()
    m.add("a", 2, 0)
    m.add("a", -1, 10)  # 20 so far, rate 1
    assert m.value("a", 15) == 25
    assert m.value("nobody", 15) == 0


def test_decayed_usage_matches_the_closed_form() -> None:
    import math

    h = 3600.0
    m = DecayedMeter(h)
    m.add(("t", "u"), 1, 0)  # one card from t=0
    m.add(("t", "u"), -1, h)  # ... to t=h
    # at t=2h: integral of 2^(-(2h - s)/h) ds over [0, h], in hours
    k = math.log(2) / h
    expected = (math.exp(-k * h) - math.exp(-k * 2 * h)) / k / 3600
    assert m.snapshot(2 * h)[("t", "u")] == pytest.approx(expected)
    flat = DecayedMeter(0)  # half-life 0 means no decay here
    flat.add("x", 2, 0)
    assert flat.snapshot(1800)["x"] == pytest.approx(1.0)
