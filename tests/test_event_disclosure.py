"""A job's timeline: who may read which other job it names, and the order it was recorded in."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from npuportal.display_time import as_shown
from quotas.models import Team
from quotas.policies.versions import create_version
from scheduling.disclosure import ANOTHER_TEAM, Viewer, other_job_text
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import finish_job
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: disclosure}
spec:
  timezone: UTC
  priorityClasses:
    - {name: high, preempts: [low]}
    - {name: normal, default: true}
    - {name: low}
  preemption: {gracePeriod: 60s, onPreempt: requeue}
  teams:
    - {name: research, shares: 1, quota: {guaranteed: {devices: 8}, max: {devices: 8}}}
    - {name: training, shares: 1, quota: {max: {devices: 28}}}
"""

#: The reclaiming job's name: it must never reach the preempted team.
SECRET = "zz-secret-reclaim"


def _submit(api, user, cls: str, name: str) -> int:
    body = {"name": name, "command": "sleep 1", "estimated_duration_s": 3600, "num_devices": 8}
    resp = api(user).post("/api/v1/jobs/", {**body, "chip_model": "910A", "priority_class": cls}, format="json")
    assert resp.status_code == 201, resp.json()
    return resp.json()["id"]


@pytest.fixture
def reclaimed(demo, api, user_factory):
    """Training's low job on the 910A server, preempted for research's reclaim (a GuaranteeReclaim)."""
    create_version(POLICY, author=None, comment="test")
    trainer = user_factory("tina", team="training", role="lead")
    researcher = user_factory("zed-researcher", team="research", role="lead")
    admin = user_factory("ada", staff=True)
    t0 = timezone.now().replace(microsecond=0) - timedelta(seconds=30)  # so an agent end time can be before now
    borrower = _submit(api, trainer, "low", "borrowed")
    assert borrower in run_tick(t0).started
    reclaim = _submit(api, researcher, "normal", SECRET)
    assert run_tick(t0 + timedelta(seconds=5)).preempted == [borrower]
    return {"trainer": trainer, "researcher": researcher, "admin": admin, "t0": t0, "borrower": borrower,
            "reclaim": reclaim}  # fmt: skip


#: What the console says for a GuaranteeReclaim (the API's detail keeps the code).
RECLAIM_WORDS = "Your team was borrowing devices guaranteed to another team, which needs them back"


def _words(text: str, job: int) -> list[str]:
    return [w for w in (f"job {job}", f"#{job}", "training") if w in text]


def _leaks(text: str, reclaim: int) -> list[str]:
    return [word for word in (f"#{reclaim}", "research", SECRET, "zed-researcher") if word in text]


def test_the_preempted_teams_lead_is_not_told_which_job_of_which_team_took_the_devices(reclaimed, api) -> None:
    borrower, reclaim = reclaimed["borrower"], reclaimed["reclaim"]
    event = JobEvent.objects.get(job_id=borrower, reason="PreemptionScheduled")
    assert event.detail == "GuaranteeReclaim" and event.other_job_id == reclaim, "stored as data, not as words"

    resp = api(reclaimed["trainer"]).get(f"/api/v1/jobs/{borrower}/")
    assert resp.status_code == 200
    scheduled = [e for e in resp.json()["events"] if e["reason"] == "PreemptionScheduled"]
    assert [e["detail"] for e in scheduled] == [f"GuaranteeReclaim for {ANOTHER_TEAM}"]
    assert _leaks(json.dumps(resp.json()), reclaim) == []

    console = Client()
    console.force_login(reclaimed["trainer"])
    page = console.get(f"/jobs/{borrower}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f"{RECLAIM_WORDS} — for {ANOTHER_TEAM}" in html, "the console says the cause in words"
    assert f"a waiting job ({ANOTHER_TEAM}) needs its devices" in html
    assert _leaks(html, reclaim) == []


def test_an_admin_reads_the_job_and_its_team(reclaimed, api) -> None:
    borrower, reclaim = reclaimed["borrower"], reclaimed["reclaim"]
    expected = f"GuaranteeReclaim for job #{reclaim} (team research)"
    resp = api(reclaimed["admin"]).get(f"/api/v1/jobs/{borrower}/")
    assert [e["detail"] for e in resp.json()["events"] if e["reason"] == "PreemptionScheduled"] == [expected]

    console = Client()
    console.force_login(reclaimed["admin"])
    html = console.get(f"/jobs/{borrower}/").content.decode()
    assert f"{RECLAIM_WORDS} — for job #{reclaim} (team research)" in html
    assert f"a waiting job (job #{reclaim} (team research)) needs its devices" in html


def test_a_member_of_the_other_jobs_team_reads_the_job_but_nobody_else_does(demo, user_factory) -> None:
    research = Team.objects.get(name="research")
    member = Viewer.of(user_factory("rita", team="research"))
    outsider = Viewer.of(user_factory("otto", team="inference"))
    admin = Viewer.of(user_factory("ada", staff=True))
    assert other_job_text(member, 19, research.pk, "research") == "job #19"
    assert other_job_text(outsider, 19, research.pk, "research") == ANOTHER_TEAM
    assert other_job_text(admin, 19, research.pk, "research") == "job #19 (team research)"
    assert other_job_text(Viewer.of(None), 19, research.pk, "research") == ANOTHER_TEAM
    assert other_job_text(member, None, None) == ""


def test_completed_with_an_earlier_agent_end_time_is_still_last_and_shows_that_time(reclaimed, api) -> None:
    """The agent's end time arrives with a poll, after the tick preempted the job: the timeline keeps that order."""
    borrower, t0 = reclaimed["borrower"], reclaimed["t0"]
    ended = t0 + timedelta(seconds=2)  # before the preemption (t0 + 5 s) was scheduled
    finish_job(borrower, exit_code=0, ended_at=ended)
    job = Job.objects.get(pk=borrower)
    assert job.state == Job.State.COMPLETED and job.ended_at == ended, "usage still ends at the agent's time"

    events = api(reclaimed["trainer"]).get(f"/api/v1/jobs/{borrower}/").json()["events"]
    assert [e["reason"] for e in events] == ["Submitted", "Scheduled", "PreemptionScheduled", "Completed"]
    recorded = [e["recorded_at"] for e in events]
    assert recorded == sorted(recorded)
    done = events[-1]
    assert done["reported_at"] == ended.isoformat().replace("+00:00", "Z")
    assert done["at"] == done["reported_at"]
    assert all(e["reported_at"] is None for e in events[:-1])
    assert [e.reason for e in Job.objects.get(pk=borrower).events.all()][-1] == "Completed"

    console = Client()
    console.force_login(reclaimed["trainer"])
    html = console.get(f"/jobs/{borrower}/").content.decode()
    rows = html[html.index('id="events"') :]
    assert rows.index("PreemptionScheduled") < rows.index("Completed")
    assert as_shown(ended, "s") in rows  # on the policy's clock, with its zone


def test_a_refused_launch_does_not_name_the_other_teams_run_holding_the_device(reclaimed, api) -> None:
    from devices.executors.agents import scrub_holder

    borrower, reclaim = reclaimed["borrower"], reclaimed["reclaim"]
    refusal = f"ascend-a-01: POST /v1/jobs: HTTP 409 device 3 is in use by job {borrower}.1"
    text, holder = scrub_holder(refusal)
    assert (text, holder) == ("ascend-a-01: POST /v1/jobs: HTTP 409 device 3 is in use by another job", borrower)
    assert scrub_holder("HTTP 409 device 3 is in use by job maintenance") == (
        "HTTP 409 device 3 is in use by job maintenance", None)  # fmt: skip
    JobEvent.objects.create(job_id=reclaim, at=timezone.now(), from_state="running", to_state="running",
                            reason="LaunchFailed", detail=f"run {reclaim}.1: {text}", other_job_id=holder)  # fmt: skip

    def detail(user) -> str:  # type: ignore[no-untyped-def]
        events = api(user).get(f"/api/v1/jobs/{reclaim}/").json()["events"]
        return next(e["detail"] for e in events if e["reason"] == "LaunchFailed")

    assert detail(reclaimed["researcher"]).endswith(f"in use by another job; held by {ANOTHER_TEAM}")
    assert _words(detail(reclaimed["researcher"]), borrower) == []
    assert detail(reclaimed["admin"]).endswith(f"; held by job #{borrower} (team training)")
