"""The node agents as an executor: launch runs on them, stop them, and reconcile what they report.

The first implementation of ``devices.executors.base.Executor``. Node polling
(``devices.services.polling``) fetches what every agent reports and applies reachability and
device health; this module brings the jobs the agents report in line with the database, in the
same short transaction per node, and makes the agent calls that follows (stops, checks, launches).

Every job attempt has its own agent job id, ``"<job id>.<attempt>"`` (the attempt counts the job's
starts), stored in ``Job.agent_job_id`` before the launch is sent. A launch retried after a lost
answer is therefore harmless (the agent's POST is idempotent on the id), and a stale run of an
earlier attempt can never be mistaken for the current one: whatever an agent runs that the database
does not have running on that node, under that id, is stopped.

What a run's end does to its job is the transitions' (``scheduling.transitions``): a run that
ended is finished, one the system ended (its agent shut down) is requeued as ``node_fail`` without
counting a retry, and a multi-node run completes when every node's part has succeeded.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db import transaction
from django.db.models import Count
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from devices.agent.exit_words import exit_words
from devices.executors.base import CANCEL_GRACE_S, EVICT_GRACE_S, Observation, ServedNode, runs_ended
from devices.models import Device, Node
from devices.services import polling, rendezvous
from devices.services.agent_client import AgentAddress, AgentClient, AgentError
from devices.services.polling import (
    Actions,
    PollResult,
    PollSummary,
    SeenJobs,
    Stop,
    fetch,
    job_addresses,
    lock_cluster,
    parallel,
    requeue_and_stop,
    running_jobs_on,
    seen_jobs,
    stop_all,
)
from quotas.models import posix_account
from scheduling import transitions
from scheduling.launch_spec import array_shape, output_file
from scheduling.models import Allocation, Job, JobEvent

log = logging.getLogger(__name__)


class AgentExecutor:
    """Jobs run by the portal's node agents (``NPUPORTAL_EXECUTOR=agents``, the default)."""

    name = "agents"

    def launch(self, job_ids: Iterable[int]) -> dict[int, bool]:
        return launch_many(job_ids)

    def stop(self, job_id: int, *, grace_s: float, cause: str) -> None:
        stop(job_id, cause, grace_s=grace_s)

    def observe(self) -> Observation:
        return poll_all()

    def inventory(self) -> list[ServedNode]:
        nodes = Node.objects.exclude(agent_url="").filter(removed_at__isnull=True).order_by("name")
        indexes: dict[int, list[int]] = defaultdict(list)
        for node_id, index in Device.objects.filter(node__in=nodes).order_by("index").values_list("node_id", "index"):
            indexes[node_id].append(index)
        return [ServedNode(n.name, tuple(indexes[n.pk])) for n in nodes]

    def set_node_service(self, node: str, *, in_service: bool, reason: str) -> str | None:
        """Nothing to do: an agent runs only what the portal places, and it places nothing on a cordoned node."""
        return None


#: How much longer than a stopped run's grace a launch waits for it to be gone (the SIGKILL, the reaping).
VACATE_MARGIN_S = 3.0


#: Agent job states in which the job still holds its devices.
AGENT_RUNNING = frozenset({"running", "stopping"})


#: Agent job ids the portal hands out: ``"<job id>.<attempt>"`` (plain ``"<job id>"`` before attempts).
PORTAL_JOB_ID = re.compile(r"[0-9]+(?:\.[0-9]+)?")


def current_attempts(job_ids: Iterable[int]) -> dict[int, int]:
    """Which start each job is on: the number of times it went pending → running (at least 1)."""
    ids = list(job_ids)
    counts = {pk: 1 for pk in ids}
    if not ids:
        return counts
    for row in (
        JobEvent.objects.filter(job_id__in=ids, from_state=Job.State.PENDING, to_state=Job.State.RUNNING)
        .values("job_id")
        .annotate(n=Count("id"))
    ):
        counts[row["job_id"]] = max(1, row["n"])
    return counts


def agent_job_id(job_id: int, attempt: int) -> str:
    return f"{job_id}.{attempt}"


#: An exit status in words, as everywhere (``devices.agent.exit_words``); the name this module gave it.
describe_exit = exit_words


def poll_all() -> PollSummary:
    """Poll every node with an agent once: fetch, apply, act (see the module docstring)."""
    nodes = list(Node.objects.exclude(agent_url="").filter(removed_at__isnull=True).order_by("name"))
    summary = PollSummary()
    if not nodes:
        return summary
    results = parallel(fetch, [AgentAddress.of(n) for n in nodes])
    seen = seen_jobs(results)
    actions = Actions()
    for node, result in zip(nodes, results, strict=True):
        summary.polled += 1
        if result.error:
            summary.failed += 1
            summary.errors[node.name] = result.error
        try:
            apply_poll(result, summary=summary, actions=actions, seen=seen)
        except Exception:
            log.exception("applying the poll of node %s failed", node.name)
    act(actions, summary)
    if summary.finished or summary.requeued:
        runs_ended(summary.finished + summary.requeued)  # after the locks: keeping outputs makes agent calls
    return summary


def apply_poll(
    result: PollResult,
    *,
    summary: PollSummary | None = None,
    actions: Actions | None = None,
    seen: SeenJobs | None = None,
) -> Actions:
    """Apply one node's poll in one transaction; returns the agent calls it needs (see :func:`act`)."""
    summary = summary if summary is not None else PollSummary()
    actions = actions if actions is not None else Actions()
    with transaction.atomic():
        lock_cluster()
        node, answered = polling.apply_health(result, summary, actions)
        if answered:
            _reconcile_jobs(node, result, seen if seen is not None else seen_jobs([result]), summary, actions)
    return actions


def _reconcile_jobs(node: Node, result: PollResult, seen: SeenJobs, summary: PollSummary, actions: Actions) -> None:
    """Bring the database and the agent in line: finish what ended, requeue what was lost, stop what is stale."""
    address = AgentAddress.of(node)
    by_id = {str(r.get("job_id")): r for r in result.jobs or ()}
    _note_accounts(node, by_id, seen)
    rows = list(Job.objects.filter(pk__in=running_jobs_on(node.pk)).values_list("pk", "launched", "agent_job_id"))
    attempts = current_attempts(pk for pk, _, _ in rows)
    expected: set[str] = set()
    for pk, launched, stored in rows:
        run_id = agent_job_id(pk, attempts[pk])
        expected.add(run_id)
        record = by_id.get(run_id)
        if record is None and launched and not stored:  # launched before attempts had their own ids
            run_id = str(pk)
            expected.add(run_id)
            record = by_id.get(run_id)
        if record is None:
            if launched:
                actions.confirm.append((address, pk, run_id))
            else:
                actions.relaunch.add(pk)
            continue
        state = record.get("state")
        if state in AGENT_RUNNING:
            if (not launched or stored != run_id) and _all_parts_running(pk, run_id, seen):
                Job.objects.filter(pk=pk, state=Job.State.RUNNING).update(launched=True, agent_job_id=run_id)
            continue
        if state == "lost":
            lost_at = _when(record.get("ended_at"))
            requeue_and_stop(
                pk,
                "LostOnAgent",
                f"node {node.name} lost the process of run {run_id}: {record.get('reason') or 'no exit status'}",
                lost_at or timezone.now(),
                summary,
                actions,
                reported_at=lost_at,
            )
            continue
        if state not in {"succeeded", "failed", "killed"}:
            continue
        exit_code, reason, detail = outcome(record)
        job_nodes = {a.node_id for a in job_addresses(pk)}
        if reason == "Completed" and len(job_nodes) > 1:
            # A gang is complete when every node's part is; wait for the others (they answer this poll or the next).
            parts = seen.get(run_id, {})
            if not all(parts.get(n, {}).get("state") == "succeeded" for n in job_nodes):
                continue
        first_id, first = node.pk, record
        if reason != "Completed" and len(job_nodes) > 1:
            first_id, first = first_failed_part(run_id, seen, node.pk, record)
        system = stopped_by_system(first)
        if system is not None:
            # The system ended it, not the job: it goes back to the queue in its place (Slurm's NODE_FAIL
            # with requeue), its retries untouched, and any other part of it is stopped.
            ended = _when(first.get("ended_at"))
            where = {a.node_id: a.name for a in job_addresses(pk)}.get(first_id, node.name)
            requeue_and_stop(
                pk,
                "NodeFail",
                f"node {where} stopped run {run_id} ({system}): the system ended it, not the job; "
                "queued again in its place",
                ended or timezone.now(),
                summary,
                actions,
                reported_at=ended,
                count_retry=False,
            )
            continue
        if reason != "Completed" and len(job_nodes) > 1:
            # The job is one unit: the part that failed first ends it, and the others are stopped.
            addresses = job_addresses(pk)
            names = {a.node_id: a.name for a in addresses}
            exit_code, reason, detail = outcome(first)
            failing = names.get(first_id, node.name)
            detail = f"on {failing}: {detail}"
            why = f"the part on {failing} failed ({detail.split(': ', 1)[1]})"
            for other in addresses:
                if other.node_id != first_id:
                    actions.stops.append(Stop(other, run_id, EVICT_GRACE_S, why))
        transitions.finish(
            pk, exit_code=exit_code, ended_at=_when(record.get("ended_at")), detail=detail, reason=reason
        )
        summary.finished.append(pk)
    for run_id, record in by_id.items():
        if record.get("state") == "running" and run_id not in expected and PORTAL_JOB_ID.fullmatch(run_id):
            actions.stops.append(Stop(address, run_id, EVICT_GRACE_S, "not running on this node in the database"))
            summary.stale_stopped.append(f"{node.name}:{run_id}")


def _note_accounts(node: Node, by_id: dict[str, dict[str, Any]], seen: SeenJobs) -> None:
    """Keep on each job running here the POSIX account its agents say its current run runs as (``Job.ran_as``).

    What the agent did, not what the portal asked for: an agent that cannot switch accounts runs
    every job as itself (docs/agent.md#accounts), and the job's page must say so.
    """
    rows = (
        Job.objects.filter(pk__in=running_jobs_on(node.pk))
        .exclude(agent_job_id="")
        .values_list("pk", "agent_job_id", "ran_as")
    )
    for pk, run_id, stored in rows:
        parts = seen.get(run_id) or ({node.pk: by_id[run_id]} if run_id in by_id else {})
        reported = reported_account(parts)
        if reported and reported != stored:
            Job.objects.filter(pk=pk).update(ran_as=reported)


def reported_account(parts: dict[int, dict[str, Any]]) -> str:
    """``root``, or ``ana on n1, root on n2`` when the nodes of one run differ; '' when none says."""
    accounts = {
        node_id: record["user"][:64]
        for node_id, record in parts.items()
        if isinstance(record.get("user"), str) and record["user"].isprintable() and record["user"]
    }
    if len(set(accounts.values())) <= 1:
        return next(iter(accounts.values()), "")
    names = dict(Node.objects.filter(pk__in=accounts).values_list("pk", "name"))
    return ", ".join(sorted(f"{account} on {names.get(n, n)}" for n, account in accounts.items()))[:200]


def _all_parts_running(job_id: int, run_id: str, seen: SeenJobs) -> bool:
    """Whether every node of the job reports this run running (a job on one node: its own record does)."""
    nodes = {a.node_id for a in job_addresses(job_id)}
    if len(nodes) < 2:
        return True
    parts = seen.get(run_id, {})
    return all(parts.get(n, {}).get("state") in AGENT_RUNNING for n in nodes)


_PART_FAILED = frozenset({"failed", "killed", "lost"})


def first_failed_part(run_id: str, seen: SeenJobs, node_id: int, record: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """``(node id, record)`` of the part of a multi-node run that ended unsuccessfully first.

    When a part fails, its peers often fail a moment later on their own (a lost connection); the
    job's exit names the first one, by the agents' end times, not whichever node the poll read first.
    """
    candidates = {n: r for n, r in seen.get(run_id, {}).items() if r.get("state") in _PART_FAILED}
    candidates.setdefault(node_id, record)

    def ended(item: tuple[int, dict[str, Any]]) -> tuple[datetime, int]:
        at = _when(item[1].get("ended_at"))
        return (at or datetime.max.replace(tzinfo=UTC)), item[0]

    return min(candidates.items(), key=ended)


#: The reason an agent older than the ``cause`` field gave the runs it stopped at its own shutdown.
_AGENT_SHUTDOWN_REASON = "agent stopped"


def stopped_by_system(record: dict[str, Any]) -> str | None:
    """Why the agent stopped this run for a reason of its own (its shutdown), in its words; ``None`` otherwise.

    Such a run did not end by anything of the job's (its exit, a signal, its memory, its time
    limit) nor by the portal's asking (a cancel, a preemption, the walltime backstop): the agent
    marks it ``cause: "system"`` (``devices.agent.jobs.JobManager.stop_all``). The portal
    requeues it rather than failing it. A record of an older agent, without ``cause``, says so
    by its reason alone.
    """
    if record.get("state") != "killed":
        return None
    cause = record.get("cause")
    why = record.get("reason") or ""
    if cause == "system" or (cause is None and why == _AGENT_SHUTDOWN_REASON):
        return why or _AGENT_SHUTDOWN_REASON
    return None


def outcome(record: dict[str, Any]) -> tuple[int | None, str, str]:
    """``(exit code, event reason, detail)`` of a run the agent reports ended."""
    state = record.get("state")
    code = record.get("exit_code")
    code = code if isinstance(code, int) and not isinstance(code, bool) else None
    why = record.get("reason") or ""
    if state == "succeeded":
        return 0, "Completed", "exit code 0"
    words = record.get("exit_reason")
    if isinstance(words, str) and words.startswith("out of memory"):
        return code, "OutOfMemory", f"on the agent: {words}"
    if state == "killed":
        if why == "walltime":
            return code, "Walltime", f"the agent stopped it at its maximum duration: {describe_exit(code)}"
        return code, "Killed", f"stopped on the agent ({why or 'no reason given'}): {describe_exit(code)}"
    if code is None:
        return None, "NonZeroExit", f"failed on the agent: {why or 'no exit status'}"
    return code, "NonZeroExit", describe_exit(code)


def _when(text: Any) -> datetime | None:
    return parse_datetime(text) if isinstance(text, str) else None


_MISSING = object()


def act(actions: Actions, summary: PollSummary | None = None) -> None:
    """Make the agent calls a poll decided on: stops first (they free devices), then checks, then launches."""
    summary = summary if summary is not None else PollSummary()
    stop_all(actions.stops)

    def ask(item: tuple[AgentAddress, int, str]) -> object:
        address, _, run_id = item
        try:
            found = AgentClient(address).job(run_id)
        except AgentError as exc:
            log.info("could not ask %s about run %s: %s", address.name, run_id, exc)
            return None
        return _MISSING if found is None else found

    for item, answer in zip(actions.confirm, parallel(ask, actions.confirm), strict=True):
        if answer is _MISSING:
            _forget(item, summary)
    if actions.relaunch:
        ids = sorted(actions.relaunch)
        launch_many(ids)
        summary.relaunched.extend(ids)


def _forget(item: tuple[AgentAddress, int, str], summary: PollSummary) -> None:
    """A launched run its agent does not know (its state dir was wiped, say): requeue the job."""
    address, job_id, run_id = item
    more = Actions()
    with transaction.atomic():
        lock_cluster()
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != Job.State.RUNNING or not job.launched:
            return
        if (job.agent_job_id or str(job_id)) != run_id:
            return
        requeue_and_stop(
            job_id,
            "LostOnAgent",
            f"node {address.name} no longer knows run {run_id}",
            timezone.now(),
            summary,
            more,
        )
    stop_all(more.stops)


@dataclass
class LaunchPlan:
    job_id: int
    agent_job_id: str
    started_at: datetime | None
    targets: list[tuple[AgentAddress, dict[str, Any]]]


def _prepare_launch(job_id: int) -> LaunchPlan | None:
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self", "team"))  # not the profile: it may be missing (outer join)
            .select_related("team", "submitter__profile")
            .filter(pk=job_id, state=Job.State.RUNNING)
            .first()
        )
        if job is None:
            return None
        run_id = agent_job_id(job.pk, current_attempts([job.pk])[job.pk])
        if job.agent_job_id != run_id:
            # Stored before anything is sent, so a poll never takes this run for a stale one.
            job.agent_job_id = run_id
            job.save(update_fields=["agent_job_id"])
        allocs = list(
            job.allocations.filter(end__isnull=True).select_related("device__node", "vnpu_template").order_by("id")
        )
        by_node: dict[int, list[Allocation]] = defaultdict(list)
        nodes: dict[int, Node] = {}
        for alloc in allocs:
            by_node[alloc.device.node_id].append(alloc)
            nodes[alloc.device.node_id] = alloc.device.node
        targets = [
            (AgentAddress.of(nodes[nid]), launch_payload(job, run_id, by_node[nid]))
            for nid in sorted(by_node, key=lambda n: nodes[n].name)
            if nodes[nid].agent_url
        ]
        return LaunchPlan(job.pk, run_id, job.started_at, targets)


def launch_payload(job: Job, run_id: str, allocs: Sequence[Allocation]) -> dict[str, Any]:
    """The ``POST /v1/jobs`` body of one node's part of a job."""
    payload: dict[str, Any] = {
        "job_id": run_id,
        "command": job.command,
        # The submitter's variables over the two the portal always gave; the agent adds its own
        # (PATH, HOME, NPUPORTAL_JOB_ID, NPUPORTAL_TEAM, the devices: docs/agent.md#environment).
        "env": {"JOB_NAME": job.name, "JOB_TEAM": job.team.name, **(job.env or {})},
        "devices": sorted(a.device.index for a in allocs),
        "team": job.team.name,
        "user": posix_account(job.submitter),  # the account it runs as on a root agent (docs/agent.md#accounts)
        # Which job, and which copy of an array, it is: SLURM_JOB_ID, SLURM_ARRAY_TASK_ID (docs/agent.md#environment).
        "portal_job": portal_job(job),
    }
    if job.cwd:
        payload["cwd"] = job.cwd
    if job.output:
        payload["output"] = output_file(job, allocs[0].device.node.name)  # %j, %x ... filled in as sbatch does
    if job.max_duration_s:
        elapsed = (timezone.now() - job.started_at).total_seconds() if job.started_at else 0
        payload["max_duration_s"] = max(1, int(job.max_duration_s - elapsed))
    sliced = [a for a in allocs if a.vnpu_template is not None]
    if sliced:
        payload["vnpu"] = {"template": sliced[0].vnpu_template.name, "device": sliced[0].device.index}
        payload["devices"] = [sliced[0].device.index]
    return payload


def portal_job(job: Job) -> dict[str, Any]:
    """The launch's ``portal_job``: the job's id and name and, for a copy of an array, its place in it.

    One small query for a copy of an array (how many copies, the lowest and highest index): what
    ``SLURM_ARRAY_TASK_COUNT``, ``_MIN`` and ``_MAX`` say.
    """
    identity: dict[str, Any] = {"id": job.pk, "name": job.name}
    if job.array_id:
        count, low, high = array_shape(job.array_id)
        identity["array"] = {
            "id": job.array_id,
            "index": job.array_index or 0,
            "count": count,
            "min": low,
            "max": high,
        }
    return identity


def _send(item: tuple[AgentAddress, dict[str, Any]]) -> AgentError | None:
    address, payload = item
    try:
        AgentClient(address).launch(payload)
    except AgentError as exc:
        return exc
    return None


def _expected_runs(node_id: int) -> set[str]:
    """Agent job ids the database has running on a node: its running jobs' current runs, as stored too."""
    rows = list(Job.objects.filter(pk__in=running_jobs_on(node_id)).values_list("pk", "launched", "agent_job_id"))
    attempts = current_attempts(pk for pk, _, _ in rows)
    expected: set[str] = set()
    for pk, launched, stored in rows:
        expected.add(agent_job_id(pk, attempts[pk]))
        if stored:
            expected.add(stored)
        elif launched:
            expected.add(str(pk))
    return expected


def _why_stopped(run_id: str) -> str:
    """The reason of the last event of the job a stale run belongs to (``Preempted``, ``Cancelled``...)."""
    job_id = int(run_id.split(".", 1)[0])
    reason = JobEvent.objects.filter(job_id=job_id).order_by("-recorded_at", "-id").values_list("reason", flat=True)
    return reason.first() or "its devices go to another job"


def vacate(plans: Sequence[LaunchPlan]) -> list[str]:
    """Stop the runs an agent still has on the devices these launches need, and wait until they are gone.

    A tick that starts a job on the devices of a job it evicted (or that was cancelled,
    failed or killed at its walltime) queues the victim's stop and the new job's launch
    as separate tasks, which several workers run in any order; and a stopped job holds
    its devices until its whole process group has exited, up to its grace period. A
    launch sent meanwhile is refused (``HTTP 409 device N is in use``). So before a
    launch is sent, each of its agents is asked what it runs: a run on one of the
    launch's devices that the database does not have running on that node is stopped,
    and the stop is awaited (``DELETE ...?wait=``) until the agent says it has ended.
    The stop a victim's own task sends is the same request, so whichever comes first,
    it is stopped once. Returns ``"<node>:<run>"`` of what was stopped here.
    """
    wanted: dict[AgentAddress, set[int]] = defaultdict(set)
    for plan in plans:
        for address, payload in plan.targets:
            wanted[address].update(d for d in payload.get("devices", ()) if isinstance(d, int))
    addresses = [a for a in wanted if wanted[a]]

    def listing(address: AgentAddress) -> list[dict[str, Any]] | None:
        try:
            return AgentClient(address).jobs()
        except AgentError as exc:  # the launch is sent all the same; a refusal is retried by the poll
            log.info("could not ask %s what it runs before a launch: %s", address.name, exc)
            return None

    stops: list[Stop] = []
    for address, records in zip(addresses, parallel(listing, addresses), strict=True):
        if not records:
            continue
        expected: set[str] | None = None
        for record in records:
            run_id = str(record.get("job_id"))
            if record.get("state") not in AGENT_RUNNING or not PORTAL_JOB_ID.fullmatch(run_id):
                continue
            held = {d for d in record.get("devices") or () if isinstance(d, int)}
            if not held & wanted[address]:
                continue
            expected = _expected_runs(address.node_id) if expected is None else expected
            if run_id not in expected:
                why = _why_stopped(run_id)
                stops.append(Stop(address, run_id, CANCEL_GRACE_S if why == "Cancelled" else EVICT_GRACE_S, why))

    def confirm(item: Stop) -> str:
        try:
            record = AgentClient(item.address).stop(
                item.agent_job_id, grace_s=item.grace_s, reason=item.why, wait_s=item.grace_s + VACATE_MARGIN_S
            )
        except AgentError as exc:
            log.warning("could not stop run %s on %s before a launch: %s", item.agent_job_id, item.address.name, exc)
            return ""
        if record is not None and record.get("state") in AGENT_RUNNING:
            log.warning("run %s on %s has not ended yet; launching anyway", item.agent_job_id, item.address.name)
        return f"{item.address.name}:{item.agent_job_id}"

    return [done for done in parallel(confirm, stops) if done]


def launch_many(job_ids: Iterable[int]) -> dict[int, bool]:
    """Send running jobs to their agents (idempotent per attempt); ``{job id: accepted by every agent}``.

    Whatever still runs on their devices is stopped first, and awaited (:func:`vacate`).
    """
    plans = [p for p in (_prepare_launch(j) for j in job_ids) if p is not None]
    vacate(plans)
    unmet: dict[int, list[tuple[AgentAddress, AgentError]]] = {}
    for plan in plans:  # a multi-node job's parts get one rendezvous (devices.services.rendezvous)
        plan.targets, refused = rendezvous.meet(plan.agent_job_id, plan.targets)
        if refused:
            unmet[plan.job_id] = refused
    sends = [(plan, target) for plan in plans if plan.job_id not in unmet for target in plan.targets]
    answers = parallel(_send, [target for _, target in sends])
    errors: dict[int, list[tuple[AgentAddress, AgentError]]] = defaultdict(list)
    accepted: dict[int, list[AgentAddress]] = defaultdict(list)
    for (plan, (address, _)), error in zip(sends, answers, strict=True):
        if error is not None:
            errors[plan.job_id].append((address, error))
        else:
            accepted[plan.job_id].append(address)
    errors.update(unmet)
    return {plan.job_id: _record_launch(plan, errors.get(plan.job_id, []), accepted[plan.job_id]) for plan in plans}


def launch(job_id: int) -> bool:
    """Send one running job to its node agents; ``True`` when every agent has it."""
    return launch_many([job_id]).get(job_id, False)


#: How an agent names the run holding a device it refused (``device 3 is in use by job 12.1``).
_HOLDER = re.compile(r"\bin use by job ([0-9]+)(?:\.[0-9]+)?")


def scrub_holder(text: str) -> tuple[str, int | None]:
    """An agent's refusal without the run it names, and that run's job id when it is one of ours.

    The run holding a device may be another team's job: the event keeps it as data
    (``JobEvent.other_job``, named per reader by ``scheduling.disclosure``), the words say
    "another job".
    """
    found = _HOLDER.search(text)
    holder = int(found.group(1)) if found else None
    return _HOLDER.sub("in use by another job", text), holder


def _record_launch(
    plan: LaunchPlan, errors: list[tuple[AgentAddress, AgentError]], accepted: list[AgentAddress]
) -> bool:
    """Mark a run launched, or record why it was not: retried, requeued, or failed for good.

    A refusal no retry can change (``AgentError.never_succeeds``: too large, a command the
    agent cannot take) fails the job at once with the agent's words; before, it was sent
    again at every poll and every requeue, a dozen refusals for one job.
    """
    if not errors:
        done = Job.objects.filter(pk=plan.job_id, state=Job.State.RUNNING, agent_job_id=plan.agent_job_id).update(
            launched=True
        )
        return bool(done)
    text = "; ".join(f"{a.name}: {e}" for a, e in errors)
    log.warning("launch of run %s failed: %s", plan.agent_job_id, text)
    text, holder = scrub_holder(text)
    stops: list[Stop] = []
    with transaction.atomic():
        lock_cluster()
        job = Job.objects.select_for_update().filter(pk=plan.job_id).first()
        if job is None or job.state != Job.State.RUNNING or job.agent_job_id != plan.agent_job_id:
            return False
        now = timezone.now()
        if any(error.never_succeeds for _, error in errors):
            detail = f"run {plan.agent_job_id} refused for good, not retried: {text}"
            transitions.fail(job.pk, reason="LaunchFailed", detail=detail, at=now)
            stops = [Stop(a, plan.agent_job_id, EVICT_GRACE_S, "launch refused") for a in accepted]
        else:
            failures = transitions.record_launch_failure(
                job,
                at=now,
                detail=f"run {plan.agent_job_id}: {text}",
                other_job_id=holder if holder is not None and Job.objects.filter(pk=holder).exists() else None,
            )
            if failures >= transitions.RETRY_BUDGET:
                transitions.requeue(
                    job.pk,
                    reason="LaunchFailed",
                    detail=f"the agents refused run {plan.agent_job_id} {failures} times; last: {text}",
                    at=now,
                )
                stops = [Stop(a, plan.agent_job_id, EVICT_GRACE_S, "launch given up") for a in accepted]
    stop_all(stops)
    return False


def stop(job_id: int, reason: str = "", *, grace_s: float | None = None) -> None:
    """Stop a job that no longer runs in the database (cancelled, preempted, failed) on every node it used.

    A job that runs again (restarted after the stop was asked for) keeps its current attempt; any
    older run still on an agent is stopped by the next poll.
    """
    job = Job.objects.filter(pk=job_id).values("state", "agent_job_id", "launched").first()
    if job is None or job["state"] == Job.State.RUNNING:
        return
    run_id = job["agent_job_id"] or str(job_id)
    nodes = Node.objects.filter(devices__allocations__job_id=job_id).exclude(agent_url="").distinct()
    grace = grace_s if grace_s is not None else CANCEL_GRACE_S if reason == "Cancelled" else EVICT_GRACE_S
    stop_all([Stop(AgentAddress.of(n), run_id, grace, reason or "stop") for n in nodes])
