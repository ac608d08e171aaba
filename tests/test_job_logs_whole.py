"""Whole logs, and saying when they are not: npuctl logs pages to the end, and the API counts the lines."""

from __future__ import annotations

import signal
import time

import pytest
from django.contrib.auth import get_user_model

from npuctl.main import INCOMPLETE, main
from quotas.access.tokens import issue_token
from scheduling.models import Job, JobOutput
from tests.test_lifecycle_harness import cluster, eager_celery, node_of, poll, submit, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest

#: 50,001 lines, 1.2 MB: five of the agent's 256 KiB pages.
LONG = 'seq -f "line %g of the output" 1 50001'
LONG_TEXT = "".join(f"line {i} of the output\n" for i in range(1, 50002))


@pytest.fixture
def npuctl(live_server, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    key = issue_token(get_user_model().objects.get(username="lead-training"), "logs")[1]
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", key)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _ended(cluster, submit, command: str):  # type: ignore[no-untyped-def]
    """Submit ``command`` and run it to its end on a real agent; ``(job, the agent it ran on)``."""
    job = submit(command)
    tick()
    job = Job.objects.get(pk=job.pk)
    agent = cluster[node_of(job)]
    deadline = time.monotonic() + 60
    while not job.is_final and time.monotonic() < deadline:
        poll()
        time.sleep(0.3)
        job = Job.objects.get(pk=job.pk)
    assert job.state == Job.State.COMPLETED, job.state
    return job, agent


def test_npuctl_logs_prints_the_whole_output_page_after_page(cluster, submit, npuctl, api) -> None:
    """Issue 26, 6: a 50,001-line log was cut at 262,144 bytes, mid-line, with exit 0."""
    job, _ = _ended(cluster, submit, LONG)
    code, out, err = npuctl("logs", str(job.pk))
    assert (code, err) == (0, "")
    assert out == LONG_TEXT  # every byte, in order, once

    lead = api(get_user_model().objects.get(username="lead-training"))
    tail = lead.get(f"/api/v1/jobs/{job.pk}/log/", {"tail": 500}).json()
    assert tail["lines"] == 50001 and tail["data"].count("\n") == 500 and tail["size"] == len(LONG_TEXT)
    kept = JobOutput.objects.get(job=job)
    assert kept.lines == 50001 and kept.offset > 0  # the kept end knows how long the whole was


def test_with_its_node_gone_npuctl_logs_says_what_it_left_out_and_exits_non_zero(cluster, submit, npuctl, api) -> None:
    job, agent = _ended(cluster, submit, LONG)
    agent.kill(signal.SIGTERM)  # only the kept end (64 KiB) is left
    kept = JobOutput.objects.get(job=job)
    code, out, err = npuctl("logs", str(job.pk))
    assert code == INCOMPLETE
    assert LONG_TEXT.endswith(out) and out.endswith("line 50001 of the output\n") and len(out) < 70000
    assert f"job {job.pk}: bytes 0 to {kept.offset} of run 1 on {kept.node}'s output were left out" in err
    # What remains still says how long the whole was.
    lead = api(get_user_model().objects.get(username="lead-training"))
    tail = lead.get(f"/api/v1/jobs/{job.pk}/log/", {"tail": 500}).json()
    assert (tail["lines"], tail["source"]) == (50001, "saved")
    code, out, err = npuctl("logs", "--tail", "2", str(job.pk))
    assert (code, out) == (0, "line 50000 of the output\nline 50001 of the output\n")  # asked for a part


def test_a_running_jobs_logs_print_what_it_wrote_so_far(cluster, submit, npuctl) -> None:
    job = submit("echo first; sleep 30")
    tick()
    job = Job.objects.get(pk=job.pk)
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    deadline = time.monotonic() + 20
    while True:
        code, out, err = npuctl("logs", str(job.pk))
        if out or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert (code, out) == (0, "first\n")
    assert f"job {job.pk}: run 1 is still going; this is its output so far (-f follows)" in err


def _download(client, job: Job, **params: object) -> tuple[int, str, object]:  # type: ignore[no-untyped-def]
    resp = client.get(f"/api/v1/jobs/{job.pk}/log/download/", params)
    body = b"".join(resp.streaming_content).decode() if resp.status_code == 200 else resp.json()
    return resp.status_code, body, resp


def test_the_whole_output_downloads_for_the_team_only(cluster, submit, api, user_factory, client) -> None:
    job, agent = _ended(cluster, submit, LONG)
    lead = api(get_user_model().objects.get(username="lead-training"))
    status, text, resp = _download(lead, job)
    assert status == 200 and text == LONG_TEXT
    assert resp["Content-Type"] == "text/plain; charset=utf-8"
    node = JobOutput.objects.get(job=job).node
    assert resp["Content-Disposition"] == f'attachment; filename="job-{job.pk}-run-1-{node}.log"'

    # Isolation: no team sees another's output, by token or by the console's session.
    other = api(user_factory("eve", team="research", role="lead"))
    status, body, _ = _download(other, job)
    assert status == 404 and str(job.pk) not in str(body), body
    client.force_login(get_user_model().objects.get(username="eve"))
    assert client.get(f"/api/v1/jobs/{job.pk}/log/download/").status_code == 404
    client.force_login(user_factory("tess", team="training"))  # a member of the job's team, signed in
    assert b"".join(client.get(f"/api/v1/jobs/{job.pk}/log/download/").streaming_content).decode() == LONG_TEXT
    client.logout()
    assert client.get(f"/api/v1/jobs/{job.pk}/log/download/").status_code in (401, 403)
    assert lead.get(f"/api/v1/jobs/{job.pk}/log/download/", {"attempt": "2"}).json()["field"] == "attempt"

    # With its node gone, the file says which bytes are missing before the kept end.
    agent.kill(signal.SIGTERM)
    kept = JobOutput.objects.get(job=job)
    status, text, _ = _download(lead, job)
    head, rest = text.split("\n", 1)
    assert status == 200 and head.startswith(f"[npuportal: bytes 0 to {kept.offset} of this output were left out: ")
    assert rest == kept.data and LONG_TEXT.endswith(rest)


def test_a_job_that_never_started_downloads_a_line_saying_so(demo, submit, api) -> None:
    job = submit("echo hi")
    lead = api(get_user_model().objects.get(username="lead-training"))
    assert _download(lead, job)[1] == "[npuportal: this job has not started, so it has no output]\n"
