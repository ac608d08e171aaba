"""A draining node becomes ``drained`` when its last job ends, everywhere it is shown (issue 18, item 4)."""

from __future__ import annotations

import pytest

from devices.models import Node
from devices.services import operations
from devices.services.draining import mark_drained
from quotas.models import AuditEvent
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def _running_job(lead: object, chip: str = "910A", devices: int = 4) -> Job:
    spec = job_service.JobSpec(name="drain-me", command="sleep 60", num_devices=devices, chip_model=chip)
    from quotas.models import Team

    job = job_service.submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    run_tick()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING
    return job


def _node_of(job: Job) -> Node:
    return Node.objects.get(devices__allocations__job=job, devices__allocations__end__isnull=True, devices__index=0)


def _state(name: str) -> str:
    return Node.objects.get(name=name).state


def test_draining_with_a_running_job_is_draining_then_drained_when_it_ends(demo, user_factory) -> None:
    lead = user_factory("lead-x", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job).distinct().get().name

    result = operations.drain_node(name, actor=None, reason="firmware")
    assert result.changed and _state(name) == Node.State.DRAINING
    run_tick()
    assert _state(name) == Node.State.DRAINING, "running work keeps the node draining"

    job_service.finish_job(job.pk, exit_code=0)
    node = Node.objects.get(name=name)
    assert node.state == Node.State.DRAINED and node.drained
    assert AuditEvent.objects.filter(action="node.drained", target=name).count() == 1

    run_tick()  # the sweep finds nothing more to do
    assert AuditEvent.objects.filter(action="node.drained", target=name).count() == 1
    assert not Job.objects.filter(allocations__device__node=node, state=Job.State.RUNNING).exists()

    again = operations.drain_node(name, actor=None)
    assert not again.changed and _state(name) == Node.State.DRAINED, "draining a drained node changes nothing"

    back = operations.uncordon_node(name, actor=None)
    assert back.changed and back.previous == Node.State.DRAINED and _state(name) == Node.State.READY


def test_a_cancel_or_a_requeue_ends_the_drain_too(demo, user_factory) -> None:
    lead = user_factory("lead-y", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    operations.drain_node(name, actor=None)
    job_service.cancel_job(job.pk, actor=lead)
    assert _state(name) == Node.State.DRAINED

    operations.uncordon_node(name, actor=None)
    other = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=other).distinct().get().name
    operations.drain_node(name, actor=None)
    job_service.requeue_job(other.pk, reason="NodeUnreachable", detail="test")
    assert _state(name) == Node.State.DRAINED


def test_draining_an_idle_node_drains_it_at_once(demo) -> None:
    name = Node.objects.exclude(devices__allocations__end__isnull=True).first().name
    result = operations.drain_node(name, actor=None)
    assert result.changed and result.node.state == Node.State.DRAINED
    assert mark_drained() == []


def test_the_tick_sweeps_a_drain_whose_allocation_closed_elsewhere(demo, user_factory) -> None:
    from scheduling.models import Allocation

    lead = user_factory("lead-z", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    operations.drain_node(name, actor=None)
    Allocation.objects.filter(job=job).update(end=job.started_at)  # a path that does not call mark_drained
    Job.objects.filter(pk=job.pk).update(state=Job.State.FAILED)
    run_tick()
    assert _state(name) == Node.State.DRAINED


def test_api_and_filter_show_drained(demo, api, user_factory, isolated_api_state) -> None:
    lead = user_factory("lead-w", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    operations.drain_node(name, actor=None)
    client = api(lead)
    rows = {n["name"]: n["state"] for n in client.get("/api/v1/nodes/").json()["results"]}
    assert rows[name] == "draining"
    job_service.finish_job(job.pk, exit_code=0)
    rows = {n["name"]: n["state"] for n in client.get("/api/v1/nodes/").json()["results"]}
    assert rows[name] == "drained"
    assert [n["name"] for n in client.get("/api/v1/nodes/?state=drained").json()["results"]] == [name]
    assert client.get(f"/api/v1/nodes/{name}/").json()["state"] == "drained"
