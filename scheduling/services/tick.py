"""The scheduling tick: load the snapshot, let the core decide, persist, all under one lock.

Two workers may fire the tick at the same moment (beat on two machines, a
retried message). The whole read-decide-write runs in one transaction that
first takes a cluster-wide lock — a PostgreSQL advisory lock, or SQLite's
write lock taken up front by ``transaction_mode=IMMEDIATE`` — so the second
tick sees the first one's allocations and can never hand out the same device.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from devices.services import inventory
from devices.services.draining import mark_drained
from npuportal.cluster_lock import TICK_LOCK_KEY as TICK_LOCK_KEY  # where it lived before
from npuportal.cluster_lock import lock_cluster as _lock_cluster
from quotas.policies.versions import active_policy
from scheduling import transitions
from scheduling.engine import reasons
from scheduling.engine.decide import decide
from scheduling.engine.estimate import ESTIMATED_REASONS, estimate_starts
from scheduling.engine.snapshot import Decisions, Snapshot
from scheduling.models import Allocation, Job, JobEvent, JobPromise, TickRecord
from scheduling.services.snapshot import LoadedState, load_snapshot

log = logging.getLogger(__name__)


@dataclass
class TickResult:
    started: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    evicted: list[int] = field(default_factory=list)
    #: Running jobs whose preemption was called off at its deadline (no waiting job needs them).
    called_off: list[int] = field(default_factory=list)
    #: Waiting jobs cancelled because their dependencies can never be satisfied.
    cancelled: list[int] = field(default_factory=list)
    waiting: int = 0
    policy_version: int | None = None
    duration_ms: float = 0.0
    decide_ms: float = 0.0
    #: The planning pass that gives later waiting jobs an estimated start (after ``decide``).
    estimate_ms: float = 0.0
    load_ms: float = 0.0
    persist_ms: float = 0.0


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


def run_tick(now: datetime | None = None) -> TickResult:
    """One full tick. Side effects on agents are queued to run after the commit.

    The cyclic garbage collector is off for the tick: loading allocates tens of
    thousands of small acyclic objects (a job, device or slot per row) that live
    until the tick ends, and every few thousand allocations the collector would
    walk the worker's whole heap to find nothing — at 10k pending jobs that
    doubled the load. It runs again afterwards and frees what the tick left.
    """
    enabled = gc.isenabled()
    if enabled:
        gc.disable()
    try:
        return _run_tick(now)
    finally:
        if enabled:
            gc.enable()


def _run_tick(now: datetime | None) -> TickResult:
    t0 = time.perf_counter()
    result = TickResult()
    with transaction.atomic():
        _lock_cluster()
        now = now or timezone.now()
        active = active_policy()
        result.policy_version = active.version
        snapshot, loaded = load_snapshot(now, active.policy)
        t1 = time.perf_counter()
        decisions = decide(snapshot)
        t2 = time.perf_counter()
        estimated = _estimate_due(now)
        if estimated:
            try:
                estimate_starts(snapshot, decisions, settings.ESTIMATE_MAX_JOBS)
            except Exception:  # estimates change no decision: a fault there must not stop scheduling
                log.exception("the planning pass of estimated starts failed; stored estimates are kept")
                estimated = False
        t2b = time.perf_counter()
        keep = not estimated and settings.ESTIMATE_MAX_JOBS > 0  # turned off: clear what passes stored
        _persist(snapshot, loaded, decisions, active.version, result, keep_estimates=keep)
        # After the evictions, and as a sweep for any path that closed a draining node's last allocation.
        mark_drained()
        # A backstop for the inventory history: a path that changed a card's status without
        # recording it is caught within one tick (one query when nothing changed).
        inventory.sweep(at=now)
        t3 = time.perf_counter()
        result.load_ms = (t1 - t0) * 1000
        result.decide_ms = (t2 - t1) * 1000
        result.estimate_ms = (t2b - t2) * 1000
        result.persist_ms = (t3 - t2b) * 1000
        result.duration_ms = (t3 - t0) * 1000
        TickRecord.objects.create(
            started_at=now,
            duration_ms=result.duration_ms,
            decide_ms=result.decide_ms,
            estimate_ms=result.estimate_ms if estimated else None,
            policy=active.record,
            policy_version=active.version,
            pending=len(snapshot.pending),
            running=len(snapshot.running),
            starts=len(result.started),
            preemptions=len(result.preempted),
            evictions=len(result.evicted),
        )
    return result


def _estimate_due(now: datetime) -> bool:
    """Whether this tick runs the planning pass (``ESTIMATE_INTERVAL_S`` since the last one).

    Each pass moves the estimates of every job behind a job that ended early,
    often thousands of rows; once per interval is what users can read, and the
    ticks between keep what the last pass stored. The last pass is found in the
    tick records, so every worker agrees under the tick's lock.
    """
    if settings.ESTIMATE_MAX_JOBS <= 0:
        return False
    interval = settings.ESTIMATE_INTERVAL_S
    if interval <= 0:
        return True
    last = (
        TickRecord.objects.filter(estimate_ms__isnull=False)
        .order_by("-started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    return last is None or not 0 <= (now - last).total_seconds() < interval


def adapt(value: datetime | None) -> object:
    return connection.ops.adapt_datetimefield_value(value)


def _write_waits(rows: list[tuple[str, str, object, int]]) -> None:
    """Many small updates: one ``UPDATE ... FROM (VALUES ...)`` per 1,000 rows on PostgreSQL.

    ``bulk_update`` builds one CASE expression per column and batch, which
    PostgreSQL plans slowly once thousands of jobs change reason at once (the
    first tick after a restart). A prepared UPDATE repeated per row is linear
    but pays a round trip per row: about 85 us, which made the 2,000 estimates
    a planning pass moves cost more than the rest of the tick. SQLite runs in
    process, where the repeated statement is cheapest.
    """
    table = Job._meta.db_table
    with connection.cursor() as cursor:
        if connection.vendor != "postgresql":
            sql = f"UPDATE {table} SET pending_reason = %s, pending_detail = %s, estimated_start = %s WHERE id = %s"
            cursor.executemany(sql, rows)
            return
        for i in range(0, len(rows), 1000):
            batch = rows[i : i + 1000]
            values = ", ".join(["(%s, %s, %s::timestamptz, %s::bigint)"] * len(batch))
            cursor.execute(
                f"UPDATE {table} AS j SET pending_reason = v.reason, pending_detail = v.detail, "
                f"estimated_start = v.est FROM (VALUES {values}) AS v(reason, detail, est, id) WHERE j.id = v.id",
                [value for row in batch for value in row],
            )


def _count_own_limits(loaded: LoadedState, decisions: Decisions, now: datetime) -> None:
    """Keep each job's time at its own team's limits (``Job.own_limits_s``) for the starvation guard.

    A job the tick leaves waiting for its team's limits (``reasons.QUOTA_REASONS``) starts a
    stretch (``own_limits_since``) unless one runs; one that no longer waits so (it started, or
    waits for cards now) adds its stretch to ``own_limits_s``. Only jobs that change side are
    written, so a quiet tick writes nothing.
    """
    own = reasons.QUOTA_REASONS
    waiting = decisions.waiting
    entering: list[int] = []
    leaving: list[int] = []
    for job_id, old in loaded.waiting.items():
        was = old[0] in own
        wait = waiting.get(job_id)
        now_own = wait is not None and wait.reason in own
        if now_own and not was:
            entering.append(job_id)
        elif was and not now_own:
            leaving.append(job_id)
    if entering:
        Job.objects.filter(pk__in=entering, own_limits_since__isnull=True).update(own_limits_since=now)
    if leaving:
        stretches = Job.objects.filter(pk__in=leaving, own_limits_since__isnull=False)
        jobs = list(stretches.only("own_limits_s", "own_limits_since"))
        for job in jobs:
            assert job.own_limits_since is not None
            job.own_limits_s += max(0.0, (now - job.own_limits_since).total_seconds())
            job.own_limits_since = None
        Job.objects.bulk_update(jobs, ["own_limits_s", "own_limits_since"])


def _persist_promises(loaded: LoadedState, decisions: Decisions) -> None:
    """Store the promises in force (``JobPromise``); delete the ones that ended.

    A promise ends when its job starts, is no longer waiting, or lapses; the
    next tick must not hold cards for it. Only changed rows are written: the
    rows of ended and changed promises go in one delete, the new ones come
    back in one insert.
    """
    changed = [p for job_id, p in decisions.promises.items() if loaded.promises.get(job_id) != p]
    stale = [job_id for job_id in loaded.promises if job_id not in decisions.promises]
    stale += [p.job_id for p in changed if p.job_id in loaded.promises]
    if stale:
        JobPromise.objects.filter(job_id__in=stale).delete()
    if changed:
        JobPromise.objects.bulk_create(
            [JobPromise(job_id=p.job_id, devices=list(p.devices), until=_dt(p.until)) for p in changed]
        )


def _persist(
    snapshot: Snapshot,
    loaded: LoadedState,
    decisions: Decisions,
    version: int | None,
    result: TickResult,
    keep_estimates: bool = False,
) -> None:
    """Write the decisions; ``keep_estimates``: the planning pass did not run, keep what it stored.

    A job still waiting for capacity with the same reason keeps its stored
    estimate until the next pass, where ``decide`` gives it none.
    """
    now = snapshot.now
    policy = snapshot.policy
    events: list[JobEvent] = []

    # Evictions first: their devices are what some starts below were promised.
    if decisions.evictions:
        requeue = policy.on_preempt == "requeue"
        transitions.evict_many(decisions.evictions, now, requeue=requeue, version=version, events=events)
        result.evicted = list(decisions.evictions)

    if decisions.cancelled:  # waiting jobs whose dependencies can never be satisfied
        result.cancelled = transitions.cancel_waiting_many(
            decisions.cancelled, now, reason=reasons.DEPENDENCY_NEVER_SATISFIED, version=version
        )

    if decisions.called_off:
        transitions.call_off_many(decisions.called_off, now, version=version, events=events)
        result.called_off = list(decisions.called_off)

    if decisions.starts:
        starts: list[transitions.Start] = []
        for start in decisions.starts:
            allocations: list[Allocation] = []
            for slot in start.slots:
                share = 1.0
                tid = None
                if slot.vnpu_template is not None:
                    chip = loaded.device_chip[slot.device_id]
                    template = snapshot.templates[(chip, slot.vnpu_template)]
                    tid = loaded.template_ids[(chip, slot.vnpu_template)]
                    cores = loaded.device_ai_cores.get(slot.device_id) or template.ai_cores or 1
                    share = template.ai_cores / cores
                allocations.append(
                    Allocation(
                        job_id=start.job_id,
                        device_id=slot.device_id,
                        vnpu_template_id=tid,
                        device_share=share,
                        start=now,
                    )
                )
            starts.append(transitions.Start(start.job_id, allocations, start.backfilled))
        transitions.start_many(starts, now, version=version, events=events)
        result.started = [s.job_id for s in decisions.starts]

    transitions.schedule_preemptions(
        [transitions.Preemption(p.job_id, _dt(p.grace_deadline), p.for_job, p.reason) for p in decisions.preemptions],
        now,
        version=version,
        events=events,
    )
    result.preempted.extend(p.job_id for p in decisions.preemptions)

    _persist_promises(loaded, decisions)

    # Waiting reasons: write only the ones that changed, so a quiet tick writes nothing.
    changed: list[tuple[str, str, object, int]] = []
    for job_id, wait in decisions.waiting.items():
        old = loaded.waiting.get(job_id)
        if old is None:
            continue
        at = wait.estimated_start
        est = round(at) if at is not None and math.isfinite(at) else None
        if est is None and keep_estimates and old[0] == wait.reason and wait.reason in ESTIMATED_REASONS:
            est = old[2]
        detail = wait.detail[:300]
        if (old[0], old[1], old[2]) != (wait.reason, detail, est):
            changed.append((wait.reason, detail, adapt(_dt(est)), job_id))
    if changed:
        _write_waits(changed)
    _count_own_limits(loaded, decisions, now)
    result.waiting = len(decisions.waiting)
    transitions.record_events(events)
