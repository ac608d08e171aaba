"""``scheduling.transitions``: what each change of a job's state writes, and what it queues after the commit."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from quotas.models import Team
from scheduling import executor_tasks, transitions
from scheduling.models import Allocation, Job, JobEvent
from scheduling.services.jobs import JobSpec, cancel_job, submit_job
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(demo) -> Job:
    lead = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(name="t", command="python train.py", chip_model="910B4", estimated_duration_s=60)
    job = submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    assert job.pk in run_tick().started
    job.refresh_from_db()
    return job


def _last_event(job: Job) -> JobEvent:
    return JobEvent.objects.filter(job=job).order_by("-recorded_at", "-id").first()


def test_an_allocation_never_ends_before_it_starts_whichever_transition_closes_it(running: Job) -> None:
    """The tick's eviction closes the way a requeue does: at the time given, or the start if that is earlier."""
    start = Allocation.objects.filter(job=running).values_list("start", flat=True).first()
    events: list[JobEvent] = []
    transitions.evict_many([running.pk], start - timedelta(hours=1), requeue=True, version=None, events=events)
    transitions.record_events(events)
    assert set(Allocation.objects.filter(job=running).values_list("end", flat=True)) == {start}
    running.refresh_from_db()
    assert running.state == Job.State.PENDING and running.pending_reason == "Preempted"
    assert (_last_event(running).from_state, _last_event(running).to_state) == ("running", "pending")


@pytest.mark.parametrize(
    ("call", "state", "reason"),
    [
        (lambda pk: transitions.finish(pk, exit_code=0), "completed", "Completed"),
        (lambda pk: transitions.finish(pk, exit_code=3), "failed", "NonZeroExit"),
        (lambda pk: transitions.finish(pk, exit_code=None, reason="OutOfMemory"), "out_of_memory", "OutOfMemory"),
        (lambda pk: transitions.time_out(pk, at=timezone.now(), detail="past it"), "timeout", "Walltime"),
        (lambda pk: transitions.fail(pk, reason="LaunchFailed", detail="too large"), "failed", "LaunchFailed"),
        (lambda pk: transitions.requeue(pk, reason="NodeFail", count_retry=False), "pending", "NodeFail"),
    ],
)
def test_each_way_out_of_running_writes_state_event_and_allocation_end(running: Job, call, state, reason) -> None:
    call(running.pk)
    running.refresh_from_db()
    event = _last_event(running)
    assert running.state == state
    assert (event.from_state, event.to_state, event.reason) == ("running", state, reason)
    assert not Allocation.objects.filter(job=running, end__isnull=True).exists()
    assert all(a.end >= a.start for a in Allocation.objects.filter(job=running))
    assert call(running.pk) is not None and Job.objects.get(pk=running.pk).state == state, "a second call is a no-op"


def test_a_requeue_by_the_system_costs_no_retry_and_one_by_the_job_does(running: Job) -> None:
    transitions.requeue(running.pk, reason="NodeFail", count_retry=False)
    assert Job.objects.get(pk=running.pk).retries == 0
    assert running.pk in run_tick().started
    transitions.requeue(running.pk, reason="LostOnAgent")
    assert Job.objects.get(pk=running.pk).retries == 1


def test_a_cancel_of_a_running_job_queues_its_stop_after_the_commit(
    running: Job, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    queued: list[tuple[int, str]] = []
    monkeypatch.setattr(executor_tasks, "queue_stop", lambda job_id, reason: queued.append((job_id, reason)))
    with django_capture_on_commit_callbacks() as hooks:
        cancel_job(running.pk, actor=None)
        assert queued == [], "nothing is sent before the commit"
    assert Job.objects.get(pk=running.pk).state == Job.State.CANCELLED
    for hook in hooks:
        hook()
    assert queued == [(running.pk, "Cancelled")]


def test_a_tick_queues_stops_before_launches_after_its_commit(
    running: Job, monkeypatch, django_capture_on_commit_callbacks
) -> None:
    sent: list[tuple[str, list[int]]] = []
    monkeypatch.setattr(executor_tasks, "queue_stops", lambda ids, reason: sent.append(("stop", list(ids))))
    monkeypatch.setattr(executor_tasks, "queue_launches", lambda ids: sent.append(("launch", list(ids))))
    events: list[JobEvent] = []
    with django_capture_on_commit_callbacks(execute=True):
        transitions.evict_many([running.pk], timezone.now(), requeue=True, version=None, events=events)
        transitions.start_many([transitions.Start(running.pk, [])], timezone.now(), version=None, events=events)
        transitions.record_events(events)
    assert sent == [("stop", [running.pk]), ("launch", [running.pk])]
