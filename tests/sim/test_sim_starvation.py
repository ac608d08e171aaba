"""The starvation guard over many ticks: a job of a team above its share is no longer passed over for ever."""

from __future__ import annotations

from sim_support import make_cluster, make_policy, row

from scheduling.sim import run_simulation

HOUR = 3600.0


def _first_starts(rows: list, cluster: object, policy: object) -> dict[str, float]:
    """Each job's first start in the replay (trace seconds; inf for one that never started)."""
    out = run_simulation(rows, cluster, policy, job_records=True)  # type: ignore[arg-type]
    return {
        r["job_id"]: (float(r["first_start_s"]) if r["first_start_s"] != "" else float("inf"))
        for r in out["job_records"]["policy"]
    }


def _world(starvation: str | None) -> dict[str, float]:
    """Two servers of 8 cards. Team a fills both for the first 2 hours (so it is above its share
    from then on); team b (ten times a's shares) submits a 4-card, 1-hour job every 10 minutes for
    20 hours, more than the cluster runs, so a backlog of b's jobs builds. At 2 hours team a
    submits one 8-card job. Returns each job's first start (trace seconds)."""
    rows = [row(f"a-early{i}", 0.0, 2 * HOUR, 8, tenant="a") for i in range(2)]
    rows += [row(f"b{i}", i * 600.0, HOUR, 4, tenant="b") for i in range(120)]
    rows.append(row("a-big", 2 * HOUR, HOUR, 8, tenant="a"))
    policy = make_policy(
        [{"name": "a", "shares": 1}, {"name": "b", "shares": 10}],
        starvation=starvation,
    )
    return _first_starts(rows, make_cluster(2, 8), policy)


def test_without_the_guard_the_big_job_waits_until_the_small_ones_stop_coming() -> None:
    starts = _world(None)
    # b's stream always has a job in front (fair share), and the first blocked job holds the cards.
    assert starts["a-big"] > 20 * HOUR


def test_with_the_guard_the_big_job_holds_its_cards_and_starts_by_its_shadow_time() -> None:
    starts = _world("2h")
    starving_from = 2 * HOUR + 2 * HOUR
    # Held at its shadow time: the 4-card jobs on its server end within the hour (they run 1 h).
    assert starving_from < starts["a-big"] <= starving_from + HOUR + 60
    # Smaller jobs kept starting meanwhile on the cards the reservation does not need.
    during = [s for j, s in starts.items() if j.startswith("b") and starving_from <= s < starts["a-big"]]
    assert during, "no small job started while the big one held its cards"
    # And b's stream is not starved in turn: every b job starts within the 40 hours plus a few.
    assert max(s for j, s in starts.items() if j.startswith("b")) < 48 * HOUR


def test_the_wait_a_teams_own_max_explains_is_told_apart() -> None:
    # One server of 8 cards; team a may hold 4. Two 4-card jobs of a at 0 (100 s and 300 s):
    # the second waits for a's own max until the first ends at 100, though 4 cards are free.
    rows = [row("a1", 0, 100, 4), row("a2", 0, 300, 4), row("b1", 10, 50, 4, tenant="b")]
    policy = make_policy([{"name": "a", "quota": {"max": {"devices": 4}}}, {"name": "b"}])
    out = run_simulation(rows, make_cluster(1, 8), policy, job_records=True)
    waits = out["policy"]["wait_s"]
    assert waits["overall"]["max"] == 100  # a2 starts when a1 ends
    assert waits["beyond_own_limits"]["max"] == 0  # all of it was a's own max; b1 started at once


def _short_first(starvation: str | None) -> dict[str, float]:
    """One server of 8 cards and shorter runs first (``weights.duration``). At 0 an 8-card job of
    2 hours arrives with a stream of 4-card, 1-hour jobs, one every 20 minutes for 20 hours: more
    than the server runs, and every one of them shorter than the big job."""
    rows = [row("long", 0.0, 2 * HOUR, 8)]
    rows += [row(f"s{i}", i * 1200.0, HOUR, 4) for i in range(60)]
    policy = make_policy(
        [{"name": "a", "shares": 1}],
        starvation=starvation,
        ordering={"weights": {"duration": 20000}},
    )
    return _first_starts(rows, make_cluster(1, 8), policy)


def test_shorter_runs_first_would_hold_a_long_job_back_until_the_stream_ends() -> None:
    starts = _short_first(None)
    assert starts["s0"] == 0.0  # submitted with the long job, it goes first
    assert starts["long"] > 20 * HOUR


def test_the_guard_bounds_the_wait_that_shorter_runs_first_makes() -> None:
    starts = _short_first("3h")
    # Starving from 3 h, it holds the server; the 1-hour jobs on it end within the hour.
    assert 3 * HOUR < starts["long"] <= 4 * HOUR + 60
