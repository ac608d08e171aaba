"""Job lifecycle through real node agents: launch, completion, failure, cancel, walltime, retries,
agent restarts and unreachable nodes (docs/health.md)."""

from __future__ import annotations

import signal
from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from devices.executors import agents as polling
from devices.models import HealthEvent, Node
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import RETRY_BUDGET, cancel_job
from scheduling.services.walltime import enforce_walltime
from tests.test_lifecycle_harness import NODE_A, NODE_B, cluster, eager_celery, node_of, poll, submit, tick
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _running(cluster, submit, command: str):  # type: ignore[no-untyped-def]
    """Submit ``command``, start it with a tick and wait until its agent runs it: ``(job, node name, agent)``."""
    job = submit(command)
    tick()
    job = _reload(job)
    name = node_of(job)
    agent = cluster[name]
    agent.wait_job(job.agent_job_id, {"running"})
    return job, name, agent


def _poll_until(job: Job, states: set[str]) -> Job:
    def polled() -> Job:
        poll()
        return _reload(job)

    return wait_for(polled, until=lambda job: job.state in states, interval=0.1, message=f"job {job.pk} to be {states}")


def test_job_launches_and_completes_with_exit_code_zero(cluster, submit) -> None:
    job = submit("echo hello; sleep 0.5")
    assert job.pk in tick().started
    job = _reload(job)
    assert job.state == Job.State.RUNNING
    assert job.launched, "the tick's launch (queued after its commit) reached the agent"
    assert job.agent_job_id == f"{job.pk}.1"
    agent = cluster[node_of(job)]
    record = agent.jobs()[job.agent_job_id]
    assert record["state"] == "running"
    assert len(record["devices"]) == 1

    done = agent.wait_job(job.agent_job_id, {"succeeded"})
    job = _poll_until(job, {Job.State.COMPLETED})
    assert job.exit_code == 0
    assert job.allocations.filter(end__isnull=True).count() == 0
    # Usage ends when the agent says the process ended, not when the poll noticed.
    assert abs((job.ended_at - datetime.fromisoformat(done["ended_at"])).total_seconds()) < 0.01
    assert job.events.last().reason == "Completed"


def test_failing_command_fails_with_its_exit_code_and_a_signal_is_named(cluster, submit) -> None:
    exits = submit("echo oops >&2; exit 3", name="exit3")
    killed = submit("kill -KILL $$", name="sigkill")
    tick()
    for job in (exits, killed):
        job = _reload(job)
        cluster[node_of(job)].wait_job(job.agent_job_id, {"failed"})
    exits = _poll_until(exits, {Job.State.FAILED})
    killed = _poll_until(killed, {Job.State.FAILED})
    assert exits.exit_code == 3
    assert exits.events.last().reason == "NonZeroExit"
    assert exits.events.last().detail == "exit code 3"
    assert killed.exit_code == -9
    assert killed.events.last().reason == "NonZeroExit"
    assert "SIGKILL" in killed.events.last().detail


def test_cancel_kills_the_job_on_its_agent(cluster, submit) -> None:
    job, _, agent = _running(cluster, submit, "sleep 30")
    cancel_job(job.pk, actor=None, reason="not needed")
    record = agent.wait_job(job.agent_job_id, {"killed"})
    assert record["reason"] == "Cancelled", "the agent's record says why the portal stopped it"
    assert record["exit_code"] == -signal.SIGTERM
    poll()
    job = _reload(job)
    assert job.state == Job.State.CANCELLED
    assert job.events.last().reason == "Cancelled"


def test_the_portal_sends_any_reason_as_one_line_the_agent_accepts(cluster, submit) -> None:
    from devices.services.agent_client import AgentAddress, AgentClient

    job, name, agent = _running(cluster, submit, "sleep 30")
    client = AgentClient(AgentAddress.of(Node.objects.get(name=name)))
    client.stop(job.agent_job_id, grace_s=1, reason="device 3 failed:\n  ECC error\t" + "x" * 300)
    record = agent.wait_job(job.agent_job_id, {"killed"})
    assert record["reason"].startswith("device 3 failed: ECC error x") and len(record["reason"]) == 200


def test_walltime_enforced_by_the_agent_is_recorded_as_walltime(cluster, submit) -> None:
    job = submit("sleep 30", max_duration_s=1)
    tick()
    job = _reload(job)
    agent = cluster[node_of(job)]
    record = agent.wait_job(job.agent_job_id, {"killed"})
    assert record["reason"] == "walltime"
    job = _poll_until(job, {Job.State.TIMEOUT})
    event = job.events.last()
    assert event.reason == "Walltime" and event.to_state == Job.State.TIMEOUT
    assert "SIGTERM" in event.detail
    assert job.exit_code == -signal.SIGTERM


def test_walltime_backstop_fails_and_stops_an_overdue_job(cluster, submit) -> None:
    job = submit("sleep 30", max_duration_s=600)
    tick()
    job = _reload(job)
    agent = cluster[node_of(job)]
    agent.wait_job(job.agent_job_id, {"running"})
    assert enforce_walltime() == [], "not overdue yet"
    later = job.started_at + timedelta(seconds=601)
    assert enforce_walltime(now=later) == [job.pk]
    job = _reload(job)
    assert job.state == Job.State.TIMEOUT
    assert job.events.last().reason == "Walltime"
    assert job.allocations.filter(end__isnull=True).count() == 0
    record = agent.wait_job(job.agent_job_id, {"killed"})
    assert record["exit_code"] == -signal.SIGTERM
    assert record["reason"] == "walltime"
    poll()
    assert _reload(job).events.last().reason == "Walltime", "the agent's later report changes nothing"


def test_preemption_eviction_stops_the_run_and_the_restart_gets_a_new_agent_id(cluster, submit) -> None:
    job = submit("sleep 30")
    tick()
    job = _reload(job)
    agent = cluster[node_of(job)]
    first = job.agent_job_id
    agent.wait_job(first, {"running"})
    # The grace of a preemption is over: the next tick evicts (the demo policy requeues preempted jobs).
    Job.objects.filter(pk=job.pk).update(preempt_deadline=timezone.now() - timedelta(seconds=1))
    assert job.pk in tick().evicted
    assert agent.wait_job(first, {"killed"})["reason"] == "Preempted"
    assert _reload(job).state == Job.State.PENDING

    assert job.pk in tick().started
    job = _reload(job)
    second = job.agent_job_id
    assert second == f"{job.pk}.2" != first
    cluster[node_of(job)].wait_job(second, {"running"})
    poll()
    job = _reload(job)
    assert job.state == Job.State.RUNNING, "the killed first run is not taken for the current one"
    assert job.launched


def test_a_launch_that_never_arrived_is_sent_by_the_next_poll_and_never_twice(cluster, submit, monkeypatch) -> None:
    from scheduling import tasks

    monkeypatch.setattr(tasks.launch_job, "delay", lambda job_id: None)  # the broker lost the message
    job = submit("sleep 30")
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING and not job.launched
    agent = cluster[node_of(job)]
    assert agent.jobs() == {}
    summary = poll()
    assert job.pk in summary.relaunched
    job = _reload(job)
    assert job.launched
    assert agent.jobs()[job.agent_job_id]["state"] == "running"
    # A duplicate message, a retried task, a second poll: still one run.
    assert polling.launch(job.pk)
    polling.launch_many([job.pk, job.pk])
    poll()
    assert list(agent.jobs()) == [job.agent_job_id]
    assert _reload(job).state == Job.State.RUNNING


def test_launch_refused_with_409_is_retried_then_the_job_is_requeued(cluster, submit) -> None:
    from devices.services.operations import cordon_node

    cordon_node(NODE_B, actor=None, reason="test: everything goes to A")
    blocker = cluster[NODE_A].call(
        "POST", "/v1/jobs", {"job_id": "maintenance", "command": "sleep 30", "devices": list(range(8))}
    )
    assert blocker.status_code == 201, blocker.text
    job = submit("sleep 30")
    tick()
    job = _reload(job)
    assert node_of(job) == NODE_A
    assert not job.launched
    for _ in range(RETRY_BUDGET - 1):
        assert _reload(job).state == Job.State.RUNNING
        poll()
    job = _reload(job)
    failures = job.events.filter(reason="LaunchFailed", to_state=Job.State.RUNNING)
    assert failures.count() == RETRY_BUDGET
    assert "409" in failures.first().detail
    assert job.state == Job.State.PENDING
    assert job.pending_reason == "LaunchFailed"
    assert job.retries == 1
    assert "maintenance" in cluster[NODE_A].jobs(), "a job the portal did not start is left alone"


@pytest.mark.parametrize(("size", "field"), [(200_000, "command"), (1_100_000, "body")])
def test_a_launch_refused_as_too_large_fails_the_job_at_once_with_the_reason(cluster, submit, size, field) -> None:
    """A job no agent can take (stored before the command limit, or under a larger one) fails on the first
    refusal with the agent's words; it used to be sent again at every poll and every requeue."""
    from django.test import override_settings

    with override_settings(MAX_COMMAND_BYTES=2 * 1024 * 1024):
        job = submit("true #" + "x" * size)
    tick()
    for _ in range(3):
        poll()
    job = _reload(job)
    assert job.state == Job.State.FAILED
    assert (job.retries, job.launched, job.pending_reason) == (0, False, "")
    assert job.allocations.filter(end__isnull=True).count() == 0, "its cards are free again"
    refusals = job.events.filter(reason="LaunchFailed")
    assert [(e.from_state, e.to_state) for e in refusals] == [(Job.State.RUNNING, Job.State.FAILED)]
    detail = refusals.get().detail
    assert "refused for good, not retried" in detail and "HTTP 413" in detail, detail
    assert ("a program takes at most" if field == "command" else "body larger than 1048576 bytes") in detail
    posts = {name: agent.log.read_text().count('"POST /v1/jobs HTTP/1.1"') for name, agent in cluster.items()}
    assert sorted(posts.values()) == [0, 1], posts  # one launch attempt, on one node
    assert all(agent.jobs() == {} for agent in cluster.values())


def test_the_longest_command_the_portal_allows_launches_even_with_every_byte_escaped(cluster, submit) -> None:
    """NPUPORTAL_MAX_COMMAND_BYTES at its maximum, each byte a control character (six bytes in JSON): the
    agent's body limit and its argument limit both take it, so what the portal accepts can run."""
    from django.test import override_settings

    from npuportal.settings import _LONGEST_ARGUMENT_BYTES

    command = "true #" + "\x01" * (_LONGEST_ARGUMENT_BYTES - 6)
    with override_settings(MAX_COMMAND_BYTES=_LONGEST_ARGUMENT_BYTES):
        job = submit(command)
    tick()
    job = _reload(job)
    assert job.launched, job.events.last().detail
    record = cluster[node_of(job)].wait_job(job.agent_job_id, {"succeeded"})
    assert record["command"] == command
    assert _poll_until(job, {Job.State.COMPLETED}).exit_code == 0


def test_agent_killed_mid_job_and_restarted_loses_nothing(cluster, submit) -> None:
    job, name, agent = _running(cluster, submit, "sleep 2; exit 7")
    agent.kill(signal.SIGKILL)
    assert settings.AGENT_MISSED_POLLS > 1
    summary = poll()
    assert summary.errors.get(name)
    node = Node.objects.get(name=name)
    assert node.missed_polls == 1 and node.reachable
    assert _reload(job).state == Job.State.RUNNING

    agent.start()
    record = agent.jobs()[job.agent_job_id]
    assert record["state"] in {"running", "failed"}, record
    poll()
    node = Node.objects.get(name=name)
    assert node.missed_polls == 0 and node.reachable and node.last_poll_error == ""
    agent.wait_job(job.agent_job_id, {"failed"})
    job = _poll_until(job, {Job.State.FAILED})
    assert job.exit_code == 7, "the exit status survived the agent"
    assert job.retries == 0
    assert list(job.events.values_list("reason", flat=True)) == ["Submitted", "Scheduled", "NonZeroExit"]


def test_node_down_for_k_polls_requeues_its_jobs_and_the_stale_run_is_stopped_when_it_returns(cluster, submit) -> None:
    job = submit("sleep 600")  # outlives every step below, however slow the machine
    tick()
    job = _reload(job)
    name = node_of(job)
    other = NODE_B if name == NODE_A else NODE_A
    agent = cluster[name]
    first = job.agent_job_id
    agent.wait_job(first, {"running"})
    poll()
    heartbeat = Node.objects.get(name=name).last_heartbeat
    agent.kill(signal.SIGKILL)  # the job keeps running without its agent

    for _ in range(settings.AGENT_MISSED_POLLS):
        poll()
    node = Node.objects.get(name=name)
    assert not node.reachable
    assert node.last_poll_error
    event = HealthEvent.objects.get(node=node, device__isnull=True, to_health="unreachable")
    assert "missed" in event.reason
    job = _reload(job)
    assert job.state == Job.State.PENDING
    assert job.pending_reason == "NodeUnreachable"
    assert job.retries == 0, "its node went away, not the job: no retry is counted"
    # Charged up to the last poll the node answered.
    assert list(job.allocations.values_list("end", flat=True)) == [heartbeat]
    assert JobEvent.objects.filter(job=job, reason="NodeUnreachable").exists()

    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING
    assert node_of(job) == other, "an unreachable node gets no new work"
    assert job.agent_job_id == f"{job.pk}.2"
    cluster[other].wait_job(job.agent_job_id, {"running"})

    agent.start()
    assert agent.jobs()[first]["state"] == "running", "the stale run survived the agent"
    summary = poll()
    assert f"{name}:{first}" in summary.stale_stopped, "stale runs are stopped at the first answer"
    assert not Node.objects.get(name=name).reachable, "one answer is not enough to take work again"
    for _ in range(settings.AGENT_REJOIN_POLLS - 1):
        poll()
    assert Node.objects.get(name=name).reachable
    assert HealthEvent.objects.filter(node=node, device__isnull=True, to_health="reachable").exists()
    agent.wait_job(first, {"killed"})
    poll()
    job = _reload(job)
    assert job.state == Job.State.RUNNING and node_of(job) == other, "only the stale run was stopped"
    assert cluster[other].jobs()[job.agent_job_id]["state"] == "running"


def test_wrong_token_is_a_failed_poll_with_a_clear_error_and_changes_nothing(cluster, submit) -> None:
    Node.objects.filter(name=NODE_A).update(agent_token="not-the-right-token-at-all")
    summary = poll()
    assert summary.failed == 1
    assert "401" in summary.errors[NODE_A]
    node = Node.objects.get(name=NODE_A)
    assert node.missed_polls == 1
    assert "401" in node.last_poll_error and "token" in node.last_poll_error
    assert node.last_heartbeat is None
    assert not node.devices.filter(last_seen__isnull=False).exists(), "no readings were recorded"
    good = Node.objects.get(name=NODE_B)
    assert good.missed_polls == 0 and good.last_heartbeat is not None and good.last_poll_error == ""

    for _ in range(settings.AGENT_MISSED_POLLS - 1):
        poll()
    node = Node.objects.get(name=NODE_A)
    assert not node.reachable
    assert "401" in HealthEvent.objects.get(node=node, to_health="unreachable").reason
    assert cluster[NODE_A].jobs() == {}


def test_a_draining_node_is_drained_when_the_poll_sees_its_last_job_end(cluster, submit, tmp_path) -> None:
    from devices.services.operations import drain_node

    gate = tmp_path / "go"  # the job runs until the test has seen it running on the draining node
    job = submit(f"while [ ! -e {gate} ]; do sleep 0.05; done")
    tick()
    job = _reload(job)
    name = node_of(job)
    drain_node(name, actor=None, reason="test")
    poll()
    node = Node.objects.get(name=name)
    assert node.state == Node.State.DRAINING and not node.drained
    assert _reload(job).state == Job.State.RUNNING, "running work finishes on a draining node"
    gate.touch()
    cluster[name].wait_job(job.agent_job_id, {"succeeded"})
    _poll_until(job, {Job.State.COMPLETED})
    node = Node.objects.get(name=name)
    assert node.state == Node.State.DRAINED, "the job's end drains the node, with no admin step"
    assert node.drained
