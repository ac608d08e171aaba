"""The tick's shortcuts give what the plain rules give.

* ``Tick.order`` (one float per job, plain lists) is :func:`priority.order_pending`;
* a layout taken from the cache (:class:`capacity.Layout`) decides exactly as a
  freshly built one, also when the caller flips fields of the same objects
  between ticks (the simulator's way) or rebuilds them (the database's way);
* ``Slot`` objects shared between ticks are values.

The full comparison against a reference copy of the engine is in
``test_engine_differential.py`` (needs ``NPUPORTAL_REF_ENGINE``).
"""

from __future__ import annotations

import copy
import random

import pytest
from hypothesis import HealthCheck, given, settings
from test_engine_properties import worlds

from scheduling.engine.bench_core import make_synthetic_snapshot
from scheduling.engine.capacity import Layout
from scheduling.engine.decide import Tick, decide
from scheduling.engine.placement import need_of
from scheduling.engine.priority import class_factors, order_pending
from scheduling.engine.snapshot import Decisions, Snapshot


def canon(out: Decisions) -> tuple:
    return (
        [(s.job_id, tuple((x.device_id, x.vnpu_template) for x in s.slots), s.backfilled) for s in out.starts],
        [(p.job_id, p.reason, p.grace_deadline, p.for_job) for p in out.preemptions],
        list(out.evictions),
        {j: (w.reason, w.detail, w.estimated_start) for j, w in out.waiting.items()},
    )


def fresh(snap: Snapshot) -> tuple:
    """Decisions with no cached layout to take."""
    Layout._idle.clear()
    return canon(decide(copy.deepcopy(snap)))


def reference_order(snap: Snapshot) -> list[int]:
    tick = Tick(snap)
    fair = tick.fair_share_of()

    def size_units(job):  # type: ignore[no-untyped-def]
        need = need_of(tick.state, job, tick.need_cache)
        return need.units[need.chips[0]] if need.chips else float(job.num_devices)

    ordered = order_pending(
        snap.pending,
        snap.policy.ordering,
        class_factors(snap.policy),
        lambda team, user: fair[(team, user)],
        tick.now,
        size_units,
        tick.state.largest_node,
    )
    return [job.id for job in ordered]


def tick_order(snap: Snapshot) -> list[int]:
    idx, _ = Tick(snap).order()
    return [snap.pending[i].id for i in idx]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_tick_order_is_order_pending(snap: Snapshot) -> None:
    assert tick_order(snap) == reference_order(snap)


@pytest.mark.parametrize("seed", range(6))
def test_tick_order_is_order_pending_with_ties(seed: int) -> None:
    rng = random.Random(seed)
    snap = make_synthetic_snapshot(300, 20, 8, 0.5, 4, seed)
    for job in snap.pending:  # many equal scores: submission time and id decide
        if rng.random() < 0.5:
            job.submitted_at = snap.pending[0].submitted_at
        if rng.random() < 0.3:
            job.user = "u0"
            job.team = "team0"
    assert tick_order(snap) == reference_order(snap)


@pytest.mark.parametrize("seed", range(8))
def test_cached_layout_decides_like_a_fresh_one(seed: int) -> None:
    rng = random.Random(seed)
    snap = make_synthetic_snapshot(200, 30, 8, 0.7, 6, seed)
    for tick in range(10):
        want = fresh(snap)
        assert canon(decide(copy.deepcopy(snap))) == want, f"rebuilt objects, tick {tick}"  # database way
        assert canon(decide(snap)) == want, f"same objects, tick {tick}"  # simulator way
        node = rng.choice(snap.nodes)
        dev = rng.choice(node.devices)
        roll = rng.random()
        if roll < 0.25:
            dev.usable = not dev.usable
        elif roll < 0.4:
            node.schedulable = not node.schedulable
        elif roll < 0.5:
            dev.hbm_mb //= 2
        elif roll < 0.6:
            dev.topology_group = f"{node.name}/other"
        elif roll < 0.7:
            node.devices.reverse()
        elif roll < 0.8:
            snap.nodes.pop()
        # else nothing changes: the cached layout is taken as it is


def test_layout_is_reused_only_for_the_same_inventory() -> None:
    snap = make_synthetic_snapshot(10, 4, 8, 0.5, 2, 1)
    Layout._idle.clear()
    decide(snap)
    (first,) = Layout._idle
    decide(copy.deepcopy(snap))
    assert Layout._idle[0] is first  # taken and put back
    snap.nodes[0].devices[0].usable = not snap.nodes[0].devices[0].usable
    decide(snap)
    assert Layout._idle[0] is not first and first in Layout._idle
    assert len(Layout._idle) <= Layout.KEEP


def test_a_tick_holds_its_layout_until_it_ends() -> None:
    snap = make_synthetic_snapshot(20, 4, 8, 0.5, 2, 2)
    Layout._idle.clear()
    decide(snap)
    one = Tick(snap)  # takes the cached layout
    other = Tick(snap)  # may not share it: builds its own
    assert one.state._layout is not other.state._layout
    assert canon(one.run()) == canon(other.run())


@pytest.mark.parametrize("whole", [True, False], ids=["whole-cards", "with-slices"])
@pytest.mark.parametrize("seed", range(6))
def test_reused_running_jobs_decide_like_fresh_ones(seed: int, whole: bool) -> None:
    """The simulator's way: the same job objects tick after tick, their fields changed in place.

    A running job seen last tick keeps its occupant (only the grace deadline and
    expected end are per tick), and with whole cards only the per-team totals and
    the card map are carried from tick to tick; changing ``now``, a deadline, the
    running list's order or membership, or starting what the tick decided must
    still decide as a fresh build does.
    """
    from datetime import timedelta

    rng = random.Random(seed)
    snap = make_synthetic_snapshot(150, 24, 8, 0.7, 5, seed)
    if whole:
        snap.running = [j for j in snap.running if not j.vnpu_template]
        snap.pending = [j for j in snap.pending if not j.vnpu_template]
    snap.inventory_key = object()
    by_id = {j.id: j for j in snap.pending}
    for tick in range(16):
        kept = list(Layout._idle)
        want = fresh(snap)
        Layout._idle[:] = kept  # this test's layout (and what it carries from tick to tick) stays
        out = decide(snap)
        assert canon(out) == want, f"tick {tick}"
        roll = rng.random()
        running = snap.running
        if roll < 0.25 and out.starts:  # the simulator's way of applying starts: same objects, moved
            for start in out.starts[: rng.randint(1, 5)]:
                job = by_id[start.job_id]
                snap.pending.remove(job)
                job.slots = start.slots
                job.started_at = snap.now.timestamp()
                running.append(job)
        elif roll < 0.4 and running:
            job = rng.choice(running)
            job.preempt_deadline = None if job.preempt_deadline else snap.now.timestamp() + rng.uniform(-60, 600)
        elif roll < 0.5:
            snap.now += timedelta(seconds=rng.uniform(1, 7200))
        elif roll < 0.7 and running:
            running.append(running.pop(rng.randrange(len(running))))  # order changes (swap-remove lists do)
        elif roll < 0.85 and running:
            running.pop(rng.randrange(len(running)))  # a job ended: its cards are free again
        elif roll < 0.92 and running:
            # Bad data: a second job on cards another one holds (both count, as a fresh build does).
            twin = copy.copy(rng.choice(running))
            twin.id = 10**6 + tick
            if rng.random() < 0.5:
                twin.slots = tuple(list(twin.slots))  # its own tuple (else it shares the other's)
            running.append(twin)
        else:
            job = rng.choice(running)
            job.slots = tuple(reversed(job.slots))  # a new tuple: seen as a new run


def test_inventory_key_stands_for_the_fingerprint() -> None:
    """With a key, equal keys share a layout without reading the devices; ``None`` never matches a key."""
    snap = make_synthetic_snapshot(10, 4, 8, 0.5, 2, 3)
    Layout._idle.clear()
    key = object()
    snap.inventory_key = key
    decide(snap)
    (first,) = Layout._idle
    assert first.key is key and first.fingerprint is None
    decide(copy.deepcopy(snap))  # deepcopy makes a new key object: a new layout
    assert Layout._idle[0] is not first
    decide(snap)
    assert Layout._idle[0] is first  # same key: reused
    snap.inventory_key = None
    decide(snap)
    assert Layout._idle[0] is not first and Layout._idle[0].key is None


@settings(max_examples=200, deadline=None)
@given(worlds())
def test_user_factors_are_the_classic_tree_factors(snap: Snapshot) -> None:
    """The per-policy tree shape gives bit-identical factors to the full table."""
    from scheduling.engine.fairshare import fair_share_factors, tree_from_usage, user_factors, user_leaf

    users = {(job.team, job.user) for job in snap.pending}
    full = fair_share_factors(tree_from_usage(snap.policy, snap.usage, users))
    assert user_factors(snap.policy, snap.usage, users) == {pair: full[user_leaf(*pair)] for pair in users}
    assert user_factors(snap.policy, snap.usage, users) == {pair: full[user_leaf(*pair)] for pair in users}
