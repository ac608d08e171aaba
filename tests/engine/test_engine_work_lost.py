"""The work a victim loses, and victim searches that lose the least of it.

The scenarios ``least_work_lost*.yaml`` and ``checkpoint_loss.yaml`` show the
choice on small stories; here are the rule itself and a property over random
clusters.
"""

from __future__ import annotations

import pytest
from engine_factory import T0, Cluster, job, policy, quota, snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.decide import decide
from scheduling.engine.snapshot import JobState, NodeState, Snapshot
from scheduling.engine.work_lost import device_hours_lost, last_checkpoint


def test_a_job_without_checkpoints_loses_everything_since_its_start() -> None:
    assert device_hours_lost(8, T0 - 2 * 3600, T0) == pytest.approx(16.0)
    assert device_hours_lost(0.25, T0 - 3600, T0) == pytest.approx(0.25)  # a quarter-card vNPU slice
    assert device_hours_lost(4, T0 + 60, T0) == 0.0  # not started yet


def test_a_checkpointing_job_loses_the_work_since_its_last_checkpoint() -> None:
    start = T0 - (2 * 3600 + 50 * 60)  # 2 h 50 min ago, a checkpoint every hour: the last one 50 min ago
    assert device_hours_lost(8, start, T0, 3600) == pytest.approx(8 * 50 / 60)
    assert device_hours_lost(8, start, T0, None) == pytest.approx(8 * 170 / 60)
    # Stopped right at a checkpoint it loses nothing; before its first, all since its start.
    assert device_hours_lost(8, T0 - 7200, T0, 3600) == 0.0
    assert device_hours_lost(2, T0 - 600, T0, 3600) == pytest.approx(2 * 600 / 3600)
    assert last_checkpoint(start, T0, 3600) == start + 2 * 3600
    assert last_checkpoint(start, T0, None) == start


TEAMS = ("b", "c")


@st.composite
def reclaim_worlds(draw: st.DrawFn) -> tuple[Snapshot, int]:
    """Full 4-card nodes of borrowers (1-, 2- and 4-card jobs, some checkpointing); team a reclaims."""
    cl = Cluster()
    nodes = draw(st.integers(1, 4))
    running: list[JobState] = []
    jid = 0
    for n in range(nodes):
        cl.node(f"n{n}", "910B4", 4)
        left = 4
        while left:
            size = draw(st.sampled_from([s for s in (1, 2, 4) if s <= left]))
            first = 4 - left
            jid += 1
            running.append(
                job(
                    jid,
                    draw(st.sampled_from(TEAMS)),
                    size,
                    draw(st.sampled_from(("normal", "low"))),
                    slots=[cl.dev(f"n{n}/{i}") for i in range(first, first + size)],
                    started=-draw(st.integers(60, 6 * 3600)),
                    checkpoint=draw(st.sampled_from((None, None, 600.0, 1800.0, 3600.0))),
                )
            )
            left -= size
    teams = {"a": quota(guaranteed={"devices": 64}), "b": quota(), "c": quota()}
    pol = policy(teams, strategy=draw(st.sampled_from(("binpack", "spread"))))
    ask = job(500, "a", draw(st.sampled_from((1, 2, 4))), "normal")
    return snapshot(pol, cl, [ask], running), ask.id


def _lost(snap: Snapshot, victims: list[int]) -> float:
    by_id = {j.id: j for j in snap.running}
    now = snap.now.timestamp()
    return sum(
        device_hours_lost(len(by_id[v].slots), by_id[v].started_at, now, by_id[v].checkpoint_interval_s)  # type: ignore[arg-type]
        for v in victims
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reclaim_worlds())
def test_the_chosen_victims_lose_no_more_than_those_of_any_one_node(world: tuple[Snapshot, int]) -> None:
    """Each node alone (its jobs only) is one spot the search could have chosen: the plan it
    gives there is an alternative, and the chosen plan never loses more than any of them."""
    snap, ask = world
    out = decide(snap)
    chosen = [p.job_id for p in out.preemptions if p.for_job == ask]
    alternatives = []
    for node in snap.nodes:
        ids = {d.id for d in node.devices}
        alone = snapshot(
            snap.policy,
            _one_node(node),
            snap.pending,
            [j for j in snap.running if {s.device_id for s in j.slots} <= ids],
        )
        victims = [p.job_id for p in decide(alone).preemptions if p.for_job == ask]
        if victims:
            alternatives.append(_lost(snap, victims))
    assert bool(chosen) == bool(alternatives), (chosen, alternatives)
    if chosen:
        assert _lost(snap, chosen) <= min(alternatives) + 1e-9, (chosen, alternatives)


def _one_node(node: NodeState) -> Cluster:
    cl = Cluster()
    cl.nodes = [node]
    return cl
