"""Differential test: the live ``decide`` against a reference copy of the engine.

Skipped unless ``NPUPORTAL_REF_ENGINE`` names a directory holding the reference
engine modules (``decide.py``, ``capacity.py``, ...), for instance the engine
before the fast path (commit f41ddd7), or the last commit's when changing it::

    mkdir -p /tmp/ref && git archive f41ddd7 scheduling/engine | tar -x -C /tmp/ref
    NPUPORTAL_REF_ENGINE=/tmp/ref/scheduling/engine .venv/bin/pytest tests/engine/test_engine_differential.py

(``NPUPORTAL_DIFF_EXAMPLES=2000`` for more random worlds.)

Without it, a process running the compiled build (``scheduling.engine.BUILD``)
takes its own source as the reference: the compiled modules must decide exactly
as the plain Python they were compiled from.

Both engines get the same snapshots (synthetic clusters of the benchmark with
many seeds, sizes and policy variants; the property tests' hypothesis worlds;
the YAML scenarios; whole simulator runs, where a snapshot's node objects are
reused from tick to tick) and must give identical decisions: the same starts
on the same slots in the same order, preemptions, evictions and waiting reasons
with their details and estimated starts.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from engine_factory import load_scenario
from hypothesis import HealthCheck, given, settings
from refloader import load_reference
from test_engine_properties import guarantee_worlds, worlds

from scheduling import engine
from scheduling.engine.bench_core import make_synthetic_snapshot, next_tick
from scheduling.engine.decide import decide
from scheduling.engine.policy import Ordering, Reservation
from scheduling.engine.snapshot import Decisions, Snapshot

ROOT = Path(__file__).resolve().parents[2]
REF = os.environ.get("NPUPORTAL_REF_ENGINE") or (
    str(ROOT / "scheduling" / "engine") if engine.BUILD == "compiled" else None
)
#: Hypothesis examples per property (``NPUPORTAL_DIFF_EXAMPLES`` for a longer run).
EXAMPLES = int(os.environ.get("NPUPORTAL_DIFF_EXAMPLES", "300"))
pytestmark = pytest.mark.skipif(
    not REF, reason="set NPUPORTAL_REF_ENGINE to a reference engine directory (or run the compiled build)"
)

SCENARIOS = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))


def _ref_decide() -> Any:
    assert REF
    return load_reference(REF).decide


def canon(out: Decisions) -> dict[str, Any]:
    return {
        "starts": [
            (s.job_id, tuple((x.device_id, x.vnpu_template) for x in s.slots), s.backfilled) for s in out.starts
        ],
        "preemptions": [(p.job_id, p.reason, p.grace_deadline, p.for_job) for p in out.preemptions],
        "evictions": list(out.evictions),
        "waiting": {j: (w.reason, w.detail, w.estimated_start) for j, w in out.waiting.items()},
    }


def assert_same(snap: Snapshot, label: str = "") -> None:
    ref_snap = copy.deepcopy(snap)
    want = canon(_ref_decide()(ref_snap))
    got = canon(decide(snap))
    if got != want:
        for key in want:
            if got[key] != want[key]:
                if key == "waiting":
                    diff = {
                        j: (want[key].get(j), got[key].get(j))
                        for j in set(want[key]) | set(got[key])
                        if want[key].get(j) != got[key].get(j)
                    }
                    example = list(diff.items())[:5]
                    raise AssertionError(f"{label}: waiting differs for {len(diff)} jobs, e.g. {example}")
                raise AssertionError(f"{label}: {key} differ\nref {want[key][:20]}\nnew {got[key][:20]}")
    # Deciding twice on the same snapshot (the simulator reuses objects) gives the same again.
    assert canon(decide(snap)) == got, f"{label}: second decide on the same snapshot differs"


def _variant(snap: Snapshot, rng: random.Random) -> Snapshot:
    """Policy and state variations of a synthetic snapshot."""
    pol = snap.policy
    changes: dict[str, Any] = {}
    if rng.random() < 0.4:
        changes["backfill"] = False
    if rng.random() < 0.3:
        changes["placement_strategy"] = "spread"
    roll = rng.random()
    if roll < 0.25:
        changes["reservations"] = ()
    elif roll < 0.5:
        changes["reservations"] = (
            Reservation("urgent-910B4", rng.choice((0.05, 0.2, 0.5)), frozenset({"910B4"}), frozenset({"urgent"})),
            Reservation("normal-all", 0.1, None, frozenset({"normal"})),
        )
    if rng.random() < 0.3:
        changes["ordering"] = Ordering(
            weight_priority_class=rng.choice((0.0, 1000.0, 10000.0)),
            weight_fair_share=rng.choice((0.0, 5000.0)),
            weight_age=rng.choice((0.0, 1000.0)),
            weight_job_size=rng.choice((0.0, 500.0, 5000.0)),
            max_age_s=rng.choice((0.0, 3600.0, 7 * 86400.0)),
        )
    if rng.random() < 0.3:
        changes["grace_period_s"] = rng.choice((0.0, 60.0, 3600.0))
    if rng.random() < 0.3:  # the synthetic queue was submitted over three days: a share of it starving
        changes["starvation_after_s"] = rng.choice((12.0, 36.0, 60.0)) * 3600.0
    if changes:
        snap.policy = dataclasses.replace(pol, **changes)
    now = snap.now.timestamp()
    for job in snap.running:
        r = rng.random()
        if r < 0.03:
            job.preempt_deadline = now - rng.uniform(0, 100)  # evicted this tick
        elif r < 0.08:
            job.preempt_deadline = now + rng.uniform(1, 600)  # leaving
        elif r < 0.1:
            job.estimated_duration_s = 0.0
            job.max_duration_s = rng.choice((None, 3600.0))
    for node in snap.nodes:
        if rng.random() < 0.03:
            node.schedulable = False
        for dev in node.devices:
            if rng.random() < 0.01:
                dev.usable = False
    if rng.random() < 0.2:
        for job in snap.pending:
            if rng.random() < 0.1:
                job.submitted_at = snap.pending[0].submitted_at  # ties
            if rng.random() < 0.05:
                job.priority_class = "unknown"
            if rng.random() < 0.05:
                job.estimated_duration_s = 0.0
    return snap


@pytest.mark.parametrize("seed", range(120))
def test_synthetic(seed: int) -> None:
    rng = random.Random(seed)
    pending = rng.choice((0, 5, 40, 150, 400))
    nodes = rng.choice((1, 3, 10, 30, 60))
    busy = rng.choice((0.0, 0.3, 0.7, 0.95))
    teams = rng.choice((1, 3, 8))
    snap = make_synthetic_snapshot(pending, nodes, 8, busy, teams, seed)
    if seed % 4:
        snap = _variant(snap, rng)
    assert_same(snap, f"seed {seed}")


@pytest.mark.parametrize("seed", range(3))
def test_synthetic_large(seed: int) -> None:
    rng = random.Random(1000 + seed)
    snap = make_synthetic_snapshot(3000, 300, 8, 0.7, 8, seed)
    if seed:
        snap = _variant(snap, rng)
    assert_same(snap, f"large seed {seed}")


@pytest.mark.parametrize("seed", range(40))
def test_synthetic_second_tick(seed: int) -> None:
    rng = random.Random(2000 + seed)
    snap = make_synthetic_snapshot(rng.choice((150, 400, 900)), rng.choice((10, 30, 60)), 8, 0.7, 8, seed)
    if seed % 3:
        snap = _variant(snap, rng)
    # The next tick over the cluster the first one filled (its starts running, its victims leaving).
    after = next_tick(snap, decide(copy.deepcopy(snap)), rng.choice((1.0, 30.0, 400.0)))
    assert_same(after, f"second tick, seed {seed}")


@pytest.mark.parametrize("seed", range(24))
def test_synthetic_starving(seed: int) -> None:
    """Starving jobs stacking holds (several per chip model), in the first tick and the next."""
    rng = random.Random(3000 + seed)
    snap = make_synthetic_snapshot(rng.choice((400, 1500, 3000)), rng.choice((30, 100, 300)), 8, 0.7, 8, seed)
    if seed % 2:
        snap = _variant(snap, rng)
    snap.policy = dataclasses.replace(snap.policy, starvation_after_s=rng.choice((24.0, 48.0, 60.0)) * 3600.0)
    if seed % 3 == 0:
        snap.policy = dataclasses.replace(snap.policy, backfill=True)
    assert_same(copy.deepcopy(snap), f"starving seed {seed}")
    after = next_tick(snap, decide(copy.deepcopy(snap)), rng.choice((1.0, 30.0, 400.0)))
    assert_same(after, f"starving second tick, seed {seed}")


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(worlds())
def test_hypothesis_worlds(snap: Snapshot) -> None:
    assert_same(snap)


@settings(max_examples=EXAMPLES // 2, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(guarantee_worlds())
def test_hypothesis_guarantee_worlds(world: tuple[Snapshot, int]) -> None:
    assert_same(world[0])


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_scenarios(path: Path) -> None:
    snap, _, _ = load_scenario(yaml.safe_load(path.read_text()))
    assert_same(snap, path.stem)


class _Both:
    """A ``decide_fn`` for the simulator that runs both engines and compares every tick."""

    def __init__(self) -> None:
        self.ticks = 0

    def __call__(self, snapshot: Snapshot) -> Decisions:
        want = canon(_ref_decide()(snapshot))
        out = decide(snapshot)
        got = canon(out)
        assert got == want, f"tick {self.ticks} differs"
        self.ticks += 1
        return out


@pytest.mark.parametrize("trace", ["itp", "alibaba"])
def test_simulation_every_tick(trace: str) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "tests" / "sim"))
    from sim_support import ALIBABA_300, EXAMPLES, ITP_300, make_cluster

    from scheduling.sim import run_simulation
    from scheduling.sim.traces import load_cluster, load_trace
    from scheduling.simulate import load_policy

    # The first engine returns no promises, so the runs hand none back (else the snapshots differ).
    both = _Both()
    if trace == "itp":
        cluster = make_cluster(16, 8, chip="910B3")
        pol = load_policy(EXAMPLES / "policies" / "ms_itp_elasticflow.yaml")
        run_simulation(load_trace(ITP_300), cluster, pol, decide_fn=both, promises=False)
    else:
        cluster = load_cluster(EXAMPLES / "clusters" / "alibaba_openb_v2023.yaml")
        pol = load_policy(EXAMPLES / "policies" / "alibaba_openb_v2023.yaml", cluster)
        class_map = {"qos-Guaranteed": "critical", "qos-LS": "high", "qos-Burstable": "normal", "qos-BE": "low"}
        run_simulation(load_trace(ALIBABA_300), cluster, pol, decide_fn=both, class_map=class_map, promises=False)
    assert both.ticks > 10


@pytest.mark.parametrize("seed", range(12))
def test_same_objects_flipped_between_ticks(seed: int) -> None:
    """The simulator's way: one set of node objects, fields flipped in place between ticks."""
    rng = random.Random(500 + seed)
    snap = make_synthetic_snapshot(60, 12, 8, 0.6, 4, seed)
    ref_decide = _ref_decide()
    for tick in range(8):
        want = canon(ref_decide(snap))
        got = canon(decide(snap))
        assert got == want, f"seed {seed} tick {tick}"
        node = rng.choice(snap.nodes)
        dev = rng.choice(node.devices)
        roll = rng.random()
        if roll < 0.3:
            dev.usable = not dev.usable
        elif roll < 0.45:
            node.schedulable = not node.schedulable
        elif roll < 0.55:
            dev.topology_group = node.name + "/g9"
        elif roll < 0.65:
            dev.ai_cores = rng.choice((8, 20, 32))
        elif roll < 0.75:
            dev.chip_model = rng.choice(("910A", "910B4", "310P3"))
        elif roll < 0.85:
            snap.nodes.append(snap.nodes.pop(0))  # order of nodes
        # else: nothing changes (the cached layout is reused)
        for job in snap.pending[: rng.randint(0, 5)]:
            job.submitted_at -= 60
