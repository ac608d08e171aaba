"""Builders shared by the simulator tests (no Django, no conftest: run with ``--noconftest``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `pytest --noconftest -p no:django` does not put the repo on the path
    sys.path.insert(0, str(ROOT))

from scheduling.engine.policy import Policy, parse_policy  # noqa: E402
from scheduling.sim.traces import ClusterSpec, TraceRow, parse_cluster  # noqa: E402

FIXTURES = ROOT / "tests" / "fixtures" / "traces"
ITP_300 = FIXTURES / "ms_itp_elasticflow_300.csv"
ALIBABA_300 = FIXTURES / "alibaba_openb_v2023_300.csv"
EXAMPLES = ROOT / "examples"


def make_policy(
    teams: list[dict[str, Any]] | None = None,
    *,
    defaults: dict[str, Any] | None = None,
    classes: list[dict[str, Any]] | None = None,
    backfill: bool = True,
    grace: str = "30s",
    on_preempt: str = "requeue",
    timezone: str = "UTC",
    starvation: str | None = None,
    ordering: dict[str, Any] | None = None,
) -> Policy:
    """A policy written as YAML and parsed by the engine's own parser."""
    doc = {
        "apiVersion": "npuportal/v1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": "sim-test"},
        "spec": {
            "timezone": timezone,
            "priorityClasses": classes
            or [{"name": "high", "preempts": ["low"]}, {"name": "normal", "default": True}, {"name": "low"}],
            "backfill": backfill,
            "preemption": {"gracePeriod": grace, "onPreempt": on_preempt},
            "teams": teams or [],
            "defaults": defaults or {"shares": 1},
        },
    }
    if starvation is not None:
        doc["spec"]["starvation"] = {"after": starvation}  # type: ignore[index]
    if ordering is not None:
        doc["spec"]["ordering"] = ordering  # type: ignore[index]
    return parse_policy(yaml.safe_dump(doc, sort_keys=False))


def make_cluster(
    nodes: int = 1,
    per_node: int = 2,
    *,
    chip: str = "910B4",
    group_size: int | None = None,
    templates: bool = False,
) -> ClusterSpec:
    doc: dict[str, Any] = {
        "nodeGroups": [
            {
                "name": "n",
                "count": nodes,
                "chipModel": chip,
                "devicesPerNode": per_node,
                "hbmMb": 32768,
                "aiCores": 20,
                "aiCpus": 7,
                "topology": {"groupSize": group_size or per_node},
            }
        ]
    }
    if templates:
        doc["vnpuTemplates"] = [
            {"chipModel": chip, "name": "vir05_1c_8g", "memoryMb": 8192, "aiCores": 5, "aiCpus": 1},
            {"chipModel": chip, "name": "vir10_3c_16g", "memoryMb": 16384, "aiCores": 10, "aiCpus": 3},
        ]
    return parse_cluster(doc)


def row(job_id: str, submit: float, duration: float, devices: int = 1, tenant: str = "a", **extra: Any) -> TraceRow:
    return TraceRow(
        job_id=job_id,
        submit_time_s=submit,
        duration_s=duration,
        num_devices=devices,
        tenant=tenant,
        user=extra.pop("user", tenant),
        status="completed",
        **extra,
    )
