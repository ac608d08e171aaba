"""Estimated starts for the whole queue (``scheduling.engine.estimate``), after ``decide``.

Times are seconds after NOW unless said otherwise. Every job is of one team,
user and class, so the queue is in submission order.
"""

from __future__ import annotations

import itertools
import math

from engine_factory import T0, TEMPLATES, Cluster, job, policy, quota, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import reasons
from scheduling.engine.capacity import expected_end
from scheduling.engine.decide import decide
from scheduling.engine.estimate import estimate_starts, plan_starts
from scheduling.engine.explain import explain
from scheduling.engine.priority import class_factors, order_pending
from scheduling.engine.snapshot import JobState


def _busy(cl: Cluster, node: str, ends: list[float], first_id: int = 1) -> list[JobState]:
    """One 1-card job per card of ``node``, card ``i`` ending ``ends[i]`` after NOW."""
    return [
        job(first_id + i, "a", slots=[cl.dev(f"{node}/{i}")], started=-600, est=600 + end) for i, end in enumerate(ends)
    ]


def _plan(pol, cl, pending, running, limit=None):
    snap = snapshot(pol, cl, pending, running)
    out = decide(snap)
    return out, {jid: (at - T0, devs) for jid, (at, devs) in plan_starts(snap, out, limit).items()}


def test_the_queue_behind_the_first_blocked_job_gets_times_from_the_running_ends() -> None:
    cl = Cluster().node("n1", devices=8)
    running = _busy(cl, "n1", [100, 200, 300, 400, 500, 600, 700, 800])
    a = job(20, n=4, est=1000, submitted=-300)
    b = job(21, n=4, est=500, submitted=-200)
    c = job(22, n=8, est=100, submitted=-100)
    out, plan = _plan(policy(), cl, [a, b, c], running)
    assert [out.waiting[j].reason for j in (20, 21, 22)] == [reasons.RESOURCES] * 3
    # a: when the 4th card frees, on the 4 cards ending first; b: the other four; c: all eight.
    assert plan[20] == (400, tuple(cl.dev(f"n1/{i}") for i in range(4)))
    assert plan[21] == (800, tuple(cl.dev(f"n1/{i}") for i in range(4, 8)))
    assert plan[22][0] == 1400  # a ends at 400 + 1000; b at 800 + 500
    # decide's own estimate (the first blocked job's shadow time) agrees with the plan's.
    assert out.waiting[20].estimated_start == T0 + 400
    assert out.waiting[21].estimated_start is None and out.waiting[22].estimated_start is None


def test_estimate_starts_fills_only_missing_estimates_rounded_up_to_the_minute() -> None:
    cl = Cluster().node("n1", devices=8)
    running = _busy(cl, "n1", [100, 200, 300, 400, 500, 600, 700, 810])
    snap = snapshot(policy(), cl, [job(20, n=4, est=1000, submitted=-300), job(21, n=4, est=500)], running)
    out = decide(snap)
    assert out.waiting[20].estimated_start == T0 + 400
    assert estimate_starts(snap, out) == 1
    assert out.waiting[20].estimated_start == T0 + 400  # decide's, kept
    assert out.waiting[21].estimated_start == T0 + 840  # 810 s, up to the minute
    # explain (sprio) shows the time the tick's pass stores.
    assert explain(snapshot(policy(), cl, snap.pending, running), 21)["estimated_start"] == T0 + 840


def test_a_ring_job_waits_for_one_ring_not_for_cards_across_both() -> None:
    cl = Cluster().node("n1", chip="910A", devices=8, groups=2)
    running = _busy(cl, "n1", [100, 200, 300, 400, 1000, 1100, 1200, 1300])
    x = job(20, n=2, est=10_000, submitted=-300)
    y = job(21, n=4, est=60, submitted=-200)
    z = job(22, n=8, est=60, submitted=-100)
    _, plan = _plan(policy(), cl, [x, y, z], running)
    assert plan[20] == (200, (cl.dev("n1/0"), cl.dev("n1/1")))
    # ring 0 now frees at 300, 400, 10200, 10200; cards 2, 3 and 4, 5 would make four at 1100,
    # but a 4-card job stays in one ring: ring 1, when its last card frees.
    assert plan[21] == (1300, tuple(cl.dev(f"n1/{i}") for i in range(4, 8)))
    # Eight cards on a 2x4 server are both rings: when x ends.
    assert plan[22] == (10_200, tuple(cl.dev(f"n1/{i}") for i in range(8)))


def test_a_multi_node_job_waits_for_whole_nodes_and_never_for_one_with_a_bad_card() -> None:
    cl = Cluster().node("n1").node("n2").node("n3", unhealthy=[5])
    running = [
        job(1, slots=[cl.dev(f"n1/{i}") for i in range(8)], n=8, started=-600, est=1100),  # ends at 500
        job(2, slots=[cl.dev(f"n2/{i}") for i in range(8)], n=8, started=-600, est=1500),  # ends at 900
    ]
    big = job(20, n=16, est=100)
    out, plan = _plan(policy(), cl, [big], running)
    assert out.waiting[20].reason == reasons.RESOURCES
    assert plan[20][0] == 900
    assert set(plan[20][1]) == {cl.dev(f"{n}/{i}") for n in ("n1", "n2") for i in range(8)}


def test_cordoned_nodes_and_cards_that_never_free_give_no_estimate() -> None:
    cl = Cluster().node("n1", devices=4).node("n2", devices=4, schedulable=False)
    forever = job(1, slots=[cl.dev("n1/0")], est=0)  # no estimate, no max duration: no end to plan on
    bounded = job(2, slots=[cl.dev("n1/1")], est=0, max_duration=3600, started=-600)
    others = [job(3 + i, slots=[cl.dev(f"n1/{i}")], est=1200) for i in (2, 3)]
    one = job(20, n=1, est=100, submitted=-300)
    three = job(21, n=3, est=100, submitted=-200)
    four = job(22, n=4, est=100, submitted=-100)
    _, plan = _plan(policy(), cl, [one, three, four], [forever, bounded, *others])
    assert plan[20][0] == 600  # a card of the 1200 s jobs (started 600 s ago)
    assert plan[21][0] == 3000  # both of them, and the bounded job's card at its max duration
    assert 22 not in plan  # all four cards of n1 would be needed; card 0 never frees, n2 is cordoned


def test_the_ticks_own_starts_and_promised_cards_count() -> None:
    cl = Cluster().node("n1", devices=4).node("n2", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 8}), "c": quota()}, grace=300)
    borrowers = [job(1 + i, "c", slots=[cl.dev(f"n2/{i}")], cls="low", est=50_000) for i in range(4)]
    starts_now = job(10, "a", n=4, est=1000, submitted=-900)
    reclaim = job(11, "a", n=4, est=2000, submitted=-800)
    after = job(12, "a", n=4, est=100, submitted=-700)
    snap = snapshot(pol, cl, [starts_now, reclaim, after], borrowers)
    snap.promises = {}
    out = decide(snap)
    assert [s.job_id for s in out.starts] == [10]
    assert out.waiting[11].reason == reasons.PREEMPTION_GRACE and 11 in out.promises
    plan = {jid: (at - T0, devs) for jid, (at, devs) in plan_starts(snap, out).items()}
    assert 11 not in plan  # a promised job has its estimate (the deadline) and its cards already
    # n1 is the started job's until 1000; n2 goes to the promised job at 300 until 2300.
    assert plan[12] == (1000, tuple(cl.dev(f"n1/{i}") for i in range(4)))


def test_a_promised_job_counts_against_its_teams_max() -> None:
    # As above, with a third node and team a at most 8 devices: the started job (4) and the
    # promised one (4) fill it, so job 12 waits for the started job to end, not for cards.
    cl = Cluster().node("n1", devices=4).node("n2", devices=4).node("n3", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 8}, max={"devices": 8}), "c": quota()}, grace=300)
    borrowers = [job(1 + i, "c", slots=[cl.dev(f"n{2 + i // 4}/{i % 4}")], cls="low", est=50_000) for i in range(8)]
    pending = [
        job(10, "a", n=4, est=1000, submitted=-900),
        job(11, "a", n=4, est=2000, submitted=-800),
        job(12, "a", n=4, est=100, submitted=-700),
    ]
    snap = snapshot(pol, cl, pending, borrowers)
    snap.promises = {}
    out = decide(snap)
    assert [s.job_id for s in out.starts] == [10] and 11 in out.promises
    assert out.waiting[12].reason == reasons.QUOTA_MAX_DEVICES
    plan = {jid: at - T0 for jid, (at, _) in plan_starts(snap, out).items()}
    assert plan[12] == 1000  # n1 again, when job 10 gives its four units back


def test_a_chip_model_the_teams_max_fences_off_is_not_planned_on() -> None:
    cl = Cluster().node("b4").node("a", chip="910A", groups=2)
    pol = policy({"inf": quota(max={"devices/910A": 0}), "a": quota()})
    running = [
        job(1, slots=[cl.dev(f"b4/{i}") for i in range(8)], n=8, started=-600, est=1600),  # ends at 1000
        job(2, slots=[cl.dev(f"a/{i}") for i in range(8)], n=8, started=-600, est=700),  # ends at 100
    ]
    first = job(20, "a", n=8, chip="910B4", est=50, submitted=-300)
    fenced = job(21, "inf", n=8, est=60, submitted=-200)
    free = job(22, "a", n=8, est=60, submitted=-100)
    out, plan = _plan(pol, cl, [first, fenced, free], running)
    assert out.waiting[21].reason == reasons.RESOURCES
    assert plan[20][0] == 1000
    assert plan[21] == (1050, tuple(cl.dev(f"b4/{i}") for i in range(8)))  # after the first job, not on 910A
    assert plan[22][0] == 100  # another team's job may take the 910A server


def test_a_quota_wait_that_never_ends_gets_no_estimate_and_the_limit_bounds_the_pass() -> None:
    cl = Cluster().node("n1", devices=8)
    pol = policy({"q": quota(max_jobs=0), "a": quota()})
    running = _busy(cl, "n1", [100, 200, 300, 400, 500, 600, 700, 800])
    capped = job(20, "q", n=1, submitted=-500)
    queue = [job(30 + i, "a", n=1, est=100, submitted=-300 + i) for i in range(5)]
    out, plan = _plan(pol, cl, [capped, *queue], running)
    assert out.waiting[20].reason == reasons.QUOTA_MAX_JOBS and 20 not in plan  # max 0 jobs: never
    assert [plan[30 + i][0] for i in range(5)] == [100, 200, 200, 300, 300]
    _, limited = _plan(pol, cl, [capped, *queue], running, limit=3)
    assert sorted(limited) == [30, 31]  # the quota wait was tried: it counts


def _q(cl: Cluster, jid: int, dev: str, end: float, team: str = "q") -> JobState:
    """A running 1-card job of ``team`` on ``dev`` expected to end ``end`` after NOW."""
    return job(jid, team, slots=[cl.dev(dev)], started=-600, est=600 + end)


def test_a_team_at_its_max_devices_is_planned_for_when_its_own_jobs_end() -> None:
    cl = Cluster().node("n1", devices=8)
    pol = policy({"q": quota(max={"devices": 2}), "a": quota()})
    running = [_q(cl, 1, "n1/0", 300), _q(cl, 2, "n1/1", 500)]
    pending = [
        job(20, "q", n=1, est=1000, submitted=-300),
        job(21, "q", n=1, est=100, submitted=-200),
        job(22, "q", n=2, est=100, submitted=-100),
    ]
    snap = snapshot(pol, cl, pending, running)
    out = decide(snap)
    assert [out.waiting[j].reason for j in (20, 21, 22)] == [reasons.QUOTA_MAX_DEVICES] * 3
    plan = {jid: at - T0 for jid, (at, _) in plan_starts(snap, out).items()}
    # Six cards are free now; the team's room is not: 20 takes the unit job 1 gives back at 300
    # and keeps it to 1300, 21 the one job 2 gives back at 500 (to 600), 22 needs both: 1300.
    assert plan == {20: 300, 21: 500, 22: 1300}
    assert estimate_starts(snap, out) == 3
    assert out.waiting[20].estimated_start == T0 + 300
    assert explain(snap, 22)["estimated_start"] == T0 + 1320  # rounded up to the minute


def test_a_team_at_its_max_jobs_is_planned_for_when_one_ends() -> None:
    cl = Cluster().node("n1", devices=8)
    pol = policy({"q": quota(max_jobs=1), "a": quota()})
    out, plan = _plan(pol, cl, [job(20, "q", n=4, submitted=-100)], [_q(cl, 1, "n1/0", 200)])
    assert out.waiting[20].reason == reasons.QUOTA_MAX_JOBS
    assert plan[20][0] == 200


def test_a_per_chip_max_plans_on_that_chip_only_and_cards_can_come_later_than_room() -> None:
    cl = Cluster().node("b4", devices=2).node("a", chip="910A", devices=8, groups=2)
    pol = policy({"q": quota(max={"devices/910B4": 2}), "a": quota()})
    running = [_q(cl, 1, "b4/0", 300), _q(cl, 2, "b4/1", 600, team="a")]
    pending = [job(20, "q", n=2, chip="910B4", submitted=-200), job(21, "q", n=2, submitted=-100)]
    out, plan = _plan(pol, cl, pending, running)
    assert out.waiting[20].reason == reasons.QUOTA_MAX_DEVICES  # 1 + 2 > 2 on 910B4
    assert [s.job_id for s in out.starts] == [21]  # no chip asked: the 910A server
    # Room for two 910B4 units at 300 (job 1 ends), both 910B4 cards only at 600.
    assert plan[20] == (600, (cl.dev("b4/0"), cl.dev("b4/1")))


def test_a_planned_job_takes_the_latest_room_so_an_earlier_start_behind_it_keeps_the_room_free_now() -> None:
    # q may hold 2 and holds 1 (until 300). Job 20 waits for 910B4 cards (free at 500), job 21
    # behind it for a 910A card (free at 100). 21 really starts at 100, while 20 still waits:
    # 20 must take the unit given back at 300, not the one free now.
    cl = Cluster().node("b", devices=2).node("x", chip="910A", devices=2)
    pol = policy({"q": quota(max={"devices": 2}), "a": quota()})
    running = [
        _q(cl, 1, "b/0", 500, team="a"),
        _q(cl, 2, "b/1", 500, team="a"),
        _q(cl, 3, "x/0", 100, team="a"),
        _q(cl, 4, "x/1", 300),
    ]
    pending = [job(20, "q", n=1, chip="910B4", submitted=-200), job(21, "q", n=1, chip="910A", submitted=-100)]
    out, plan = _plan(pol, cl, pending, running)
    assert [out.waiting[j].reason for j in (20, 21)] == [reasons.RESOURCES] * 2
    assert plan[20][0] == 500 and plan[21] == (100, (cl.dev("x/0"),))


def test_a_request_above_the_teams_max_gets_no_estimate() -> None:
    cl = Cluster().node("n1", devices=8)
    pol = policy({"q": quota(max={"devices": 2}), "a": quota()})
    out, plan = _plan(pol, cl, [job(20, "q", n=4)], [])
    # Above the team's max under every schedule: it never runs, so it is never planned.
    assert out.waiting[20].reason == reasons.NEVER_RUNNABLE and plan == {}


def test_jobs_waiting_for_cards_are_planned_within_their_teams_max_too() -> None:
    # decide admits all three (nothing of the team runs yet); once two of them run the team
    # is at its max, so the third waits for the first to end, not for the third card.
    cl = Cluster().node("n1", devices=4)
    pol = policy({"q": quota(max={"devices": 2}), "a": quota()})
    running = [_q(cl, 1 + i, f"n1/{i}", 100 * (i + 1), team="a") for i in range(4)]
    pending = [job(20 + i, "q", n=1, est=1000, submitted=-300 + i) for i in range(3)]
    out, plan = _plan(pol, cl, pending, running)
    assert {out.waiting[20 + i].reason for i in range(3)} == {reasons.RESOURCES}
    assert [plan[20 + i][0] for i in range(3)] == [100, 200, 1100]


def test_slices_go_where_the_templates_resources_free_first_sliced_cards_before_whole_ones() -> None:
    """A 310P3 card has 8 AI cores; ``vir04`` takes 4 (and half the memory)."""
    cl = Cluster().node("p", chip="310P3", devices=2)
    card0, card1 = cl.dev("p/0"), cl.dev("p/1")
    running = [
        job(1, slots=[(card0, "vir04")], vnpu="vir04", started=-600, est=700),  # ends at 100
        job(2, slots=[(card0, "vir04")], vnpu="vir04", started=-600, est=900),  # ends at 300
        job(3, slots=[card1], started=-600, est=1100),  # the whole card until 500
    ]
    s1, s2, s3 = (job(20 + i, vnpu="vir04", est=1000, submitted=-400 + 100 * i) for i in range(3))
    whole = job(23, chip="310P3", est=100, submitted=-100)
    out, plan = _plan(policy(), cl, [s1, s2, s3, whole], running)
    assert all(out.waiting[j].reason == reasons.RESOURCES for j in (20, 21, 22, 23))
    assert plan[20] == (100, (card0,))  # the first slice on card 0 ends
    assert plan[21] == (300, (card0,))  # the second: card 0 is sliced, so before card 1 at 500
    assert plan[22] == (500, (card1,))  # card 0 would only have room at 1100
    assert plan[23] == (1300, (card0,))  # a whole card waits for every slice on it (s2 ends at 1300)


def test_a_slice_in_its_preemption_grace_is_planned_so_the_jobs_behind_it_wait_for_its_share() -> None:
    """Slices get no promise: the plan itself must give the card's share to the job that preempted."""
    cl = Cluster().node("p", chip="310P3", devices=1)
    card = cl.dev("p/0")
    victim = job(1, cls="low", slots=[card], est=50_000)
    first = job(20, cls="high", vnpu="vir04", est=1000, submitted=-300)  # preempts the low job
    second = job(21, vnpu="vir04", est=100, submitted=-200)
    third = job(22, vnpu="vir04", est=100, submitted=-100)
    snap = snapshot(policy(grace=300), cl, [first, second, third], [victim])
    out = decide(snap)
    assert out.waiting[20].reason == reasons.PREEMPTION_GRACE and 20 not in out.promises
    plan = {jid: (at - T0, devs) for jid, (at, devs) in plan_starts(snap, out).items()}
    assert plan[20] == (300, (card,))  # half the card from the deadline, until 1300
    assert plan[21] == (300, (card,))  # the other half
    assert plan[22] == (400, (card,))  # after the second, not beside both at 300
    estimate_starts(snap, out)
    assert out.waiting[20].estimated_start == T0 + 300  # decide's (the deadline), kept


def test_waiting_decisions_come_in_priority_order() -> None:
    """The pass walks ``Decisions.waiting`` as the queue: it must be the tick's order."""
    cl = Cluster().node("n1", devices=8).node("n2", chip="910A", devices=8, groups=2)
    running = _busy(cl, "n1", [100] * 8)
    pending = [
        job(
            100 + i,
            ("a", "b", "c")[i % 3],
            n=(1, 2, 4, 8)[i % 4],
            cls=("high", "normal", "low")[i % 3],
            user=f"u{i % 5}",
            submitted=-10 * ((i * 7) % 13),
            est=300,
        )
        for i in range(30)
    ]
    snap = snapshot(policy(), cl, pending, running, usage={("a", "u1"): 50.0, ("b", "u2"): 5.0})
    out = decide(snap)
    pol = snap.policy
    from scheduling.engine.decide import Tick

    tick = Tick(snap)
    fair = tick.fair_share_of()
    tick.state.release()
    ordered = order_pending(
        snap.pending, pol.ordering, class_factors(pol), lambda t, u: fair[(t, u)], T0, lambda j: j.num_devices, 8
    )
    expected = [j.id for j in ordered if j.id in out.waiting]
    assert list(out.waiting) == expected


# -- properties over random clusters ------------------------------------------------------------


_SLICES = {"310P3": ("vir02", "vir04"), "910B4": ("vir05_1c_8g", "vir10_3c_16g")}


@st.composite
def _worlds(draw):
    cl = Cluster()
    for k in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["910A", "910B4", "310P3"]))
        bad = draw(st.sets(st.integers(0, 3), max_size=1))
        if kind == "910A":
            cl.node(f"n{k}", chip="910A", devices=8, groups=2, unhealthy=bad)
        elif kind == "910B4":
            cl.node(f"n{k}", devices=8, unhealthy=bad)
        else:
            cl.node(f"n{k}", chip="310P3", devices=4, unhealthy=bad)
    running = []
    jid = 1
    durations = st.sampled_from([0, 700, 1300, 4000, 9000])
    for node in cl.nodes:
        for dev in node.devices:
            use = draw(st.integers(0, 9))
            if use < 5:  # a whole-card job
                running.append(
                    job(jid, slots=[dev.id], started=-600, est=draw(durations),
                        max_duration=draw(st.sampled_from([None, 20_000.0])))
                )  # fmt: skip
                jid += 1
            elif use < 8 and dev.chip_model in _SLICES:  # one or two slices that fit together
                for name in draw(st.lists(st.sampled_from(_SLICES[dev.chip_model]), min_size=1, max_size=2)):
                    running.append(
                        job(jid, slots=[(dev.id, name)], vnpu=name, started=-600, est=draw(durations),
                            max_duration=20_000.0)
                    )  # fmt: skip
                    jid += 1
    pending = []
    for i in range(draw(st.integers(1, 14))):
        if draw(st.integers(0, 3)) == 0:
            chip = draw(st.sampled_from(["310P3", "910B4"]))
            name = draw(st.sampled_from(_SLICES[chip]))
            pending.append(
                job(1000 + i, submitted=-1000 + i, vnpu=name, chip=draw(st.sampled_from([None, chip])),
                    est=draw(st.sampled_from([100, 2000, 8000])))
            )  # fmt: skip
            continue
        pending.append(
            job(1000 + i, n=draw(st.sampled_from([1, 1, 2, 4, 8, 16])), submitted=-1000 + i,
                est=draw(st.sampled_from([100, 2000, 8000])), max_duration=draw(st.sampled_from([None, 9000.0])),
                chip=draw(st.sampled_from([None, "910A", "910B4", "310P3"])))
        )  # fmt: skip
    return cl, running, pending


def _end(j: JobState, start: float) -> float:
    return start + (j.estimated_duration_s or j.max_duration_s or math.inf)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_worlds())
def test_the_plan_never_overfills_a_card_and_keeps_the_placement_rules(world) -> None:
    """Whole cards: one job at a time. Slices: never beside a whole-card job, never beyond the card's
    AI cores, memory or AI CPUs. Running jobs, the tick's starts and the plan together.

    Last, EASY backfill's promise: the first blocked job can still start at its shadow time
    after the tick's (backfilled) starts, as the plan, made after them, finds. (This caught
    slices backfilled onto a held sliced card.)"""
    cl, running, pending = world
    snap = snapshot(policy(), cl, pending, running)
    out = decide(snap)
    plan = plan_starts(snap, out)
    now = T0
    devices = {d.id: (n, d) for n in cl.nodes for d in n.devices}
    whole: dict[int, list[tuple[float, float]]] = {}
    sliced: dict[int, list[tuple[float, float, str]]] = {}

    def hold(j: JobState, devs, start: float, end: float) -> None:
        for d in devs:
            if j.vnpu_template:
                sliced.setdefault(d, []).append((start, end, j.vnpu_template))
            else:
                whole.setdefault(d, []).append((start, end))

    for r in running:
        hold(r, [r.slots[0].device_id], now, expected_end(r, now))
    jobs = {j.id: j for j in pending}
    for s in out.starts:
        hold(jobs[s.job_id], [slot.device_id for slot in s.slots], now, _end(jobs[s.job_id], now))
    for jid, (at, devs) in plan.items():
        j = jobs[jid]
        assert out.waiting[jid].reason in (reasons.RESOURCES, reasons.PRIORITY, reasons.PREEMPTION_GRACE)
        assert at >= now
        n = 1 if j.vnpu_template else j.num_devices
        assert len(devs) == len(set(devs)) == n
        nodes = {devices[d][0].name for d in devs}
        chips = {devices[d][1].chip_model for d in devs}
        assert len(chips) == 1 and (j.chip_model is None or chips == {j.chip_model})
        assert all(devices[d][1].usable and devices[d][0].schedulable for d in devs)
        size = len(devices[devs[0]][0].devices)
        if n <= size:
            assert len(nodes) == 1
        if n <= 4 and chips == {"910A"}:
            assert len({devices[d][1].topology_group for d in devs}) == 1
        if n > size:
            assert all(sum(1 for d in devs if devices[d][0].name == name) == size for name in nodes)
        hold(j, devs, at, _end(j, at))
    for d, spans in whole.items():
        spans.sort()
        for (_, e1), (s2, _) in itertools.pairwise(spans):
            assert s2 >= e1, f"card {d} planned twice: {spans}"
        for s1, e1, _ in sliced.get(d, ()):
            assert all(e1 <= s2 or e2 <= s1 for s2, e2 in spans), f"card {d}: a slice beside a whole-card job"
    for d, spans in sliced.items():
        dev = devices[d][1]
        for at in {s0 for s0, _, _ in spans}:
            on = [TEMPLATES[(dev.chip_model, name)] for s0, e0, name in spans if s0 <= at < e0]
            assert sum(t.ai_cores for t in on) <= dev.ai_cores, f"card {d} over its AI cores at {at - now}"
            assert sum(t.memory_mb for t in on) <= dev.hbm_mb
            assert sum(t.ai_cpus for t in on) <= dev.ai_cpus
    # The first job waiting for capacity starts when decide said (its shadow time).
    first = next(((j, w) for j, w in out.waiting.items() if w.reason == reasons.RESOURCES), None)
    if first is not None and first[1].estimated_start is not None and first[0] in plan:
        assert plan[first[0]][0] == first[1].estimated_start


@st.composite
def _limited_worlds(draw):
    """A world of :func:`_worlds` shared by two teams, each with random limits."""
    cl, running, pending = draw(_worlds())
    teams = ("p", "q")
    for j in [*running, *pending]:
        j.team = draw(st.sampled_from(teams))
    limits = {}
    for team in teams:
        caps = {}
        if draw(st.booleans()):
            caps["devices"] = float(draw(st.integers(0, 24)))
        if draw(st.booleans()):
            caps[f"devices/{draw(st.sampled_from(['910A', '910B4', '310P3']))}"] = float(draw(st.integers(0, 12)))
        limits[team] = quota(max=caps, max_jobs=draw(st.one_of(st.none(), st.integers(0, 12))))
    return cl, running, pending, limits


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_limited_worlds())
def test_the_plan_keeps_every_team_within_its_limits(world) -> None:
    """At each planned start, the team's running jobs, the tick's starts and the jobs planned so
    far, with the new one, stay within its ``max`` devices (overall and per chip model) and its
    max jobs, unless the team was above a limit already (then the plan adds nothing there)."""
    cl, running, pending, limits = world
    snap = snapshot(policy(limits), cl, pending, running)
    out = decide(snap)
    plan = plan_starts(snap, out)
    now = T0
    devices = {d.id: d for n in cl.nodes for d in n.devices}
    cores = {}
    for d in devices.values():
        cores[d.chip_model] = max(cores.get(d.chip_model, 0), d.ai_cores)

    def units(j: JobState, devs) -> tuple[str, float]:
        chip = devices[devs[0]].chip_model
        if j.vnpu_template:
            return chip, TEMPLATES[(chip, j.vnpu_template)].ai_cores / cores[chip]
        return chip, float(len(devs))

    spans = []  # (team, chip, units, start, end, planned?)
    deadlines = {p.job_id: p.grace_deadline for p in out.preemptions}
    for r in running:
        if r.id in out.evictions:
            continue
        end = expected_end(r, now)
        if r.id in deadlines:
            end = min(end, max(deadlines[r.id], now))
        spans.append((r.team, *units(r, [s.device_id for s in r.slots]), now, end, False))
    jobs = {j.id: j for j in pending}
    for s in out.starts:
        j = jobs[s.job_id]
        spans.append((j.team, *units(j, [x.device_id for x in s.slots]), now, _end(j, now), False))
    for jid, (at, devs) in plan.items():
        j = jobs[jid]
        spans.append((j.team, *units(j, list(devs)), at, _end(j, at), True))
    for team, q in limits.items():
        mine = [x for x in spans if x[0] == team]
        for _, chip, _, at, _, planned in mine:
            if not planned:
                continue
            live = [x for x in mine if x[3] <= at < x[4]]
            held = [x for x in live if not x[5]]
            checks = [(q.max_concurrent_jobs, len(live), len(held))]
            if "devices" in q.max:
                checks.append((q.max["devices"], sum(x[2] for x in live), sum(x[2] for x in held)))
            cap = q.max.get(f"devices/{chip}")
            if cap is not None:
                on = [x for x in live if x[1] == chip]
                checks.append((cap, sum(x[2] for x in on), sum(x[2] for x in on if not x[5])))
            for limit, total, already in checks:
                if limit is not None:
                    assert total <= max(limit, already) + 1e-6, f"team {team} above {limit} at {at - now}"
