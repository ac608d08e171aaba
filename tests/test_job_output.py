"""A job's output through real agents: followed while it runs, read after it ended, kept when the node is gone."""

from __future__ import annotations

import signal

import pytest
from django.contrib.auth import get_user_model

from scheduling.models import Job, JobOutput
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.test_lifecycle_harness import cluster, eager_celery, node_of, open_devices, poll, submit, tick
from tests.waiting import ceiling, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest


def _log(client, job: Job, **params: object) -> dict:  # type: ignore[no-untyped-def]
    resp = client.get(f"/api/v1/jobs/{job.pk}/log/", params)
    assert resp.status_code == 200, resp.content
    return resp.json()


def _started(cluster, submit, command: str):  # type: ignore[no-untyped-def]
    """Submit ``command``, tick, and wait until its node's agent runs it: ``(job, agent)``."""
    job = submit(command)
    tick()
    job = Job.objects.get(pk=job.pk)
    agent = cluster[node_of(job)]
    agent.wait_job(job.agent_job_id, {"running"})
    return job, agent


def test_output_is_followed_while_it_runs_and_kept_after_the_node_is_gone(cluster, submit, api, tmp_path) -> None:
    lead = api(get_user_model().objects.get(username="lead-training"))
    gate = tmp_path / "go"  # the job writes its last line only once the follower has had the first ones
    command = f"echo first; echo 'to stderr' >&2; while [ ! -e {gate} ]; do sleep 0.05; done; echo second; sleep 0.5"
    job, agent = _started(cluster, submit, command)

    seen, offset, pieces = "", 0, []

    def read_on() -> dict:  # type: ignore[type-arg]
        nonlocal seen, offset
        chunk = _log(lead, job, offset=offset)
        assert chunk["offset"] == offset and chunk["attempt"] == 1 and chunk["source"] == "agent"
        seen += chunk["data"]
        pieces.append((chunk["data"], chunk["complete"]))
        offset = chunk["next_offset"]
        if "to stderr" in seen:
            gate.touch()
        return chunk

    wait_for(read_on, until=lambda chunk: chunk["complete"], interval=0.1, message=f"job {job.pk}'s log to complete")
    assert seen == "first\nto stderr\nsecond\n"
    # While it ran the follower had the first lines and not the last, then the rest from its offset.
    assert any(data and "second" not in data and not done for data, done in pieces), pieces

    poll()
    assert Job.objects.get(pk=job.pk).state == Job.State.COMPLETED
    kept = JobOutput.objects.get(job=job, attempt=1)
    assert kept.data == seen and kept.offset == 0 and kept.size == len(seen.encode())

    assert _log(lead, job, tail=1)["data"] == "second\n"
    agent.kill(signal.SIGTERM)  # the node is gone: the kept end still answers
    after = _log(lead, job)
    assert after["data"] == seen and after["complete"] and after["source"] == "saved"


def _first_output(client, job: Job, **params: object) -> dict:  # type: ignore[no-untyped-def]
    """The log once the run has written something (its first line comes at once)."""
    return wait_for(
        lambda: _log(client, job, **params), until=lambda chunk: chunk["data"], interval=0.1, message="a first line"
    )


def test_an_earlier_runs_output_is_read_with_attempt_after_a_requeue(cluster, submit, api) -> None:
    """A card fails under the first run: the job runs again, and ``?attempt=1`` still reads the first run."""
    lead = api(get_user_model().objects.get(username="lead-training"))
    job, agent = _started(cluster, submit, 'echo "run $NPUPORTAL_JOB_ID"; sleep 30')
    assert _first_output(lead, job)["data"] == f"run {job.pk}.1\n"
    poll()
    agent.fault(open_devices(job)[0].index, "ecc")
    assert job.pk in poll().requeued  # the end of the first run is kept as it leaves its cards
    tick()
    job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.RUNNING and job.agent_job_id == f"{job.pk}.2"
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})

    latest = _first_output(lead, job)
    assert (latest["attempt"], latest["attempts"], latest["data"]) == (2, 2, f"run {job.pk}.2\n")
    first = _log(lead, job, attempt=1)
    assert (first["attempt"], first["data"], first["complete"]) == (1, f"run {job.pk}.1\n", True)
    assert first["source"] == "saved" and JobOutput.objects.filter(job=job, attempt=1).exists()
    assert _log(lead, job, attempt=1, tail=1)["data"] == f"run {job.pk}.1\n"
    resp = lead.get(f"/api/v1/jobs/{job.pk}/log/", {"attempt": "3"})
    assert resp.status_code == 400 and resp.json()["field"] == "attempt"


def test_log_parameters_are_checked_and_other_teams_see_nothing(cluster, submit, api, user_factory) -> None:
    lead = api(get_user_model().objects.get(username="lead-training"))
    job = submit("echo hi")
    tick()
    for params, field in (
        ({"offset": "-3"}, "offset"),
        ({"offset": "abc"}, "offset"),
        ({"tail": "x"}, "tail"),
        ({"attempt": "2"}, "attempt"),
        ({"attempt": "0"}, "attempt"),
        ({"node": "nowhere"}, "node"),
        ({"offset": "0", "tail": "3"}, "tail"),
    ):
        resp = lead.get(f"/api/v1/jobs/{job.pk}/log/", params)
        assert resp.status_code == 400, (params, resp.content)
        assert resp.json()["field"] == field, resp.json()
    other = api(user_factory("eve", team="research", role="lead"))
    assert other.get(f"/api/v1/jobs/{job.pk}/log/").status_code == 404


@requires_chromium
@pytest.mark.browser
def test_the_job_page_shows_the_output_growing_while_it_runs(cluster, submit, page, user_factory, tmp_path) -> None:  # noqa: F811
    """What a lead sees: the first line, then the next one appear on the job page without a reload."""
    from playwright.sync_api import expect

    user_factory("tess", team="training", role="lead")
    gate = tmp_path / "go"  # the second line comes once the page shows the first
    job = submit(f"echo first-line; while [ ! -e {gate} ]; do sleep 0.05; done; echo second-line; sleep 600")
    tick()
    job = Job.objects.get(pk=job.pk)
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    login(page, "tess", "pw-tess")
    page.goto(f"/jobs/{job.pk}/")
    output = page.locator("#job-output")
    expect(output).to_contain_text("first-line")
    snap(page, "first-line")
    gate.touch()
    expect(output).to_contain_text("second-line")  # no reload: the page follows
    expect(page.locator("#job-output-status")).to_contain_text("following")
    snap(page, "second-line")
    assert page.locator("text={{").count() == 0  # no raw template text anywhere


def test_npuctl_logs_follow_prints_each_line_once_until_the_job_ends(cluster, submit, live_server) -> None:
    """``npuctl logs JOB -f`` as a person runs it: the lines as they come, none twice, and it returns at the end."""
    import os
    import subprocess
    import sys

    from quotas.access.tokens import issue_token

    key = issue_token(get_user_model().objects.get(username="lead-training"), "logs")[1]
    job = submit("echo line-1; sleep 1; echo line-2; sleep 1; echo line-3; sleep 1")
    tick()
    job = Job.objects.get(pk=job.pk)
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    env = {**os.environ, "NPUPORTAL_URL": live_server.url, "NPUPORTAL_TOKEN": key}
    follower = subprocess.Popen(
        [sys.executable, "-m", "npuctl", "logs", str(job.pk), "-f"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def follower_returned() -> bool:
            poll()  # the job's end reaches the portal at a poll, as the worker's would
            return follower.poll() is not None

        wait_for(follower_returned, interval=0.5, message="npuctl logs -f to return")
        out, err = follower.communicate(timeout=ceiling(60))
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == 0, err
    assert out == "line-1\nline-2\nline-3\n", out
    assert Job.objects.get(pk=job.pk).state == Job.State.COMPLETED
