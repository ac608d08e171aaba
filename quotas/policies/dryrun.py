"""Dry run of a policy change: replay recorded jobs under the current and the candidate policy.

Both runs go through the same simulator and the same ``decide`` the tick uses,
on a model of this cluster built from the database, so the difference shown
is the difference the change would make — not an estimate from another model.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from devices.models import Device, Node, VnpuTemplate
from scheduling.engine.policy import Policy
from scheduling.engine.snapshot import VnpuTemplate as EngineTemplate
from scheduling.models import Job
from scheduling.sim import compare, run_simulation
from scheduling.sim.traces import ClusterSpec, NodeGroup, load_trace


def cluster_spec() -> ClusterSpec:
    """This cluster as the simulator's node groups (nodes of one shape form a group)."""
    shapes: Counter[tuple[str, int, int, int, int, int]] = Counter()
    for node in Node.objects.filter(removed_at__isnull=True).prefetch_related("devices"):
        devices = list(node.devices.all())
        if not devices:
            continue
        first = devices[0]
        groups = Counter(d.topology_group for d in devices)
        group_size = max(groups.values()) if groups else len(devices)
        shapes[(first.chip_model, len(devices), first.hbm_mb, first.ai_cores, first.ai_cpus, group_size)] += 1
    if not shapes:
        raise ValueError("the cluster has no nodes with devices")
    node_groups = tuple(
        NodeGroup(
            name=f"{chip.lower()}-{i}",
            count=count,
            chip_model=chip,
            devices_per_node=n,
            hbm_mb=hbm,
            ai_cores=cores,
            ai_cpus=cpus,
            group_size=group,
        )
        for i, ((chip, n, hbm, cores, cpus, group), count) in enumerate(sorted(shapes.items()))
    )
    templates = tuple(
        EngineTemplate(t.chip_model, t.name, t.memory_mb, t.ai_cores, t.ai_cpus) for t in VnpuTemplate.objects.all()
    )
    return ClusterSpec(node_groups=node_groups, vnpu_templates=templates)


def recorded_rows(since: datetime, until: datetime) -> list[dict[str, Any]]:
    """Jobs submitted in the window as trace rows; run time as it was, or as estimated if unknown."""
    cores = dict(Device.objects.values_list("chip_model", "ai_cores").distinct())
    rows = []
    jobs = (
        Job.objects.filter(submitted_at__gte=since, submitted_at__lt=until)
        .exclude(Q(state=Job.State.CANCELLED) & Q(started_at__isnull=True))
        .select_related("team", "submitter", "vnpu_template")
        .order_by("submitted_at", "id")
    )
    for job in jobs:
        if job.started_at and job.ended_at:
            duration = (job.ended_at - job.started_at).total_seconds()
        else:
            duration = float(job.estimated_duration_s)
        row: dict[str, Any] = {
            "job_id": str(job.pk),
            "submit_time_s": (job.submitted_at - since).total_seconds(),
            "duration_s": max(duration, 1.0),
            "num_devices": job.num_devices,
            "tenant": job.team.name,
            "user": job.submitter.username,
            "status": job.state,
            "priority_class": job.priority_class,
            "chip_model": job.chip_model or None,
            "checkpoint_interval_s": job.checkpoint_interval_s,
        }
        if job.vnpu_template is not None:
            card = cores.get(job.vnpu_template.chip_model) or job.vnpu_template.ai_cores
            row["gpu_milli"] = max(1, round(1000 * job.vnpu_template.ai_cores / card))
        rows.append(row)
    return rows


def dry_run(current: Policy, candidate: Policy, *, days: int = 7, trace: str | None = None) -> dict[str, Any]:
    """Metrics of both policies on the same input, and their per-team difference (candidate − current)."""
    if days < 1 or days > 90:
        raise ValueError("--days must be between 1 and 90")
    cluster = cluster_spec()
    if trace:
        rows: list[Any] = load_trace(trace)
        start = timezone.now() - timedelta(days=days)
        source = f"trace {trace}"
    else:
        until = timezone.now()
        start = until - timedelta(days=days)
        rows = recorded_rows(start, until)
        source = f"recorded jobs of the last {days} day(s)"
    a = run_simulation(rows, cluster, current, start=start)["policy"]
    b = run_simulation(rows, cluster, candidate, start=start)["policy"]
    return {"source": source, "jobs": len(rows), "current": a, "candidate": b, "comparison": compare(a, b)}


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def format_comparison(result: dict[str, Any]) -> str:
    lines = [f"dry run over {result['source']}: {result['jobs']} job(s)", ""]
    lines.append(
        f"{'team':14} {'device-hours':>24} {'wait p50 (s)':>22} {'wait p95 (s)':>22} {'wait max (s)':>22} "
        f"{'not started':>14} {'preemptions':>14}"
    )
    for team, d in result["comparison"]["teams"].items():
        cells = []
        for key in ("device_hours", "wait_p50_s", "wait_p95_s", "wait_max_s", "not_started", "preemptions"):
            cell = d[key]
            delta = cell["delta"]
            sign = "+" if isinstance(delta, int | float) and delta > 0 else ""
            cells.append(f"{_fmt(cell['a'])} → {_fmt(cell['b'])} ({sign}{_fmt(delta)})")
        lines.append(
            f"{team:14} {cells[0]:>24} {cells[1]:>22} {cells[2]:>22} {cells[3]:>22} {cells[4]:>14} {cells[5]:>14}"
        )
    overall = result["comparison"]["overall"]
    lines.append("")
    lines.append(
        "overall: utilisation {} → {}, wait p95 {} → {} s, longest wait {} → {} s".format(
            _fmt(overall["utilisation"]["a"], 3),
            _fmt(overall["utilisation"]["b"], 3),
            _fmt(overall["wait_p95_s"]["a"]),
            _fmt(overall["wait_p95_s"]["b"]),
            _fmt(overall["wait_max_s"]["a"]),
            _fmt(overall["wait_max_s"]["b"]),
        )
    )
    return "\n".join(lines)
