"""The account a job really ran as, as the cluster reported it (``Job.ran_as``), on the job's page,
in the API and in ``npuctl show`` — next to the account the portal asked for.

The agents here run every job as themselves (``--jobs-as-agent``, as an agent that cannot switch
accounts does), so the job asked to run as ``lead-training`` runs as this test's own account.
"""

from __future__ import annotations

import os
import pwd
import time

import pytest
from django.test import Client

from devices.executors.agents import reported_account
from devices.models import Node
from npuctl.main import runs_as
from scheduling.models import Job
from tests.test_lifecycle_harness import cluster, eager_celery, node_of, poll, submit, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest

ME = pwd.getpwuid(os.geteuid()).pw_name


def _polled_until(job: Job, check, timeout: float = 30) -> Job:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        poll()
        job = Job.objects.get(pk=job.pk)
        if check(job):
            return job
        time.sleep(0.2)
    raise AssertionError(f"job {job.pk}: {job.state}, ran_as {job.ran_as!r}")


def test_the_job_says_which_account_its_agent_ran_it_as(cluster, submit, api) -> None:
    job = submit("sleep 30")
    page_before = Client()
    lead = job.submitter
    page_before.force_login(lead)
    html = page_before.get(f"/jobs/{job.pk}/").content.decode()
    assert "the cluster reports the account once the job runs" in html
    assert '<code id="job-posix-user">lead-training</code>' in html

    tick()
    job = Job.objects.get(pk=job.pk)
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    job = _polled_until(job, lambda j: j.ran_as)
    assert job.ran_as == ME, "what the agent did, not what the portal asked for"

    html = page_before.get(f"/jobs/{job.pk}/").content.decode()
    assert f'<span id="job-ran-as"><code>{ME}</code> <span class="muted">as the cluster reported</span>' in html
    live = page_before.get(f"/live/jobs/{job.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert f'<span id="job-ran-as" hx-swap-oob="true"><code>{ME}</code>' in live, "the page follows it live"

    body = api(lead).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["ran_as"], body["posix_user"]) == (ME, "lead-training")
    assert runs_as(body) == f"{ME} (as the cluster reported; asked for lead-training)"


def test_npuctl_show_says_runs_as_in_every_case() -> None:
    assert runs_as({"posix_user": "ana", "ran_as": "ana"}) == "ana"
    assert runs_as({"posix_user": "ana", "ran_as": ""}) == "ana (asked for; not reported by the cluster yet)"
    assert runs_as({"posix_user": "ana", "ran_as": "root"}) == "root (as the cluster reported; asked for ana)"
    assert runs_as({"ran_as": "root"}) == "root"  # an older server without posix_user


def test_a_run_whose_nodes_differ_names_each_account_with_its_node(demo) -> None:
    a, b = Node.objects.get(name="ascend-b4-01"), Node.objects.get(name="ascend-b4-02")
    assert reported_account({a.pk: {"user": "ana"}, b.pk: {"user": "ana"}}) == "ana"
    assert (
        reported_account({a.pk: {"user": "ana"}, b.pk: {"user": "root"}}) == "ana on ascend-b4-01, root on ascend-b4-02"
    )
    assert reported_account({a.pk: {"user": None}, b.pk: {}}) == "", "an agent that does not say is not guessed for"
    assert reported_account({a.pk: {"user": "x\ny"}}) == "", "only a printable account name is kept"
