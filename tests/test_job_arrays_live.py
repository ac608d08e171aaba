"""Job arrays, dependencies and end states through real node agents, the API, npuctl and the console.

What a Slurm user reaches for: each copy of an array knows which it is (``$SLURM_ARRAY_TASK_ID``), an
array's ``%N`` lets N copies run at once, ``--dependency`` chains jobs, and a job stopped at its time
limit reads ``timeout`` everywhere, ``npuctl history --state timeout`` included.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from npuctl.main import main as npuctl
from quotas.access.tokens import issue_token
from scheduling.models import Job
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.test_lifecycle_harness import cluster, eager_celery, poll, submit, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest

#: Generous: the machine is shared, and each round is a poll of two real agents.
DEADLINE_S = 60.0
PRINT_INDEX = (
    'echo "task=$SLURM_ARRAY_TASK_ID count=$SLURM_ARRAY_TASK_COUNT min=$SLURM_ARRAY_TASK_MIN '
    "max=$SLURM_ARRAY_TASK_MAX array=$SLURM_ARRAY_JOB_ID job=$SLURM_JOB_ID "
    'ours=$NPUPORTAL_ARRAY_ID/$NPUPORTAL_ARRAY_INDEX/$NPUPORTAL_ARRAY_COUNT"'
)
JOB = {"num_devices": 1, "chip_model": "910B4", "estimated_duration_s": 60}


def _lead() -> Any:
    return get_user_model().objects.get(username="lead-training")


def _until(what: str, check: Callable[[], bool], *, each: Callable[[], Any] = poll) -> None:
    """Poll (and whatever ``each`` does) until ``check()`` holds; fail saying ``what`` after DEADLINE_S."""
    deadline = time.monotonic() + DEADLINE_S
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {DEADLINE_S:g} s: {what}")
        each()
        time.sleep(0.2)


def _states(ids: Iterable[int]) -> dict[int, str]:
    return dict(Job.objects.filter(pk__in=list(ids)).values_list("pk", "state"))


def _round() -> None:
    """One round of the worker: a poll (what ended), then a tick (what starts)."""
    poll()
    tick()


def _log(client: Any, job_id: int) -> str:
    resp = client.get(f"/api/v1/jobs/{job_id}/log/")
    assert resp.status_code == 200, resp.content
    return resp.json()["data"]


def test_each_copy_of_an_array_knows_which_it_is_and_percent_n_runs_that_many_at_once(cluster, api) -> None:
    lead = api(_lead())
    body = {**JOB, "name": "shard", "command": PRINT_INDEX + "; sleep 2", "team": "training", "array": "1,4,7%2"}
    resp = lead.post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 201, resp.content
    copies = resp.json()
    ids = [c["id"] for c in copies]
    array_id = copies[0]["array_id"]
    assert [c["array_index"] for c in copies] == [1, 4, 7]

    started = [i for i in tick().started if i in ids]
    assert started == ids[:2], "two at once, the lowest indices first"
    third = lead.get(f"/api/v1/jobs/{ids[2]}/").json()
    assert third["pending_reason"] == "JobArrayTaskLimit"
    assert third["pending_detail"] == f"array {array_id} runs at most 2 copies at once"

    _until("every copy completed", lambda: set(_states(ids).values()) == {"completed"}, each=_round)
    for copy, index in zip(copies, (1, 4, 7), strict=True):
        assert _log(lead, copy["id"]) == (
            f"task={index} count=3 min=1 max=7 array={ids[0]} job={copy['id']} ours={array_id}/{index}/3\n"
        )


def test_a_dependency_chain_through_npuctl_and_real_agents(cluster, live_server, monkeypatch, capsys) -> None:
    key = issue_token(_lead(), "chain")[1]
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", key)

    def submit_cli(*argv: str) -> int:
        capsys.readouterr()
        assert npuctl(["submit", "--team", "training", "--chip", "910B4", "--time", "1m", *argv]) == 0
        return int(capsys.readouterr().out.split()[2])

    prepare = submit_cli("--name", "prepare", "--", "echo preparing; exit 3")
    train = submit_cli("--name", "train", "-d", f"afterok:{prepare}", "--", "echo training")
    rescue = submit_cli("--name", "rescue", "--dependency", f"afternotok:{prepare}", "--", "echo rescued")
    report = submit_cli("--name", "report", "-d", f"afterok:{rescue}", "--", "echo reported")

    tick()
    assert Job.objects.get(pk=train).pending_reason == "Dependency"
    assert Job.objects.get(pk=report).pending_detail == f"waits for job {rescue} to complete"
    capsys.readouterr()
    assert npuctl(["queue", "--me"]) == 0
    queue = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert queue[str(train)][7] == "Dependency" and queue[str(report)][7] == "Dependency"

    chain = [prepare, train, rescue, report]
    _until(
        "the chain settled",
        lambda: _states(chain) == {prepare: "failed", train: "cancelled", rescue: "completed", report: "completed"},
        each=_round,
    )
    cancelled = Job.objects.get(pk=train).events.last()
    assert cancelled.reason == "DependencyNeverSatisfied"
    assert cancelled.detail == f"afterok:{prepare} can never be satisfied: job {prepare} ended failed"
    capsys.readouterr()
    assert npuctl(["show", str(report)]) == 0
    shown = {line.split("  ")[0]: line.split()[-1] for line in capsys.readouterr().out.splitlines() if "  " in line}
    assert shown["depends on"] == f"afterok:{rescue}"


def test_a_job_killed_at_its_time_limit_is_timeout_in_the_api_and_npuctl(
    cluster, submit, live_server, api, monkeypatch, capsys
) -> None:
    job = submit("echo started; sleep 30", max_duration_s=2, name="too-long")
    tick()
    _until("the agent stopped it at its time limit", lambda: _states([job.pk])[job.pk] == "timeout")
    body = api(_lead()).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (body["state"], body["exit_reason"]) == ("timeout", "time limit reached")
    assert body["events"][-1]["reason"] == "Walltime" and body["events"][-1]["to_state"] == "timeout"
    assert [(r["attempt"], r["state"], r["exit_reason"]) for r in body["runs"]] == [
        (1, "timeout", "time limit reached")
    ]

    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", issue_token(_lead(), "history")[1])
    capsys.readouterr()
    assert npuctl(["history", "--state", "timeout,out_of_memory"]) == 0
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert rows[0][:4] == ["JOBID", "NAME", "TEAM", "STATE"]
    assert [r[:4] for r in rows[1:]] == [[str(job.pk), "too-long", "training", "timeout"]]
    assert npuctl(["history", "--state", "failed"]) == 0
    assert str(job.pk) not in [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert npuctl(["history", "-j", str(job.pk)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["JOBID", "RUN", "NAME", "STATE"]
    assert lines[1].split()[:4] == [str(job.pk), "1", "too-long", "timeout"] and "time limit reached" in lines[1]


@requires_chromium
@pytest.mark.browser
def test_the_console_shows_an_arrays_indices_and_a_timeout(cluster, submit, page, api, user_factory) -> None:  # noqa: F811
    """What a lead sees: each copy's page prints its own index; a job stopped at its limit reads Timeout."""
    from playwright.sync_api import expect

    user_factory("tara", team="training", role="lead")
    lead = api(_lead())
    resp = lead.post(
        "/api/v1/jobs/",
        {**JOB, "name": "shard", "command": PRINT_INDEX, "team": "training", "array": 3},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    copies = resp.json()
    too_long = submit("echo started; sleep 30", max_duration_s=2, name="too-long")
    ids = [c["id"] for c in copies] + [too_long.pk]
    tick()
    _until(
        "the copies completed and the long one hit its limit",
        lambda: _states(ids) == {**{c["id"]: "completed" for c in copies}, too_long.pk: "timeout"},
        each=_round,
    )

    login(page, "tara", "pw-tara")
    for copy in copies:
        page.goto(f"/jobs/{copy['id']}/")
        expect(page.locator("#job-output")).to_contain_text(
            f"task={copy['array_index']} count=3 min=0 max=2", timeout=15000
        )
        expect(page.locator("#job-array")).to_contain_text(f"{copy['array_id']} index {copy['array_index']}")
        snap(page, f"copy-{copy['array_index']}")
    page.goto(f"/jobs/{too_long.pk}/")
    expect(page.locator("#job-state")).to_have_text("Timeout")
    expect(page.locator("#job-exit-reason")).to_contain_text("time limit reached")
    snap(page, "timeout")
    page.goto("/jobs/?state=timeout")
    expect(page.locator("text=too-long").first).to_be_visible()
    snap(page, "timeout-list")
