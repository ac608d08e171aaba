"""Promises: cards freed by a preemption go to the job they were freed for.

Without them, a team reclaiming its guarantee could see the cards it waited a
grace period for taken by a higher-priority job of a borrowing team in the
tick its victims leave, and had to preempt again (and again). The tests drive
several ticks, handing back ``Decisions.promises`` as every caller does.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from engine_factory import NOW, T0, Cluster, job, policy, quota, small_cluster, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine import reasons
from scheduling.engine.decide import decide
from scheduling.engine.snapshot import Decisions, JobState, Promise, Snapshot

GRACE = 300.0


def _reclaim_world() -> tuple[Cluster, object, list[JobState], JobState]:
    """Team c (no guarantee) borrows the whole 4-card node that team a is guaranteed."""
    cl = Cluster().node("n1", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 4}), "c": quota()}, grace=GRACE)
    running = [job(i + 1, "c", slots=[cl.dev(f"n1/{i}")], cls="low", started=-600) for i in range(4)]
    return cl, pol, running, job(100, "a", n=4, cls="normal")


def _at(seconds: float, pol, cl, pending, running, promises) -> Decisions:
    snap = snapshot(pol, cl, pending, running, now=NOW + timedelta(seconds=seconds))
    snap.promises = dict(promises)
    return decide(snap)


def test_the_plan_returns_a_promise_of_the_cards_it_frees() -> None:
    cl, pol, running, ask = _reclaim_world()
    out = _at(0, pol, cl, [ask], running, {})
    assert out.waiting[100].reason == reasons.PREEMPTION_GRACE
    assert out.promises == {100: Promise(100, tuple(cl.dev(f"n1/{i}") for i in range(4)), T0 + GRACE)}


def test_freed_cards_go_to_the_job_they_were_freed_for_not_to_a_higher_class() -> None:
    cl, pol, running, ask = _reclaim_world()
    first = _at(0, pol, cl, [ask], running, {})
    for r in running:
        r.preempt_deadline = T0 + GRACE
    rival = job(200, "c", n=4, cls="high", submitted=200)  # ranks above the waiting job
    out = _at(GRACE, pol, cl, [ask, rival], running, first.promises)
    assert out.evictions == [1, 2, 3, 4]
    assert [s.job_id for s in out.starts] == [100]
    assert out.promises == {}  # kept: nothing to hand back
    assert out.waiting[200].reason == reasons.RESOURCES
    # Without the promise handed back, the rival takes the cards and the job must preempt again.
    lost = _at(GRACE, pol, cl, [ask, rival], running, {})
    assert [s.job_id for s in lost.starts] == [200]


def test_no_other_search_counts_promised_cards_of_leaving_jobs() -> None:
    cl, pol, running, ask = _reclaim_world()
    first = _at(0, pol, cl, [ask], running, {})
    for r in running:
        r.preempt_deadline = T0 + GRACE
    rival = job(200, "c", n=4, cls="high", submitted=100)  # "high" may preempt "low"
    out = _at(150, pol, cl, [ask, rival], running, first.promises)
    assert out.starts == [] and out.preemptions == []
    assert out.waiting[100].reason == reasons.PREEMPTION_GRACE
    assert out.waiting[100].estimated_start == T0 + GRACE
    rival_wait = out.waiting[200]
    assert rival_wait.reason == reasons.RESOURCES
    assert rival_wait.estimated_start is not None
    assert rival_wait.estimated_start >= T0 + GRACE + ask.estimated_duration_s
    assert out.promises == first.promises
    # Not handed back: the rival counts the leaving jobs' cards as its own way in.
    unaware = _at(150, pol, cl, [ask, rival], running, {})
    assert unaware.waiting[200].reason == reasons.PREEMPTION_GRACE


def test_a_promise_lapses_one_grace_period_after_it_was_due() -> None:
    cl = Cluster().node("n1", devices=4)
    promise = {100: Promise(100, tuple(cl.dev(f"n1/{i}") for i in range(4)), T0)}
    blocked = job(100, "a", n=4, cls="normal", max_duration=10 * 86400)
    capped = policy({"a": quota(guaranteed={"devices": 4}, max_duration=86400), "c": quota()}, grace=GRACE)
    rival = job(200, "c", n=4, cls="high")
    held = _at(GRACE - 1, capped, cl, [blocked, rival], [], promise)
    # Its maximum duration is over the team's under every schedule: admission stops it, and it says
    # it can never run (feasibility), not that it waits for now.
    assert held.waiting[100].reason == reasons.NEVER_RUNNABLE
    assert held.starts == [] and held.promises == promise  # the job cannot start, the cards stay held
    # The rival's shadow time sees the held cards busy until the promised job would end.
    assert held.waiting[200].reason == reasons.RESOURCES
    assert held.waiting[200].estimated_start == T0 + GRACE - 1 + blocked.estimated_duration_s
    lapsed = _at(GRACE, capped, cl, [blocked, rival], [], promise)
    assert [s.job_id for s in lapsed.starts] == [200] and lapsed.promises == {}


def test_promised_cards_the_job_does_not_take_are_free_for_the_jobs_after_it() -> None:
    cl = Cluster().node("n1", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 4}), "b": quota()}, grace=GRACE)
    promise = {100: Promise(100, tuple(cl.dev(f"n1/{i}") for i in range(4)), T0)}
    ask = job(100, "a", n=2, cls="high")
    later = job(300, "b", n=2, cls="low")
    out = _at(0, pol, cl, [ask, later], [], promise)
    assert sorted(s.job_id for s in out.starts) == [100, 300]
    assert out.promises == {}
    used = [x.device_id for s in out.starts for x in s.slots]
    assert sorted(used) == sorted(promise[100].devices)


def test_a_job_no_longer_waiting_drops_its_promise_and_holds_nothing() -> None:
    cl = Cluster().node("n1", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 4}), "b": quota()}, grace=GRACE)
    promise = {100: Promise(100, tuple(cl.dev(f"n1/{i}") for i in range(4)), T0 + GRACE)}
    other = job(300, "b", n=4, cls="low")
    out = _at(0, pol, cl, [other], [], promise)  # job 100 was cancelled
    assert [s.job_id for s in out.starts] == [300] and out.promises == {}


def test_free_cards_of_a_plan_are_held_from_later_jobs_of_the_same_tick() -> None:
    cl = Cluster().node("n1", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 4}), "c": quota()}, grace=GRACE)
    running = [job(i + 1, "c", slots=[cl.dev(f"n1/{i}")], cls="low", started=-600) for i in range(2)]
    ask = job(100, "a", n=4, cls="normal")
    later = job(300, "c", n=1, cls="low", est=60)  # ranks below, would fit on a free card
    snap = snapshot(pol, cl, [ask, later], running)
    snap.promises = {}
    out = decide(snap)
    assert out.waiting[100].reason == reasons.PREEMPTION_GRACE
    assert sorted(out.promises[100].devices) == [cl.dev(f"n1/{i}") for i in range(4)]
    assert out.starts == [] and out.waiting[300].reason == reasons.RESOURCES
    # A caller that keeps no promises gets the old behaviour: the later job takes a promised card.
    legacy = decide(snapshot(pol, cl, [ask, later], running))
    assert [s.job_id for s in legacy.starts] == [300]


def test_slice_requests_get_no_promise() -> None:
    cl = Cluster().node("n1", devices=1)
    pol = policy({"a": quota(guaranteed={"devices": 1}), "c": quota()}, grace=GRACE)
    running = [job(1, "c", slots=[cl.dev("n1/0")], cls="low", started=-600)]
    out = _at(0, pol, cl, [job(100, "a", vnpu="vir05_1c_8g", chip="910B4")], running, {})
    assert out.waiting[100].reason == reasons.PREEMPTION_GRACE
    assert out.promises == {}


# -- served within the grace, whatever arrives meanwhile ---------------------------------------


def _advance(snap: Snapshot, out: Decisions, step: float, arrivals: list[JobState]) -> Snapshot:
    """The next tick's snapshot: starts run, evicted jobs gone, victims leaving (and for which job),
    preemptions called off, promises handed back."""
    now = snap.now.timestamp()
    started = {s.job_id: s for s in out.starts}
    leaving = {p.job_id: p for p in out.preemptions}
    running = [j for j in snap.running if j.id not in set(out.evictions)]
    for j in running:
        if j.id in out.called_off:  # (decide cleared them on these objects already)
            assert j.preempt_deadline is None and j.preempted_for is None
        if j.id in leaving and j.preempt_deadline is None:
            j.preempt_deadline = leaving[j.id].grace_deadline
            j.preempted_for = leaving[j.id].for_job
    pending = []
    for j in snap.pending:
        if j.id in started:
            j.started_at = now
            j.slots = tuple(started[j.id].slots)
            running.append(j)
        else:
            pending.append(j)
    nxt = Snapshot(
        snap.now + timedelta(seconds=step),
        snap.policy,
        snap.nodes,
        pending + arrivals,
        running,
        snap.templates,
        snap.usage,
        snap.month_device_hours,
    )
    nxt.promises = dict(out.promises)
    return nxt


@st.composite
def contested_reclaims(draw: st.DrawFn) -> tuple[Snapshot, list[list[JobState]], float]:
    """Team a asks within its guarantee; borrowers hold the cluster (a few cards may be free) and keep
    sending jobs: higher-class ones, and short low ones that would fit on a free card."""
    cl, total = small_cluster(draw)
    g_a = draw(st.integers(1, total))
    used_a = draw(st.integers(0, g_a - 1))
    want = draw(st.integers(1, min(4, g_a - used_a)))
    teams = {"a": quota(guaranteed={"devices": g_a}), "b": quota(guaranteed={"devices": total - g_a}), "c": quota()}
    # The subject is the promise; the reclaim bound (tests/engine/test_engine_units.py) is set above
    # every borrower's run here (they ran up to 2.5 h, past the default 2 h), so reclaim always may.
    pol = replace(policy(teams, backfill=draw(st.booleans()), grace=GRACE), reclaim_loss_limit_s=12 * 3600.0)
    ids = [d.id for n in cl.nodes for d in n.devices]
    owners = ["a"] * used_a + [draw(st.sampled_from(("c", "c", "c", None))) for _ in range(total - used_a)]
    running = [
        job(i + 1, team, cls="normal" if team == "a" else draw(st.sampled_from(("low", "normal"))), slots=[dev],
            started=-draw(st.integers(60, 9000)), est=86400.0)
        for i, (dev, team) in enumerate(zip(ids, owners, strict=True))
        if team is not None  # a free card
    ]  # fmt: skip
    ask = job(500, "a", want, "normal", est=86400.0)
    step = draw(st.sampled_from((30.0, 60.0, 100.0)))
    ticks = int(GRACE // step) + 2
    # With the job: short low jobs of the borrower, which would fit on a free card.
    beside = [
        job(900 + k, "c", draw(st.integers(1, 2)), "low", submitted=-1, est=60.0)
        for k in range(draw(st.integers(0, 2)))
    ]
    arrivals = [  # in the ticks after
        [
            job(1000 + 10 * t + k, draw(st.sampled_from(("b", "c"))), draw(st.integers(1, 4)),
                draw(st.sampled_from(("high", "high", "low"))), submitted=t * step - 1,
                est=draw(st.sampled_from((60.0, 86400.0))))
            for k in range(draw(st.integers(0, 2)))
        ]
        for t in range(1, ticks + 1)
    ]  # fmt: skip
    snap = snapshot(pol, cl, [ask, *beside], running)
    snap.promises = {}  # a caller that keeps promises (none yet)
    return snap, arrivals, step


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(contested_reclaims())
def test_a_team_within_its_guarantee_is_served_by_the_grace_deadline(
    world: tuple[Snapshot, list[list[JobState]], float],
) -> None:
    snap, arrivals, step = world
    due: float | None = None
    for t, batch in enumerate(arrivals):
        out = decide(snap)
        now = snap.now.timestamp()
        if any(s.job_id == 500 for s in out.starts):
            assert due is None or now <= due + step, (now, due)
            return
        wait = out.waiting[500]
        if due is None:
            assert wait.reason == reasons.PREEMPTION_GRACE, wait
            due = wait.estimated_start
        assert due is not None
        assert now < due, f"tick {t}: still waiting at {now - T0:.0f}s, due at {due - T0:.0f}s: {wait}"
        snap = _advance(snap, out, step, batch)
    raise AssertionError("the job never started")


def test_a_search_made_on_a_broken_promise_leaves_the_other_promised_cards_claimed() -> None:
    """Job 100's promise is broken (card 2 now runs a job of its own team), so it searches first and
    fails; job 300, later and within its guarantee, must still not count 100's leaving cards."""
    from scheduling.engine.policy import Ordering

    cl = Cluster().node("n1", devices=4)
    teams = {"a": quota(guaranteed={"devices": 4}), "b": quota(guaranteed={"devices": 4}), "c": quota()}
    pol = policy(teams, grace=GRACE, ordering=Ordering(weight_priority_class=0.0, weight_fair_share=0.0))
    running = [job(i + 1, "c", slots=[cl.dev(f"n1/{i}")], cls="low", deadline=100) for i in (0, 1, 3)]
    running.append(job(4, "a", slots=[cl.dev("n1/2")]))
    promise = {100: Promise(100, tuple(cl.dev(f"n1/{i}") for i in range(4)), T0 + 100)}
    ask = job(100, "a", n=4, submitted=-300)
    other = job(300, "b", n=1, submitted=-100)
    out = _at(0, pol, cl, [ask, other], running, promise)
    assert out.waiting[100].reason == reasons.RESOURCES
    assert out.waiting[300].reason == reasons.RESOURCES, out.waiting[300]
    assert 300 not in out.promises


def _two_asks_world(team_a):
    """Team a runs nothing; team c borrows two 4-card nodes; a third node is free."""
    cl = Cluster().node("n1", devices=4).node("n2", devices=4).node("n3", devices=4)
    pol = policy({"a": team_a, "c": quota()}, grace=GRACE)
    running = [
        job(1 + i, "c", slots=[cl.dev(f"n{2 + i // 4}/{i % 4}")], cls="low", est=50_000, started=-600) for i in range(8)
    ]
    pending = [
        job(10, "a", n=4, est=1000, submitted=-900),  # starts on n1
        job(11, "a", n=4, est=2000, submitted=-800),  # reclaims n2: promised
        job(12, "a", n=4, est=100, submitted=-700),
    ]
    return cl, pol, running, pending


def test_a_promised_job_counts_toward_its_teams_max_so_no_one_is_preempted_for_a_job_beyond_it() -> None:
    # a may hold 8: the started job and the promised one fill it. Job 12 would take a to 12
    # devices once both run, so it must not preempt anyone: its victims would lose their
    # work for a job that could not start when they are gone.
    cl, pol, running, pending = _two_asks_world(quota(guaranteed={"devices": 8}, max={"devices": 8}))
    out = _at(0, pol, cl, pending, running, {})
    assert [s.job_id for s in out.starts] == [10]
    assert out.waiting[11].reason == reasons.PREEMPTION_GRACE and list(out.promises) == [11]
    assert out.waiting[12].reason == reasons.QUOTA_MAX_DEVICES
    assert {p.for_job for p in out.preemptions} == {11} and len(out.preemptions) == 4
    # The next ticks, the promise handed back: still counted, and never against the job itself.
    for r in running:
        if any(p.job_id == r.id for p in out.preemptions):
            r.preempt_deadline = T0 + GRACE
    started = job(10, "a", n=4, est=1000, submitted=-900, slots=[s.device_id for s in out.starts[0].slots], started=0)
    waiting = [pending[1], pending[2]]
    mid = _at(100, pol, cl, waiting, [*running, started], out.promises)
    assert mid.waiting[11].reason == reasons.PREEMPTION_GRACE and mid.promises == out.promises
    assert mid.waiting[12].reason == reasons.QUOTA_MAX_DEVICES and mid.preemptions == []
    due = _at(GRACE, pol, cl, waiting, [*running, started], out.promises)
    assert [s.job_id for s in due.starts] == [11]
    assert due.waiting[12].reason == reasons.QUOTA_MAX_DEVICES and due.preemptions == []


def test_a_promised_job_counts_toward_its_teams_guarantee_so_reclaim_stops_at_it() -> None:
    # a is guaranteed 8: 4 running and 4 promised are all of it. Job 12 is beyond the
    # guarantee, and "normal" may preempt nobody by class: it waits for cards.
    cl, pol, running, pending = _two_asks_world(quota(guaranteed={"devices": 8}))
    out = _at(0, pol, cl, pending, running, {})
    assert list(out.promises) == [11] and {p.for_job for p in out.preemptions} == {11}
    assert out.waiting[12].reason == reasons.RESOURCES


@st.composite
def several_asks(draw: st.DrawFn) -> Snapshot:
    """Team a, with a guarantee and maybe a max and a max of jobs, asks for several jobs at once
    while team c borrows most of the cluster."""
    cl, total = small_cluster(draw)
    guaranteed = draw(st.integers(1, total))
    cap = draw(st.one_of(st.none(), st.integers(guaranteed, total)))
    a = quota(
        guaranteed={"devices": guaranteed},
        max=None if cap is None else {"devices": cap},
        max_jobs=draw(st.one_of(st.none(), st.integers(1, 4))),
        hours=draw(st.one_of(st.none(), st.sampled_from([30.0, 100.0, 250.0]))),  # a job: 24 h per card
    )
    pol = policy({"a": a, "c": quota()}, backfill=draw(st.booleans()), grace=GRACE)
    ids = [d.id for n in cl.nodes for d in n.devices]
    running = [
        job(i + 1, "c", cls="low", slots=[dev], started=-draw(st.integers(60, 9000)), est=86400.0)
        for i, dev in enumerate(ids)
        if draw(st.integers(0, 4))  # a few cards free
    ]
    asks = [
        job(500 + k, "a", draw(st.integers(1, 4)), "normal", submitted=-100 + k, est=86400.0)
        for k in range(draw(st.integers(2, 4)))
    ]
    snap = snapshot(pol, cl, asks, running)
    snap.promises = {}
    return snap


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(several_asks())
def test_no_job_holding_a_promise_is_refused_by_its_teams_own_limits(snap: Snapshot) -> None:
    """Victims lose their work for the job they were preempted for: that job must still be
    admitted when its cards come free. A later job of its team is not admitted on the room the
    plan took (the plan counts, as in Kueue), so the team's limits never refuse it: neither its
    ``max`` devices, nor its max jobs, nor its monthly device-hours."""
    own_limits = (reasons.QUOTA_MAX_DEVICES, reasons.QUOTA_MAX_JOBS, reasons.MONTHLY_BUDGET_EXHAUSTED)
    for _ in range(5):
        out = decide(snap)
        for jid in snap.promises or {}:
            if jid in out.waiting:
                assert out.waiting[jid].reason not in own_limits, (
                    jid,
                    out.waiting[jid],
                )
        snap = _advance(snap, out, 100.0, [])


# -- preemptions called off at their deadline ----------------------------------------------------


def _victims_of_a_job_that_started_elsewhere():
    """Team c's four jobs on n1 were preempted for job 100 of team a, which then started on n2
    (its cards came free early). Their grace ends at GRACE."""
    cl = Cluster().node("n1", devices=4).node("n2", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 4}), "c": quota()}, grace=GRACE)
    victims = [job(i + 1, "c", slots=[cl.dev(f"n1/{i}")], cls="low", started=-600, deadline=GRACE) for i in range(4)]
    for v in victims:
        v.preempted_for = 100
    elsewhere = job(100, "a", n=4, slots=[cl.dev(f"n2/{i}") for i in range(4)], started=-100)
    return cl, pol, victims, elsewhere


def test_a_victim_whose_job_started_elsewhere_runs_on_at_its_deadline() -> None:
    cl, pol, victims, elsewhere = _victims_of_a_job_that_started_elsewhere()
    later = job(300, "c", n=1, cls="low", est=60)  # would take a card of an evicted victim
    before = _at(GRACE - 1, pol, cl, [later], [*victims, elsewhere], {})
    assert before.called_off == [] and before.evictions == []  # not before the deadline
    out = _at(GRACE, pol, cl, [later], [*victims, elsewhere], {})
    assert out.called_off == [1, 2, 3, 4] and out.evictions == []
    assert all(v.preempt_deadline is None and v.preempted_for is None for v in victims)
    assert out.waiting[300].reason == reasons.RESOURCES  # the victims' cards stay theirs


def test_a_victim_runs_out_its_grace_when_its_job_still_waits_or_a_promise_counts_on_it() -> None:
    cl, pol, victims, elsewhere = _victims_of_a_job_that_started_elsewhere()
    waiting = job(100, "a", n=4)  # the job it was for still waits
    out = _at(GRACE, pol, cl, [waiting], victims, {})
    assert out.called_off == [] and out.evictions == [1, 2, 3, 4]

    cl, pol, victims, elsewhere = _victims_of_a_job_that_started_elsewhere()
    other = job(200, "a", n=2)  # planned on two of the leaving cards in a tick between
    promise = {200: Promise(200, (cl.dev("n1/0"), cl.dev("n1/1")), T0 + GRACE)}
    out = _at(GRACE, pol, cl, [other], [*victims, elsewhere], promise)
    assert out.called_off == [3, 4] and sorted(out.evictions) == [1, 2]
    assert [s.job_id for s in out.starts] == [200]


def test_no_call_off_without_the_job_it_was_for_or_without_promises_kept() -> None:
    cl, pol, victims, elsewhere = _victims_of_a_job_that_started_elsewhere()
    victims[0].preempted_for = None  # a caller that does not say
    out = _at(GRACE, pol, cl, [], [*victims, elsewhere], {})
    assert out.called_off == [2, 3, 4] and out.evictions == [1]
    cl, pol, victims, elsewhere = _victims_of_a_job_that_started_elsewhere()
    snap = snapshot(pol, cl, [], [*victims, elsewhere], now=NOW + timedelta(seconds=GRACE))
    assert snap.promises is None  # keeps no promises: cannot tell what counts on the cards
    out = decide(snap)
    assert out.called_off == [] and out.evictions == [1, 2, 3, 4]


@st.composite
def reclaims_with_early_ends(draw: st.DrawFn) -> tuple[Snapshot, list[list[int]]]:
    """:func:`several_asks`, and between ticks some of team c's jobs end early (cards come free
    before the victims' deadlines, so a job may start elsewhere and leave its victims unneeded)."""
    snap = draw(several_asks())
    ids = [j.id for j in snap.running]
    ends = [draw(st.lists(st.sampled_from(ids), max_size=3, unique=True)) if ids else [] for _ in range(6)]
    return snap, ends


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reclaims_with_early_ends())
def test_a_called_off_preemption_never_takes_cards_a_promise_counts_on(
    world: tuple[Snapshot, list[list[int]]],
) -> None:
    """Whatever ends early: a preemption is only called off once the job it was for stopped
    waiting, and never under a promise in force; every promised job starts by its deadline."""
    snap, ends = world
    due: dict[int, float] = {}
    for gone in ends:
        out = decide(snap)
        now = snap.now.timestamp()
        pending = {j.id for j in snap.pending}
        promised = {dev for p in (snap.promises or {}).values() if p.job_id in pending for dev in p.devices}
        running = {j.id: j for j in snap.running}
        for jid in out.called_off:
            assert not any(slot.device_id in promised for slot in running[jid].slots), jid
        started = {s.job_id for s in out.starts}
        for jid, until in list(due.items()):
            if jid in started:
                del due[jid]
            else:
                assert now <= until, f"job {jid} promised for {until - T0:.0f}s, still waiting at {now - T0:.0f}s"
        for jid, promise in out.promises.items():
            due.setdefault(jid, promise.until)
        snap = _advance(snap, out, 100.0, [])
        snap.running = [j for j in snap.running if j.id not in gone or j.preempt_deadline is not None]


def test_a_promised_job_takes_its_freed_cards_though_a_job_in_front_is_blocked() -> None:
    """Found by the property above: backfill off, team a's 1-card job preempts within its guarantee,
    then the team's earlier 2-card job starts on cards that came free early, so the 1-card job is no
    longer within the guarantee when its card comes free, and its other 2-card job blocks the node.
    Its card was freed for it and held from every other job: it takes it at the deadline."""
    cl = Cluster().node("n0", devices=4)
    pol = policy({"a": quota(guaranteed={"devices": 1}), "c": quota()}, backfill=False, grace=GRACE)
    running = [  # jobs 3 and 4 have run least: the cheapest victims
        job(i + 1, "c", cls="low", slots=[cl.dev(f"n0/{i}")], started=-61 if i < 2 else -60, est=86400.0)
        for i in range(4)
    ]
    asks = [job(500 + k, "a", n, "normal", submitted=-100 + k, est=86400.0) for k, n in enumerate((2, 2, 1))]
    snap = snapshot(pol, cl, asks, running)
    snap.promises = {}
    out = decide(snap)
    assert [(p.job_id, p.for_job) for p in out.preemptions] == [(3, 502)]
    assert out.promises[502].devices == (cl.dev("n0/2"),)
    for _ in range(2):
        snap = _advance(snap, out, 100.0, [])
        out = decide(snap)
    snap.running = [j for j in snap.running if j.id not in (1, 2)]  # ended early
    snap = _advance(snap, out, 100.0, [])
    out = decide(snap)  # the deadline: job 3 leaves
    assert out.evictions == [3]
    assert {s.job_id: [x.device_id for x in s.slots] for s in out.starts} == {
        500: [cl.dev("n0/0"), cl.dev("n0/1")],
        502: [cl.dev("n0/2")],
    }
    assert out.waiting[501].reason == reasons.RESOURCES
    assert 502 not in out.promises
