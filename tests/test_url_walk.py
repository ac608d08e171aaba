"""Every URL the portal has, as every kind of visitor, with and without a format suffix: never a 5xx.

The walk reads the URL patterns themselves (``get_resolver()``, recursively), fills each
path parameter with a value that names a real object of the demo site, and asks for it
plain, with ``.json`` and with ``.api`` — anonymous, as a team member and as an admin. A
route that refuses GET (405) is POSTed an empty body instead. A route added later is
walked without anybody listing it here.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from django.utils.regex_helper import normalize

from devices.models import Device, Node
from quotas.models import ApiToken, Policy, Team
from quotas.models.tenancy import TeamInvitation
from quotas.tenancy.members import token_hash
from scheduling.models import Job

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

SUFFIXES = ("json", "api")
#: A health probe's 503 is its answer ("the tick is stale"), not a failure: nothing else may answer 5xx.
PROBES = {"/healthz", "/healthz.json", "/healthz.api"}


def url_patterns(patterns: list, prefix: str = "") -> Iterator[tuple[str, URLPattern]]:
    """Every endpoint pattern with the regex of the whole path (its includes' prefixes joined)."""
    for pattern in patterns:
        regex = pattern.pattern.regex.pattern.removeprefix("^")
        if isinstance(pattern, URLResolver):
            yield from url_patterns(pattern.url_patterns, prefix + regex.removesuffix(r"\Z"))
        else:
            yield prefix + regex, pattern


def samples(path_regex: str, pattern: URLPattern, objects: dict[str, str]) -> dict[str, str]:
    """A value for each parameter, chosen by its name and the part of the site it is in."""
    values = dict(objects)
    if path_regex.startswith(("api/v1/devices",)):
        values["pk"] = objects["device"]
    elif path_regex.startswith("api/v1/tokens"):
        values["pk"] = objects["token"]
    if "nodes" in path_regex:
        values["name"] = objects["node"]
    model_admin = getattr(pattern.callback, "model_admin", None)
    if model_admin is not None:  # an admin page of one model: an object of that model
        first = model_admin.model._default_manager.order_by("pk").values_list("pk", flat=True).first()
        values["object_id"] = str(first or 1)
        values["id"] = str(first or 1)
    return values


def paths(objects: dict[str, str]) -> list[str]:
    found: set[str] = set()
    for regex, pattern in url_patterns(get_resolver().url_patterns):
        values = samples(regex, pattern, objects)
        for template, params in normalize("^" + regex):
            if "format" in params:
                for suffix in SUFFIXES:
                    found.add("/" + template % {**values, "format": suffix})
                continue
            path = "/" + template % values
            found.add(path)
            for suffix in SUFFIXES:
                found.add(f"{path.rstrip('/')}.{suffix}" if path != "/" else f"/.{suffix}")
    return sorted(found)


@pytest.fixture
def site(demo, user_factory, isolated_api_state) -> dict[str, object]:
    job = Job.objects.order_by("pk").first()
    team = job.team
    member = user_factory("walker", team=team.name)
    # The member the walk's DELETE removes (/api/v1/teams/<name>/members/<username>/): not the walker.
    user_factory("walked", team=team.name)
    admin = get_user_model().objects.create_superuser("walker-admin", password="pw", email="a@example.com")
    token = ApiToken.objects.create(user=member, name="walk", key_hash="0" * 64, prefix="npu_walk")
    # An open invitation, so /invite/<secret>/ is walked as a page that answers, not only as a 410.
    TeamInvitation.objects.create(team=team, email="walk@example.org", token_hash=token_hash("walk-secret"))
    objects = {
        "pk": str(job.pk),
        "name": team.name,
        "team": team.name,
        "month": "2025-03",
        "version": str(Policy.objects.order_by("version").values_list("version", flat=True).first()),
        "action": "cordon",
        "node": Node.objects.order_by("name").values_list("name", flat=True).first(),
        "device": str(Device.objects.order_by("pk").values_list("pk", flat=True).first()),
        "token": str(token.pk),
        "content_type_id": str(ContentType.objects.get_for_model(Job).pk),
        "object_id": str(job.pk),
        "id": str(admin.pk),
        "app_label": "devices",
        "url": "nowhere/",
        "secret": "walk-secret",
        "username": "walked",
    }
    assert Team.objects.filter(name=team.name).exists()
    return {"objects": objects, "member": member, "admin": admin}


def test_no_url_answers_5xx_to_anyone(site) -> None:
    walked = paths(site["objects"])
    assert "/api/v1/jobs/{}/log.json".format(site["objects"]["pk"]) in walked
    assert len(walked) > 300
    failures: list[str] = []
    for role in ("anonymous", "member", "admin"):
        client = Client(raise_request_exception=False)
        user = site.get(role)
        for path in walked:
            if user is not None:
                client.force_login(user)  # again each time: /logout/ signs out
            response = client.get(path)
            method = "GET"
            if response.status_code == 405:
                method = "POST"
                response = client.post(path, data=b"", content_type="application/json")
            if response.status_code >= 500 and not (path in PROBES and response.status_code == 503):
                failures.append(f"{role} {method} {path} -> {response.status_code}: {response.content[:160]!r}")
    assert not failures, "\n".join(failures)


def test_every_api_method_with_a_format_suffix_is_answered(site) -> None:
    """Beyond GET: create, change and delete through ``.json`` paths (empty bodies: 400s, not 500s)."""
    admin = Client(raise_request_exception=False)
    admin.force_login(site["admin"])
    api = [p for p in paths(site["objects"]) if p.startswith("/api/v1/") and p.endswith((".json", ".api"))]
    failures: list[str] = []
    later: list[tuple[str, str]] = []
    for path in api:
        allowed = admin.options(path).get("Allow", "")
        for method in ("POST", "PUT", "PATCH", "DELETE"):
            if method in allowed:
                later.append((method, path))
    assert ("POST", "/api/v1/jobs.json") in later
    assert ("PATCH", f"/api/v1/teams/{site['objects']['team']}.json") in later
    for method, path in sorted(later, key=lambda m: m[0] == "DELETE"):  # deletions last
        response = admin.generic(method, path, b"", content_type="application/json")
        if response.status_code >= 500:
            failures.append(f"{method} {path} -> {response.status_code}: {response.content[:160]!r}")
    assert not failures, "\n".join(failures)
    member = Client(raise_request_exception=False)
    member.force_login(site["member"])
    job = {"name": "suffixed", "command": "true", "num_devices": 1}
    created = member.post("/api/v1/jobs.json", job, content_type="application/json")
    assert created.status_code == 201, created.content
    assert created.json()["name"] == "suffixed"
    log = admin.get(f"/api/v1/jobs/{created.json()['id']}/log.json")
    assert log.status_code == 200 and log["Content-Type"].startswith("application/json")
    assert admin.get(f"/api/v1/jobs/{created.json()['id']}/log.api")["Content-Type"].startswith("text/html")
    assert admin.get("/api/v1/jobs/1/log.xml").status_code == 404
