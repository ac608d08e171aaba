"""A job's runs and how each ended (``scheduling.services.runs``): the API's ``runs`` and the job page.

A run the system ended is requeued; that run says ``node_fail`` or ``preempted`` while the job goes on,
as ``sacct --duplicates`` shows a requeued job's earlier attempts.
"""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from quotas.models import Team
from scheduling.models import Job
from scheduling.services.jobs import JobSpec, finish_job, requeue_job, submit_job
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def _started(job: Job) -> None:
    assert job.pk in run_tick().started


def test_requeued_runs_say_node_fail_or_preempted_and_the_last_how_the_job_ended(demo, api, client) -> None:
    lead = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(name="resilient", command="python train.py", chip_model="910B4", estimated_duration_s=60)
    job = submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    _started(job)
    requeue_job(
        job.pk, reason="NodeFail", detail="node ascend-b4-01 stopped run 1.1 (agent stopped)", count_retry=False
    )
    _started(job)
    requeue_job(job.pk, reason="Preempted", detail="grace period over", count_retry=False)
    _started(job)
    finish_job(job.pk, exit_code=0, ended_at=timezone.now())

    body = api(lead).get(f"/api/v1/jobs/{job.pk}/").json()
    assert body["state"] == "completed"
    assert [(r["attempt"], r["state"], r["reason"], r["exit_code"]) for r in body["runs"]] == [
        (1, "node_fail", "NodeFail", None),
        (2, "preempted", "Preempted", None),
        (3, "completed", "Completed", 0),
    ]
    assert body["runs"][0]["exit_reason"] == "stopped by its node's shutdown"
    assert body["runs"][0]["detail"].startswith("node ascend-b4-01 stopped run")
    assert all(r["nodes"] and r["started_at"] and r["ended_at"] for r in body["runs"])

    client.force_login(lead)
    page = client.get(f"/live/jobs/{job.pk}/").content.decode()
    assert 'id="job-runs"' in page
    assert "Node failure" in page and "Preempted" in page and "Completed" in page


def test_a_job_that_ran_once_has_one_run_and_the_page_no_runs_table(demo, api, client) -> None:
    lead = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(name="once", command="true", chip_model="910B4", estimated_duration_s=60)
    job = submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    assert api(lead).get(f"/api/v1/jobs/{job.pk}/").json()["runs"] == []
    _started(job)
    running = api(lead).get(f"/api/v1/jobs/{job.pk}/").json()["runs"]
    assert [(r["attempt"], r["state"], r["ended_at"], r["exit_reason"]) for r in running] == [
        (1, "running", None, None)
    ]
    client.force_login(lead)
    assert 'id="job-runs"' not in client.get(f"/live/jobs/{job.pk}/").content.decode()
