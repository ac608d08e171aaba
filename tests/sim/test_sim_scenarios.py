"""Small replays whose numbers are worked out by hand."""

from __future__ import annotations

import pytest
from sim_support import make_cluster, make_policy, row

from scheduling.sim import DEFAULT_START, jain_index, run_simulation

T0 = DEFAULT_START.timestamp()


def _metrics(rows, cluster, policy, *, baseline=None, **kw):
    return run_simulation(rows, cluster, policy, baseline=baseline, **kw)


def test_three_jobs_on_one_node_exact_waits_and_utilisation() -> None:
    # One node, 2 cards. A takes both for 100 s; B and C arrive behind it and start together at 100.
    rows = [row("A", 0, 100, 2), row("B", 10, 50, 1), row("C", 20, 30, 1)]
    out = _metrics(rows, make_cluster(1, 2), make_policy(), baseline="fifo")
    for key in ("policy", "baseline"):
        m = out[key]
        assert m["jobs"]["total"] == 3
        assert m["jobs"]["started"] == m["jobs"]["completed"] == 3
        waits = m["wait_s"]["overall"]
        # waits 0, 90 (B: 10 -> 100), 80 (C: 20 -> 100); p50 of [0, 80, 90] is 80
        assert waits["count"] == 3
        assert waits["p50"] == 80
        assert waits["max"] == 90
        assert waits["mean"] == pytest.approx(170 / 3, abs=1e-3)
        # busy: 2x100 + 50 + 30 = 280 device-s over 150 s x 2 cards
        assert m["span_s"] == 150
        assert m["devices"]["utilisation"] == pytest.approx(280 / 300, abs=1e-6)
        assert m["devices"]["busy_device_hours"] == pytest.approx(280 / 3600, abs=1e-3)
        assert m["teams"]["a"]["device_hours"] == pytest.approx(280 / 3600, abs=1e-3)
        assert m["quota"]["overrun_device_s"] == 0
    assert out["comparison"]["overall"]["wait_p50_s"]["delta"] == 0


def test_strict_fifo_blocks_behind_the_head_but_the_engine_backfills() -> None:
    # 2 cards. A holds one for 100 s; B wants both; C (1 card, 10 s) fits now and ends long before A.
    rows = [row("A", 0, 100, 1), row("B", 1, 10, 2), row("C", 2, 10, 1)]
    out = _metrics(rows, make_cluster(1, 2), make_policy(backfill=True), baseline="fifo")
    fifo = out["baseline"]["wait_s"]["overall"]
    # FIFO: B starts at 100 (wait 99), C behind it at 110 (wait 108).
    assert fifo["max"] == 108
    assert out["baseline"]["span_s"] == 120  # C runs 110-120
    engine = out["policy"]
    # Backfilling C at t=2 cannot delay B (C ends at 12, B can start at 100 at the earliest).
    assert engine["wait_s"]["overall"]["p50"] == 0
    assert engine["span_s"] == 110
    assert out["comparison"]["overall"]["wait_p95_s"]["delta"] < 0


def test_events_at_one_timestamp_are_one_decide() -> None:
    rows = [row(f"j{i}", 5, 10, 1) for i in range(4)]
    calls: list[int] = []

    from scheduling.engine.decide import decide

    def counting(snapshot):
        calls.append(len(snapshot.pending))
        return decide(snapshot)

    m = _metrics(rows, make_cluster(1, 4), make_policy(), decide_fn=counting)["policy"]
    assert calls[0] == 4  # all four submissions seen by the first call
    assert m["jobs"]["completed"] == 4
    assert m["span_s"] == 10


def test_skipped_jobs_are_counted_by_reason() -> None:
    """Unreadable rows by what is wrong; jobs that can never run under the engine's rule as ``never_runnable``."""
    policy = make_policy(
        [{"name": "small", "shares": 1, "quota": {"max": {"devices": 2}}}],
        classes=[{"name": "normal", "default": True}],
    )
    rows = [
        row("ok", 0, 10, 1),
        row("zero", 0, 0, 1),
        row("negative", 0, -5, 1),
        row("cpu-only", 0, 10, 0),
        row("huge", 0, 10, 5),  # the cluster has 4 cards
        row("other-chip", 0, 10, 1, chip_model="910A"),
        row("bad-class", 0, 10, 1, priority_class="platinum"),
        row("over-team-max", 0, 10, 3, tenant="small"),
        row("fits-team-max", 0, 10, 2, tenant="small"),
    ]
    out = _metrics(rows, make_cluster(2, 2), policy)
    assert out["input"]["skipped_by_reason"] == {
        "never_runnable": 3,  # huge, other-chip, over-team-max
        "no_devices": 1,
        "unknown_priority_class": 1,
        "zero_duration": 2,
    }
    jobs = out["policy"]["jobs"]
    assert out["input"]["never_runnable"] == jobs["never_runnable"] == 3
    assert jobs["total"] == 9 and jobs["skipped"] == 7 and jobs["eligible"] == 2
    assert jobs["completed"] == 2


def test_fractional_devices_become_the_smallest_covering_vnpu() -> None:
    cluster = make_cluster(1, 1, templates=True)  # one 20-core card; vir05 = 0.25, vir10 = 0.5
    rows = [
        row("quarter", 0, 100, 1, gpu_milli=230),
        row("half", 0, 100, 1, gpu_milli=470),
        row("most", 0, 100, 1, gpu_milli=810),  # no template covers 0.81: a whole card
    ]
    seen: dict[int, tuple[str | None, int]] = {}
    from scheduling.engine.decide import decide

    def spy(snapshot):
        for job in snapshot.pending:
            seen[job.id] = (job.vnpu_template, job.num_devices)
        return decide(snapshot)

    m = _metrics(rows, cluster, make_policy(), decide_fn=spy)["policy"]
    assert seen == {1: ("vir05_1c_8g", 1), 2: ("vir10_3c_16g", 1), 3: (None, 1)}
    assert m["jobs"]["completed"] == 3
    # card equivalents: 0.25 + 0.5 + 1 for 100 s each
    assert m["devices"]["busy_device_hours"] == pytest.approx(1.75 * 100 / 3600, abs=1e-3)


def test_jain_index_known_values() -> None:
    assert jain_index([1, 1, 1, 1]) == 1
    assert jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([2, 1]) == pytest.approx(0.9)
    assert jain_index([]) is None
    assert jain_index([0, 0]) is None


def test_jain_over_one_window_from_a_replay() -> None:
    # Equal shares; for the first hour team a uses 2 cards and team b 1: x = (2, 1), J = 9 / 10.
    rows = [row("a1", 0, 3600, 2, tenant="a"), row("b1", 0, 3600, 1, tenant="b")]
    m = _metrics(rows, make_cluster(1, 4), make_policy())["policy"]
    assert m["fairness"]["windows"] == 1
    assert m["fairness"]["jain_mean"] == pytest.approx(0.9)
    assert m["teams"]["a"]["entitled_fraction"] == 0.5
    assert m["teams"]["a"]["usage_over_entitlement"] == pytest.approx((2 / 3) / 0.5, abs=1e-6)


def test_entitlement_follows_departments_and_shares() -> None:
    from scheduling.engine.policy import parse_policy

    text = "\n".join(
        [
            "apiVersion: npuportal/v1",
            "kind: SchedulingPolicy",
            "metadata: {name: t}",
            "spec:",
            "  departments: [{name: d, shares: 1}]",
            "  teams:",
            "    - {name: x, department: d, shares: 3}",
            "    - {name: y, department: d, shares: 1}",
            "    - {name: z, shares: 1}",
        ]
    )
    policy = parse_policy(text)
    rows = [row("1", 0, 10, 1, tenant="x"), row("2", 0, 10, 1, tenant="y"), row("3", 0, 10, 1, tenant="z")]
    teams = _metrics(rows, make_cluster(1, 4), policy)["policy"]["teams"]
    # department d and team z split 1:1; inside d, x and y split 3:1
    assert teams["x"]["entitled_fraction"] == pytest.approx(0.375)
    assert teams["y"]["entitled_fraction"] == pytest.approx(0.125)
    assert teams["z"]["entitled_fraction"] == pytest.approx(0.5)


def test_start_time_sets_the_wall_clock() -> None:
    from datetime import UTC, datetime

    start = datetime(2021, 3, 4, tzinfo=UTC)
    stamps: list[float] = []
    from scheduling.engine.decide import decide

    def spy(snapshot):
        stamps.append(snapshot.now.timestamp())
        return decide(snapshot)

    out = _metrics([row("a", 60, 10, 1)], make_cluster(), make_policy(), start=start, decide_fn=spy)
    assert stamps[0] == start.timestamp() + 60
    assert out["policy"]["start"] == "2021-03-04T00:01:00+00:00"


def test_a_quota_window_opening_is_an_event() -> None:
    # Team a may use 1 card, 2 between 02:00 and 04:00 UTC; the trace starts at midnight.
    policy = make_policy(
        [
            {
                "name": "a",
                "shares": 1,
                "quota": {"max": {"devices": 1}},
                "schedules": [{"name": "night", "between": "02:00-04:00", "quota": {"max": {"devices": 2}}}],
            }
        ]
    )
    rows = [row("1", 0, 36000, 1), row("2", 0, 600, 1)]
    m = _metrics(rows, make_cluster(1, 2), policy)["policy"]
    assert m["wait_s"]["overall"]["max"] == 7200  # job 2 starts when the window opens
    assert m["quota"]["overrun_device_s"] == 0


def test_a_monthly_budget_resets_at_the_month_start() -> None:
    policy = make_policy([{"name": "a", "shares": 1, "quota": {"deviceHoursPerMonth": 1}}])
    rows = [row("1", 0, 3000, 1), row("2", 0, 3000, 1)]  # 0.83 device-hours each
    m = _metrics(rows, make_cluster(1, 2), policy)["policy"]
    assert m["jobs"]["completed"] == 2
    assert m["wait_s"]["overall"]["max"] == 31 * 86400  # 2024-01-01 -> 2024-02-01


def test_first_estimates_are_compared_with_the_starts() -> None:
    # One 8-card node. A runs 0-1000. B (t=10) is the first blocked job: decide's estimate 1000.
    # C (t=20) is behind it: the planning pass says 1500 (B's end). Both start exactly then.
    rows = [row("A", 0, 1000, 8), row("B", 10, 500, 8), row("C", 20, 100, 8)]
    m = run_simulation(rows, make_cluster(1, 8), make_policy(), estimates_every=1.0)["policy"]
    est = m["estimates"]
    assert est["jobs"] == 2 and est["passes"] >= 2
    assert est["error_s"]["p50"] == 0 and est["abs_error_s"]["max"] == 0
    assert est["within_60s"] == 1.0 and est["started_later"]["share"] == 0.0


def test_a_job_overtaken_by_a_higher_class_starts_later_than_first_estimated() -> None:
    # B's first estimate (t=10) is 1000; a high-class C (t=30) takes the node at 1000 for 400 s, so B
    # starts at 1400: 400 s later than it was shown. C's own first estimate, 1000, holds.
    rows = [row("A", 0, 1000, 8), row("B", 10, 500, 8), row("C", 30, 400, 8, priority_class="high")]
    m = run_simulation(rows, make_cluster(1, 8), make_policy(), estimates_every=1.0)["policy"]
    est = m["estimates"]
    assert est["jobs"] == 2
    assert est["started_later"]["share"] == 0.5 and est["started_later"]["by_s"]["max"] == 400
    assert est["abs_error_s"]["p50"] == 200  # of [0, 400]
    # Sampling the estimates changes no decision.
    plain = run_simulation(rows, make_cluster(1, 8), make_policy())["policy"]
    assert "estimates" not in plain and plain["wait_s"] == m["wait_s"]


def test_cards_of_jobs_that_ended_between_ticks_are_free_again() -> None:
    # Two nodes of 4 cards. A (2 cards) starts alone; B, a vNPU slice, starts while A runs (the next
    # tick then cannot carry the free state over and counts the running jobs again). Both end long
    # before C and D arrive, each wanting a whole node: both start at once. A replay that kept A's
    # cards held started one and left the other waiting "does not fit even when running jobs end".
    cluster = make_cluster(2, 4, templates=True)
    rows = [row("A", 0, 100, 2), row("B", 10, 50, 1, gpu_milli=230), row("C", 1000, 60, 4), row("D", 1000, 60, 4)]
    out = _metrics(rows, cluster, make_policy(), job_records=True)
    records = {rec["job_id"]: rec for rec in out["job_records"]["policy"]}
    assert {key: records[key]["wait_s"] for key in "ABCD"} == {"A": 0, "B": 0, "C": 0, "D": 0}
    assert out["policy"]["jobs"]["completed"] == 4
