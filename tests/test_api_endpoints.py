"""What each new endpoint answers: teams, nodes, devices, policies, tokens, resubmit, explain, errors."""

from __future__ import annotations

import re

import pytest
from rest_framework.test import APIClient

from devices.models import Node
from quotas.models import ApiToken, AuditEvent, Policy
from scheduling.models import Allocation, Job

pytestmark = pytest.mark.django_db

GOOD_JOB = {"name": "ok", "command": "sleep 1", "num_devices": 1, "estimated_duration_s": 60}


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Every test of this module with its own throttle counters and policy cache (see conftest)."""


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
    # Nothing runs there, so the drain is over at once.
    assert admin.post("/api/v1/nodes/ascend-a-01/drain/").json()["state"] == "drained"
    assert admin.post("/api/v1/nodes/ascend-a-01/uncordon/").json()["state"] == "ready"
    events = list(
        AuditEvent.objects.filter(target="ascend-a-01").order_by("id").values_list("action", "actor__username")
    )
    assert events == [
        ("node.cordon", "root"),
        ("node.drain", "root"),
        ("node.drained", None),
        ("node.uncordon", "root"),
    ]
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


def test_explain_answers_the_breakdown_for_the_team_only(people, api) -> None:
    created = api(people["member"]).post("/api/v1/jobs/", GOOD_JOB, format="json").json()
    resp = api(people["member"]).get(f"/api/v1/jobs/{created['id']}/explain/")
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["job_id"] == created["id"] and body["team"] == "training" and body["state"] == "pending"
    assert set(body["factors"]) >= {"age", "fair_share"} and body["decision"] in {"start", "wait"}
    assert api(people["other"]).get(f"/api/v1/jobs/{created['id']}/explain/").status_code == 404
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
        ("/api/v1/jobs/?limit=abc", 400),
        ("/api/v1/jobs/?offset=-3&limit=-1", 400),
        ("/api/v1/jobs/?submitted_after=yesterday", 400),
        ("/api/v1/jobs/?submitted_before=0129-09-08T15:38:58.658270-21:04", 200),  # an offset PostgreSQL refuses
        ("/api/v1/jobs/?submitted_before=0001-01-01T00:00:00%2B23:59", 400),  # before year 1 in UTC
        ("/api/v1/jobs/?state=sleeping", 400),
        ("/api/v1/jobs/abc/", 404),
        ("/api/v1/jobs/99999999999999999999999/", 404),
        ("/api/v1/nope/", 404),
        ("/api/v1/nodes/?reachable=maybe", 400),  # an unreadable boolean is refused, not ignored
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


# -- job lists at scale: keyset pages, no COUNT, constant queries -------------------------


def _history(people, n: int, *, team: str = "training", start: int = 0) -> list[int]:
    """``n`` jobs of ``team``, in groups of five sharing one submit time (as an array's copies do)."""
    from datetime import timedelta

    from django.utils import timezone

    from quotas.models import Team

    base = timezone.now() - timedelta(days=1)
    jobs = Job.objects.bulk_create(
        Job(
            team=Team.objects.get(name=team),
            submitter=people["lead"],
            name=f"hist-{start + i}",
            command="x",
            priority_class="normal",
            state=("completed", "pending", "failed")[i % 3],
            submitted_at=base + timedelta(seconds=(start + i) // 5),
        )
        for i in range(n)
    )
    return [job.pk for job in jobs]


def _newest_first(**filters) -> list[int]:
    return list(Job.objects.filter(**filters).order_by("-submitted_at", "-id").values_list("id", flat=True))


def _counts_jobs(queries: list[dict]) -> list[str]:
    return [q["sql"] for q in queries if "COUNT(" in q["sql"].upper() and "scheduling_job" in q["sql"]]


def test_job_list_pages_by_cursor_visit_every_job_once_in_order(people, api) -> None:
    _history(people, 43)
    client = api(people["admin"])
    page = client.get("/api/v1/jobs/?limit=7").json()
    assert set(page) == {"next", "previous", "results"} and page["previous"] is None
    seen, pages = [j["id"] for j in page["results"]], [page]
    while page["next"]:
        assert "offset=" not in page["next"] and "cursor=" in page["next"] and "limit=7" in page["next"]
        page = client.get(page["next"]).json()
        seen += [j["id"] for j in page["results"]]
        pages.append(page)
    assert seen == _newest_first()
    assert all(len(p["results"]) == 7 for p in pages[:-1])
    # ... and back again through `previous`, page by page.
    back = []
    for earlier, later in zip(reversed(pages[:-1]), reversed(pages[1:]), strict=True):
        assert later["previous"]
        back_page = client.get(later["previous"]).json()
        assert [j["id"] for j in back_page["results"]] == [j["id"] for j in earlier["results"]]
        back.append(back_page)
    assert back[-1]["previous"] is None


def test_job_list_filters_and_member_views_page_the_same_way(people, api) -> None:
    _history(people, 20)
    _history(people, 9, team="research", start=100)
    member = api(people["member"])
    for path, expected in [
        ("/api/v1/jobs/?limit=4&state=pending", _newest_first(team__name="training", state="pending")),
        (
            "/api/v1/jobs/?limit=3&team=training&state=completed",
            _newest_first(team__name="training", state="completed"),
        ),
        ("/api/v1/jobs/?limit=5", _newest_first(team__name="training")),
        ("/api/v1/jobs/?limit=5&user=lena", _newest_first(team__name="training", submitter__username="lena")),
    ]:
        page, seen = member.get(path).json(), []
        while True:
            seen += [j["id"] for j in page["results"]]
            if not page["next"]:
                break
            page = member.get(page["next"]).json()
        assert seen == expected, path
    assert member.get("/api/v1/jobs/?team=research").json()["results"] == []


def test_job_list_limit_offset_and_bad_cursors(people, api) -> None:
    _history(people, 12)
    client = api(people["admin"])
    everything = _newest_first()
    assert [j["id"] for j in client.get("/api/v1/jobs/?offset=4&limit=3").json()["results"]] == everything[4:7]
    after_offset = client.get("/api/v1/jobs/?offset=4&limit=3").json()
    assert [j["id"] for j in client.get(after_offset["next"]).json()["results"]] == everything[7:10]
    assert [j["id"] for j in client.get(after_offset["previous"]).json()["results"]] == everything[1:4]
    assert client.get("/api/v1/jobs/?limit=abc").json()["field"] == "limit"
    assert client.get("/api/v1/jobs/?limit=0").json()["field"] == "limit"
    assert client.get("/api/v1/jobs/?offset=" + "9" * 30).json()["field"] == "offset"
    past_the_end = client.get("/api/v1/jobs/?offset=" + "9" * 18).json()
    assert past_the_end == {"next": None, "previous": "http://testserver/api/v1/jobs/", "results": []}
    for cursor in (
        "abc",
        "e30",
        "eyJwIjpbIngiLDFdLCJyIjowfQ",
        "eyJwIjpbIjIwMjYtMDEtMDFUMDA6MDA6MDArMDA6MDAiLDk5OTk5OTk5OTk5OTk5OTk5OTk5OTldLCJyIjowfQ",
    ):
        resp = client.get(f"/api/v1/jobs/?cursor={cursor}")
        assert resp.status_code == 400, cursor
        assert resp.json()["field"] == "cursor" and resp.json()["error"].startswith("cursor:")


@pytest.mark.parametrize("role", ["admin", "member"])
def test_job_list_is_one_constant_query_and_never_counts_the_table(people, api, role) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = api(people[role])
    client.get("/api/v1/jobs/")  # the token's last_used, caches
    sizes = []
    for extra in (3, 60):
        _history(people, extra, start=len(sizes) * 1000)
        for path in ("/api/v1/jobs/", "/api/v1/jobs/?state=pending&team=training", "/api/v1/jobs/?limit=5"):
            with CaptureQueriesContext(connection) as ctx:
                page = client.get(path).json()
            assert not _counts_jobs(ctx.captured_queries), path
            sizes.append(len(ctx.captured_queries))
            if page["next"]:
                with CaptureQueriesContext(connection) as ctx:
                    client.get(page["next"])
                assert not _counts_jobs(ctx.captured_queries)
                sizes.append(len(ctx.captured_queries))
    # Auth, (a member's team ids), the page: the same whatever the size of the table or the depth.
    assert set(sizes) == {2 if role == "admin" else 3}, sizes


def test_console_job_list_pages_without_counting(people, monkeypatch) -> None:
    import re

    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    from scheduling.services import console

    monkeypatch.setattr(console, "JOB_LIST_PAGE", 6)
    _history(people, 25)
    client = Client()
    client.force_login(people["member"])
    html = client.get("/jobs/").content.decode()
    seen, sizes = [], []
    while True:
        seen += [int(i) for i in re.findall(r'href="/jobs/(\d+)/"', html)]
        older = re.search(r'href="\?(?:state=[^"&]*&amp;)?cursor=([^"]+)">Older', html)
        if not older:
            break
        with CaptureQueriesContext(connection) as ctx:
            html = client.get(f"/jobs/?cursor={older.group(1)}").content.decode()
        assert not _counts_jobs(ctx.captured_queries)
        sizes.append(len(ctx.captured_queries))
    assert seen == _newest_first(team__name="training")
    assert len(set(sizes)) == 1, sizes
    pending = client.get("/jobs/?state=pending").content.decode()
    assert [int(i) for i in re.findall(r'href="/jobs/(\d+)/"', pending)] == _newest_first(
        team__name="training", state="pending"
    )[:6]
    assert client.get("/jobs/?cursor=garbage").status_code == 200  # a stale link starts again at the newest


# -- submissions: the same answers, fewer queries ------------------------------------------


def test_job_representation_matches_drf_field_by_field(people, api) -> None:
    from datetime import timedelta

    from django.utils import timezone
    from rest_framework import serializers

    from devices.models import VnpuTemplate
    from scheduling.api.serializers import (
        JobSerializer,
        JobSummarySerializer,
        job_representation,
        job_summary_representation,
    )

    now = timezone.now()
    running = Job.objects.create(
        team=people["lead"].memberships.get().team, submitter=people["lead"], name="r", command="c",
        priority_class="high", vnpu_template=VnpuTemplate.objects.first(), chip_model="310P3", state="running",
        submitted_at=now - timedelta(hours=1), started_at=now, max_duration_s=7200,
        estimated_start=now, preempt_deadline=now + timedelta(seconds=30), array_id="A1", array_index=3,
    )  # fmt: skip
    done = Job.objects.create(
        team=running.team, submitter=people["member"], name="d", command="c", priority_class="low",
        state="failed", submitted_at=now, started_at=now, ended_at=now, exit_code=137, retries=2,
    )  # fmt: skip
    waiting = Job.objects.create(
        team=running.team, submitter=people["member"], name="w", command="c", priority_class="normal",
        submitted_at=now, pending_reason="Resources", pending_detail="needs 8 cards",
    )  # fmt: skip
    for tz in ("UTC", "Asia/Shanghai"):
        with timezone.override(tz):
            for job in Job.objects.filter(pk__in=[running.pk, done.pk, waiting.pk]).select_related(
                "team", "submitter", "vnpu_template"
            ):
                drf = serializers.ModelSerializer.to_representation(JobSerializer(), job)
                assert job_representation(job) == dict(drf)
                assert list(job_representation(job)) == JobSerializer.Meta.fields
                summary = serializers.ModelSerializer.to_representation(JobSummarySerializer(), job)
                assert job_summary_representation(job) == dict(summary)
                assert list(job_summary_representation(job)) == JobSummarySerializer.Meta.fields


def test_submission_answers_and_stores_the_same_through_both_write_paths(people, api, monkeypatch) -> None:
    """The one-statement insert (PostgreSQL) and the ORM transaction store the same job, event and array."""
    from django.forms.models import model_to_dict

    from scheduling.models import JobEvent
    from scheduling.services import job_insert

    def submit(body: dict) -> list[dict]:
        resp = api(people["member"]).post("/api/v1/jobs/", {**GOOD_JOB, "team": "training", **body}, format="json")
        assert resp.status_code == 201, resp.content
        answer = resp.json()
        return answer if isinstance(answer, list) else [answer]

    def stored(answer: list[dict]) -> list[tuple]:
        rows = []
        for item in answer:
            job = Job.objects.get(pk=item["id"])
            events = [{k: v for k, v in model_to_dict(e).items() if k not in ("id", "job")} for e in job.events.all()]
            fields = {k: v for k, v in model_to_dict(job).items() if k not in ("id", "submitted_at")}
            fields["array_id"] = "A" if fields["array_id"] else ""
            assert all(e["at"] == job.submitted_at for e in events)
            assert all(e["recorded_at"] is not None for e in events)  # when written: differs from run to run
            rows.append((fields, [{k: v for k, v in e.items() if k not in ("at", "recorded_at")} for e in events]))
        return rows

    def scrub(answer: list[dict]) -> list[dict]:
        return [{**j, "id": 0, "submitted_at": "", "array_id": "A" if j["array_id"] else ""} for j in answer]

    results = {}
    for name, available in (("fast", job_insert.available()), ("orm", False)):
        monkeypatch.setattr(job_insert, "available", lambda available=available: available)
        single = submit({"name": " lone ", "max_duration_s": 7200})
        array = submit({"name": "sweep", "array": 3, "vnpu_template": "vir02"})
        one = submit({"name": "solo", "array": 1})
        # Slurm's index list and at-most-running; a dependency, stored resolved (the array by its id).
        ranged = submit({"name": "ranged", "array": "1,3,5-9:2%2", "depends_on": f"afterok:{array[0]['id']}"})
        assert [j["name"] for j in array] == ["sweep[0]", "sweep[1]", "sweep[2]"]
        assert {j["array_id"] for j in array} == {f"A{array[0]['id']}"} and one[0]["array_id"] == f"A{one[0]['id']}"
        assert JobEvent.objects.filter(job_id__in=[j["id"] for j in array]).count() == 3
        assert [(j["name"], j["array_index"], j["array_limit"]) for j in ranged] == [
            (f"ranged[{i}]", i, 2) for i in (1, 3, 5, 7, 9)
        ]
        assert {j["depends_on"] for j in ranged} == {f"afterok:{array[0]['array_id']}"}
        assert ranged[0]["array_id"] == f"A{ranged[0]['id']}" and [j["id"] for j in ranged] == sorted(
            j["id"] for j in ranged
        )
        results[name] = [(scrub(a), stored(a)) for a in (single, array, one)]
        results[name].append(
            (
                [j | {"depends_on": "-"} for j in scrub(ranged)],
                [(f | {"depends_on": "-"}, e) for f, e in stored(ranged)],
            )
        )
    assert results["fast"] == results["orm"]


def test_a_submission_is_a_fixed_handful_of_queries(people, api) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = api(people["member"])
    client.post("/api/v1/jobs/", {**GOOD_JOB, "team": "training"}, format="json")  # token last_used, caches
    counts = {}
    for body in ({}, {"array": 2}, {"array": 40}):
        with CaptureQueriesContext(connection) as ctx:
            resp = client.post("/api/v1/jobs/", {**GOOD_JOB, "team": "training", **body}, format="json")
        assert resp.status_code == 201
        counts[body.get("array", 1)] = len(ctx.captured_queries)
    # token; team through the memberships; active policy; the inventory for "can it ever run" (devices
    # by node, vNPU templates); the insert (one statement on PostgreSQL; BEGIN, INSERT, INSERT, COMMIT
    # elsewhere, and a few more for an array). A named chip model adds one count (is there such a chip?).
    if connection.vendor == "postgresql":
        assert counts == {1: 6, 2: 6, 40: 6}
    else:
        # SQLite's bulk insert takes at most 999 parameters a statement: 39 copies of a job's
        # 31 columns are two statements, not one per copy.
        assert counts[1] <= 9 and counts[2] <= counts[40] <= counts[2] + 1 <= 12, counts


def test_array_names_keep_their_length_limit(people, api) -> None:
    resp = api(people["member"]).post(
        "/api/v1/jobs/", {**GOOD_JOB, "team": "training", "name": "x" * 197, "array": 12}, format="json"
    )
    assert resp.status_code == 400
    assert resp.json() == {
        "error": "name: must be at most 200 characters",
        "field": "name",
        "details": {"name": ["must be at most 200 characters"]},
    }
    assert not Job.objects.filter(name__startswith="x" * 197).exists()


def test_throttle_rates_come_from_the_environment(monkeypatch) -> None:
    from npuportal.settings import _throttle_rate

    monkeypatch.setenv("NPUPORTAL_THROTTLE_USER", "5000/s")
    assert _throttle_rate("NPUPORTAL_THROTTLE_USER", "600/min") == "5000/s"
    monkeypatch.delenv("NPUPORTAL_THROTTLE_USER")
    assert _throttle_rate("NPUPORTAL_THROTTLE_USER", "600/min") == "600/min"
    monkeypatch.setenv("NPUPORTAL_THROTTLE_USER", "lots")
    with pytest.raises(ValueError, match="NPUPORTAL_THROTTLE_USER"):
        _throttle_rate("NPUPORTAL_THROTTLE_USER", "600/min")


def test_numeric_settings_from_the_environment_name_the_variable_when_wrong(monkeypatch) -> None:
    from npuportal.settings import _env_number

    monkeypatch.delenv("NPUPORTAL_ESTIMATE_MAX_JOBS", raising=False)
    assert _env_number("NPUPORTAL_ESTIMATE_MAX_JOBS", 2000, whole=True) == 2000
    monkeypatch.setenv("NPUPORTAL_ESTIMATE_MAX_JOBS", " 500 ")
    assert _env_number("NPUPORTAL_ESTIMATE_MAX_JOBS", 2000, whole=True) == 500
    for bad, why in (
        ("lots", "expected a whole number"),
        ("2.5", "expected a whole number"),
        ("-1", "expected a number of at least 0"),
    ):
        monkeypatch.setenv("NPUPORTAL_ESTIMATE_MAX_JOBS", bad)
        with pytest.raises(ValueError, match=rf"NPUPORTAL_ESTIMATE_MAX_JOBS='{re.escape(bad)}': {why}$"):
            _env_number("NPUPORTAL_ESTIMATE_MAX_JOBS", 2000, whole=True)
    monkeypatch.setenv("NPUPORTAL_TICK_INTERVAL", "0")
    with pytest.raises(ValueError, match=re.escape("NPUPORTAL_TICK_INTERVAL='0': expected a number of at least 0.1")):
        _env_number("NPUPORTAL_TICK_INTERVAL", 3, minimum=0.1)
    monkeypatch.setenv("NPUPORTAL_TICK_INTERVAL", "nan")
    with pytest.raises(ValueError, match="NPUPORTAL_TICK_INTERVAL"):
        _env_number("NPUPORTAL_TICK_INTERVAL", 3, minimum=0.1)
