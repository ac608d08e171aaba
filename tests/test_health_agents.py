"""Device faults injected into real agents: drain, requeue, restart elsewhere, rejoin (docs/health.md)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.utils import timezone

from devices.models import Device, HealthEvent
from scheduling.models import Job, JobEvent
from scheduling.services.snapshot import load_snapshot
from tests.test_lifecycle_harness import (
    NODE_A,
    NODE_B,
    cluster,
    eager_celery,
    node_of,
    open_devices,
    poll,
    submit,
    tick,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest


def _engine_usable(device: Device) -> bool:
    from quotas.policies.versions import active_policy

    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    return next(d.usable for n in snapshot.nodes for d in n.devices if d.id == device.pk)


def _fail_and_requeue(cluster, submit, kind: str, devices: int) -> tuple[Job, Device, str]:
    """Start a job, break one of its devices with ``kind``, poll; returns the job, the device, the old run id."""
    job = submit("sleep 30", devices=devices)
    tick()
    job = Job.objects.get(pk=job.pk)
    agent = cluster[node_of(job)]
    first = job.agent_job_id
    agent.wait_job(first, {"running"})
    poll()
    device = open_devices(job)[devices // 2]
    agent.fault(device.index, kind)
    summary = poll()
    assert device.pk in summary.failed_devices
    assert job.pk in summary.requeued
    return Job.objects.get(pk=job.pk), Device.objects.get(pk=device.pk), first


def _assert_drained_and_requeued(job: Job, device: Device, reason_word: str) -> HealthEvent:
    assert device.health == Device.Health.FAILED
    assert not device.usable
    assert not _engine_usable(device), "the engine sees the failed device as unusable"
    event = HealthEvent.objects.get(device=device)
    assert (event.from_health, event.to_health) == ("healthy", "failed")
    assert reason_word in event.reason
    assert job.state == Job.State.PENDING
    assert job.retries == 1
    assert job.pending_reason == "DeviceFailed"
    requeue = JobEvent.objects.get(job=job, reason="DeviceFailed")
    assert f"/{device.index} failed" in requeue.detail and reason_word in requeue.detail
    # Usage is charged up to the failure: every allocation ends at the poll that saw it.
    assert set(job.allocations.values_list("end", flat=True)) == {event.at}
    assert requeue.at == event.at
    return event


def test_ecc_error_drains_the_device_requeues_the_job_and_it_restarts_on_other_devices(cluster, submit) -> None:
    job, device, first = _fail_and_requeue(cluster, submit, "ecc", devices=2)
    _assert_drained_and_requeued(job, device, "ECC")
    old_agent = cluster[device.node.name]
    assert old_agent.wait_job(first, {"killed"})["reason"] == "DeviceFailed", "the old process was stopped"
    assert device.ecc_errors == 1

    assert job.pk in tick().started
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING
    assert device.pk not in {d.pk for d in open_devices(job)}
    assert job.agent_job_id == f"{job.pk}.2"
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    poll()
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.launched
    assert job.submitted_at == JobEvent.objects.get(job=job, reason="Submitted").at, "it kept its place in the queue"


def test_a_job_out_of_retries_ends_node_fail_at_the_failure_time(cluster, submit) -> None:
    from scheduling.services.jobs import RETRY_BUDGET

    job = submit("sleep 30")
    tick()
    Job.objects.filter(pk=job.pk).update(retries=RETRY_BUDGET)
    job = Job.objects.get(pk=job.pk)
    agent = cluster[node_of(job)]
    agent.wait_job(job.agent_job_id, {"running"})
    device = open_devices(job)[0]
    agent.fault(device.index, "ecc")
    poll()
    job = Job.objects.get(pk=job.pk)
    event = HealthEvent.objects.get(device=device)
    assert job.state == Job.State.NODE_FAIL, "its node's fault ended it, as Slurm's NODE_FAIL"
    assert job.ended_at == event.at
    assert set(job.allocations.values_list("end", flat=True)) == {event.at}
    last = job.events.last()
    assert last.reason == "DeviceFailed" and "retry budget" in last.detail
    assert agent.wait_job(job.agent_job_id, {"killed"})


def test_lost_device_moves_a_whole_node_job_to_the_other_node(cluster, submit) -> None:
    job, device, first = _fail_and_requeue(cluster, submit, "lost", devices=8)
    _assert_drained_and_requeued(job, device, "lost")
    first_node = device.node.name
    cluster[first_node].wait_job(first, {"killed"})

    tick()
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING
    assert node_of(job) == (NODE_B if first_node == NODE_A else NODE_A), "8 cards fit only on the other node"
    other = cluster[node_of(job)]
    other.wait_job(job.agent_job_id, {"running"})
    assert len(other.jobs()[job.agent_job_id]["devices"]) == 8
    poll()
    assert Job.objects.get(pk=job.pk).state == Job.State.RUNNING
    assert cluster[first_node].jobs()[first]["state"] == "killed"


def test_recovered_device_rejoins_only_after_k_healthy_polls_and_flaps_are_damped(cluster) -> None:
    k = settings.HEALTH_REJOIN_POLLS
    assert k >= 2
    agent = cluster[NODE_A]
    poll()
    device = Device.objects.get(node__name=NODE_A, index=5)
    agent.fault(5, "ecc")
    poll()
    device.refresh_from_db()
    assert device.health == Device.Health.FAILED

    agent.fault(5, "recover")
    poll()
    device.refresh_from_db()
    assert device.health == Device.Health.FAILED and device.healthy_streak == 1
    assert "recovering" in device.health_detail
    # It flaps: one bad reading resets the count.
    agent.fault(5, "lost")
    poll()
    device.refresh_from_db()
    assert device.health == Device.Health.FAILED and device.healthy_streak == 0
    agent.fault(5, "recover")
    for _ in range(k - 1):
        poll()
        device.refresh_from_db()
        assert device.health == Device.Health.FAILED
        assert not _engine_usable(device)
    poll()
    device.refresh_from_db()
    assert device.health == Device.Health.HEALTHY
    assert device.usable and _engine_usable(device)
    events = list(HealthEvent.objects.filter(device=device).values_list("from_health", "to_health"))
    assert events == [("healthy", "failed"), ("failed", "healthy")], "one event per transition, none per flap"
    assert "rejoined" in HealthEvent.objects.filter(device=device).last().reason


def test_overheating_device_is_degraded_keeps_its_job_and_takes_no_new_work(cluster, submit) -> None:
    job = submit("sleep 30")
    tick()
    job = Job.objects.get(pk=job.pk)
    agent = cluster[node_of(job)]
    agent.wait_job(job.agent_job_id, {"running"})
    device = open_devices(job)[0]
    agent.fault(device.index, "overheat")
    poll()
    device.refresh_from_db()
    assert device.health == Device.Health.DEGRADED
    assert "98" in device.health_detail
    assert not _engine_usable(device)
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.retries == 0, "running work stays on a degraded device"
    assert agent.jobs()[job.agent_job_id]["state"] == "running"
    assert device.temp_c == 98

    agent.fault(device.index, "recover")
    for _ in range(settings.HEALTH_REJOIN_POLLS):
        poll()
    device.refresh_from_db()
    assert device.health == Device.Health.HEALTHY
    assert list(HealthEvent.objects.filter(device=device).values_list("to_health", flat=True)) == [
        "degraded",
        "healthy",
    ]


def test_poll_records_readings_and_heartbeat(cluster) -> None:
    before = timezone.now()
    summary = poll()
    assert summary.polled == 2 and summary.failed == 0
    for name in (NODE_A, NODE_B):
        device = Device.objects.get(node__name=name, index=1)
        assert device.temp_c == 36 and device.power_w == 74.3 and device.hbm_used_mb == 983
        assert device.last_seen >= before
        assert device.node.last_heartbeat >= before
        assert device.health == Device.Health.HEALTHY
    assert not HealthEvent.objects.exists(), "a healthy cluster writes no history"
