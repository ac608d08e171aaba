"""The job list as ``npuctl queue`` and ``npuctl history`` read it: nodes held, device-hours, end-time filters."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from devices.models import Device
from quotas.models import Team
from scheduling.models import Allocation, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def world(demo, user_factory, isolated_api_state):
    return {
        "lead": user_factory("hist-lead", team="training", role="lead"),
        "other": user_factory("hist-other", team="research"),
    }


def _job(user, state: str, *, ended_ago_h: float | None = None, ran_h: float = 1.0, name: str = "j") -> Job:
    now = timezone.now()
    ended = None if ended_ago_h is None else now - timedelta(hours=ended_ago_h)
    started = (ended or now) - timedelta(hours=ran_h) if state != "pending" else None
    return Job.objects.create(
        team=Team.objects.get(name="training"),
        submitter=user,
        name=name,
        command="python train.py",
        priority_class="normal",
        num_devices=2,
        state=state,
        submitted_at=(started or now) - timedelta(minutes=5),
        started_at=started,
        ended_at=ended,
        exit_code=0 if state == "completed" else (1 if state == "failed" else None),
    )


def _hold(job: Job, node: str, index: int, *, share: float = 1.0) -> None:
    device = Device.objects.get(node__name=node, index=index)
    Allocation.objects.create(job=job, device=device, device_share=share, start=job.started_at, end=job.ended_at)


def _list(api, user, query: str = "") -> list[dict]:
    resp = api(user).get(f"/api/v1/jobs/?user={user.username}{query}")
    assert resp.status_code == 200, resp.content
    return resp.json()["results"]


def test_a_running_job_lists_the_nodes_it_holds_and_its_device_hours(world, api) -> None:
    running = _job(world["lead"], "running", ran_h=2)
    _hold(running, "ascend-b4-02", 0)
    _hold(running, "ascend-b4-01", 0)
    _hold(running, "ascend-b4-01", 1)
    waiting = _job(world["lead"], "pending")
    rows = {j["id"]: j for j in _list(api, world["lead"])}
    assert rows[running.pk]["nodes"] == ["ascend-b4-01", "ascend-b4-02"]
    assert rows[running.pk]["device_hours"] == pytest.approx(6.0, abs=0.01)  # 3 cards × 2 h, up to now
    assert rows[waiting.pk]["nodes"] == [] and rows[waiting.pk]["device_hours"] == 0.0
    # The job's older keys are all still there.
    assert {"id", "state", "command_preview", "exit_code", "ended_at"} <= set(rows[running.pk])


def test_an_ended_job_holds_no_nodes_and_keeps_its_device_hours(world, api) -> None:
    done = _job(world["lead"], "completed", ended_ago_h=1, ran_h=1.5)
    _hold(done, "ascend-b4-01", 2)
    _hold(done, "ascend-310p-01", 0, share=0.25)  # a slice counts at its share of a card
    (row,) = _list(api, world["lead"])
    assert row["nodes"] == []
    assert row["device_hours"] == pytest.approx(1.5 * 1.25)


def test_ended_after_and_before_pick_jobs_by_their_end(world, api) -> None:
    now = timezone.now()
    old = _job(world["lead"], "completed", ended_ago_h=50)
    recent = _job(world["lead"], "failed", ended_ago_h=2)
    cancelled = _job(world["lead"], "cancelled", ended_ago_h=1)
    _job(world["lead"], "running")  # no end: never in an ended_* window
    after = (now - timedelta(hours=24)).isoformat()
    assert {j["id"] for j in _list(api, world["lead"], f"&ended_after={after.replace('+', '%2B')}")} == {
        recent.pk,
        cancelled.pk,
    }
    before = (now - timedelta(hours=24)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert [j["id"] for j in _list(api, world["lead"], f"&ended_before={before}")] == [old.pk]
    # Several states at once (repeated), with a window.
    rows = _list(api, world["lead"], f"&state=failed&state=completed&ended_before={now:%Y-%m-%dT%H:%M:%SZ}")
    assert {j["id"] for j in rows} == {old.pk, recent.pk}


def test_another_teams_ended_jobs_stay_hidden(world, api) -> None:
    _job(world["lead"], "completed", ended_ago_h=1)
    resp = api(world["other"]).get("/api/v1/jobs/?user=hist-lead&state=completed")
    assert resp.status_code == 200 and resp.json()["results"] == []


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("state=finished", "state"),
        ("state=completed&state=done", "state"),
        ("ended_after=yesterday", "ended_after"),
        ("ended_after=", "ended_after"),
        ("ended_before=2026-13-01", "ended_before"),
    ],
)
def test_bad_history_filters_are_400_naming_the_parameter(world, api, query, field) -> None:
    resp = api(world["lead"]).get(f"/api/v1/jobs/?{query}")
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["field"] == field and body["error"], body


def test_the_list_stays_one_query_for_the_page_with_nodes_and_hours(world, api, django_assert_max_num_queries):
    client = api(world["lead"])
    client.get("/api/v1/jobs/")  # token, caches
    for i in range(12):
        job = _job(world["lead"], "running", name=f"r{i}")
        _hold(job, "ascend-b4-02", i % 8)
        job.state = "completed"
        job.ended_at = timezone.now()
        job.save()
        Allocation.objects.filter(job=job).update(end=job.ended_at)
    with django_assert_max_num_queries(3):  # auth, the member's teams, the page
        assert len(client.get("/api/v1/jobs/?user=hist-lead").json()["results"]) == 12
