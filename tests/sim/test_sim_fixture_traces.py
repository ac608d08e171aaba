"""Slices of the real traces through the real core and the FIFO baseline."""

from __future__ import annotations

import pytest
from sim_support import ALIBABA_300, EXAMPLES, ITP_300, make_cluster

from scheduling.sim import compare, run_simulation
from scheduling.sim.traces import load_cluster, load_trace
from scheduling.simulate import load_policy


@pytest.fixture(scope="module")
def itp() -> dict:
    cluster = make_cluster(16, 8, chip="910B3")  # 128 cards: the slice queues
    policy = load_policy(EXAMPLES / "policies" / "ms_itp_elasticflow.yaml")
    return run_simulation(load_trace(ITP_300), cluster, policy, baseline="fifo")


@pytest.fixture(scope="module")
def alibaba() -> dict:
    cluster = load_cluster(EXAMPLES / "clusters" / "alibaba_openb_v2023.yaml")
    policy = load_policy(EXAMPLES / "policies" / "alibaba_openb_v2023.yaml", cluster)
    class_map = {"qos-Guaranteed": "critical", "qos-LS": "high", "qos-Burstable": "normal", "qos-BE": "low"}
    return run_simulation(load_trace(ALIBABA_300), cluster, policy, baseline="fifo", class_map=class_map)


@pytest.mark.parametrize("run", ["policy", "baseline"])
def test_itp_slice_every_job_accounted_for(itp: dict, run: str) -> None:
    m = itp[run]
    jobs = m["jobs"]
    assert jobs["total"] == 300 and jobs["skipped"] == 0
    assert jobs["started"] + jobs["never_started"] == jobs["eligible"] == 300
    assert jobs["completed"] + jobs["cancelled"] + jobs["requeued_not_restarted"] <= jobs["started"]
    assert jobs["completed"] == 300  # every job of the slice fits 16 servers
    assert 0 < m["devices"]["utilisation"] <= 1
    assert m["quota"]["overrun_device_s"] == 0 and m["quota"]["violations"] == 0
    waits = m["wait_s"]["overall"]
    assert waits["p50"] <= waits["p95"] <= waits["p99"] <= waits["max"]
    assert set(m["wait_s"]["by_team"]) == set(m["teams"])
    assert sum(t["usage_fraction"] for t in m["teams"].values()) == pytest.approx(1, abs=1e-4)


def test_itp_slice_policy_uses_as_many_device_hours_as_fifo(itp: dict) -> None:
    lost = itp["policy"]["preemption"]["device_hours_lost"]
    assert itp["policy"]["devices"]["busy_device_hours"] == pytest.approx(
        itp["baseline"]["devices"]["busy_device_hours"] + lost, rel=1e-6
    )
    assert itp["baseline"]["preemption"]["preemptions"] == 0
    assert itp["baseline"]["quota"]["checked"] is False


def test_alibaba_slice_skips_and_vnpu(alibaba: dict) -> None:
    # rows 1-300: 22 zero durations (never-scheduled Pending pods), 18 pods without a GPU
    assert alibaba["input"]["skipped_by_reason"] == {"no_devices": 18, "zero_duration": 22}
    for run in ("policy", "baseline"):
        m = alibaba[run]
        assert m["jobs"]["eligible"] == 260
        assert m["jobs"]["completed"] + m["jobs"]["requeued_not_restarted"] + m["jobs"]["never_started"] <= 260
        assert m["quota"]["overrun_device_s"] == 0
    assert set(alibaba["policy"]["wait_s"]["by_class"]) <= {"critical", "high", "normal", "low"}
    assert alibaba["policy"]["teams"]["qos-BE"]["entitled_fraction"] == pytest.approx(0.2)


def test_compare_reports_per_team_differences(itp: dict) -> None:
    diff = compare(itp["baseline"], itp["policy"])
    assert diff == itp["comparison"]
    for team, d in diff["teams"].items():
        a = itp["baseline"]["teams"][team]
        b = itp["policy"]["teams"][team]
        assert d["device_hours"] == {
            "a": a["device_hours"],
            "b": b["device_hours"],
            "delta": round(b["device_hours"] - a["device_hours"], 6),
        }
        assert d["wait_p95_s"]["a"] == a["wait_s"]["p95"]
        assert d["preemptions"]["b"] == b["preemptions"]
    assert diff["overall"]["utilisation"]["delta"] is not None


def test_compare_handles_a_team_only_one_side_has() -> None:
    a = {"teams": {"x": {"device_hours": 1.0, "wait_s": {"p50": 1, "p95": 2}, "preemptions": 0}}}
    b = {"teams": {"y": {"device_hours": 2.0, "wait_s": {"p50": 3, "p95": 4}, "preemptions": 1}}}
    diff = compare(a, b)
    assert diff["teams"]["x"]["device_hours"] == {"a": 1.0, "b": None, "delta": None}
    assert diff["teams"]["y"]["preemptions"] == {"a": None, "b": 1, "delta": None}


def test_the_core_leaves_the_shared_snapshot_lists_alone() -> None:
    """The simulator hands the core its own pending/running lists (no copy per event)."""
    from scheduling.engine.decide import decide

    def guarded(snapshot):
        before = ([j.id for j in snapshot.pending], [j.id for j in snapshot.running])
        nodes = [(n.name, len(n.devices)) for n in snapshot.nodes]
        out = decide(snapshot)
        assert ([j.id for j in snapshot.pending], [j.id for j in snapshot.running]) == before
        assert [(n.name, len(n.devices)) for n in snapshot.nodes] == nodes
        return out

    cluster = make_cluster(4, 8, chip="910B3")
    policy = load_policy(EXAMPLES / "policies" / "ms_itp_elasticflow.yaml")
    m = run_simulation(load_trace(ITP_300)[:120], cluster, policy, decide_fn=guarded)["policy"]
    assert m["jobs"]["started"] > 0
