"""Invariants over random clusters, queues and policies (hypothesis)."""

from __future__ import annotations

import math

from engine_factory import TEMPLATES, Cluster, job, policy, quota, small_cluster, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.decide import decide
from scheduling.engine.policy import Reservation
from scheduling.engine.snapshot import JobState, Snapshot

TEAMS = ("a", "b", "c")
CLASSES = ("high", "normal", "low")
SHAPES = {"910B4": (8, 1), "910A": (8, 2), "310P3": (4, 1)}


@st.composite
def worlds(draw: st.DrawFn, reservations: bool = True, starvation: bool = False) -> Snapshot:
    cl = Cluster()
    for n in range(draw(st.integers(1, 4))):
        chip = draw(st.sampled_from(sorted(SHAPES)))
        size, groups = SHAPES[chip]
        bad = draw(st.lists(st.integers(0, size - 1), max_size=2))
        cl.node(f"n{n}", chip, size, groups, bad, draw(st.booleans()) or n > 0)
    teams = {}
    for t in TEAMS:
        teams[t] = quota(
            guaranteed={"devices": draw(st.sampled_from((0, 2, 4)))},
            max=draw(st.sampled_from(({}, {"devices": 6}, {"devices": 12, "devices/910A": 4}))),
            max_jobs=draw(st.sampled_from((None, 3))),
        )
    res = []
    if reservations and draw(st.booleans()):
        res.append(Reservation("r", draw(st.sampled_from((0.25, 0.5))), None, frozenset({"high"})))
    pol = policy(
        teams,
        backfill=draw(st.booleans()),
        strategy=draw(st.sampled_from(("binpack", "spread"))),
        reservations=res,
        starvation=draw(st.sampled_from((1000.0, 5000.0))) if starvation else None,
    )
    # Running jobs: fill random free cards (whole) or slices, within each team's max.
    running: list[JobState] = []
    jid = 0
    for node in cl.nodes:
        for dev in node.devices:
            roll = draw(st.integers(0, 3))
            if roll == 0:
                continue
            jid += 1
            team = draw(st.sampled_from(TEAMS))
            kw = {"team": team, "cls": draw(st.sampled_from(CLASSES)), "started": -draw(st.integers(60, 7200))}
            if roll == 3 and dev.chip_model in ("310P3", "910B4"):
                tmpl = "vir02" if dev.chip_model == "310P3" else "vir05_1c_8g"
                running.append(job(jid, vnpu=tmpl, slots=[(dev.id, tmpl)], chip=dev.chip_model, **kw))
            else:
                running.append(job(jid, slots=[dev.id], **kw))
    pending = []
    for i in range(draw(st.integers(0, 12))):
        vnpu = draw(st.sampled_from((None, None, None, "vir02", "vir05_1c_8g")))
        chip = None if vnpu is None else ("310P3" if vnpu == "vir02" else "910B4")
        pending.append(
            job(
                1000 + i,
                draw(st.sampled_from(TEAMS)),
                1 if vnpu else draw(st.sampled_from((1, 2, 3, 4, 8, 16))),
                draw(st.sampled_from(CLASSES)),
                submitted=-draw(st.integers(1, 10000)),
                est=draw(st.integers(60, 20000)),
                chip=chip if vnpu else draw(st.sampled_from((None, None, "910B4", "910A"))),
                vnpu=vnpu,
            )
        )
    return snapshot(pol, cl, pending, running)


def _units(snap: Snapshot, device_id: int, template: str | None) -> tuple[str, float]:
    dev = next(d for n in snap.nodes for d in n.devices if d.id == device_id)
    if template is None:
        return dev.chip_model, 1.0
    return dev.chip_model, TEMPLATES[(dev.chip_model, template)].ai_cores / dev.ai_cores


PROPS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPS
@given(worlds())
def test_no_device_over_allocated_and_gangs_whole(snap: Snapshot) -> None:
    out = decide(snap)
    devices = {d.id: (node, d) for node in snap.nodes for d in node.devices}
    evicted = set(out.evictions)
    whole: set[int] = set()
    cores: dict[int, int] = {}
    mem: dict[int, int] = {}
    pending = {j.id: j for j in snap.pending}
    holders = [(j, j.slots) for j in snap.running if j.id not in evicted]
    holders += [(pending[s.job_id], s.slots) for s in out.starts]
    for _j, slots in holders:
        for slot in slots:
            if slot.vnpu_template is None:
                assert slot.device_id not in whole and slot.device_id not in cores, "card given twice"
                whole.add(slot.device_id)
            else:
                assert slot.device_id not in whole, "slice on a whole card"
                dev = devices[slot.device_id][1]
                t = TEMPLATES[(dev.chip_model, slot.vnpu_template)]
                cores[slot.device_id] = cores.get(slot.device_id, 0) + t.ai_cores
                mem[slot.device_id] = mem.get(slot.device_id, 0) + t.memory_mb
                assert cores[slot.device_id] <= dev.ai_cores and mem[slot.device_id] <= dev.hbm_mb
    for start in out.starts:
        j = pending[start.job_id]
        nodes = {devices[s.device_id][0].name for s in start.slots}
        chips = {devices[s.device_id][1].chip_model for s in start.slots}
        assert len(chips) == 1
        for s in start.slots:
            node, dev = devices[s.device_id]
            assert dev.usable and node.schedulable
        if j.vnpu_template:
            assert len(start.slots) == 1
            continue
        assert len(start.slots) == j.num_devices, "gang started partly"
        node_size = max(len([d for d in n.devices if d.chip_model in chips]) for n in snap.nodes)
        if j.num_devices <= node_size:
            assert len(nodes) == 1
        else:
            for name in nodes:  # whole nodes only
                node = next(n for n in snap.nodes if n.name == name)
                assert {d.id for d in node.devices} <= {s.device_id for s in start.slots}
    assert set(out.waiting) | {s.job_id for s in out.starts} == set(pending)


@PROPS
@given(worlds())
def test_max_never_exceeded_and_reservations_respected(snap: Snapshot) -> None:
    out = decide(snap)
    pending = {j.id: j for j in snap.pending}
    evicted = set(out.evictions)
    before: dict[tuple[str, str], float] = {}
    after: dict[tuple[str, str], float] = {}
    for j in snap.running:
        if j.id in evicted:
            continue
        for s in j.slots:
            chip, u = _units(snap, s.device_id, s.vnpu_template)
            for key in ("devices", f"devices/{chip}"):
                before[(j.team, key)] = before.get((j.team, key), 0) + u
                after[(j.team, key)] = after.get((j.team, key), 0) + u
    for start in out.starts:
        j = pending[start.job_id]
        for s in start.slots:
            chip, u = _units(snap, s.device_id, s.vnpu_template)
            for key in ("devices", f"devices/{chip}"):
                after[(j.team, key)] = after.get((j.team, key), 0) + u
    for (team, key), used in after.items():
        cap = snap.policy.team(team).quota.max.get(key)
        if cap is not None:
            assert used <= max(cap, before.get((team, key), 0)) + 1e-9, (team, key, used, cap)
    for res in snap.policy.reservations:
        others = [pending[s.job_id] for s in out.starts if pending[s.job_id].priority_class not in res.priority_classes]
        if not others:
            continue
        usable = [d for n in snap.nodes if n.schedulable for d in n.devices if d.usable]
        held = math.floor(res.ratio * len(usable) + 1e-9)
        taken: dict[int, float] = {}
        reserved_use = 0.0
        jobs = [(j, j.slots) for j in snap.running if j.id not in evicted]
        jobs += [(pending[s.job_id], s.slots) for s in out.starts]
        usable_ids = {d.id for d in usable}
        for j, slots in jobs:
            for s in slots:
                if s.device_id not in usable_ids:
                    continue
                _, u = _units(snap, s.device_id, s.vnpu_template)
                taken[s.device_id] = taken.get(s.device_id, 0) + u
                if j.priority_class in res.priority_classes:
                    reserved_use += u
        free = len(usable_ids) - sum(min(v, 1.0) for v in taken.values())
        assert free + 1e-9 >= held - reserved_use, (free, held, reserved_use)


@st.composite
def guarantee_worlds(draw: st.DrawFn) -> tuple[Snapshot, int]:
    """Team a asks for one card within its guarantee; borrowers hold the cluster."""
    cl, total = small_cluster(draw)
    g_a = draw(st.integers(1, total))
    g_b = draw(st.integers(0, total - g_a))
    used_a = draw(st.integers(0, g_a - 1))
    teams = {"a": quota(guaranteed={"devices": g_a}), "b": quota(guaranteed={"devices": g_b}), "c": quota()}
    pol = policy(teams, backfill=draw(st.booleans()), strategy=draw(st.sampled_from(("binpack", "spread"))))
    running = []
    ids = [d.id for n in cl.nodes for d in n.devices]
    owners = ["a"] * used_a + [draw(st.sampled_from(("b", "c"))) for _ in range(total - used_a)]
    for i, (dev, team) in enumerate(zip(ids, owners, strict=True)):
        running.append(
            job(i + 1, team, cls=draw(st.sampled_from(CLASSES)), slots=[dev], started=-draw(st.integers(60, 9000)))
        )
    ask = job(500, "a", 1, draw(st.sampled_from(CLASSES)))
    return snapshot(pol, cl, [ask], running), ask.id


@PROPS
@given(guarantee_worlds())
def test_team_within_guarantee_is_served_or_its_borrowers_preempted(world: tuple[Snapshot, int]) -> None:
    snap, ask = world
    out = decide(snap)
    if any(s.job_id == ask for s in out.starts):
        return
    wait = out.waiting[ask]
    if wait.reason == "Resources" and "reclaiming cards would throw away" in wait.detail:
        # The reclaim bound (policy ``preemption.reclaimLossLimit``): allowed only when every job
        # of a team over its guarantee has run longer than the bound (none checkpoints here),
        # and no class preemption was open to it (that would have been planned instead).
        now = snap.now.timestamp()
        limit = snap.policy.reclaim_loss_limit_s
        assert not out.preemptions, wait
        for team in ("b", "c"):
            jobs = [j for j in snap.running if j.team == team]
            if len(jobs) > snap.policy.team(team).quota.guaranteed.get("devices", 0):
                assert all(now - (j.started_at or now) > limit for j in jobs), (team, wait)
        return
    assert wait.reason == "PreemptionGrace", wait
    victims = [p for p in out.preemptions if p.for_job == ask]
    assert victims, "no borrower asked to leave"
    by_id = {j.id: j for j in snap.running}
    for p in victims:
        # Reclaim takes from other teams; the team's own lower-class jobs may go by class preemption.
        assert by_id[p.job_id].team != "a" or p.reason == "ClassPreemption"
        assert p.grace_deadline == snap.now.timestamp() + snap.policy.grace_period_s
    assert sum(len(by_id[p.job_id].slots) for p in victims) >= 1
