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
from typing import Any
from zoneinfo import ZoneInfo

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import F, FloatField, Func, Q, QuerySet

from devices.models import Device, Node, VnpuTemplate
from quotas.models import Membership, Team
from scheduling.engine.policy import Policy
from scheduling.engine.snapshot import DeviceState, JobState, NodeState, Promise, Slot, Snapshot
from scheduling.engine.snapshot import VnpuTemplate as EngineTemplate
from scheduling.models import Allocation, Job, JobPromise
from scheduling.services.dependencies import standings

#: Usage older than this many half-lives weighs under 1/16 and is not read.
USAGE_WINDOW_HALF_LIVES = 4


@dataclass
class LoadedState:
    """What the persist step compares against, keyed by job id."""

    #: pending job id -> (reason, detail, estimated start in whole epoch seconds)
    waiting: dict[int, tuple[str, str, float | None]] = field(default_factory=dict)
    running: dict[int, JobState] = field(default_factory=dict)
    template_ids: dict[tuple[str, str], int] = field(default_factory=dict)
    device_ai_cores: dict[int, int] = field(default_factory=dict)
    device_node: dict[int, int] = field(default_factory=dict)
    device_chip: dict[int, str] = field(default_factory=dict)
    #: pending job id -> its promise as stored (``JobPromise``)
    promises: dict[int, Promise] = field(default_factory=dict)


class EpochSeconds(Func):
    """A timestamp as float seconds since the epoch, computed by the database.

    Turning tens of thousands of timestamps into ``datetime`` objects costs
    more than the rest of the load together; the engine wants floats anyway.
    """

    output_field = FloatField()

    def as_postgresql(self, compiler, connection, **extra):
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::float8", **extra)

    def as_sqlite(self, compiler, connection, **extra):
        template = "((julianday(%(expressions)s) - 2440587.5) * 86400.0)"
        return self.as_sql(compiler, connection, template=template, **extra)


def epoch(field: str) -> EpochSeconds:
    return EpochSeconds(F(field))


def raw_rows(queryset: QuerySet[Any]) -> list[tuple[Any, ...]]:
    """The queryset's rows as the driver returns them, skipping Django's per-value converters.

    Only for ``values_list`` querysets of plain numbers and strings on the tick's
    hot path, where the converters cost more than the query.
    """
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def month_start(now: datetime, tz: str) -> datetime:
    """First instant of ``now``'s calendar month in the policy's timezone."""
    local = now.astimezone(ZoneInfo(tz))
    return local.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def load_snapshot(now: datetime, policy: Policy) -> tuple[Snapshot, LoadedState]:
    state = LoadedState()
    nodes_by_id: dict[int, NodeState] = {}
    # A removed node (``removed_at``) has left the inventory: its rows stay for the history, unscheduled.
    node_rows = list(Node.objects.filter(removed_at__isnull=True).values_list("id", "name", "state", "reachable"))
    for node_id, name, node_state, reachable in node_rows:
        nodes_by_id[node_id] = NodeState(
            name=name,
            devices=[],
            schedulable=node_state == Node.State.READY and reachable,
            state=node_state if reachable else "unreachable",
        )
    usable_health = Device.USABLE_HEALTH
    device_rows = raw_rows(
        Device.objects.filter(node__removed_at__isnull=True)
        .values_list(
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
            "outside_use",
        )
        .order_by("node_id", "index")
    )
    for row in device_rows:
        dev_id, node_id, index, chip, group, hbm, cores, cpus, health, schedulable, outside = row
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
                # A card a job outside the portal holds (Slurm's, seen at the executor's poll) is
                # unusable as a cordoned or unhealthy one is: the engine never gives it.
                usable=bool(schedulable) and health in usable_health and node.schedulable and not outside,
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
    for job_id, device_id, tid in raw_rows(
        Allocation.objects.filter(end__isnull=True).values_list("job_id", "device_id", "vnpu_template_id")
    ):
        slots_by_job[job_id].append(Slot(device_id, template_names.get(tid) if tid else None))

    pending: list[JobState] = []
    running: list[JobState] = []
    now_ts = now.timestamp()
    rows = (
        Job.objects.filter(state__in=[Job.State.PENDING, Job.State.RUNNING])
        .annotate(
            sub_ts=epoch("submitted_at"),
            start_ts=epoch("started_at"),
            dl_ts=epoch("preempt_deadline"),
            est_ts=epoch("estimated_start"),
            own_ts=epoch("own_limits_since"),
        )
        .values_list(
            "id",
            "team__name",
            "submitter__username",
            "priority_class",
            "num_devices",
            "vnpu_template_id",
            "chip_model",
            "sub_ts",
            "estimated_duration_s",
            "max_duration_s",
            "start_ts",
            "dl_ts",
            "preempted_for",
            "checkpoint_interval_s",
            "state",
            "pending_reason",
            "pending_detail",
            "est_ts",
            "depends_on",
            "array_id",
            "array_limit",
            "own_limits_s",
            "own_ts",
        )
        .order_by("id")
    )
    running_state = Job.State.RUNNING
    depending: list[tuple[int, str]] = []
    array_limits: dict[int, tuple[str, int]] = {}
    for (job_id, team, user, pclass, ndev, tid, chip, submitted, est, max_s, started, deadline,
         preempted_for, checkpoint, job_state, reason, detail, est_start, depends_on, array_id,
         array_limit, own_s, own_ts) in raw_rows(rows):  # fmt: skip
        # Positional on purpose: this loop runs once per queued job on every tick.
        job = JobState(
            job_id,
            team,
            user,
            pclass,
            ndev,
            submitted,
            float(est),
            template_names.get(tid) if tid else None,
            chip or None,
            float(max_s) if max_s else None,
            started,
            (),
            deadline,
            preempted_for,
            float(checkpoint) if checkpoint else None,
            # Its time at its own team's limits so far, the current stretch included.
            float(own_s or 0.0) + (max(0.0, now_ts - own_ts) if own_ts is not None else 0.0),
        )
        if array_limit:
            array_limits[job_id] = (array_id, array_limit)
        if job_state == running_state:
            job.slots = tuple(slots_by_job.get(job_id, ()))
            running.append(job)
            state.running[job_id] = job
        else:
            pending.append(job)
            state.waiting[job_id] = (reason, detail, round(est_start) if est_start is not None else None)
            if depends_on:
                depending.append((job_id, depends_on))

    for job_id, devices, until in (
        JobPromise.objects.filter(job__state=Job.State.PENDING)
        .annotate(until_ts=epoch("until"))
        .values_list("job_id", "devices", "until_ts")
    ):
        if devices:
            state.promises[job_id] = Promise(job_id, tuple(int(d) for d in devices), until)

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
        promises=dict(state.promises),
        # Everything the nodes and devices above were built from: equal rows, equal inventory
        # (the engine then keeps its layout without reading the 8,000 devices of a large cluster).
        inventory_values=(node_rows, device_rows),
        # Where the waiting jobs' dependencies stand (two queries, only when some job has any).
        dependencies=standings(depending) if depending else None,
        array_limits=array_limits or None,
        member_limits=member_limits() or None,
    )
    return snapshot, state


def member_limits() -> dict[tuple[str, str], tuple[float | None, int | None]]:
    """The limits team leads set on members, by (team, username): one query, of the few rows that have any."""
    rows = Membership.objects.filter(Q(max_devices__isnull=False) | Q(max_jobs__isnull=False)).values_list(
        "team__name", "user__username", "max_devices", "max_jobs"
    )
    return {(team, user): (cards, jobs) for team, user, cards, jobs in rows}


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
    if connection.vendor == "postgresql" and decay_k:
        return _usage_postgres(now_ts, decay_k, since_ts, oldest)
    rows = Allocation.objects.filter(Q(end__isnull=True) | Q(end__gte=datetime.fromtimestamp(oldest, tz=now.tzinfo)))
    for team, user, share, s, end in raw_rows(
        rows.annotate(s_ts=epoch("start"), e_ts=epoch("end")).values_list(
            "job__team__name", "job__submitter__username", "device_share", "s_ts", "e_ts"
        )
    ):
        e = min(end, now_ts) if end is not None else now_ts
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


def _usage_postgres(now_ts: float, decay_k: float, since_ts: float, oldest: float) -> tuple[dict, dict]:
    """The same sums as :func:`_usage`, aggregated by PostgreSQL: one row per (team, user) comes back."""
    sql = f"""
        WITH spans AS (
            SELECT t.name AS team, u.{get_user_model().USERNAME_FIELD} AS username, a.device_share AS share,
                   EXTRACT(EPOCH FROM a.start)::float8 AS s,
                   LEAST(COALESCE(EXTRACT(EPOCH FROM a."end")::float8, %(now)s), %(now)s) AS e
            FROM {Allocation._meta.db_table} a
            JOIN {Job._meta.db_table} j ON j.id = a.job_id
            JOIN {Team._meta.db_table} t ON t.id = j.team_id
            JOIN {get_user_model()._meta.db_table} u ON u.id = j.submitter_id
            WHERE a."end" IS NULL OR a."end" >= to_timestamp(%(oldest)s)
        )
        SELECT team, username,
               SUM(share * (EXP(-%(k)s * (%(now)s - e)) - EXP(-%(k)s * (%(now)s - s))) / %(k)s / 3600.0),
               SUM(share * GREATEST(0, e - GREATEST(s, %(since)s)) / 3600.0)
        FROM spans WHERE e > s GROUP BY team, username
    """
    usage: dict[tuple[str, str], float] = {}
    month: dict[str, float] = defaultdict(float)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"now": now_ts, "k": decay_k, "since": since_ts, "oldest": oldest})
        for team, user, decayed, month_hours in cursor.fetchall():
            usage[(team, user)] = decayed
            month[team] += month_hours
    return usage, dict(month)
