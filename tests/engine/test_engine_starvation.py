"""The starvation guard (scheduling.engine.starvation): who counts as starving, what its hold keeps.

The stories of the guard are YAML scenarios (scenarios/starvation*.yaml); these are the edges.
"""

from __future__ import annotations

from dataclasses import replace

from engine_factory import T0, Cluster, classes, job, policy, quota, snapshot
from hypothesis import HealthCheck, given, settings
from test_engine_properties import worlds

from scheduling.engine import reasons
from scheduling.engine.decide import Tick, decide
from scheduling.engine.explain import explain
from scheduling.engine.snapshot import Snapshot
from scheduling.engine.starvation import MAX_HOLDS_PER_CHIP, Guard, served_late, starving_first

H = 3600.0


def _busy_two_nodes() -> tuple[Cluster, list]:
    """n1 and n2 of 8 cards, each half busy with team b's jobs ending in 1 h (n1) and 2 h (n2)."""
    cl = Cluster().node("n1").node("n2")
    running = [
        job(1, "b", 4, slots=[cl.dev(f"n1/{i}") for i in range(4)], started=-H, est=2 * H),
        job(2, "b", 4, slots=[cl.dev(f"n2/{i}") for i in range(4)], started=-H, est=3 * H),
    ]
    return cl, running


def test_a_class_threshold_wins_over_the_policys() -> None:
    pcs = classes(("high", ["low"]), "normal", "low")
    pcs = tuple(replace(pc, starvation_after_s=2 * H) if pc.name == "high" else pc for pc in pcs)
    guard = Guard(policy(priority_classes=pcs, starvation=24 * H))
    assert guard.after("high") == 2 * H and guard.after("normal") == 24 * H
    assert guard.after("gone") == 24 * H, "a class the policy no longer has takes the policy's threshold"
    assert guard.starving(job(1, cls="high", submitted=-3 * H), T0)
    assert not guard.starving(job(2, cls="normal", submitted=-3 * H), T0)
    off = Guard(policy(priority_classes=pcs))
    assert off.on and off.after("normal") is None, "a class may turn the guard on for itself alone"
    assert not Guard(policy()).on


def test_a_starving_job_its_quota_refuses_holds_nothing() -> None:
    cl, running = _busy_two_nodes()
    running.append(job(3, "a", 1, slots=[cl.dev("n2/7")], started=-H, est=9 * H))
    pol = policy({"a": quota(max_jobs=1), "b": quota()}, starvation=24 * H)
    pending = [job(10, "a", 8, submitted=-30 * H), job(11, "b", 8, submitted=-H)]
    out = decide(snapshot(pol, cl, pending, running))
    assert out.waiting[10].reason == reasons.QUOTA_MAX_JOBS
    # The ordinary first blocked job gets its hold as without the guard.
    assert out.waiting[11].reason == reasons.RESOURCES and out.waiting[11].estimated_start == T0 + H


def test_a_job_within_its_guarantee_takes_an_ordinary_hold_but_not_a_starving_jobs() -> None:
    # One server, half busy until 1 h: a's 8-card job holds all of it (the 4 free cards too).
    cl = Cluster().node("n1")
    running = [job(1, "b", 4, slots=[cl.dev(f"n1/{i}") for i in range(4)], started=-H, est=2 * H)]
    teams = {"a": quota(), "b": quota(), "c": quota(guaranteed={"devices": 8})}
    # c's 4-card job runs 5 h: it does not end before the hold's shadow time (1 h). c used even
    # more than a, so a's job comes first (and holds the server) with the guard or without it.
    pending = [job(10, "a", 8, submitted=-30 * H), job(12, "c", 4, submitted=-60, est=5 * H)]
    usage = {("a", "u"): 1e6, ("c", "u"): 1e7}
    guarded = decide(snapshot(policy(teams, starvation=24 * H), cl, pending, running, usage=usage))
    assert guarded.waiting[10].estimated_start == T0 + H
    assert 12 in guarded.waiting, "c's job would delay the starving job: it waits"
    plain = decide(snapshot(policy(teams), cl, pending, running, usage=usage))
    assert [s.job_id for s in plain.starts] == [12], "within its guarantee, it takes an ordinary hold's cards"


def test_at_most_so_many_starving_jobs_hold_cards_on_one_chip_model() -> None:
    cl = Cluster().node("n1", devices=2)
    running = [job(1, "b", 2, slots=[cl.dev("n1/0"), cl.dev("n1/1")], started=-H, est=2 * H)]
    pending = [job(100 + i, "a", 1, submitted=-30 * H + i, est=H) for i in range(MAX_HOLDS_PER_CHIP + 2)]
    out = decide(snapshot(policy(starvation=24 * H), cl, pending, running))
    held = [j for j in pending if out.waiting[j.id].estimated_start is not None]
    assert len(held) == MAX_HOLDS_PER_CHIP
    assert [j.id for j in held] == [j.id for j in pending[:MAX_HOLDS_PER_CHIP]], "the oldest hold first"
    last = out.waiting[pending[-1].id]
    assert "served before other jobs" in last.detail and "hold cards on 910B4 first" in last.detail
    # Held one after the other on two cards: every hour two more start.
    starts = sorted(out.waiting[j.id].estimated_start for j in held)  # type: ignore[type-var]
    assert starts[:4] == [T0 + H, T0 + H, T0 + 2 * H, T0 + 2 * H]


def test_explain_says_how_long_the_job_waited_and_whether_it_is_starving() -> None:
    cl, running = _busy_two_nodes()
    pending = [job(10, "a", 8, submitted=-30 * H), job(11, "b", 8, submitted=-H)]
    snap = snapshot(policy(starvation=24 * H), cl, pending, running)
    got = explain(snap, 10)
    assert got["starvation"] == {"after_s": 24 * H, "waited_s": 30 * H, "starving": True}
    assert got["detail"].startswith("waiting more than 24h: cards on n1 held for it from")
    assert explain(snap, 11)["starvation"]["starving"] is False


PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(worlds(starvation=True))
def test_starving_holds_never_overlap_and_nothing_started_on_them_delays_them(snap: Snapshot) -> None:
    tick = Tick(snap)
    out = tick.run()
    holds = [h for chip_holds in tick.holds.values() for h in chip_holds if h.starving]
    for i, a in enumerate(holds):
        for b in holds[i + 1 :]:
            if a.devices & b.devices:
                assert a.until <= b.shadow + 1e-6 or b.until <= a.shadow + 1e-6, "two holds on a card at once"
    pending = {j.id: j for j in snap.pending}
    now = snap.now.timestamp()
    for start in out.starts:
        j = pending[start.job_id]
        duration = j.estimated_duration_s or j.max_duration_s or 0.0
        for h in holds:
            if h.job_id != j.id and h.devices & {s.device_id for s in start.slots}:
                assert now + duration <= h.shadow + 1e-6, f"job {j.id} on cards held for job {h.job_id}"
    # Starving jobs are decided first, oldest first (the waits and starts keep the tick's order).
    starving = sorted((j.submitted_at, j.id) for j in snap.pending if tick.guard.starving(j, now))
    order = [jid for jid in out.waiting] + [s.job_id for s in out.starts]
    assert tick.starving == len(starving)
    idx, _ = Tick(snap).order()
    assert {snap.pending[k].id for k in idx[: len(starving)]} == {jid for _, jid in starving}
    assert all(jid in order for _, jid in starving)


def test_a_slice_that_ends_before_the_later_hold_only_does_not_start_on_a_card_the_earlier_hold_has() -> None:
    """Two starving holds stack on a sliced card: the first from when its slice ends, the second after
    the first's job. A slice job that ends before the second hold's time but not the first's may
    borrow the second's cards only: the sliced card is the first's until then, and a slice on it
    would delay that job.

    (Found by the property test below: lending the second hold's cards showed the card's slices
    to placement again, and the slice started on the first hold's card.)
    """
    cl = Cluster().node("n1", chip="310P3", devices=4)
    running = [
        job(1, slots=[cl.dev("n1/1")], started=-60, est=H),
        job(2, slots=[cl.dev("n1/2")], started=-60, est=H),
        job(3, vnpu="vir02", slots=[cl.dev("n1/3")], started=-H + 60, est=H),  # its slice ends in 60 s
    ]
    pending = [
        job(10, "c", 2, submitted=-1000, est=60),  # starving: n1/0 now and n1/3 in 60 s
        job(11, "a", 3, submitted=-1000 + 1, est=60),  # starving: after job 1 and 2 end
        job(12, "c", 1, "low", vnpu="vir02", submitted=-5, est=120),  # ends in 120 s: after job 10's hold
    ]
    tick = Tick(snapshot(policy(starvation=900), cl, pending, running))
    out = tick.run()
    holds = {h.job_id: h for hs in tick.holds.values() for h in hs}
    assert holds[10].shadow == T0 + 60 and cl.dev("n1/3") in holds[10].devices
    assert cl.dev("n1/3") in holds[11].devices and holds[11].shadow > T0 + 120
    assert [s.job_id for s in out.starts] == [], "no slice on the card held for job 10"
    assert out.waiting[12].reason == reasons.RESOURCES


def _reclaim_world(starvation: float | None) -> list[int]:
    """n1 and n2 of 8 cards, all borrowed by team b: on n1 an 8-card job that started 10 minutes
    ago after waiting 30 h; on n2 one that started 40 minutes ago at once. Team c, within its
    guarantee, reclaims 8 cards. Returns the victims' ids."""
    cl = Cluster().node("n1").node("n2")
    running = [
        job(1, "b", 8, slots=[cl.dev(f"n1/{i}") for i in range(8)], started=-600, submitted=-30 * H, est=9 * H),
        job(2, "b", 8, slots=[cl.dev(f"n2/{i}") for i in range(8)], started=-2400, submitted=-2400, est=9 * H),
    ]
    teams = {"b": quota(), "c": quota(guaranteed={"devices": 8})}
    pol = policy(teams, starvation=starvation)
    out = decide(snapshot(pol, cl, [job(10, "c", 8, submitted=-60)], running))
    return [p.job_id for p in out.preemptions]


def test_a_reclaim_spares_the_job_the_guard_just_served_when_another_costs_less() -> None:
    # Least work alone: the job started 10 minutes ago (1.3 device-hours) before the 40-minute one (5.3).
    assert _reclaim_world(None) == [1]
    # With the guard at 24 h, job 1 started 29.8 h after submission: its 24 h of 8 cards count too.
    assert _reclaim_world(24 * H) == [2]


def test_starving_jobs_go_first_longest_waiting_first_and_equal_waits_by_id() -> None:
    """The starving jobs lead the order by their wait beyond their own limits, ties by id; the
    others keep their order. (The sort is by time alone and then by id within equal times.)"""
    guard = Guard(policy(starvation=24 * H))
    pending = [
        job(7, submitted=-30 * H),
        job(3, submitted=-2 * H),  # not starving
        job(9, submitted=-40 * H),
        job(5, submitted=-30 * H),
        replace(job(4, submitted=-40 * H), own_limits_s=10 * H),  # 30 h beyond its own limits
        job(8, submitted=-1 * H),  # not starving
        job(6, submitted=-30 * H),
    ]
    idx = [5, 0, 2, 1, 3, 6, 4]  # a priority order
    out, starving = starving_first(guard, pending, idx, T0)
    assert [pending[k].id for k in out] == [9, 4, 5, 6, 7, 8, 3]
    assert starving == 5  # the first five of the order
    assert starving_first(guard, pending[1:2], [0], T0) == ([0], 0)


def test_served_late_names_the_jobs_that_started_past_their_threshold() -> None:
    guard = Guard(policy(starvation=24 * H))
    late = job(1, slots=[0], started=-60, submitted=-30 * H)
    on_time = job(2, slots=[1], started=-60, submitted=-2 * H)
    assert served_late(guard, [late, on_time]) == {1: 24 * H}
    assert served_late(Guard(policy()), [late]) == {}


def test_time_at_its_own_teams_limits_does_not_make_a_job_starving() -> None:
    """Issue 30: the guard bounds the wait other teams cause, not the wait at the team's own max.

    Before the change a job waited 30 h, 28 of them with its team at its max, counted as
    starving: it went before every other job and held the cards its team was not even allowed.
    """
    guard = Guard(policy(starvation=24 * H))
    at_cap = replace(job(1, submitted=-30 * H), own_limits_s=28 * H)
    assert not guard.starving(at_cap, T0), "2 h beyond its own limits is not 24 h"
    assert guard.starving(replace(at_cap, own_limits_s=5 * H), T0), "25 h beyond its own limits is"
    # In the queue: the job that waited at its own cap no longer goes before a fresher one.
    cl, running = _busy_two_nodes()
    pol = policy({"a": quota(), "b": quota()}, starvation=24 * H)
    capped = replace(job(10, "a", 8, submitted=-30 * H), own_limits_s=28 * H)
    other = job(11, "b", 8, submitted=-2 * H)
    out = decide(snapshot(pol, cl, [capped, other], running, usage={("a", "u"): 1.0, ("b", "u"): 1e7}))
    assert "waiting more than" not in out.waiting[10].detail


def test_a_run_the_guard_served_late_is_late_only_beyond_its_own_limits() -> None:
    guard = Guard(policy(starvation=24 * H))
    started = replace(job(1, submitted=-40 * H, started=-10 * H, slots=[1]), own_limits_s=20 * H)
    assert served_late(guard, [started]) == {}, "it started 30 h after submission, 10 h beyond its own limits"
    assert served_late(guard, [replace(started, own_limits_s=0.0)]) == {1: 24 * H}
