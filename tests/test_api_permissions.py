"""Permission matrix of every API endpoint (NetBox style), and pinned query counts of the list endpoints.

Roles: anonymous, a member of team A (training), the lead of team A, a member of
team B (research), an admin. Another team's objects are 404 (ids cannot be
probed); an action your role may not take is 403; no sign-in is 401.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from devices.models import Device, Node
from quotas.access.tokens import issue_token
from quotas.models import Policy, Team
from scheduling.models import Job

pytestmark = pytest.mark.django_db

ROLES = ("anon", "member_a", "lead_a", "member_b", "admin")

JOB = {"name": "perm", "command": "sleep 1", "team": "training", "num_devices": 1, "estimated_duration_s": 60}

#: (method, path, body, expected status per role in ROLES order)
MATRIX = [
    ("get", "/api/v1/", None, (401, 200, 200, 200, 200)),
    ("get", "/api/v1/jobs/", None, (401, 200, 200, 200, 200)),
    ("post", "/api/v1/jobs/", JOB, (401, 201, 201, 400, 201)),
    ("get", "/api/v1/jobs/{job}/", None, (401, 200, 200, 404, 200)),
    ("post", "/api/v1/jobs/{job}/cancel/", None, (401, 200, 200, 404, 200)),
    ("post", "/api/v1/jobs/{job}/resubmit/", None, (401, 201, 201, 404, 201)),
    ("get", "/api/v1/jobs/{job}/explain/", None, (401, 200, 200, 404, 200)),
    ("get", "/api/v1/teams/", None, (401, 200, 200, 200, 200)),
    ("get", "/api/v1/teams/training/", None, (401, 200, 200, 404, 200)),
    ("get", "/api/v1/teams/training/usage/", None, (401, 403, 200, 404, 200)),
    ("get", "/api/v1/teams/training/members/", None, (401, 403, 200, 404, 200)),
    ("get", "/api/v1/teams/no-such-team/", None, (401, 404, 404, 404, 404)),
    ("patch", "/api/v1/teams/training/", {"shares": 55, "comment": "perm"}, (401, 403, 403, 404, 200)),
    ("patch", "/api/v1/teams/research/", {"shares": 25, "comment": "perm"}, (401, 404, 404, 403, 200)),
    ("put", "/api/v1/teams/training/", {"shares": 55, "comment": "perm"}, (401, 405, 405, 405, 405)),
    ("get", "/api/v1/nodes/", None, (401, 200, 200, 200, 200)),
    ("get", "/api/v1/nodes/ascend-a-01/", None, (401, 200, 200, 200, 200)),
    ("post", "/api/v1/nodes/ascend-a-01/cordon/", {"reason": "t"}, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/nodes/ascend-a-01/drain/", None, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/nodes/ascend-a-01/uncordon/", None, (401, 403, 403, 403, 200)),
    ("get", "/api/v1/devices/", None, (401, 200, 200, 200, 200)),
    ("get", "/api/v1/devices/{device}/", None, (401, 200, 200, 200, 200)),
    ("get", "/api/v1/policies/", None, (401, 403, 403, 403, 200)),
    ("get", "/api/v1/policies/1/", None, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/policies/", {"yaml": "{policy}", "comment": "perm"}, (401, 403, 403, 403, 201)),
    ("post", "/api/v1/policies/1/activate/", None, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/policies/validate/", {"yaml": "{policy}"}, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/policies/dry-run/", {"yaml": "{policy}", "days": 1}, (401, 403, 403, 403, 200)),
    ("get", "/api/v1/policies/diff/?a=1&b=active", None, (401, 403, 403, 403, 200)),
    ("post", "/api/v1/policies/diff/", {"a": "1", "b_yaml": "{policy}"}, (401, 403, 403, 403, 200)),
    ("get", "/api/v1/tokens/", None, (401, 200, 200, 200, 200)),
    ("post", "/api/v1/tokens/", {"name": "perm"}, (401, 201, 201, 201, 201)),
    ("delete", "/api/v1/tokens/{lead_token}/", None, (401, 404, 204, 404, 404)),
]


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Every test of this module with its own throttle counters and policy cache (see conftest)."""


@pytest.fixture
def world(demo, user_factory):
    users = {
        "member_a": user_factory("ann", team="training"),
        "lead_a": user_factory("leo", team="training", role="lead"),
        "member_b": user_factory("bob", team="research"),
        "admin": user_factory("ada", staff=True),
    }
    job = Job.objects.create(
        team=Team.objects.get(name="training"),
        submitter=users["member_a"],
        name="a-job",
        command="sleep 1",
        priority_class="normal",
        estimated_duration_s=60,
        submitted_at=timezone.now(),
    )
    token, _ = issue_token(users["lead_a"], "leo's laptop")
    ids = {
        "job": job.pk,
        "device": Device.objects.first().pk,
        "lead_token": token.pk,
        "policy": Policy.objects.get(is_active=True).yaml_text,
    }
    return users, ids


def _client(role: str, users: dict[str, object], api) -> APIClient:
    return APIClient() if role == "anon" else api(users[role])


def _fill(value: object, ids: dict[str, object]) -> object:
    if isinstance(value, str):
        for key, replacement in ids.items():
            value = value.replace("{" + key + "}", str(replacement))
        return value
    if isinstance(value, dict):
        return {k: _fill(v, ids) for k, v in value.items()}
    return value


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize(
    ("method", "path", "body", "expected"), MATRIX, ids=[f"{m.upper()} {p}" for m, p, _, _ in MATRIX]
)
def test_permission_matrix(world, api, role, method, path, body, expected) -> None:
    users, ids = world
    want = expected[ROLES.index(role)]
    client = _client(role, users, api)
    kwargs = {"format": "json"} if body is not None else {}
    resp = (
        getattr(client, method)(_fill(path, ids), _fill(body, ids), **kwargs)
        if body is not None
        else getattr(client, method)(_fill(path, ids))
    )
    assert resp.status_code == want, resp.content[:300]
    if want >= 400:
        assert resp.json()["error"], resp.content


def test_refused_actions_change_nothing(world, api) -> None:
    users, ids = world
    before = (Job.objects.count(), Policy.objects.count(), Node.objects.filter(state="ready").count())
    for role in ("member_a", "lead_a", "member_b"):
        client = api(users[role])
        client.post("/api/v1/nodes/ascend-a-01/cordon/")
        client.post("/api/v1/policies/", {"yaml": ids["policy"], "comment": "sneaky"}, format="json")
        client.patch("/api/v1/teams/training/", {"shares": 99, "comment": "sneaky"}, format="json")
        client.patch("/api/v1/teams/research/", {"shares": 99, "comment": "sneaky"}, format="json")
    api(users["member_b"]).post(f"/api/v1/jobs/{ids['job']}/cancel/")
    api(users["member_b"]).post(f"/api/v1/jobs/{ids['job']}/resubmit/")
    api(users["member_b"]).post("/api/v1/jobs/", JOB, format="json")
    assert (Job.objects.count(), Policy.objects.count(), Node.objects.filter(state="ready").count()) == before
    assert Job.objects.get(pk=ids["job"]).state == "pending"


def test_no_path_leaks_another_teams_jobs_or_people(world, api) -> None:
    users, _ = world
    client = api(users["member_b"])
    assert client.get("/api/v1/jobs/?team=training").json()["results"] == []
    assert client.get("/api/v1/jobs/?user=ann").json()["results"] == []
    everything = b"".join(
        client.get(path).content
        for path in ("/api/v1/nodes/", "/api/v1/nodes/ascend-a-01/", "/api/v1/devices/?limit=100", "/api/v1/teams/")
    )
    assert b"a-job" not in everything and b"ann" not in everything and b"leo" not in everything


# -- query counts -----------------------------------------------------------------


def _more_rows(users: dict[str, object], n: int) -> None:
    """``n`` more jobs, nodes with devices, teams, policies and tokens."""
    from quotas.models import Membership

    training = Team.objects.get(name="training")
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            team=training,
            submitter=users["member_a"],
            name=f"bulk-{i}",
            command="x",
            priority_class="normal",
            submitted_at=now - timedelta(minutes=i),
        )
        for i in range(n)
    )
    for i in range(n):
        node = Node.objects.create(name=f"extra-{len(Node.objects.all())}-{i}")
        Device.objects.bulk_create(Device(node=node, index=d, chip_model="910B4") for d in range(4))
        team = Team.objects.create(name=f"team-{node.pk}")
        Membership.objects.create(user=users["member_a"], team=team)
        issue_token(users["member_a"], f"t{i}")
    text = Policy.objects.get(is_active=True).yaml_text
    latest = Policy.objects.order_by("-version").first().version
    Policy.objects.bulk_create(Policy(version=latest + 1 + i, yaml_text=text, comment="bulk") for i in range(n))


LISTS = [
    ("/api/v1/jobs/", 4),
    ("/api/v1/teams/", 4),
    ("/api/v1/nodes/", 5),
    ("/api/v1/devices/", 4),
    ("/api/v1/policies/", 4),
    ("/api/v1/tokens/", 4),
]


@pytest.mark.parametrize(("path", "limit"), LISTS)
def test_list_endpoints_do_not_grow_queries_with_rows(world, api, django_assert_max_num_queries, path, limit) -> None:
    users, _ = world
    user = users["admin"] if path.startswith("/api/v1/policies") else users["member_a"]
    client = api(user)
    client.get(path)  # warm the token's last_used and caches
    with django_assert_max_num_queries(limit):
        small = client.get(path + "?limit=100")
    _more_rows(users, 8)
    with django_assert_max_num_queries(limit):
        big = client.get(path + "?limit=100")
    assert small.status_code == big.status_code == 200
    assert len(big.json()["results"]) > len(small.json()["results"])


@pytest.mark.parametrize(
    ("path", "limit"),
    [("/api/v1/teams/training/", 12), ("/api/v1/nodes/ascend-a-01/", 5), ("/api/v1/jobs/{job}/", 6)],
)
def test_detail_endpoints_have_a_bounded_number_of_queries(world, api, django_assert_max_num_queries, path, limit):
    users, ids = world
    client = api(users["lead_a"])
    _more_rows(users, 5)
    with django_assert_max_num_queries(limit):
        assert client.get(_fill(path, ids)).status_code == 200
