"""A run that ended because of the system is requeued in its place; one the job ended itself fails it.

The poll's rule (``devices.services.polling.stopped_by_system``) applied to what an agent reports:
these tests hand ``apply_poll`` the agent's record as the agent writes it, on the demo site without
agents. The same rule through real agents and the whole system: tests/test_supervisor_restarts.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from devices.executors.agents import apply_poll, outcome, stopped_by_system
from devices.models import Node
from devices.services.polling import PollResult
from quotas.models import Team
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import RETRY_BUDGET, JobSpec, submit_job
from scheduling.services.tick import run_tick
from tests.test_lifecycle_harness import without_reservation

pytestmark = pytest.mark.django_db


def _running(devices: int = 1) -> Job:
    lead = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(name="train", command="sleep 30", num_devices=devices, chip_model="910B4")
    job = submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    assert job.pk in run_tick().started
    # As the launch leaves it (tests on the database alone run no agent call after a commit).
    Job.objects.filter(pk=job.pk).update(launched=True, agent_job_id=f"{job.pk}.1")
    return Job.objects.get(pk=job.pk)


def _nodes(job: Job) -> list[Node]:
    return list(Node.objects.filter(devices__allocations__job=job).distinct().order_by("name"))


def _report(node: Node, *records: dict[str, Any]) -> PollResult:
    devices = [{"index": i, "chip_model": "910B4", "health": "OK"} for i in range(8)]
    body = {"node": node.name, "backend": "sim", "devices": devices}
    return PollResult(node.pk, timezone.now(), devices=body, jobs=list(records))


def _killed(run_id: str, reason: str, code: int = -15, **more: Any) -> dict[str, Any]:
    ended = timezone.now().isoformat()
    return {"job_id": run_id, "state": "killed", "exit_code": code, "reason": reason, "ended_at": ended, **more}


def test_a_run_the_agent_stopped_at_its_shutdown_is_requeued_in_its_place(demo) -> None:
    job = _running()
    Job.objects.filter(pk=job.pk).update(retries=RETRY_BUDGET)  # no retry left: still not failed
    record = _killed(f"{job.pk}.1", "agent stopped", cause="system", exit_reason="stopped (agent stopped)")
    apply_poll(_report(_nodes(job)[0], record))
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.PENDING
    assert job.pending_reason == "NodeFail"
    assert job.retries == RETRY_BUDGET, "a system requeue costs the job no retry"
    assert job.submitted_at == JobEvent.objects.get(job=job, reason="Submitted").at, "it keeps its place"
    assert job.allocations.filter(end__isnull=True).count() == 0
    event = job.events.last()
    assert (event.from_state, event.to_state, event.reason) == (Job.State.RUNNING, Job.State.PENDING, "NodeFail")
    assert "agent stopped" in event.detail and "not the job" in event.detail, event.detail
    assert not job.events.filter(to_state=Job.State.FAILED).exists()

    assert job.pk in run_tick().started, "it runs again"
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING


def test_a_record_of_an_older_agent_is_known_by_its_reason() -> None:
    """Agents before the ``cause`` field said ``agent stopped`` alone; a portal's stop never says that."""
    assert stopped_by_system(_killed("7.1", "agent stopped")) == "agent stopped"
    assert stopped_by_system(_killed("7.1", "Preempted")) is None
    assert stopped_by_system(_killed("7.1", "agent stopped", cause="portal")) is None
    assert stopped_by_system({"job_id": "7.1", "state": "failed", "exit_code": -15, "cause": "system"}) is None


@pytest.mark.parametrize(
    ("record", "reason", "state"),
    [
        # The job's own signal: the same SIGTERM as a shutdown's, but the job sent it.
        ({"state": "failed", "exit_code": -15, "reason": "killed by SIGTERM"}, "NonZeroExit", "failed"),
        ({"state": "failed", "exit_code": 3, "reason": "exited with status 3"}, "NonZeroExit", "failed"),
        # Its own time limit, enforced by the agent: Slurm's TIMEOUT.
        ({"state": "killed", "exit_code": -15, "reason": "walltime"}, "Walltime", "timeout"),
        # Its own memory: Slurm's OUT_OF_MEMORY.
        (
            {"state": "failed", "exit_code": -9, "exit_reason": "out of memory (1 process(es) killed)"},
            "OutOfMemory",
            "out_of_memory",
        ),
        # Someone on the node stopped it through the agent's API: as before, the job fails with their reason.
        ({"state": "killed", "exit_code": -15, "reason": "maintenance"}, "Killed", "failed"),
    ],
)
def test_a_run_that_ended_by_the_job_or_a_stop_request_ends_the_job(demo, record, reason, state) -> None:
    job = _running()
    record = {"job_id": f"{job.pk}.1", "ended_at": timezone.now().isoformat(), **record}
    assert stopped_by_system(record) is None
    apply_poll(_report(_nodes(job)[0], record))
    job = Job.objects.get(pk=job.pk)
    assert job.state == state
    assert job.events.last().reason == reason == outcome(record)[1]
    assert job.events.last().to_state == state
    assert job.retries == 0


def test_a_gang_whose_part_a_shutdown_stopped_is_requeued_and_its_other_part_stopped(demo) -> None:
    without_reservation()
    job = _running(devices=16)
    first, second = _nodes(job)
    run_id = f"{job.pk}.1"
    Node.objects.filter(pk__in=[first.pk, second.pk]).update(agent_url="http://127.0.0.1:9")
    stopped = _killed(run_id, "agent stopped", cause="system")
    # The other part failed a moment later on its own (its peer went away): the shutdown came first.
    later = _killed(run_id, "", code=1) | {"state": "failed", "ended_at": (timezone.now()).isoformat()}
    seen = {run_id: {first.pk: stopped, second.pk: later}}
    actions = apply_poll(_report(second, later), seen=seen)
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.PENDING and job.pending_reason == "NodeFail", job.events.last().detail
    assert job.retries == 0
    assert f"node {first.name} stopped run {run_id}" in job.events.last().detail
    assert {(s.address.name, s.agent_job_id) for s in actions.stops} == {(first.name, run_id), (second.name, run_id)}


def test_a_node_that_stops_answering_requeues_its_jobs_without_counting_a_retry(demo, settings) -> None:
    settings.AGENT_MISSED_POLLS = 2
    job = _running()
    Job.objects.filter(pk=job.pk).update(retries=RETRY_BUDGET)
    node = _nodes(job)[0]
    for _ in range(2):
        apply_poll(PollResult(node.pk, timezone.now(), error="connection refused"))
    job = Job.objects.get(pk=job.pk)
    assert (job.state, job.pending_reason, job.retries) == (Job.State.PENDING, "NodeUnreachable", RETRY_BUDGET)
