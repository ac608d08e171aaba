"""Preemptions, evictions, quota checks and contract violations, with scripted cores."""

from __future__ import annotations

import pytest
from sim_support import make_cluster, make_policy, row

from scheduling.engine import decide as decide_module
from scheduling.engine.snapshot import Decisions, Preemption, Slot, Snapshot, Start
from scheduling.sim import SimulationError, run_simulation

PLACEHOLDER_CORE = "placeholder" in (decide_module.decide.__doc__ or "")
RANK = {"high": 0, "normal": 1, "low": 2}


def scripted_core(*, evict: bool = True, grace: float = 30.0):
    """A tiny core: highest class first on free cards; high preempts low; evicts when grace is over."""

    def core(snapshot: Snapshot) -> Decisions:
        now = snapshot.now.timestamp()
        out = Decisions()
        busy = {s.device_id for j in snapshot.running for s in j.slots}
        for job in snapshot.running:
            if evict and job.preempt_deadline is not None and job.preempt_deadline <= now:
                out.evictions.append(job.id)
                busy -= {s.device_id for s in job.slots}
        free = [d.id for n in snapshot.nodes for d in n.devices if d.id not in busy]
        for job in sorted(snapshot.pending, key=lambda j: (RANK[j.priority_class], j.submitted_at, j.id)):
            if len(free) >= job.num_devices:
                out.starts.append(Start(job.id, tuple(Slot(d) for d in free[: job.num_devices])))
                free = free[job.num_devices :]
                continue
            if job.priority_class == "high":
                for victim in snapshot.running:
                    if victim.priority_class == "low" and victim.preempt_deadline is None:
                        out.preemptions.append(Preemption(victim.id, "ClassPreemption", now + grace, job.id))
                        break
        return out

    return core


ROWS = [row("L", 0, 1000, 1, priority_class="low"), row("H", 100, 50, 1, priority_class="high")]


def test_victim_runs_out_its_grace_then_is_requeued_with_its_work_lost() -> None:
    m = run_simulation(ROWS, make_cluster(1, 1), make_policy(), decide_fn=scripted_core())["policy"]
    # L 0-130 (preempted at 100, grace 30), H 130-180, L again 180-1180 (full duration).
    p = m["preemption"]
    assert p["preemptions"] == 1 and p["victims_stopped"] == 1 and p["requeued"] == 1
    assert p["forced_stops"] == 0 and p["cancelled"] == 0
    assert p["device_hours_lost"] == pytest.approx(130 / 3600, abs=1e-3)
    assert m["jobs"]["completed"] == 2
    assert m["span_s"] == 1180
    assert m["wait_s"]["by_class"]["high"]["max"] == 30
    assert m["wait_s"]["by_class"]["low"]["max"] == 0  # wait counts to the first start
    assert m["devices"]["utilisation"] == pytest.approx(1.0)
    assert m["teams"]["a"]["preemptions"] == 1


def test_a_checkpointing_victim_loses_only_the_work_since_its_last_checkpoint_and_resumes() -> None:
    rows = [
        row("L", 0, 1000, 1, priority_class="low", checkpoint_interval_s=60),
        row("H", 100, 50, 1, "b", priority_class="high"),
    ]
    m = run_simulation(rows, make_cluster(1, 1), make_policy(), decide_fn=scripted_core())["policy"]
    # L 0-130 (preempted at 100, stopped at 130; saved at 120), H 130-180, L again 180-1060 (880 s left).
    p = m["preemption"]
    assert p["device_hours_lost"] == pytest.approx(10 / 3600, abs=1e-3)
    assert p["device_hours_lost_by_team"] == {"a": pytest.approx(10 / 3600, abs=1e-3), "b": 0}
    assert p["device_hours_lost_by_class"] == {"high": 0, "low": pytest.approx(10 / 3600, abs=1e-3)}
    assert m["teams"]["a"]["device_hours_lost"] == p["device_hours_lost_by_team"]["a"]
    assert m["span_s"] == 1060
    assert m["jobs"]["completed"] == 2


def test_cancel_on_preempt() -> None:
    m = run_simulation(ROWS, make_cluster(1, 1), make_policy(on_preempt="cancel"), decide_fn=scripted_core())["policy"]
    assert m["jobs"]["completed"] == 1 and m["jobs"]["cancelled"] == 1
    assert m["preemption"]["cancelled"] == 1
    assert m["span_s"] == 180


def test_a_core_that_forgets_to_evict_is_overruled_and_counted() -> None:
    m = run_simulation(ROWS, make_cluster(1, 1), make_policy(), decide_fn=scripted_core(evict=False))["policy"]
    assert m["preemption"]["forced_stops"] == 1
    assert m["wait_s"]["by_class"]["high"]["max"] == 30  # H still starts at the deadline (second decide)
    assert m["span_s"] == 1180


def test_zero_grace_stops_at_once_without_a_forced_stop() -> None:
    m = run_simulation(ROWS, make_cluster(1, 1), make_policy(), decide_fn=scripted_core(grace=0))["policy"]
    assert m["preemption"]["forced_stops"] == 0
    assert m["wait_s"]["by_class"]["high"]["max"] == 0
    assert m["preemption"]["device_hours_lost"] == pytest.approx(100 / 3600, abs=1e-3)


def test_a_victim_that_ends_during_its_grace_just_completes() -> None:
    rows = [row("L", 0, 110, 1, priority_class="low"), row("H", 100, 50, 1, priority_class="high")]
    m = run_simulation(rows, make_cluster(1, 1), make_policy(), decide_fn=scripted_core())["policy"]
    assert m["preemption"]["finished_in_grace"] == 1
    assert m["preemption"]["victims_stopped"] == 0
    assert m["jobs"]["completed"] == 2


def _greedy(snapshot: Snapshot) -> Decisions:
    """Starts everything that fits, ignoring quotas."""
    busy = {s.device_id for j in snapshot.running for s in j.slots}
    free = [d.id for n in snapshot.nodes for d in n.devices if d.id not in busy]
    out = Decisions()
    for job in snapshot.pending:
        if len(free) >= job.num_devices:
            out.starts.append(Start(job.id, tuple(Slot(d) for d in free[: job.num_devices])))
            free = free[job.num_devices :]
    return out


def test_quota_overrun_is_measured_in_device_seconds() -> None:
    policy = make_policy([{"name": "a", "shares": 1, "quota": {"max": {"devices": 1}}}])
    rows = [row("1", 0, 100, 1), row("2", 0, 60, 1)]
    q = run_simulation(rows, make_cluster(1, 2), policy, decide_fn=_greedy)["policy"]["quota"]
    assert q["violations"] == 1
    assert q["overrun_device_s"] == pytest.approx(60)  # one card too many until job 2 ends
    assert "team a 1 devices over max" in q["examples"][0]


@pytest.mark.xfail(PLACEHOLDER_CORE, reason="the placeholder core ignores quotas", strict=False)
def test_the_core_never_overruns_a_quota() -> None:
    policy = make_policy([{"name": "a", "shares": 1, "quota": {"max": {"devices": 1}}}, {"name": "b", "shares": 1}])
    rows = [row("1", 0, 100, 1), row("2", 0, 60, 1), row("3", 5, 60, 1), row("4", 5, 30, 1, tenant="b")]
    m = run_simulation(rows, make_cluster(1, 2), policy)["policy"]
    assert m["quota"]["violations"] == 0 and m["quota"]["overrun_device_s"] == 0
    assert m["jobs"]["completed"] == 4
    assert m["teams"]["a"]["device_hours"] == pytest.approx(220 / 3600, abs=1e-3)
    # team a runs one job at a time: 0-100, 100-160, 160-220
    assert m["wait_s"]["by_team"]["a"]["max"] == 155


@pytest.mark.parametrize(
    ("core", "message"),
    [
        (lambda s: Decisions(starts=[Start(999, (Slot(1),))]), "started job 999, which is not pending"),
        (lambda s: Decisions(starts=[Start(1, (Slot(1),)), Start(2, (Slot(1),))]), "device 1 is not free"),
        (lambda s: Decisions(starts=[Start(1, (Slot(1), Slot(2)))]), "2 slots for a job of 1 device"),
        (lambda s: Decisions(starts=[Start(1, (Slot(77),))]), "unknown device 77"),
        (lambda s: Decisions(evictions=[1]), "evicted job 1, which is not running"),
    ],
)
def test_impossible_decisions_stop_the_replay(core, message: str) -> None:
    rows = [row("1", 0, 10, 1), row("2", 0, 10, 1)]
    with pytest.raises(SimulationError, match=message):
        run_simulation(rows, make_cluster(1, 2), make_policy(), decide_fn=core)


def test_jobs_the_core_never_starts_are_reported_with_its_reason() -> None:
    from scheduling.engine.snapshot import Wait

    def refuses(snapshot: Snapshot) -> Decisions:
        return Decisions(waiting={j.id: Wait("Topology") for j in snapshot.pending})

    m = run_simulation([row("1", 0, 10, 1)], make_cluster(), make_policy(), decide_fn=refuses)["policy"]
    assert m["jobs"]["never_started"] == 1
    assert m["jobs"]["never_started_by_reason"] == {"Topology": 1}


def test_victims_whose_job_started_elsewhere_run_on_and_complete() -> None:
    """Team c fills two 4-card nodes: short jobs on one, long ones on the other. Team a asks for
    its guaranteed 4 cards: the long jobs, which ran least, are preempted (grace 300 s). The short
    jobs end at 100 s and a's job starts there; at the deadline nothing needs the long jobs'
    cards, so their preemption is called off and they run to their end."""
    rows = [row(f"s{i}", 0, 100, 1, tenant="c", priority_class="low") for i in range(4)]
    rows += [row(f"l{i}", 1, 5000, 1, tenant="c", priority_class="low") for i in range(4)]
    rows.append(row("A", 10, 1000, 4, tenant="a"))
    pol = make_policy(
        [{"name": "a", "shares": 1, "quota": {"guaranteed": {"devices": 4}}}, {"name": "c", "shares": 1}],
        grace="300s",
    )
    m = run_simulation(rows, make_cluster(2, 4), pol)["policy"]
    p = m["preemption"]
    assert p["preemptions"] == 4 and p["called_off"] == 4
    assert p["victims_stopped"] == 0 and p["device_hours_lost"] == 0
    assert m["jobs"]["completed"] == 9
    assert m["wait_s"]["by_team"]["a"]["max"] == 90  # from 10 s to the short jobs' end
    assert m["span_s"] == 5001
