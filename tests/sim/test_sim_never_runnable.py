"""Trace rows that can never run are skipped by the engine's own rule and counted as ``never_runnable``.

The rule is :func:`scheduling.engine.feasibility.check`, the one the API uses to refuse such a
job at submission; here it is asked about the simulated inventory and the replayed policy.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from sim_support import FIXTURES, ROOT, make_policy

from scheduling.engine.feasibility import Request, never_runnable
from scheduling.sim import run_simulation
from scheduling.sim.traces import load_trace, parse_cluster

TRACE = FIXTURES / "never_runnable_small.csv"
#: Two pools: 16 × 910B4 (two 8-card servers) and 8 × 910A; no pool holds 25.
CLUSTER = {
    "nodeGroups": [
        {"name": "b4", "count": 2, "chipModel": "910B4", "devicesPerNode": 8, "hbmMb": 32768, "aiCores": 20,
         "aiCpus": 7, "topology": {"groupSize": 8}},
        {"name": "a", "count": 1, "chipModel": "910A", "devicesPerNode": 8, "hbmMb": 32768, "aiCores": 32,
         "aiCpus": 7, "topology": {"groupSize": 4}},
    ]
}  # fmt: skip
TEAMS = [
    {"name": "training", "shares": 2, "quota": {"max": {"devices": 24}}},
    {"name": "research", "shares": 1, "quota": {"max": {"devices": 8}, "maxJobDuration": "1d"}},
]
IMPOSSIBLE = {"more-than-any-pool", "over-the-team-max", "longer-than-max-duration", "unknown-chip"}


def test_rows_that_can_never_run_are_skipped_and_counted() -> None:
    policy = make_policy(TEAMS)
    out = run_simulation(load_trace(TRACE), parse_cluster(CLUSTER), policy, job_records=True)
    assert out["input"]["never_runnable"] == out["policy"]["jobs"]["never_runnable"] == 4
    assert out["input"]["skipped_by_reason"] == {"never_runnable": 4}
    jobs = out["policy"]["jobs"]
    assert jobs["total"] == 7 and jobs["eligible"] == 3 and jobs["completed"] == 3
    replayed = {r["job_id"] for r in out["job_records"]["policy"]}
    assert replayed == {"fits-8", "fits-16", "fits-4"}


def test_the_simulator_and_the_submission_rule_agree_row_by_row() -> None:
    """Each row the replay skipped is one the engine refuses, and each it replayed one it accepts."""
    policy = make_policy(TEAMS)
    spec = parse_cluster(CLUSTER)
    for row in load_trace(TRACE):
        request = Request(
            team=row.tenant,
            num_devices=row.num_devices,
            chip_model=row.chip_model,
            priority_class="normal",
            duration_s=row.duration_s,
            estimated_duration_s=row.duration_s,
        )
        found = never_runnable(policy, request, spec.build_nodes(), spec.templates())
        assert (found is not None) == (row.job_id in IMPOSSIBLE), (row.job_id, found)


def test_the_command_line_reports_never_runnable(tmp_path: Path) -> None:
    import yaml

    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump(CLUSTER))
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "npuportal/v1",
                "kind": "SchedulingPolicy",
                "metadata": {"name": "small"},
                "spec": {"priorityClasses": [{"name": "normal", "default": True}], "teams": TEAMS},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-m", "scheduling.simulate", "--trace", str(TRACE), "--cluster", str(cluster),
         "--policy", str(policy), "--out", "-"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["input"]["never_runnable"] == data["policy"]["jobs"]["never_runnable"] == 4
    assert "4 never runnable" in done.stderr
