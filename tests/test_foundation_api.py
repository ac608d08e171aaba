"""Job API: bad input is refused with the field named, teams never see each other's jobs."""

from __future__ import annotations

import pytest

from scheduling.models import Job, JobEvent

pytestmark = pytest.mark.django_db

GOOD = {"name": "ok", "command": "sleep 1", "num_devices": 1, "estimated_duration_s": 60}


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"num_devices": -1}, "num_devices", ""),
        ({"num_devices": "many"}, "num_devices", ""),
        ({"num_devices": 10000}, "num_devices", "no chip model has that many"),
        ({"name": ""}, "name", ""),
        ({"command": None}, "command", ""),
        ({"vnpu_template": "vir99"}, "vnpu_template", "unknown"),
        ({"chip_model": "H100"}, "chip_model", "no device"),
        ({"priority_class": "urgent"}, "priority_class", "unknown class"),
        ({"priority_class": "critical"}, "priority_class", "may not use"),
        ({"estimated_duration_s": 10**9}, "estimated_duration_s", ""),
        (
            {"estimated_duration_s": 7200, "max_duration_s": 3600},
            "estimated_duration_s",
            "2 h is more than the job's maximum run time (1 h)",
        ),
        ({"checkpoint_interval_s": 0}, "checkpoint_interval_s", ""),
        ({"checkpoint_interval_s": 10**9}, "checkpoint_interval_s", ""),
        ({"checkpoint_interval_s": "often"}, "checkpoint_interval_s", ""),
        ({"team": "training"}, "team", "belong"),
    ],
)
def test_bad_submissions_get_400_naming_the_field_and_change_nothing(
    demo, api, user_factory, body, field, words
) -> None:
    lead = user_factory("rita", team="research", role="lead")
    before = Job.objects.count()
    resp = api(lead).post("/api/v1/jobs/", {**GOOD, **body}, format="json")
    assert resp.status_code == 400, resp.content
    data = resp.json()
    assert data["field"] == field
    assert words in data["error"]
    assert Job.objects.count() == before


@pytest.mark.parametrize("array", [None, 3])
@pytest.mark.parametrize(
    ("body", "why"),
    [
        # training may hold 24 cards; the largest chip pool has 16.
        ({"num_devices": 25}, "a 25-card job; no chip model has that many cards (910B4: 16, 910A: 8, 310P3: 4)"),
        ({"num_devices": 17, "chip_model": "910B4"}, "a 17-card job; the cluster has 16 cards of 910B4"),
        # A quarter of the 910B4 cards is held for critical: a normal job never gets all 16.
        (
            {"num_devices": 16, "chip_model": "910B4"},
            "a 16-card job is more than the reservations leave: reservation online-inference holds 4 of the "
            "16 910B4 cards for critical: a normal job can have at most 12 of them",
        ),
    ],
)
def test_a_job_that_can_never_run_is_a_400_naming_num_devices_and_stores_nothing(
    demo, api, user_factory, body, why, array
) -> None:
    """Accepted, such a job would wait forever "at its device limit ... for now"; the engine's rule says why."""
    lead = user_factory("lena", team="training", role="lead")
    before = (Job.objects.count(), JobEvent.objects.count())
    resp = api(lead).post("/api/v1/jobs/", {**GOOD, **body, **({"array": array} if array else {})}, format="json")
    assert resp.status_code == 400, resp.content
    message = f"this job can never run here: {why}"
    expected = {"error": f"num_devices: {message}", "field": "num_devices", "details": {"num_devices": [message]}}
    assert resp.json() == expected
    assert (Job.objects.count(), JobEvent.objects.count()) == before


@pytest.mark.clock
@pytest.mark.parametrize(("first", "last", "status"), [(-3, -1, 400), (-1, 1, 201), (2, 4, 201)])
def test_a_dated_quota_window_lets_a_job_in_until_its_last_day(demo, api, user_factory, first, last, status) -> None:
    """An approved request let research hold 8 cards on some dates: a job that needs them is accepted
    before and during those dates (it can run then), and refused, naming the field, once they are over."""
    from datetime import timedelta
    from pathlib import Path

    from django.utils import timezone

    from quotas.policies.versions import active_policy, create_version
    from scheduling.engine.policy import parse_policy, policy_clock

    text = (Path(__file__).resolve().parents[1] / "examples" / "policies" / "demo.yaml").read_text()
    # Today on the clock of the policy about to be applied (the demo's, Asia/Shanghai), not the one
    # active now: the clock sweep runs the demo on the instant's own zone.
    today = policy_clock(parse_policy(text), timezone.now())[2]
    window = f"{{from: '{today + timedelta(days=first)}', until: '{today + timedelta(days=last)}'}}"
    text = text.replace(
        "max: {devices: 12}\n        maxConcurrentJobs: 10\n        allowedPriorityClasses: [normal, low]\n",
        "max: {devices: 4}\n        maxConcurrentJobs: 10\n        allowedPriorityClasses: [normal, low]\n"
        f"      schedules:\n        - {{name: request-1, dates: {window}, between: '00:00-24:00',"
        " quota: {max: {devices: 8}}}\n",
    )
    create_version(text, author=None, comment="request-1")
    assert [s.name for s in active_policy().policy.team("research").schedules] == ["request-1"]
    lead = user_factory("rita", team="research", role="lead")
    before = Job.objects.count()
    resp = api(lead).post("/api/v1/jobs/", {**GOOD, "num_devices": 8, "chip_model": "910B4"}, format="json")
    assert resp.status_code == status, resp.content
    if status == 400:
        assert resp.json()["field"] == "num_devices"
        assert "an 8-card job is more than team research may ever hold (4 cards" in resp.json()["error"]
        assert Job.objects.count() == before


def test_max_duration_above_the_teams_limit_is_refused(demo, api, user_factory) -> None:
    lead = user_factory("ivan", team="inference", role="lead")
    resp = api(lead).post("/api/v1/jobs/", {**GOOD, "max_duration_s": 30 * 86400}, format="json")
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert resp.json()["field"] == "max_duration_s" and "maxJobDuration" not in error, "no policy keys in a refusal"
    assert error == "max_duration_s: 30 d is more than team inference's 24 h limit on run time"


def test_a_checkpoint_interval_is_stored_shown_and_resubmitted(demo, api, user_factory) -> None:
    lead = user_factory("rita", team="research", role="lead")
    created = api(lead).post("/api/v1/jobs/", {**GOOD, "checkpoint_interval_s": 1800}, format="json")
    assert created.status_code == 201, created.content
    assert created.json()["checkpoint_interval_s"] == 1800
    assert Job.objects.get(pk=created.json()["id"]).checkpoint_interval_s == 1800
    copy = api(lead).post(f"/api/v1/jobs/{created.json()['id']}/resubmit/").json()
    assert copy["checkpoint_interval_s"] == 1800
    plain = api(lead).post("/api/v1/jobs/", GOOD, format="json").json()
    assert plain["checkpoint_interval_s"] is None
    listed = {j["id"]: j for j in api(lead).get("/api/v1/jobs/").json()["results"]}
    assert listed[created.json()["id"]]["checkpoint_interval_s"] == 1800


def test_a_member_sees_and_cancels_only_their_teams_jobs(demo, api, user_factory) -> None:
    alice = user_factory("alice", team="training")
    eve = user_factory("eve", team="research")
    created = api(alice).post("/api/v1/jobs/", {**GOOD, "team": "training"}, format="json").json()
    listed = api(eve).get("/api/v1/jobs/").json()["results"]
    assert created["id"] not in {j["id"] for j in listed}
    assert all(j["team"] == "research" for j in listed)
    assert api(eve).get(f"/api/v1/jobs/{created['id']}/").status_code == 404
    assert api(eve).post(f"/api/v1/jobs/{created['id']}/cancel/").status_code == 404
    assert Job.objects.get(pk=created["id"]).state == "pending"
    own = api(alice).get(f"/api/v1/jobs/{created['id']}/")
    assert own.status_code == 200 and own.json()["events"][0]["to_state"] == "pending"


def test_admin_sees_every_team(demo, api, user_factory) -> None:
    admin = user_factory("root", staff=True)
    teams = {j["team"] for j in api(admin).get("/api/v1/jobs/?limit=200").json()["results"]}
    assert {"training", "research", "inference"} <= teams


def test_unauthenticated_requests_are_refused(demo) -> None:
    from rest_framework.test import APIClient

    resp = APIClient().get("/api/v1/jobs/")
    assert resp.status_code in (401, 403)
    assert "error" in resp.json()


def test_job_array_submits_indexed_copies(demo, api, user_factory) -> None:
    lead = user_factory("arr", team="research", role="lead")
    resp = api(lead).post("/api/v1/jobs/", {**GOOD, "name": "sweep", "array": 4}, format="json")
    assert resp.status_code == 201
    jobs = resp.json()
    assert [j["array_index"] for j in jobs] == [0, 1, 2, 3]
    assert len({j["array_id"] for j in jobs}) == 1
    assert [j["name"] for j in jobs] == ["sweep[0]", "sweep[1]", "sweep[2]", "sweep[3]"]
