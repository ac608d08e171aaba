"""Unit checks of single features that scenarios do not pin down."""

from __future__ import annotations

import copy
from datetime import timedelta

from engine_factory import NOW, T0, Cluster, classes, job, policy, quota, snapshot

from scheduling.engine import reasons
from scheduling.engine.bench_core import bench_decide, make_synthetic_snapshot, next_tick
from scheduling.engine.decide import decide
from scheduling.engine.policy import Schedule, TeamPolicy
from scheduling.engine.quota import quota_in_force


def _nodes_of(out, cl):
    return {s.job_id: {cl.name_of(x.device_id).split("/")[0] for x in s.slots} for s in out.starts}


def test_binpack_fills_the_fullest_node_spread_the_emptiest() -> None:
    cl = Cluster().node("n1").node("n2")
    running = [job(1, slots=[cl.dev("n1/0"), cl.dev("n1/1")])]
    pending = [job(10, n=2)]
    assert _nodes_of(decide(snapshot(policy(strategy="binpack"), cl, pending, running)), cl) == {10: {"n1"}}
    assert _nodes_of(decide(snapshot(policy(strategy="spread"), cl, pending, running)), cl) == {10: {"n2"}}


def test_quota_in_force_follows_the_time_of_day_schedule() -> None:
    night = Schedule(
        "night", None, 20 * 60, 8 * 60, {"max": {"devices": 16}}, resolved_quota=quota(max={"devices": 16})
    )
    pol = policy({"a": TeamPolicy("a", None, 1.0, quota(max={"devices": 2}), (night,))})
    assert quota_in_force(pol, "a", NOW)[1] is None  # 10:00
    q, name = quota_in_force(pol, "a", NOW + timedelta(hours=12))  # 22:00
    assert name == "night" and q.max == {"devices": 16}
    cl = Cluster().node("n1")
    day = decide(snapshot(pol, cl, [job(1, n=4)]))
    assert day.waiting[1].reason == reasons.QUOTA_MAX_DEVICES
    late = decide(snapshot(pol, cl, [job(1, n=4)], now=NOW + timedelta(hours=12)))
    assert [s.job_id for s in late.starts] == [1]


def test_multi_node_gang_reclaims_whole_nodes() -> None:
    cl = Cluster().node("n1").node("n2")
    pol = policy({"a": quota(guaranteed={"devices": 16}), "b": quota()})
    running = [job(i + 1, "b", slots=[cl.dev(f"n{1 + i // 8}/{i % 8}")], started=-60 * (i + 1)) for i in range(16)]
    out = decide(snapshot(pol, cl, [job(100, "a", n=16)], running))
    assert len(out.preemptions) == 16
    assert all(p.reason == reasons.GUARANTEE_RECLAIM and p.for_job == 100 for p in out.preemptions)
    assert out.waiting[100].estimated_start == T0 + 300


def test_reclaim_takes_no_more_than_needed_and_spares_guaranteed_teams() -> None:
    cl = Cluster().node("n1", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 2}), "b": quota(guaranteed={"devices": 2}), "c": quota()})
    running = [
        job(1, "b", slots=[cl.dev("n1/0")], cls="low", started=-10),  # b is within its guarantee
        job(2, "b", slots=[cl.dev("n1/1")], cls="low", started=-20),
        job(3, "c", slots=[cl.dev("n1/2")], cls="high", started=-9000),  # c borrows everything it holds
        job(4, "c", slots=[cl.dev("n1/3")], cls="normal", started=-5000),
    ]
    out = decide(snapshot(pol, cl, [job(10, "a", n=1)], running))
    assert [p.job_id for p in out.preemptions] == [4]  # c's cheaper job; b is not borrowing


def test_unknown_class_is_refused() -> None:
    out = decide(snapshot(policy(), Cluster().node("n1"), [job(1, cls="vip")]))
    assert out.waiting[1].reason == reasons.QUOTA_CLASS_NOT_ALLOWED


def test_every_reason_has_plain_words() -> None:
    codes = [v for k, v in vars(reasons).items() if k.isupper() and isinstance(v, str)]
    assert all(reasons.describe(code) != code for code in codes)


def test_decide_is_deterministic_on_the_synthetic_cluster() -> None:
    snap = make_synthetic_snapshot(pending=600, nodes=60)
    a, b = decide(snap), decide(snap)
    assert a.starts == b.starts and a.preemptions == b.preemptions and a.waiting == b.waiting
    assert a.starts and set(a.waiting) | {s.job_id for s in a.starts} == {j.id for j in snap.pending}


def test_bench_reports_figures() -> None:
    res = bench_decide(pending=200, nodes=20, ticks=2, growth=(100, 200))
    assert res["median_ms"] > 0 and [r["pending"] for r in res["growth"]] == [100, 200]
    nxt = res["next_tick"]  # the tick after the first one: its starts are running now
    assert nxt["pending"] == 200 - res["starts"] and nxt["running"] > res["running"] and nxt["median_ms"] > 0
    for split in (res["split"], nxt["split"]):  # the tick's three parts, each timed
        assert set(split) == {"state_ms", "order_ms", "decide_ms"} and min(split.values()) > 0
    starving = res["starving"]  # guard on and off, timed in pairs (2 * ticks + 1 of them)
    assert starving["pairs"] == 5 and starving["starving_jobs"] > 0
    assert starving["on_min_ms"] <= starving["on_median_ms"] and starving["ratio"] > 0


def test_next_tick_runs_what_the_tick_started() -> None:
    snap = make_synthetic_snapshot(pending=300, nodes=20, busy=0.5)
    out = decide(copy.deepcopy(snap))
    assert out.starts
    later = next_tick(snap, out, seconds=60.0)
    started = {s.job_id: s for s in out.starts}
    running = {j.id: j for j in later.running}
    assert not started.keys() & {j.id for j in later.pending}
    for jid, start in started.items():
        job = running[jid]
        assert job.slots == tuple(start.slots) and job.started_at == snap.now.timestamp()
    assert later.now.timestamp() == snap.now.timestamp() + 60.0
    assert all(j.started_at is None for j in snap.pending)  # the snapshot it came from is untouched
    # What the next tick holds is what the first one decided: nothing it started can start again.
    again = decide(later)
    assert not {s.job_id for s in again.starts} & started.keys()


def test_cards_left_by_victims_of_a_plan_count_for_later_searches_in_the_same_tick() -> None:
    """A search's bound on what a pool could free grows where a plan made jobs leave.

    Oldest first (class weight 0): Z (high, 3 cards) finds too little to preempt and
    fails; X (urgent) makes the 2-card batch job V leave for one card, so V's other
    card comes free at the deadline unclaimed; Y (high, 2 cards) can then have that
    card plus the low job L's. A bound kept from Z's search would refuse the pool.
    """
    from scheduling.engine.policy import Ordering

    cl = Cluster().node("n1", devices=8)
    prio = classes(("urgent", ["batch"]), ("high", ["low"]), "normal", "low", "batch")
    pol = policy({"c": quota()}, prio, ordering=Ordering(weight_priority_class=0.0, weight_fair_share=0.0))
    running = [
        job(1, "c", cls="batch", slots=[cl.dev("n1/0"), cl.dev("n1/1")], n=2),
        job(2, "c", cls="low", slots=[cl.dev("n1/2")]),
        *[job(3 + i, "c", cls="normal", slots=[cl.dev(f"n1/{3 + i}")]) for i in range(5)],
    ]
    pending = [
        job(10, "c", n=3, cls="high", submitted=-300),
        job(11, "c", n=1, cls="urgent", submitted=-200),
        job(12, "c", n=2, cls="high", submitted=-100),
    ]
    out = decide(snapshot(pol, cl, pending, running))
    assert out.waiting[10].reason == reasons.RESOURCES
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(1, 11), (2, 12)]
    assert out.waiting[12].reason == reasons.PREEMPTION_GRACE


def test_pool_bounds_worked_out_at_once_equal_those_worked_out_card_by_card() -> None:
    from scheduling.engine.bench_core import clone_snapshot
    from scheduling.engine.decide import Tick

    first = make_synthetic_snapshot(3000, nodes=200, seed=3)
    snap = next_tick(first, decide(clone_snapshot(first)))  # jobs leaving, a full cluster
    tick = Tick(snap)
    pre = tick.preemptor
    pre.claimed.update(d.id for n in snap.nodes[:40:7] for d in n.devices[:3])
    compared = 0
    for chip in tick.state.chips.values():
        for kinds in (frozenset({"batch"}), frozenset({"batch", "normal"}), frozenset()):
            pre._potential_cache.clear()
            pre._potential_all(chip, kinds)
            at_once = dict(pre._potential_cache[kinds])
            pre._potential_cache.clear()
            pre._misses[(chip.name, kinds)] = 10**9  # card by card from here on
            for pool, mask in at_once.items():
                assert pre._potential(pool, kinds) == mask, (chip.name, kinds)
                compared += 1
    assert compared > 200


def test_a_teams_memo_of_admissions_outlives_starts_only_while_every_limit_has_room() -> None:
    from scheduling.engine.policy import Quota
    from scheduling.engine.quota import TeamLedger

    ledger = TeamLedger("a", Quota(max={"devices": 10.0, "devices/910A": 5.0}, max_concurrent_jobs=4), None, 0.0)
    ledger.big = 4.0  # the largest request of the tick
    ledger.adm["shape"] = (None, "", ("910B4",))
    ledger.add("910B4", 2.0, 1)  # 8 devices and 3 jobs of room left: every request still fits
    assert ledger.adm and ledger.jobs == 1
    ledger.add("910A", 2.0, 1)  # 910A: 3 left, less than a 4-card request
    assert not ledger.adm
    ledger.adm["shape"] = (None, "", ("910B4",))
    ledger.add("910B4", 1.0, 1)  # 5 devices left overall, one job left: fine
    assert ledger.adm
    ledger.add("910B4", 1.0, 1)  # the fourth job: max concurrent jobs reached
    assert not ledger.adm and ledger.jobs == 4


def test_a_team_reaching_its_max_within_a_tick_is_refused_from_then_on() -> None:
    cl = Cluster().node("n1", devices=8)
    pol = policy({"a": quota(max={"devices": 4})})
    out = decide(snapshot(pol, cl, [job(10 + i, "a", n=1, submitted=-100 + i) for i in range(6)]))
    assert sorted(s.job_id for s in out.starts) == [10, 11, 12, 13]
    assert {out.waiting[j].reason for j in (14, 15)} == {reasons.QUOTA_MAX_DEVICES}


def test_a_pool_whose_cards_never_free_gives_no_estimate_rather_than_infinity() -> None:
    cl = Cluster().node("n1", devices=2)
    forever = [job(i + 1, slots=[cl.dev(f"n1/{i}")], est=0) for i in range(2)]  # no estimate, no max
    out = decide(snapshot(policy(), cl, [job(10, n=1)], forever))
    assert out.waiting[10].reason == reasons.RESOURCES
    assert out.waiting[10].estimated_start is None


def test_a_job_started_without_any_duration_keeps_its_cards_in_the_same_ticks_shadow_times() -> None:
    # A job with neither estimate nor max duration has no known end once running (the next
    # tick's expected_end says so). The tick that starts it must see it the same way: its
    # card is not a release "now" for the shadow time of the job blocked behind it.
    cl = Cluster().node("n1", devices=2)
    running = [job(1, slots=[cl.dev("n1/1")], est=1800)]
    pending = [job(10, n=1, est=0, submitted=-200), job(11, n=2, submitted=-100)]
    out = decide(snapshot(policy(), cl, pending, running))
    assert [s.job_id for s in out.starts] == [10]
    assert out.waiting[11].reason == reasons.RESOURCES
    assert out.waiting[11].estimated_start is None  # was NOW: job 10's card taken to end at once
    # The next tick, job 10 running, says the same.
    started = job(10, n=1, est=0, slots=[s.device_id for s in out.starts[0].slots], started=0)
    again = decide(snapshot(policy(), cl, [job(11, n=2, submitted=-100)], [*running, started]))
    assert again.waiting[11].estimated_start is None


def test_a_guarantee_reclaim_does_not_throw_away_more_than_the_bound_per_card() -> None:
    """Issue 30: a reclaim that would lose more than ``reclaimLossLimit`` of work per card waits.

    Before the bound, the least-work search took b's run of 5 h on 8 cards (40 device-hours
    thrown away) to give a its guarantee at once.
    """
    from dataclasses import replace as with_

    from engine_factory import NOW, Cluster, job, policy, quota, snapshot

    from scheduling.engine import reasons
    from scheduling.engine.decide import decide

    hour = 3600.0
    cl = Cluster().node("n1")
    running = [job(1, "b", 8, slots=[cl.dev(f"n1/{i}") for i in range(8)], started=-5 * hour, est=10 * hour)]
    teams = {"a": quota(guaranteed={"devices": 8}), "b": quota()}
    pending = [job(10, "a", 8)]
    out = decide(snapshot(policy(teams), cl, pending, running))
    assert out.preemptions == [], "5 h of work per card is more than the default 2 h"
    assert out.waiting[10].reason == reasons.RESOURCES
    assert "more than 2h of a borrower's work per card" in out.waiting[10].detail
    # A run younger than the bound is reclaimed as before.
    young = [with_(running[0], started_at=NOW.timestamp() - 1.5 * hour)]
    out = decide(snapshot(policy(teams), cl, pending, young))
    assert [(p.job_id, p.reason) for p in out.preemptions] == [(1, reasons.GUARANTEE_RECLAIM)]
    # The bound is the policy's: at 6 h the old run is reclaimed too.
    pol = policy(teams)
    pol = with_(pol, reclaim_loss_limit_s=6 * hour)
    out = decide(snapshot(pol, cl, pending, running))
    assert [p.job_id for p in out.preemptions] == [1]
