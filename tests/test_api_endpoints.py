"""What each new endpoint answers: teams, nodes, devices, policies, tokens, resubmit, explain, errors."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from devices.models import Node
from quotas.models import ApiToken, AuditEvent, Policy
from scheduling.models import Allocation, Job

pytestmark = pytest.mark.django_db

GOOD_JOB = {"name": "ok", "command": "sleep 1", "num_devices": 1, "estimated_duration_s": 60}


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """Throttle counters of this test only, and no parsed policy cached from another test's v1."""
    from rest_framework.throttling import SimpleRateThrottle

    from quotas import services

    monkeypatch.setattr(SimpleRateThrottle, "cache_format", f"throttle-{uuid.uuid4().hex}-%(scope)s-%(ident)s")
    services._cache.clear()
    yield
    services._cache.clear()


@pytest.fixture
def people(demo, user_factory):
    return {
        "admin": user_factory("root", staff=True),
        "lead": user_factory("lena", team="training", role="lead"),
        "member": user_factory("max", team="training"),
        "other": user_factory("olga", team="research"),
    }


def _policy_text(version: int | None = None) -> str:
    record = Policy.objects.get(version=version) if version else Policy.objects.get(is_active=True)
    return record.yaml_text


# -- teams --------------------------------------------------------------------


def test_team_list_shows_your_teams_and_role(people, api) -> None:
    names = [t["name"] for t in api(people["member"]).get("/api/v1/teams/").json()["results"]]
    assert names == ["training"]
    everything = api(people["admin"]).get("/api/v1/teams/").json()["results"]
    assert {t["name"] for t in everything} == {"inference", "training", "research"}
    assert {t["my_role"] for t in everything} == {"admin"}
    assert api(people["lead"]).get("/api/v1/teams/").json()["results"][0]["my_role"] == "lead"


def test_team_detail_has_quota_for_members_and_usage_members_for_leads(people, api) -> None:
    mine = api(people["member"]).get("/api/v1/teams/training/").json()
    assert mine["quota"]["guaranteed"] == {"devices": 10}
    assert mine["quota"]["max"] == {"devices": 24}
    assert mine["quota"]["maxJobDuration"] == "7d"
    assert mine["quota"]["policy_version"] == 1
    assert mine["quota"]["in_use"]["devices"] == 0
    assert mine["usage"] is None and mine["members"] is None
    led = api(people["lead"]).get("/api/v1/teams/training/").json()
    # The demo history: llama (8 cards × 20 h) finished within the month or not, depending on today.
    assert led["usage"]["team"] == "training" and led["usage"]["total_device_hours"] >= 0
    assert {m["username"] for m in led["members"]} == {"lead-training", "lena", "max"}


def test_team_usage_endpoint_roles_and_month(people, api) -> None:
    assert api(people["member"]).get("/api/v1/teams/training/usage/").status_code == 403
    assert api(people["other"]).get("/api/v1/teams/training/usage/").status_code == 404
    resp = api(people["lead"]).get("/api/v1/teams/training/usage/?month=2020-02")
    assert resp.status_code == 200
    assert resp.json()["month"] == "2020-02" and resp.json()["device_hours"] == {}
    bad = api(people["lead"]).get("/api/v1/teams/training/usage/?month=2020-13")
    assert bad.status_code == 400 and bad.json()["field"] == "month"
    assert api(people["member"]).get("/api/v1/teams/training/members/").status_code == 403
    assert api(people["admin"]).get("/api/v1/teams/research/members/").status_code == 200


def test_usage_counts_a_running_job_up_to_now(people, api) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from devices.models import Device

    job = Job.objects.create(
        team=people["lead"].memberships.get().team,
        submitter=people["lead"],
        name="live",
        command="x",
        priority_class="normal",
        state="running",
        submitted_at=timezone.now(),
        started_at=timezone.now(),
    )
    device = Device.objects.filter(chip_model="910A").first()
    Allocation.objects.create(job=job, device=device, start=timezone.now() - timedelta(minutes=30))
    body = api(people["lead"]).get("/api/v1/teams/training/usage/").json()
    assert body["running_jobs"] == 1
    assert body["device_hours"]["910A"] >= 0.49
    quota = api(people["member"]).get("/api/v1/teams/training/").json()["quota"]
    assert quota["in_use"] == {"devices": 1.0, "devices/910A": 1.0}


# -- nodes and devices ----------------------------------------------------------


def test_nodes_hide_agent_tokens_from_everyone_and_urls_from_non_admins(people, api) -> None:
    Node.objects.filter(name="ascend-b4-01").update(agent_url="http://10.0.0.5:8470", agent_token="s3cret")
    for who in ("member", "lead", "admin"):
        for path in ("/api/v1/nodes/", "/api/v1/nodes/ascend-b4-01/"):
            resp = api(people[who]).get(path)
            assert resp.status_code == 200
            assert "s3cret" not in resp.content.decode()
            assert ("10.0.0.5" in resp.content.decode()) == (who == "admin")
    node = api(people["member"]).get("/api/v1/nodes/ascend-b4-01/").json()
    assert node["devices_total"] == 8 and node["devices_free"] == 8 and len(node["devices"]) == 8
    assert node["chip_models"] == ["910B4"]


def test_cordon_drain_uncordon_are_audited_and_idempotent(people, api) -> None:
    admin = api(people["admin"])
    resp = admin.post("/api/v1/nodes/ascend-a-01/cordon/", {"reason": "fan noise"}, format="json")
    assert resp.status_code == 200 and resp.json()["state"] == "cordoned"
    assert admin.post("/api/v1/nodes/ascend-a-01/cordon/").status_code == 200  # again: no change
    assert admin.post("/api/v1/nodes/ascend-a-01/drain/").json()["state"] == "draining"
    assert admin.post("/api/v1/nodes/ascend-a-01/uncordon/").json()["state"] == "ready"
    events = list(
        AuditEvent.objects.filter(target="ascend-a-01").order_by("id").values_list("action", "actor__username")
    )
    assert events == [("node.cordon", "root"), ("node.drain", "root"), ("node.uncordon", "root")]
    assert "fan noise" in AuditEvent.objects.get(action="node.cordon").detail
    assert admin.post("/api/v1/nodes/no-such-node/cordon/").status_code == 404
    long = admin.post("/api/v1/nodes/ascend-a-01/cordon/", {"reason": "x" * 400}, format="json")
    assert long.status_code == 400 and long.json()["field"] == "reason"


def test_device_filters(people, api) -> None:
    client = api(people["member"])
    chips = {d["chip_model"] for d in client.get("/api/v1/devices/?chip_model=310P3").json()["results"]}
    assert chips == {"310P3"}
    on_node = client.get("/api/v1/devices/?node=ascend-a-01&limit=100").json()
    assert on_node["count"] == 8 and {d["node"] for d in on_node["results"]} == {"ascend-a-01"}
    assert client.get("/api/v1/devices/?health=failed").json()["count"] == 0
    bad = client.get("/api/v1/devices/?health=on-fire")
    assert bad.status_code == 400 and bad.json()["field"] == "health"


# -- policies -----------------------------------------------------------------


def test_policy_list_detail_validate_and_diff(people, api) -> None:
    admin = api(people["admin"])
    listed = admin.get("/api/v1/policies/").json()["results"]
    assert listed[0]["version"] == 1 and listed[0]["active"] is True and "yaml_text" not in listed[0]
    assert "kind: SchedulingPolicy" in admin.get("/api/v1/policies/1/").json()["yaml_text"]
    ok = admin.post("/api/v1/policies/validate/", {"yaml": _policy_text()}, format="json").json()
    assert ok["valid"] is True
    bad = admin.post("/api/v1/policies/validate/", {"yaml": "spec: [1"}, format="json").json()
    assert bad["valid"] is False and bad["issues"][0]["severity"] == "error"
    unknown_chip = _policy_text().replace("devices/910B4: 10", "devices/H100: 10")
    issues = admin.post("/api/v1/policies/validate/", {"yaml": unknown_chip}, format="json").json()["issues"]
    assert any("H100" in i["message"] for i in issues)
    missing = admin.post("/api/v1/policies/validate/", {}, format="json")
    assert missing.status_code == 400 and missing.json()["field"] == "yaml"
    same = admin.get("/api/v1/policies/diff/?a=1&b=active").json()
    assert same["changes"] == [] and same["diff"] == ""
    assert admin.get("/api/v1/policies/diff/?a=1&b=9").json()["field"] == "b"
    assert admin.get("/api/v1/policies/diff/?a=1").json()["field"] == "b"


def test_apply_needs_a_comment_refuses_invalid_text_and_activates(people, api) -> None:
    admin = api(people["admin"])
    text = _policy_text().replace("guaranteed: {devices: 4}", "guaranteed: {devices: 5}")
    no_comment = admin.post("/api/v1/policies/", {"yaml": text}, format="json")
    assert no_comment.status_code == 400 and no_comment.json()["field"] == "comment"
    blank = admin.post("/api/v1/policies/", {"yaml": text, "comment": "   "}, format="json")
    assert blank.status_code == 400 and blank.json()["field"] == "comment"
    invalid = admin.post("/api/v1/policies/", {"yaml": "spec: {teams: 3}", "comment": "x"}, format="json")
    assert invalid.status_code == 400
    assert invalid.json()["field"] == "yaml" and invalid.json()["details"]["issues"]
    assert Policy.objects.count() == 1
    created = admin.post("/api/v1/policies/", {"yaml": text, "comment": "research +1"}, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["version"] == 2 and body["active"] is True
    assert any("research" in c for c in body["changes"])
    diff = admin.post("/api/v1/policies/diff/", {"a": "1", "b_yaml": text}, format="json").json()
    assert diff["a"] == "v1" and diff["changes"] == body["changes"]
    rollback = admin.post("/api/v1/policies/1/activate/", {"comment": "rollback"}, format="json")
    assert rollback.status_code == 200 and rollback.json()["active"] is True
    assert Policy.objects.get(is_active=True).version == 1
    assert AuditEvent.objects.filter(action="policy.activate", target="policy v1").count() == 2
    assert admin.post("/api/v1/policies/77/activate/").status_code == 404


def test_dry_run_compares_and_stores_nothing(people, api) -> None:
    admin = api(people["admin"])
    text = _policy_text().replace("guaranteed: {devices: 4}", "guaranteed: {devices: 6}")
    resp = admin.post("/api/v1/policies/dry-run/", {"yaml": text, "days": 3}, format="json")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["changes"] and "teams" in body["comparison"] and body["jobs"] >= 0
    assert Policy.objects.count() == 1
    assert admin.post("/api/v1/policies/dry-run/", {"yaml": text, "days": 0}, format="json").json()["field"] == "days"


# -- tokens -------------------------------------------------------------------


def test_tokens_are_several_per_user_shown_once_and_revocable(people) -> None:
    client = APIClient()
    client.force_authenticate(people["member"])
    made = client.post("/api/v1/tokens/", {"name": "laptop"}, format="json")
    assert made.status_code == 201
    key = made.json()["key"]
    assert key.startswith("npu_") and ApiToken.objects.get().key_hash != key
    client.post("/api/v1/tokens/", {"name": "ci"}, format="json")
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert [t["name"] for t in listed] == ["ci", "laptop"] and all("key" not in t for t in listed)

    bearer = APIClient()
    bearer.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    assert bearer.get("/api/v1/jobs/").status_code == 200
    assert ApiToken.objects.get(name="laptop").last_used is not None

    stranger = APIClient()
    stranger.force_authenticate(people["other"])
    token_id = made.json()["id"]
    assert stranger.delete(f"/api/v1/tokens/{token_id}/").status_code == 404
    assert client.delete(f"/api/v1/tokens/{token_id}/").status_code == 204
    refused = bearer.get("/api/v1/jobs/")
    assert refused.status_code == 401 and refused.json()["error"] == "Invalid token."
    assert client.post("/api/v1/tokens/", {"name": ""}, format="json").json()["field"] == "name"


# -- jobs: resubmit and explain -------------------------------------------------------


def test_resubmit_copies_the_spec_for_the_team_only(people, api) -> None:
    created = api(people["member"]).post("/api/v1/jobs/", {**GOOD_JOB, "name": "again"}, format="json").json()
    copy = api(people["lead"]).post(f"/api/v1/jobs/{created['id']}/resubmit/")
    assert copy.status_code == 201
    body = copy.json()
    assert body["id"] != created["id"] and body["name"] == "again" and body["submitter"] == "lena"
    assert body["state"] == "pending" and body["estimated_duration_s"] == 60
    assert api(people["other"]).post(f"/api/v1/jobs/{created['id']}/resubmit/").status_code == 404
    assert Job.objects.filter(name="again").count() == 2


def test_explain_answers_501_or_a_breakdown(people, api) -> None:
    from scheduling.api.views import _explainer

    created = api(people["member"]).post("/api/v1/jobs/", GOOD_JOB, format="json").json()
    resp = api(people["member"]).get(f"/api/v1/jobs/{created['id']}/explain/")
    if _explainer() is None:
        assert resp.status_code == 501 and "explain" in resp.json()["error"]
    else:
        assert resp.status_code == 200, resp.content
    assert api(people["other"]).get(f"/api/v1/jobs/{created['id']}/explain/").status_code == 404


def test_explain_uses_the_engine_function_when_it_exists(people, api, monkeypatch) -> None:
    import scheduling.api.views as job_views

    seen = {}

    def fake(snapshot, job_id):
        seen["job"] = job_id
        seen["pending"] = [j.id for j in snapshot.pending]
        return {"job_id": job_id, "factors": {"age": 0.5, "nan": float("nan")}}

    monkeypatch.setattr(job_views, "_explainer", lambda: fake)
    created = api(people["member"]).post("/api/v1/jobs/", GOOD_JOB, format="json").json()
    resp = api(people["member"]).get(f"/api/v1/jobs/{created['id']}/explain/")
    assert resp.status_code == 200
    assert resp.json() == {"job_id": created["id"], "factors": {"age": 0.5, "nan": None}}
    assert created["id"] in seen["pending"]
    done = Job.objects.exclude(state__in=["pending", "running"]).filter(team__name="training").first()
    assert api(people["member"]).get(f"/api/v1/jobs/{done.pk}/explain/").json()["field"] == "state"


def test_jobs_filter_by_several_states(people, api) -> None:
    api(people["member"]).post("/api/v1/jobs/", GOOD_JOB, format="json")
    states = {
        j["state"] for j in api(people["admin"]).get("/api/v1/jobs/?state=pending&state=completed").json()["results"]
    }
    assert states == {"pending", "completed"}


# -- the one error shape ---------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/api/v1/jobs/?limit=abc", 200),
        ("/api/v1/jobs/?offset=-3&limit=-1", 200),
        ("/api/v1/jobs/?submitted_after=yesterday", 400),
        ("/api/v1/jobs/?state=sleeping", 400),
        ("/api/v1/jobs/abc/", 404),
        ("/api/v1/jobs/99999999999999999999999/", 404),
        ("/api/v1/nope/", 404),
        ("/api/v1/nodes/?reachable=maybe", 200),  # an unreadable boolean is ignored
        ("/api/v1/teams/training/usage/?month=x", 400),
    ],
)
def test_bad_query_input_never_500s_and_keeps_the_error_shape(people, api, path, status) -> None:
    resp = api(people["lead"]).get(path)
    assert resp.status_code == status, resp.content
    if status >= 400:
        body = resp.json()
        assert set(body) >= {"error", "field"} and body["error"]


def test_wrong_body_types_are_400(people, api) -> None:
    admin = api(people["admin"])
    for path, body in [
        ("/api/v1/policies/validate/", {"yaml": ["a list"]}),
        ("/api/v1/policies/dry-run/", {"yaml": "x", "days": "many"}),
        ("/api/v1/tokens/", ["not", "an", "object"]),
        ("/api/v1/jobs/", {"num_devices": {"a": 1}, "name": "x", "command": "y"}),
        ("/api/v1/nodes/ascend-a-01/cordon/", {"reason": {"deep": True}}),
    ]:
        resp = admin.post(path, body, format="json")
        assert resp.status_code == 400, (path, resp.content)
        assert resp.json()["error"]


def test_throttling_answers_429_in_the_error_shape(people, api, monkeypatch) -> None:
    from rest_framework.throttling import UserRateThrottle

    monkeypatch.setitem(UserRateThrottle.THROTTLE_RATES, "user", "3/min")
    client = api(people["member"])
    codes = [client.get("/api/v1/teams/").status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    assert "throttled" in client.get("/api/v1/teams/").json()["error"].lower()
