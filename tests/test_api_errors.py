"""No 500s and one error shape: every answer under /api/ that is an error is the API's JSON error body.

Each case here was a 500 or an HTML page before: an out-of-range ``limit``
(a ``DataError``), a deeply nested body (a ``RecursionError``), a path the URL
patterns reject, a failed CSRF check, a body too large, an unknown ``format``.
"""

from __future__ import annotations

import json

import pytest
from django.core.exceptions import RequestDataTooBig
from django.test import Client, RequestFactory
from rest_framework.test import APIClient

from npuportal.api import error_handling

HUGE = "9223372036854775808"  # 2**63: one past PostgreSQL's bigint


@pytest.fixture
def admin(demo, user_factory, api, isolated_api_state) -> APIClient:
    return api(user_factory("errors-admin", staff=True))


def assert_error(resp, status: int, field: str | None = None) -> dict:
    """The response is ``status`` with the error shape; ``field`` is the one it names."""
    assert resp.status_code == status, resp.content
    assert resp["Content-Type"].startswith("application/json"), resp["Content-Type"]
    body = json.loads(resp.content)
    assert isinstance(body["error"], str) and body["error"]
    assert body["field"] == field, body
    return body


@pytest.mark.parametrize("endpoint", ["teams", "devices", "nodes", "policies", "tokens", "jobs"])
@pytest.mark.parametrize(
    ("query", "field"),
    [
        (f"limit={HUGE}", "limit"),
        (f"offset={HUGE}", "offset"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=abc", "limit"),
        ("offset=-1", "offset"),
        ("limit=", "limit"),
    ],
)
def test_limit_and_offset_out_of_range_are_400_naming_them(admin, endpoint, query, field) -> None:
    body = assert_error(admin.get(f"/api/v1/{endpoint}/?{query}"), 400, field)
    assert body["error"].startswith(f"{field}: ")


@pytest.mark.parametrize("endpoint", ["teams", "devices", "nodes", "policies", "tokens"])
def test_limit_and_offset_in_range_still_page(admin, endpoint) -> None:
    resp = admin.get(f"/api/v1/{endpoint}/?limit=1000&offset=0")
    assert resp.status_code == 200
    assert "results" in resp.json()
    assert admin.get(f"/api/v1/{endpoint}/?limit=1&offset=4611686018427387904").json()["results"] == []


def test_a_body_nested_100000_deep_is_400_naming_body(admin) -> None:
    deep = "[" * 100_000 + "]" * 100_000
    for path in ("/api/v1/tokens/", "/api/v1/policies/validate/", "/api/v1/jobs/"):
        body = assert_error(admin.post(path, deep, content_type="application/json"), 400, "body")
        assert "nested deeper than 64" in body["error"]
    # brackets inside strings are text, not nesting
    resp = admin.post("/api/v1/tokens/", {"name": "[" * 200}, format="json")
    assert_error(resp, 400, "name")  # too long a name, read as a string


def test_bad_json_and_wrong_media_type(admin) -> None:
    assert_error(admin.post("/api/v1/tokens/", "{", content_type="application/json"), 400, "body")
    assert_error(admin.post("/api/v1/tokens/", b"\xff\xfe", content_type="application/json"), 400, "body")
    assert_error(admin.post("/api/v1/tokens/", "name=x", content_type="application/x-www-form-urlencoded"), 415)


def test_a_body_over_the_size_limit_is_413(admin, settings) -> None:
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    resp = admin.post("/api/v1/tokens/", {"name": "x" * 2000}, format="json")
    body = assert_error(resp, 413, "body")
    assert "at most 1,000 bytes" in body["error"]


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/jobs/abc/",
        "/api/v1/jobs/%0A/",
        "/api/v1/jobs/1%0A/",
        "/api/v1/nodes/a%0Ab/",
        "/api/v1/jobs/99999999999999999999999/",
        "/api/v1/nope/",
        "/api/v1/nope",
        "/api/v1/jobs/1.xml",
        "/api/nothing/",
    ],
)
def test_paths_the_patterns_reject_are_404_json(admin, path) -> None:
    body = assert_error(admin.get(path), 404)
    assert body["error"].startswith("no API endpoint at ")


def test_console_404_is_still_a_page(admin, client) -> None:
    resp = client.get("/no-such-console-page/")
    assert resp.status_code == 404
    assert resp["Content-Type"].startswith("text/html")


def test_csrf_failure_with_a_session_is_403_json(demo, user_factory, isolated_api_state) -> None:
    client = Client(enforce_csrf_checks=True)
    client.force_login(user_factory("csrf-user", team="training"))  # sign-in lockout needs a request: no login()
    # a DRF view: SessionAuthentication's own CSRF check
    assert_error(client.post("/api/v1/tokens/", {"name": "x"}, content_type="application/json"), 403)
    # Django's CsrfViewMiddleware answers through CSRF_FAILURE_VIEW (no view under /api/ leaves it the check)
    request = RequestFactory().post("/api/v1/tokens/")
    body = assert_error(error_handling.csrf_failure(request, "CSRF cookie not set."), 403)
    assert body["error"] == "CSRF check failed: CSRF cookie not set."
    # outside the API, the console keeps Django's page
    page = client.post("/jobs/new/", {})
    assert page.status_code == 403 and page["Content-Type"].startswith("text/html")


def test_method_not_allowed_is_405_json(admin) -> None:
    resp = admin.put("/api/v1/jobs/", {}, format="json")
    assert_error(resp, 405)
    assert "GET" in resp["Allow"]


def test_unknown_format_is_400_naming_format(admin) -> None:
    body = assert_error(admin.get("/api/v1/nodes/?format=xml"), 400, "format")
    assert "'xml'" in body["error"] and "json" in body["error"]
    assert admin.get("/api/v1/nodes/?format=json").status_code == 200
    assert_error(admin.get("/api/v1/reports/statements/?format=yaml"), 400, "format")


def test_unreadable_filter_values_are_400_naming_the_filter(admin) -> None:
    assert_error(admin.get("/api/v1/nodes/?reachable=maybe"), 400, "reachable")
    assert_error(admin.get("/api/v1/devices/?schedulable=null"), 400, "schedulable")
    assert_error(admin.get("/api/v1/policies/?active=1"), 400, "active")
    assert_error(admin.get("/api/v1/jobs/?submitted_after="), 400, "submitted_after")
    assert admin.get("/api/v1/nodes/?reachable=true").status_code == 200
    assert admin.get("/api/v1/devices/?chip_model=").status_code == 200  # free text: empty means no filter


def test_wrong_json_types_and_unknown_fields_are_400(admin) -> None:
    assert_error(admin.post("/api/v1/tokens/", {"name": 5}, format="json"), 400, "name")
    assert_error(admin.post("/api/v1/tokens/", {"name": "x", "nmae": "y"}, format="json"), 400, "nmae")
    assert_error(admin.post("/api/v1/policies/dry-run/", {"yaml": "x", "days": "7"}, format="json"), 400, "days")
    assert_error(admin.post("/api/v1/nodes/ascend-a-01/cordon/", {"reason": 0}, format="json"), 400, "reason")


def test_an_unhandled_exception_is_500_json_under_the_api(admin, monkeypatch) -> None:
    from devices.api import views

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(views, "nodes_with_devices", broken)
    client = APIClient(raise_request_exception=False)
    client.credentials(**admin._credentials)
    body = assert_error(client.get("/api/v1/nodes/"), 500)
    assert "boom" not in body["error"]


def test_the_handlers_answer_json_under_the_api_and_pages_elsewhere() -> None:
    factory = RequestFactory()
    api, console = factory.get("/api/v1/jobs/"), factory.get("/jobs/")
    assert error_handling.server_error(api).status_code == 500
    assert error_handling.server_error(api)["Content-Type"] == "application/json"
    assert error_handling.server_error(console)["Content-Type"].startswith("text/html")
    assert error_handling.page_not_found(console, None)["Content-Type"].startswith("text/html")
    assert error_handling.csrf_failure(console, "no token")["Content-Type"].startswith("text/html")
    assert error_handling.permission_denied(api, None).status_code == 403
    assert error_handling.bad_request(api, None)["Content-Type"] == "application/json"
    assert error_handling.bad_request(api, RequestDataTooBig("too big")).status_code == 413


def test_the_middleware_turns_any_html_error_under_the_api_into_the_shape() -> None:
    from django.http import HttpResponse

    def html_page(request: object) -> HttpResponse:
        page = HttpResponse("<h1>Bad Gateway</h1>", status=502, content_type="text/html")
        page["Allow"] = "GET"
        return page

    middleware = error_handling.ApiErrorMiddleware(html_page)
    answer = middleware(RequestFactory().get("/api/v1/nodes/"))
    assert answer.status_code == 502 and json.loads(answer.content) == {"error": "bad gateway", "field": None}
    assert answer["Allow"] == "GET"
    console = middleware(RequestFactory().get("/nodes/"))
    assert console["Content-Type"].startswith("text/html")


@pytest.mark.parametrize(
    ("path", "status", "field"),
    [
        ("/api/v1/devices/?chip_model=a%00b", 400, "chip_model"),
        ("/api/v1/jobs/?user=a%00b", 400, "user"),
        ("/api/v1/jobs/?cursor=a%00b", 400, "cursor"),
        ("/api/v1/reports/statements/a%00b/2026-11/", 404, None),
        ("/api/v1/teams/a%00b/", 404, None),
    ],
)
def test_a_nul_character_anywhere_is_refused_not_a_database_error(admin, path, status, field) -> None:
    """PostgreSQL refuses NUL in text: it must never get that far."""
    assert_error(admin.get(path), status, field)
