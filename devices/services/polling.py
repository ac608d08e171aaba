"""Agent polls: device health, node reachability, and the state of jobs on each node.

Network calls run concurrently in threads with timeouts and never hold a
database transaction; the results are then applied node by node, each in its
own short transaction, so one slow or dead agent delays nobody else.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from devices.models import Device, Node
from devices.services.agent_client import AgentClient, AgentError
from scheduling.models import Allocation, Job

log = logging.getLogger(__name__)

#: npu-smi / agent health words → our health states.
AGENT_HEALTH = {
    "OK": Device.Health.HEALTHY,
    "Warning": Device.Health.WARNING,
    "Alarm": Device.Health.DEGRADED,
    "Critical": Device.Health.FAILED,
    "UNKNOWN": Device.Health.FAILED,
    "lost": Device.Health.FAILED,
}
#: How bad a state is, to decide if a device got worse.
SEVERITY = {
    Device.Health.HEALTHY: 0,
    Device.Health.WARNING: 1,
    Device.Health.DEGRADED: 2,
    Device.Health.UNKNOWN: 3,
    Device.Health.FAILED: 3,
}


def _setting(name: str, default: float) -> float:
    return float(getattr(settings, name, default))


@dataclass
class PollResult:
    node_id: int
    devices: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] | None = None
    error: str = ""


@dataclass
class PollSummary:
    polled: int = 0
    failed: int = 0
    finished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    relaunched: list[int] = field(default_factory=list)
    failed_devices: list[int] = field(default_factory=list)


def _fetch(node: Node) -> PollResult:
    client = AgentClient(node)
    try:
        return PollResult(node.pk, devices=client.devices(), jobs=client.jobs())
    except AgentError as exc:
        return PollResult(node.pk, error=str(exc))


def poll_all() -> PollSummary:
    nodes = list(Node.objects.exclude(agent_url=""))
    summary = PollSummary()
    if not nodes:
        return summary
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        results = list(pool.map(_fetch, nodes))
    for node, result in zip(nodes, results, strict=True):
        summary.polled += 1
        if result.error:
            summary.failed += 1
        try:
            apply_poll(node.pk, result, summary)
        except Exception:
            log.exception("applying the poll of node %s failed", node.name)
    return summary


def device_health(report: dict[str, Any], device: Device) -> tuple[str, str]:
    """Map one device's report to a health state and a reason a person can read."""
    word = str(report.get("health", "UNKNOWN"))
    health = AGENT_HEALTH.get(word, Device.Health.FAILED)
    reason = f"agent reports {word}"
    ecc = report.get("ecc_errors")
    if isinstance(ecc, int) and ecc > device.ecc_errors:
        return Device.Health.FAILED, f"ECC errors rose to {ecc}"
    temp = report.get("temp_c")
    if (
        health == Device.Health.HEALTHY
        and isinstance(temp, int | float)
        and temp >= _setting("HEALTH_TEMP_WARNING_C", 85)
    ):
        return Device.Health.WARNING, f"temperature {temp} °C"
    return health, reason


@transaction.atomic
def apply_poll(node_id: int, result: PollResult, summary: PollSummary | None = None) -> None:
    summary = summary or PollSummary()
    node = Node.objects.select_for_update().get(pk=node_id)
    now = timezone.now()
    if result.error:
        node.missed_polls += 1
        if node.reachable and node.missed_polls >= _setting("AGENT_MISSED_POLLS", 3):
            node.reachable = False
            log.warning("node %s unreachable after %s missed polls: %s", node.name, node.missed_polls, result.error)
            for job_id in _running_jobs_on(node_id):
                _requeue(job_id, "NodeUnreachable", f"node {node.name} stopped answering", summary)
        node.save(update_fields=["missed_polls", "reachable"])
        return
    node.missed_polls = 0
    node.reachable = True
    node.last_heartbeat = now
    node.save(update_fields=["missed_polls", "reachable", "last_heartbeat"])
    _apply_devices(node, result.devices or {}, now, summary)
    _reconcile_jobs(node, result.jobs or [], summary)


def _apply_devices(node: Node, body: dict[str, Any], now: datetime, summary: PollSummary) -> None:
    reports = {d.get("index"): d for d in body.get("devices", []) if isinstance(d, dict)}
    rejoin = int(_setting("HEALTH_REJOIN_POLLS", 3))
    for device in Device.objects.select_for_update().filter(node=node):
        report = reports.get(device.index)
        if report is None:
            new, why = Device.Health.FAILED, "missing from the agent's inventory"
        else:
            new, why = device_health(report, device)
            device.temp_c = report.get("temp_c")
            device.power_w = report.get("power_w")
            device.aicore_pct = report.get("aicore_pct")
            device.hbm_used_mb = report.get("hbm_used_mb")
            ecc = report.get("ecc_errors")
            if isinstance(ecc, int):
                device.ecc_errors = ecc
        old = device.health
        if SEVERITY[new] < SEVERITY.get(old, 3) and SEVERITY.get(old, 3) >= 2:
            # Damp flapping: a sick device must look well several polls in a row to rejoin.
            device.healthy_streak += 1
            if device.healthy_streak >= rejoin:
                device.health, device.health_detail, device.healthy_streak = new, f"recovered: {why}", 0
        else:
            device.healthy_streak = 0
            device.health = new
            if new != old:
                device.health_detail = why
        device.last_seen = now
        device.save()
        if device.health == Device.Health.FAILED and old != Device.Health.FAILED:
            summary.failed_devices.append(device.pk)
            log.warning("device %s failed: %s", device, device.health_detail)
            for job_id in (
                Allocation.objects.filter(device=device, end__isnull=True).values_list("job_id", flat=True).distinct()
            ):
                _requeue(job_id, "DeviceFailed", f"device {device} failed: {device.health_detail}", summary, stop=True)


def _running_jobs_on(node_id: int) -> list[int]:
    return list(
        Allocation.objects.filter(device__node_id=node_id, end__isnull=True, job__state=Job.State.RUNNING)
        .values_list("job_id", flat=True)
        .distinct()
    )


def _requeue(job_id: int, reason: str, detail: str, summary: PollSummary, stop: bool = False) -> None:
    from scheduling.services.jobs import requeue_job

    nodes = list(
        Allocation.objects.filter(job_id=job_id, end__isnull=True).values_list("device__node_id", flat=True).distinct()
    )
    requeue_job(job_id, reason=reason, detail=detail)
    summary.requeued.append(job_id)
    if stop:
        transaction.on_commit(lambda: _stop_quietly(job_id, nodes))


def _stop_quietly(job_id: int, node_ids: list[int]) -> None:
    for node in Node.objects.filter(pk__in=node_ids).exclude(agent_url=""):
        try:
            AgentClient(node).stop(job_id, grace_s=5)
        except AgentError:
            log.info("could not stop job %s on %s (it may already be gone)", job_id, node.name)


def _reconcile_jobs(node: Node, agent_jobs: list[dict[str, Any]], summary: PollSummary) -> None:
    """Bring the database in line with what the agent says runs on it."""
    from scheduling.services.jobs import finish_job

    by_id = {str(j.get("job_id")): j for j in agent_jobs if isinstance(j, dict)}
    for job in Job.objects.filter(pk__in=_running_jobs_on(node.pk)):
        record = by_id.get(str(job.pk))
        if record is None:
            if job.launched:
                _requeue(job.pk, "LostOnAgent", f"node {node.name} no longer knows the job", summary)
            else:
                summary.relaunched.append(job.pk)
            continue
        state = record.get("state")
        if state == "running":
            if not job.launched:
                Job.objects.filter(pk=job.pk).update(launched=True)
            continue
        ended = parse_datetime(record["ended_at"]) if record.get("ended_at") else None
        if state == "succeeded":
            finish_job(job.pk, exit_code=0, ended_at=ended)
        elif state in {"failed", "killed"}:
            code = record.get("exit_code")
            detail = f"{state}: {record.get('reason') or ''} exit code {code}".strip()
            finish_job(
                job.pk, exit_code=code if isinstance(code, int) and code != 0 else 1, ended_at=ended, detail=detail
            )
        elif state == "lost":
            _requeue(job.pk, "LostOnAgent", "the agent lost the job's process", summary)
            continue
        else:
            continue
        summary.finished.append(job.pk)
    if summary.relaunched:
        from scheduling import tasks

        ids = list(summary.relaunched)
        transaction.on_commit(lambda: [tasks.launch_job.delay(i) for i in ids])


def launch_payload(job: Job, node: Node) -> dict[str, Any]:
    allocs = list(job.allocations.filter(end__isnull=True, device__node=node).select_related("device", "vnpu_template"))
    payload: dict[str, Any] = {
        "job_id": job.pk,
        "command": job.command,
        "env": {"JOB_NAME": job.name, "JOB_TEAM": job.team.name},
        "devices": sorted(a.device.index for a in allocs),
    }
    if job.max_duration_s:
        elapsed = (timezone.now() - job.started_at).total_seconds() if job.started_at else 0
        payload["max_duration_s"] = max(1, int(job.max_duration_s - elapsed))
    if allocs and allocs[0].vnpu_template is not None:
        payload["vnpu"] = {"template": allocs[0].vnpu_template.name, "device": allocs[0].device.index}
    return payload


def launch(job_id: int) -> bool:
    """Send a running job to its node agents; idempotent on the agent side."""
    job = Job.objects.select_related("team").filter(pk=job_id, state=Job.State.RUNNING).first()
    if job is None:
        return False
    node_ids = set(job.allocations.filter(end__isnull=True).values_list("device__node_id", flat=True))
    ok = True
    for node in Node.objects.filter(pk__in=node_ids):
        if not node.agent_url:
            continue
        try:
            AgentClient(node).launch(launch_payload(job, node))
        except AgentError as exc:
            ok = False
            log.warning("launch of job %s on %s failed: %s", job_id, node.name, exc)
    if ok:
        Job.objects.filter(pk=job_id, state=Job.State.RUNNING).update(launched=True)
    return ok


def stop(job_id: int) -> None:
    """Stop a job on every node it used (idempotent on the agent side)."""
    node_ids = set(Allocation.objects.filter(job_id=job_id).values_list("device__node_id", flat=True))
    _stop_quietly(job_id, list(node_ids))
