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


def test_the_guard_bound_is_read_from_the_replay_and_holds_for_the_big_job() -> None:
    """``wait_s.guard_bound``: the big job of ``_world`` starved, and started within the bound
    (its threshold plus the hour b's running jobs still had to run), as did the few of b's that starved."""
    rows = [row(f"a-early{i}", 0.0, 2 * HOUR, 8, tenant="a") for i in range(2)]
    rows += [row(f"b{i}", i * 600.0, HOUR, 4, tenant="b") for i in range(120)]
    rows.append(row("a-big", 2 * HOUR, HOUR, 8, tenant="a"))
    teams = [{"name": "a", "shares": 1}, {"name": "b", "shares": 10}]
    guarded = run_simulation(rows, make_cluster(2, 8), make_policy(teams, starvation="12h"))["policy"]
    bound = guarded["wait_s"]["guard_bound"]
    assert bound["starved"] >= 1 and bound["over_bound"] == 0, bound
    # At 2 h, b's own backlog (more than the cluster runs) starves too: those jobs wait for each
    # other, oldest first, and many are over the one-job bound; the figure says so.
    overloaded = run_simulation(rows, make_cluster(2, 8), make_policy(teams, starvation="2h"))["policy"]
    assert overloaded["wait_s"]["guard_bound"]["over_bound"] > 0
    assert run_simulation(rows, make_cluster(2, 8), make_policy(teams))["policy"]["wait_s"]["guard_bound"] is None


def test_time_at_the_teams_own_max_does_not_start_the_guard() -> None:
    """Issue 30: a job held by its own team's max for longer than the threshold is not starving.

    Team a may hold 8 cards and runs an 8-card job for 5 h; its second job waits for a's own max
    all that time, with 8 cards free. Its wait beyond its own limits is a minute: it never
    starves (the engine's side: tests/engine/test_engine_starvation.py), and b's 4-card jobs
    keep the free server busy.
    """
    rows = [row("a1", 0.0, 5 * HOUR, 8), row("a2", 60.0, HOUR, 8)]
    rows += [row(f"b{i}", 5 * HOUR - 600.0 + i, 2 * HOUR, 4, tenant="b") for i in range(2)]
    teams = [{"name": "a", "quota": {"max": {"devices": 8}}}, {"name": "b"}]
    out = run_simulation(rows, make_cluster(2, 8), make_policy(teams, starvation="2h"), job_records=True)
    waits = out["policy"]["wait_s"]
    assert waits["guard_bound"]["starved"] == 0, "its wait beyond its own limits never reached 2 h"
    starts = {r["job_id"]: float(r["first_start_s"]) for r in out["job_records"]["policy"]}
    assert starts["b0"] < 5 * HOUR and starts["b1"] < 5 * HOUR, "b's jobs took the free server"
    assert starts["a2"] == 5 * HOUR, "a2 starts when a's own job ends"
