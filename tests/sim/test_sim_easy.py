"""The EASY-backfill baseline and the backlogged fairness measure, on schedules worked out by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_support import EXAMPLES, ITP_300, make_cluster, make_policy, row
from test_sim_cli import ITP_CLUSTER, simulate

from scheduling.sim import DEFAULT_START, Simulation, parse_baselines, prepare_jobs, run_simulation


def _starts(out: dict, key: str = "baseline") -> dict[str, float]:
    return {r["job_id"]: r["first_start_s"] for r in out["job_records"][key]}


def test_easy_keeps_the_reservation_backfills_short_jobs_and_holds_back_long_ones() -> None:
    # One server of 4 cards. A holds 2 until 100. B wants all 4: blocked, shadow time 100 (A's
    # end), reserved cards = the whole server. C (1 card, ends 2 + 50 = 52 <= 100) backfills at 2.
    # D (1 card, 200 s: would end at 203 > 100 on a reserved card) must not start. E (1 card,
    # ends 4 + 40 = 44) backfills on the last free card at 4. C ends at 52: D still would delay B.
    # A ends at 100: B starts on its reservation (100-150); D starts after B, at 150.
    rows = [
        row("A", 0, 100, 2),
        row("B", 1, 50, 4),
        row("C", 2, 50, 1),
        row("D", 3, 200, 1),
        row("E", 4, 40, 1),
    ]
    out = run_simulation(rows, make_cluster(1, 4), make_policy(), baseline="easy", job_records=True)
    assert _starts(out) == {"A": 0, "B": 100, "C": 2, "D": 150, "E": 4}
    m = out["baseline"]
    assert m["scheduler"] == "easy" and m["policy"] is None
    assert m["quota"]["checked"] is False and m["preemption"]["preemptions"] == 0
    # waits 0, 99, 0, 147, 0
    assert m["wait_s"]["overall"]["max"] == 147
    assert m["wait_s"]["overall"]["mean"] == pytest.approx((99 + 147) / 5, abs=1e-3)
    # Strict FIFO on the same jobs: everything behind B waits for it (C, D and E all start at 150).
    fifo = run_simulation(rows, make_cluster(1, 4), make_policy(), baseline="fifo", job_records=True)
    assert _starts(fifo) == {"A": 0, "B": 100, "C": 150, "D": 150, "E": 150}


def test_easy_lets_a_long_job_run_on_cards_the_reservation_does_not_need() -> None:
    # Three servers of 2 cards, first fit: A fills server 0 until 100; X (until 30) and V (until 5)
    # take server 1; Y takes one card of server 2 until 200. At 6 one card is free on server 1 and
    # one on server 2. B (2 cards on one server) fits nowhere now; first fit finds room when X
    # ends: shadow 30, reserved = server 1. F (1 card, 500 s) ends long after 30 but fits on
    # server 2's free card, which B does not need: it starts at 7 (first fit alone would have put
    # it on server 1). G (same shape) only fits on server 1's reserved card: it waits; B starts at
    # 30 on server 1 (until 80); G gets server 1 again when B ends at 80, before A's end at 100.
    rows = [
        row("A", 0, 100, 2),
        row("X", 0, 30, 1),
        row("V", 0, 5, 1),
        row("Y", 0, 200, 1),
        row("B", 6, 50, 2),
        row("F", 7, 500, 1),
        row("G", 8, 500, 1),
    ]
    out = run_simulation(rows, make_cluster(3, 2), make_policy(), baseline="easy", job_records=True)
    assert _starts(out) == {"A": 0, "X": 0, "V": 0, "Y": 0, "B": 30, "F": 7, "G": 80}


def test_backlogged_fairness_by_hand_for_two_teams() -> None:
    # Team a has 3 shares, b has 1: entitled fractions 3/4 and 1/4. One server of 4 cards.
    # a1 (3 cards, 0-100) and b1 (1 card, 0-60) start at once; a2 (2 cards) arrives at 10 and b2
    # (1 card, 10 s) at 20.
    policy = make_policy([{"name": "a", "shares": 3}, {"name": "b", "shares": 1}])
    rows = [
        row("a1", 0, 100, 3, tenant="a"),
        row("b1", 0, 60, 1, tenant="b"),
        row("a2", 10, 10, 2, tenant="a"),
        row("b2", 20, 10, 1, tenant="b"),
    ]
    out = run_simulation(rows, make_cluster(1, 4), policy, baseline="fifo,easy")
    # FIFO: a2 heads the queue until a1 ends at 100; b2 waits behind it. Both teams wait from 20
    # to 100 (10-20: only a waits, left out).
    #   20-60:  a holds 3, b holds 1 -> x = (3 / (3/4), 1 / (1/4)) = (4, 4): J = 1
    #   60-100: a holds 3, b holds 0 -> x = (4, 0): J = 4^2 / (2 * 4^2) = 1/2
    fifo = out["baselines"]["fifo"]["fairness"]
    assert fifo["backlogged"] == pytest.approx((40 * 1 + 40 * 0.5) / 80)
    assert fifo["backlogged_s"] == 80
    # EASY: a2's shadow time is 100; b2 (ends 60 + 10 = 70 <= 100) backfills when b1 ends at 60,
    # so from 60 only a waits: just 20-60 counts, J = 1.
    easy = out["baselines"]["easy"]["fairness"]
    assert easy["backlogged"] == pytest.approx(40 * 1 / 40)
    assert easy["backlogged_s"] == 40


def test_backlogged_fairness_is_none_without_two_waiting_teams() -> None:
    rows = [row("a1", 0, 100, 4, tenant="a"), row("a2", 1, 10, 4, tenant="a")]
    m = run_simulation(rows, make_cluster(1, 4), make_policy(), baseline="fifo")["baseline"]
    assert m["fairness"]["backlogged"] is None and m["fairness"]["backlogged_s"] == 0


def test_baseline_names_are_parsed_in_order_once() -> None:
    assert parse_baselines("fifo, easy,fifo") == ["fifo", "easy"]
    assert parse_baselines(["easy"]) == ["easy"]
    assert parse_baselines(None) == []
    with pytest.raises(ValueError, match="unknown baseline 'sjf'"):
        parse_baselines("fifo,sjf")


def test_cli_with_two_baselines_writes_each_by_name(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(ITP_CLUSTER)
    out = tmp_path / "metrics.json"
    done = simulate(
        "--trace",
        ITP_300,
        "--cluster",
        cluster,
        "--policy",
        EXAMPLES / "policies" / "ms_itp_elasticflow.yaml",
        "--baseline",
        "fifo,easy",
        "--out",
        out,
        "--jobs-out",
        tmp_path / "jobs.csv",
        "--quiet",
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    assert set(data) == {"input", "policy", "baseline", "comparison", "baselines", "comparisons"}
    # "baseline" / "comparison" stay the first one's (FIFO), as with --baseline fifo alone
    assert data["baseline"] == data["baselines"]["fifo"]
    assert data["comparison"] == data["comparisons"]["fifo"]
    assert list(data["baselines"]) == ["fifo", "easy"] == list(data["comparisons"])
    for name in ("fifo", "easy"):
        m = data["baselines"][name]
        assert m["scheduler"] == name
        assert m["jobs"]["completed"] == 300
        assert m["wait_s"]["overall"]["max"] is not None
        assert "backlogged" in m["fairness"]
        assert set(data["comparisons"][name]) == {"overall", "teams"}
    assert data["policy"]["scheduler"] == "engine" and "backlogged" in data["policy"]["fairness"]
    # EASY backfills where strict FIFO blocks: never a longer mean wait on this slice
    fifo_wait = data["baselines"]["fifo"]["wait_s"]["overall"]["mean"]
    assert data["baselines"]["easy"]["wait_s"]["overall"]["mean"] <= fifo_wait
    assert (tmp_path / "jobs-baseline.csv").exists()
    assert (tmp_path / "jobs-baseline-easy.csv").exists()


def test_cli_refuses_an_unknown_baseline_in_the_list() -> None:
    done = simulate("--trace", "t", "--cluster", "c", "--policy", "p", "--out", "o", "--baseline", "fifo,sjf")
    assert done.returncode == 2 and "invalid choice: 'sjf'" in done.stderr and "Traceback" not in done.stderr


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(st.integers(0, 300), st.integers(1, 200), st.sampled_from([1, 1, 2, 3, 4, 8])),
        min_size=1,
        max_size=25,
    )
)
def test_easy_starts_every_job_and_the_first_in_line_by_its_shadow_time(raw) -> None:
    # Estimates are exact in a replay, so backfilling never delays the reserved job: it starts
    # at or before every shadow time it was given (the Occupancy raises on a double-booked card).
    rows = sorted((row(f"j{i}", s, d, n) for i, (s, d, n) in enumerate(raw)), key=lambda r: r.submit_time_s)
    cluster = make_cluster(2, 4)
    jobs, _ = prepare_jobs(rows, cluster, make_policy(), DEFAULT_START.timestamp())
    sim = Simulation(jobs, cluster, make_policy(), baseline="easy")
    easy = sim.easy_baseline
    assert easy is not None
    shadows: dict[int, list[float]] = {}
    decide = sim.decide_fn

    def recording(snapshot):
        out = decide(snapshot)
        if easy.reservation is not None:
            job_id, shadow, _ = easy.reservation
            shadows.setdefault(job_id, []).append(shadow)
        return out

    sim.decide_fn = recording
    m = sim.run()
    assert m["jobs"]["completed"] == len(jobs)
    assert m["devices"]["busy_device_hours"] == pytest.approx(sum(j.units * j.duration for j in jobs) / 3600, abs=1e-3)
    by_id = {j.state.id: j for j in jobs}
    for job_id, times in shadows.items():
        start = by_id[job_id].first_start
        assert start is not None and start <= min(times) + 1e-6
