"""Node polling: fetch what every agent reports, and apply node reachability and device health.

A poll has three phases, so no database transaction is ever open during a network call:

1. **fetch** — every agent is asked for its devices and jobs, concurrently, each call with a timeout;
2. **apply** — node by node, one short transaction each (under the cluster lock, so a tick
   never decides on half-applied health): reachability, readings, the health state machine
   (:mod:`devices.services.health`) with a :class:`HealthEvent` per transition (here), and the jobs the
   agent reports reconciled with the database (the agents' executor, ``devices.executors.agents``).
   What this needs of the agents is collected as actions;
3. **act** — stop runs that must not run, ask about jobs an agent seems to have forgotten, and
   (re)launch jobs that no agent has accepted yet, again concurrently (``devices.executors.agents``).

A node that stops answering, or a device that fails, takes its running jobs with it: they are
requeued (``scheduling.transitions.requeue``) and their runs stopped wherever they still run.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, TypeVar

from django.utils import timezone

from devices.executors.base import CANCEL_GRACE_S as CANCEL_GRACE_S  # where it lived before
from devices.executors.base import EVICT_GRACE_S, Observation
from devices.models import Device, HealthEvent, Node
from devices.services import health as hm
from devices.services import inventory
from devices.services.agent_client import AgentAddress, AgentClient, AgentError
from npuportal.cluster_lock import lock_cluster as lock_cluster  # where it lived before
from scheduling import transitions
from scheduling.models import Allocation, Job

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


#: Most agents called at once.
MAX_PARALLEL = 16


def parallel(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` over ``items`` in threads (network calls only: threads never touch the database)."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL, len(items))) as pool:
        return list(pool.map(fn, items))


def running_jobs_on(node_id: int) -> list[int]:
    return list(
        Allocation.objects.filter(device__node_id=node_id, end__isnull=True, job__state=Job.State.RUNNING)
        .values_list("job_id", flat=True)
        .distinct()
        .order_by("job_id")
    )


def job_addresses(job_id: int) -> list[AgentAddress]:
    """Agents of the nodes a job holds devices on now."""
    nodes = Node.objects.filter(devices__allocations__job_id=job_id, devices__allocations__end__isnull=True)
    return [AgentAddress.of(n) for n in nodes.exclude(agent_url="").distinct().order_by("name")]


@dataclass
class PollResult:
    node_id: int
    #: When the agent was asked: the time of the readings, and of any failure they show.
    fetched_at: datetime
    devices: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] | None = None
    error: str = ""


@dataclass(frozen=True)
class Stop:
    address: AgentAddress
    agent_job_id: str
    grace_s: float
    why: str


@dataclass
class Actions:
    """Agent calls decided while applying polls, made once the transactions are committed."""

    stops: list[Stop] = field(default_factory=list)
    #: ``(agent, job id, agent job id)`` of launched jobs missing from the agent's list.
    confirm: list[tuple[AgentAddress, int, str]] = field(default_factory=list)
    relaunch: set[int] = field(default_factory=set)


#: What a poll found and did: the executor's observation (``devices.executors.base``).
PollSummary = Observation


#: agent job id → {node id: the agent's record}, over every agent that answered this poll.
SeenJobs = dict[str, dict[int, dict[str, Any]]]


def fetch(address: AgentAddress) -> PollResult:
    at = timezone.now()
    client = AgentClient(address)
    try:
        devices = client.devices()
        jobs = client.jobs()
    except AgentError as exc:
        return PollResult(address.node_id, at, error=str(exc))
    return PollResult(address.node_id, at, devices=devices, jobs=jobs)


def seen_jobs(results: Iterable[PollResult]) -> SeenJobs:
    seen: SeenJobs = defaultdict(dict)
    for result in results:
        for record in result.jobs or ():
            seen[str(record.get("job_id"))][result.node_id] = record
    return seen


def apply_health(result: PollResult, summary: PollSummary, actions: Actions) -> tuple[Node, bool]:
    """Apply one node's reachability and device health, in the caller's transaction (under the cluster lock).

    Returns the node and whether the jobs its agent reported are to be reconciled: they are when
    the agent answered, even if its vendor tool could not read the devices.
    """
    t = hm.Thresholds.from_settings()
    node = Node.objects.select_for_update().get(pk=result.node_id)
    now = timezone.now()
    tool_error = (result.devices or {}).get("error") if not result.error else None
    if result.error:
        _apply_missed(node, result, now, t, summary, actions)
        return node, False
    if tool_error:
        # The agent answered but its vendor tool could not read the devices (npu-smi timed out,
        # say). That is no reading, not a verdict that every device failed: health stays as it
        # was and the poll counts as missed, so a tool that keeps failing still ends with the
        # node unreachable. The agent does know its jobs, so those are reconciled as usual.
        _apply_missed(node, replace(result, error=f"device readings failed: {tool_error}"), now, t, summary, actions)
        return node, node.reachable
    _apply_answer(node, result, now, t)
    _apply_devices(node, result, now, t, summary, actions)
    return node, True


def _apply_missed(
    node: Node, result: PollResult, now: datetime, t: hm.Thresholds, summary: PollSummary, actions: Actions
) -> None:
    node.missed_polls += 1
    node.answered_polls = 0
    node.last_poll_error = result.error[:500]
    log.info("poll of node %s failed (%s in a row): %s", node.name, node.missed_polls, result.error)
    node.save(update_fields=["missed_polls", "answered_polls", "last_poll_error"])
    if node.reachable and node.missed_polls >= t.missed_polls:
        log.warning("node %s unreachable after %s missed polls: %s", node.name, node.missed_polls, result.error)
        mark_unreachable(
            node,
            at=now,
            reason=f"missed {node.missed_polls} polls in a row; last error: {result.error}",
            cause=f"missed {node.missed_polls} polls in a row",
        )
    if node.reachable:
        return
    # Usage is charged up to the last poll the node answered: after it nobody knows what ran.
    requeue_jobs_on(
        node,
        f"node {node.name} stopped answering ({node.missed_polls} polls missed; last error: {result.error})",
        node.last_heartbeat or now,
        summary,
        actions,
    )


def mark_unreachable(node: Node, *, at: datetime, reason: str, cause: str) -> None:
    """``node`` goes ``reachable → unreachable``: its health event and inventory history, in the caller's transaction.

    The agents' poll calls it after missed polls, the Slurm executor when Slurm says the node is down.
    """
    node.reachable = False
    node.save(update_fields=["reachable"])
    HealthEvent.objects.create(node=node, at=at, from_health="reachable", to_health="unreachable", reason=reason[:500])
    _record_node(node, at, cause)


def mark_reachable(node: Node, *, at: datetime, reason: str, cause: str) -> None:
    """``node`` is back (``unreachable → reachable``): it takes work again; its event and inventory history."""
    node.reachable = True
    node.save(update_fields=["reachable"])
    HealthEvent.objects.create(node=node, at=at, from_health="unreachable", to_health="reachable", reason=reason[:500])
    _record_node(node, at, cause)


def requeue_jobs_on(node: Node, detail: str, at: datetime, summary: PollSummary, actions: Actions) -> None:
    """Requeue every job running on an unreachable ``node`` (``NodeUnreachable``) and stop it wherever it runs.

    Its node or agent went away, which says nothing of the job: no retry is counted.
    """
    for job_id in running_jobs_on(node.pk):
        requeue_and_stop(job_id, "NodeUnreachable", detail, at, summary, actions, skip_node=node.pk, count_retry=False)


def _apply_answer(node: Node, result: PollResult, now: datetime, t: hm.Thresholds) -> None:
    """The agent answered: a reachable node stays so; an unreachable one rejoins after a streak.

    A node that went away once may go away again (a flaky link, an agent that crashes in a
    loop): work placed on it at its first answer would be requeued again a few polls later,
    losing what it did. So it takes work again only after ``AGENT_REJOIN_POLLS`` answers in a
    row; a missed poll on the way starts the streak over. Its stale runs are stopped at the
    first answer all the same (see :func:`_reconcile_jobs`).
    """
    node.answered_polls += 1
    rejoined = False
    if not node.reachable:
        if node.answered_polls >= t.node_rejoin_polls:
            rejoined = True
            log.warning("node %s is reachable again", node.name)
        else:
            log.info(
                "node %s answers again (%s of %s polls in a row before it takes work)",
                node.name,
                node.answered_polls,
                t.node_rejoin_polls,
            )
    body_error = (result.devices or {}).get("error") or ""
    node.missed_polls = 0
    node.last_heartbeat = result.fetched_at
    node.last_poll_error = f"device readings: {body_error}"[:500] if body_error else ""
    node.save(update_fields=["missed_polls", "answered_polls", "last_heartbeat", "last_poll_error"])
    if rejoined:
        mark_reachable(
            node,
            at=now,
            reason=f"the agent answered {node.answered_polls} polls in a row after being unreachable",
            cause="the agent answers again",
        )


def _apply_devices(
    node: Node, result: PollResult, now: datetime, t: hm.Thresholds, summary: PollSummary, actions: Actions
) -> None:
    reports: dict[int, dict[str, Any]] = {}
    for entry in (result.devices or {}).get("devices", []):
        if isinstance(entry, dict) and isinstance(entry.get("index"), int):
            reports[entry["index"]] = entry
    changed: list[Device] = []
    for device in Device.objects.select_for_update().filter(node=node).order_by("index"):
        device.node = node
        report = reports.get(device.index)
        verdict = hm.classify(report, known_ecc=device.ecc_errors, first_reading=device.last_seen is None, t=t)
        if report is not None:
            device.temp_c = _number(report.get("temp_c"))
            device.power_w = _number(report.get("power_w"))
            device.aicore_pct = _number(report.get("aicore_pct"))
            hbm = report.get("hbm_used_mb")
            device.hbm_used_mb = hbm if isinstance(hbm, int) and hbm >= 0 else None
            ecc = report.get("ecc_errors")
            if isinstance(ecc, int) and not isinstance(ecc, bool) and ecc >= 0:
                device.ecc_errors = ecc
            device.last_seen = result.fetched_at
        old = device.health
        step = hm.step(old, device.healthy_streak, verdict, t.rejoin_polls)
        device.health, device.healthy_streak, device.health_detail = step.health, step.streak, step.detail[:300]
        device.save(
            update_fields=[
                "health",
                "healthy_streak",
                "health_detail",
                "temp_c",
                "power_w",
                "aicore_pct",
                "hbm_used_mb",
                "ecc_errors",
                "last_seen",
            ]
        )
        if step.changed:
            HealthEvent.objects.create(
                node=node,
                device=device,
                at=result.fetched_at,
                from_health=old,
                to_health=step.health,
                reason=step.detail[:500],
            )
            worse = hm.SEVERITY[step.health] > hm.SEVERITY.get(old, 3)
            log.log(
                logging.WARNING if worse else logging.INFO,
                "device %s/%s: %s → %s (%s)",
                node.name,
                device.index,
                old,
                step.health,
                step.detail,
            )
            if step.health == hm.FAILED:
                summary.failed_devices.append(device.pk)
            changed.append(device)
        if device.health != hm.FAILED:
            continue
        # Level-triggered: a job that landed on a failed device by a race is evicted at the next poll too.
        at = result.fetched_at if step.changed else now
        for job_id in (
            Allocation.objects.filter(device=device, end__isnull=True, job__state=Job.State.RUNNING)
            .values_list("job_id", flat=True)
            .distinct()
        ):
            requeue_and_stop(
                job_id,
                "DeviceFailed",
                f"device {node.name}/{device.index} failed: {device.health_detail}",
                at,
                summary,
                actions,
            )
    # Each card's health change is in its own event's cause (the derived one carries the detail).
    inventory.record(changed, at=result.fetched_at)


def _record_node(node: Node, at: datetime, cause: str) -> None:
    """The inventory history of every card of ``node``, after its reachability changed."""
    devices = list(Device.objects.filter(node=node))
    for device in devices:
        device.node = node
    inventory.record(devices, at=at, cause=cause)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def requeue_and_stop(
    job_id: int,
    reason: str,
    detail: str,
    at: datetime,
    summary: PollSummary,
    actions: Actions,
    *,
    skip_node: int | None = None,
    reported_at: datetime | None = None,
    count_retry: bool = True,
) -> None:
    """Requeue a running job and stop it on every agent that can be reached.

    The retry budget applies unless ``count_retry`` is false: a run the system stopped
    (:func:`stopped_by_system`) says nothing about the job, so it costs the job nothing.
    """
    row = Job.objects.filter(pk=job_id).values_list("agent_job_id", "launched").first()
    if row is None:
        return
    addresses = [a for a in job_addresses(job_id) if a.node_id != skip_node]
    transitions.requeue(job_id, reason=reason, detail=detail, at=at, reported_at=reported_at, count_retry=count_retry)
    summary.requeued.append(job_id)
    stored, launched = row
    run_id = stored or (str(job_id) if launched else "")
    if run_id:
        actions.stops.extend(Stop(a, run_id, EVICT_GRACE_S, reason) for a in addresses)


def stop_all(stops: Sequence[Stop]) -> None:
    def one(item: Stop) -> None:
        try:
            AgentClient(item.address).stop(item.agent_job_id, grace_s=item.grace_s, reason=item.why)
            log.info("stopped run %s on %s (%s)", item.agent_job_id, item.address.name, item.why)
        except AgentError as exc:
            log.info("could not stop run %s on %s (%s): %s", item.agent_job_id, item.address.name, item.why, exc)

    unique: dict[tuple[int, str], Stop] = {}
    for s in stops:  # one call per run; the first reason given is the most specific (a device failed, say)
        unique.setdefault((s.address.node_id, s.agent_job_id), s)
    parallel(one, list(unique.values()))
