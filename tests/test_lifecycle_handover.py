"""Devices handed from a preempted job to the job it was preempted for, through real node agents.

The tick evicts the victim and starts the waiting job on its cards in one transaction, then
queues the victim's stop and the new job's launch as separate tasks, which workers run in any
order; the victim holds its cards until its process group has exited. The launch must reach
the agent only once the victim is gone: no ``LaunchFailed`` (``HTTP 409 device N is in use``).
"""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from django.contrib.auth import get_user_model

from devices.services.operations import cordon_node
from quotas.models import Team
from quotas.policies.versions import create_version
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import JobSpec, submit_job
from tests.test_lifecycle_harness import NODE_A, NODE_B, cluster, eager_celery, node_of, poll, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery"]  # fixtures, imported for pytest

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: handover}
spec:
  timezone: UTC
  priorityClasses:
    - {name: normal, default: true}
    - {name: low}
  preemption: {gracePeriod: 1s, onPreempt: requeue}
  teams:
    - {name: research, shares: 1, quota: {guaranteed: {devices: 8}, max: {devices: 8}}}
    - {name: training, shares: 1, quota: {max: {devices: 28}}}
"""

#: Takes a second to leave after SIGTERM (it saves a checkpoint, say): its cards stay busy meanwhile.
SLOW_TO_LEAVE = "trap 'sleep 1; exit 0' TERM; sleep 60 & wait"


def _submit(team: str, command: str, priority_class: str) -> Job:
    lead = get_user_model().objects.get(username=f"lead-{team}")
    spec = JobSpec(name=f"{team}-job", command=command, num_devices=8, chip_model="910B4",
                   priority_class=priority_class, estimated_duration_s=3600)  # fmt: skip
    return submit_job(team=Team.objects.get(name=team), user=lead, spec=spec)


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.parametrize("victim_stop", ["queued", "lost"])
def test_the_beneficiary_is_launched_only_after_the_victim_has_left_its_cards(
    cluster, monkeypatch, victim_stop: str
) -> None:
    from scheduling import tasks

    if victim_stop == "lost":  # another worker has not run it yet, or the broker lost it
        monkeypatch.setattr(tasks.stop_job, "delay", lambda *args, **kwargs: None)
    create_version(POLICY, author=None, comment="test")
    cordon_node(NODE_B, actor=None, reason="test: one node of cards")
    victim = _submit("training", SLOW_TO_LEAVE, "low")
    assert victim.pk in tick().started
    victim = Job.objects.get(pk=victim.pk)
    agent = cluster[node_of(victim)]
    first = victim.agent_job_id
    agent.wait_job(first, {"running"})

    beneficiary = _submit("research", "sleep 30", "normal")
    assert tick().preempted == [victim.pk]
    time.sleep(1.1)  # the grace period
    result = tick()
    assert result.evicted == [victim.pk] and result.started == [beneficiary.pk]

    beneficiary = Job.objects.get(pk=beneficiary.pk)
    assert node_of(beneficiary) == NODE_A and beneficiary.launched
    runs = agent.jobs()
    left, came = runs[first], runs[beneficiary.agent_job_id]
    assert left["state"] == "killed" and left["reason"] == "Preempted"
    assert left["exit_code"] == 0, "it left by itself after SIGTERM, within its grace"
    assert came["state"] == "running"
    assert _at(left["ended_at"]) <= _at(came["started_at"])
    poll()
    assert not JobEvent.objects.filter(reason="LaunchFailed").exists()
    assert Job.objects.get(pk=beneficiary.pk).state == Job.State.RUNNING
    assert Job.objects.get(pk=victim.pk).state == Job.State.PENDING
