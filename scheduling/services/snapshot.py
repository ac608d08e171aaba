"""Builds the engine's snapshot from the database, with as few queries as possible.

The tick is the hot path, so rows are read with ``values_list`` (no model
instances) and everything the persist step needs to write only what changed is
kept in :class:`LoadedState`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from zoneinfo import ZoneInfo

from django.db.models import Q

from devices.models import Device, Node, VnpuTemplate
from scheduling.engine.policy import Policy
from scheduling.engine.snapshot import DeviceState, JobState, NodeState, Slot, Snapshot
from scheduling.engine.snapshot import VnpuTemplate as EngineTemplate
from scheduling.models import Allocation, Job

#: Usage older than this many half-lives weighs under 1/16 and is not read.
USAGE_WINDOW_HALF_LIVES = 4


@dataclass
class LoadedState:
    """What the persist step compares against, keyed by job id."""

    waiting: dict[int, tuple[str, str, datetime | None]] = field(default_factory=dict)
    running: dict[int, JobState] = field(default_factory=dict)
    template_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    device_ai_cores: dict[int, int] = field(default_factory=dict)
    device_node: dict[int, int] = field(default_factory=dict)
    device_chip: dict[int, str] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def month_start(now: datetime, tz: str) -> datetime:
    """First instant of ``now``'s calendar month in the policy's timezone."""
    local = now.astimezone(ZoneInfo(tz))
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def load_snapshot(now: datetime, policy: Policy) -> tuple[Snapshot, LoadedState]:
    state = LoadedState()
    nodes_by_id: dict[int, NodeState] = {}
    for node_id, name, node_state, reachable in Node.objects.values_list("id", "name", "state", "reachable"):
        nodes_by_id[node_id] = NodeState(
            name=name,
            devices=[],
            schedulable=node_state == Node.State.READY and reachable,
            state=node_state if reachable else "unreachable",
        )
    usable_health = Device.USABLE_HEALTH
    for row in Device.objects.values_list(
        "id",
        "node_id",
        "index",
        "chip_model",
        "topology_group",
        "hbm_mb",
        "ai_cores",
        "ai_cpus",
        "health",
        "schedulable",
    ).order_by("node_id", "index"):
        dev_id, node_id, index, chip, group, hbm, cores, cpus, health, schedulable = row
        node = nodes_by_id[node_id]
        node.devices.append(
            DeviceState(
                id=dev_id,
                node=node.name,
                index=index,
                chip_model=chip,
                topology_group=group or "0",
                hbm_mb=hbm,
                ai_cores=cores,
                ai_cpus=cpus,
                usable=schedulable and health in usable_health and node.schedulable,
                health=health,
            )
        )
        state.device_ai_cores[dev_id] = cores
        state.device_node[dev_id] = node_id
        state.device_chip[dev_id] = chip

    templates: dict[tuple[str, str], EngineTemplate] = {}
    template_names: dict[int, str] = {}
    for tid, chip, name, mem, cores, cpus in VnpuTemplate.objects.values_list(
        "id", "chip_model", "name", "memory_mb", "ai_cores", "ai_cpus"
    ):
        templates[(chip, name)] = EngineTemplate(chip, name, mem, cores, cpus)
        template_names[tid] = name
        state.template_ids[(chip, name)] = tid

    slots_by_job: dict[int, list[Slot]] = defaultdict(list)
    for job_id, device_id, tid in Allocation.objects.filter(end__isnull=True).values_list(
        "job_id", "device_id", "vnpu_template_id"
    ):
        slots_by_job[job_id].append(Slot(device_id, template_names.get(tid) if tid else None))

    pending: list[JobState] = []
    running: list[JobState] = []
    for row in (
        Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
        .values_list(
            "id",
            "team__name",
            "submitter__username",
            "priority_class",
            "num_devices",
            "vnpu_template_id",
            "chip_model",
            "submitted_at",
            "estimated_duration_s",
            "max_duration_s",
            "started_at",
            "preempt_deadline",
            "state",
            "pending_reason",
            "pending_detail",
            "estimated_start",
        )
        .order_by("id")
    ):
        (
            job_id,
            team,
            user,
            pclass,
            ndev,
            tid,
            chip,
            submitted,
            est,
            max_s,
            started,
            deadline,
            job_state,
            reason,
            detail,
            est_start,
        ) = row
        job = JobState(
            id=job_id,
            team=team,
            user=user,
            priority_class=pclass,
            num_devices=ndev,
            submitted_at=submitted.timestamp(),
            estimated_duration_s=float(est),
            vnpu_template=template_names.get(tid) if tid else None,
            chip_model=chip or None,
            max_duration_s=float(max_s) if max_s else None,
            started_at=_ts(started),
            preempt_deadline=_ts(deadline),
        )
        if job_state == Job.State.RUNNING:
            job.slots = tuple(slots_by_job.get(job_id, ()))
            running.append(job)
            state.running[job_id] = job
        else:
            pending.append(job)
            state.waiting[job_id] = (reason, detail, est_start)

    usage, month_hours = _usage(now, policy)
    snapshot = Snapshot(
        now=now,
        policy=policy,
        nodes=list(nodes_by_id.values()),
        pending=pending,
        running=running,
        templates=templates,
        usage=usage,
        month_device_hours=month_hours,
    )
    return snapshot, state


def _usage(now: datetime, policy: Policy) -> tuple[dict[tuple[str, str], float], dict[str, float]]:
    """Decayed device-hours per (team, user) and this month's device-hours per team.

    The decay is integrated exactly over each allocation interval (not sampled
    at its end), so a long job counts the same whether or not it is still running.
    """
    half_life = policy.ordering.usage_half_life_s
    since = month_start(now, policy.timezone)
    window_start = now.timestamp() - USAGE_WINDOW_HALF_LIVES * half_life
    oldest = min(since.timestamp(), window_start)
    now_ts = now.timestamp()
    decay_k = math.log(2) / half_life if half_life > 0 else 0.0
    since_ts = since.timestamp()
    usage: dict[tuple[str, str], float] = defaultdict(float)
    month: dict[str, float] = defaultdict(float)
    rows = Allocation.objects.filter(Q(end__isnull=True) | Q(end__gte=datetime.fromtimestamp(oldest, tz=now.tzinfo)))
    for team, user, share, start, end in rows.values_list(
        "job__team__name", "job__submitter__username", "device_share", "start", "end"
    ):
        s = start.timestamp()
        e = min(end.timestamp(), now_ts) if end is not None else now_ts
        if e <= s:
            continue
        if decay_k:
            # ∫ 2^(-(now-t)/H) dt from s to e, in hours
            hours = (math.exp(-decay_k * (now_ts - e)) - math.exp(-decay_k * (now_ts - s))) / decay_k / 3600.0
        else:
            hours = (e - s) / 3600.0
        usage[(team, user)] += share * hours
        if e > since_ts:
            month[team] += share * (e - max(s, since_ts)) / 3600.0
    return dict(usage), dict(month)
