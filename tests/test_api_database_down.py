"""With the database down the API answers 503 in its JSON error shape, never Django's HTML error page,
and the console a page of its own saying so (503 too), never a bare "Server Error".

The server under test is a real gunicorn pointed at a PostgreSQL address where
nothing listens, so every query fails the way it does when the database is
stopped: refused at connect.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import requests
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.test import Client, override_settings
from django.urls import path

from tests.conftest import free_port
from tests.waiting import ceiling, wait_for

ROOT = Path(settings.BASE_DIR)
DEAD_DATABASE = "postgres://postgres@127.0.0.1:{port}/npuportal_nowhere"


def _expect_503(resp: requests.Response) -> None:
    assert resp.status_code == 503, resp.text[:500]
    assert resp.headers["Content-Type"].startswith("application/json"), resp.headers
    assert resp.json() == {"error": "the database is not answering; try again shortly", "field": None}
    assert resp.headers["Retry-After"] == "5"


@pytest.fixture(scope="module")
def dead_db_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    tmp = tmp_path_factory.mktemp("dbdown")
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        {
            "DATABASE_URL": DEAD_DATABASE.format(port=free_port()),
            "DJANGO_SETTINGS_MODULE": "npuportal.settings",
            "NPUPORTAL_VAR_DIR": str(tmp / "var"),
        }
    )
    port = free_port()
    log = tmp / "gunicorn.log"
    argv = [sys.executable, "-m", "gunicorn", "npuportal.wsgi", "-b", f"127.0.0.1:{port}", "-w", "1"]
    with log.open("wb") as out:
        web = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:

        def answers() -> bool:
            assert web.poll() is None, log.read_text()[-3000:]
            requests.get(base + "/healthz", timeout=ceiling(60))
            return True

        wait_for(answers, ignore=(requests.RequestException,), interval=0.2, message="gunicorn to answer /healthz")
        yield base
    finally:
        web.terminate()
        web.wait(timeout=ceiling(60))
    text = log.read_text()
    assert "Traceback" not in text and "Internal Server Error" not in text, text[-3000:]
    assert "database unavailable for GET /api/v1/jobs/" in text


@pytest.mark.slow
def test_api_calls_answer_503_json_while_the_database_is_down(dead_db_server: str) -> None:
    base = dead_db_server
    token = {"Authorization": "Token npu_0123456789abcdef"}
    _expect_503(requests.get(f"{base}/api/v1/jobs/", headers=token, timeout=ceiling(60)))
    _expect_503(requests.get(f"{base}/api/v1/jobs/7/", headers=token, timeout=ceiling(60)))
    job = {"name": "x", "command": "true", "num_devices": 1}
    _expect_503(requests.post(f"{base}/api/v1/jobs/", json=job, headers=token, timeout=ceiling(60)))
    _expect_503(requests.post(f"{base}/api/v1/jobs/7/cancel/", headers=token, timeout=ceiling(60)))
    _expect_503(requests.get(f"{base}/api/v1/reports/statements/", headers=token, timeout=ceiling(60)))
    # A browser's session cookie: the session is read from the database too.
    _expect_503(requests.get(f"{base}/api/v1/nodes/", cookies={"sessionid": "abc" * 10}, timeout=ceiling(60)))
    # Without credentials nothing needs the database: the usual 401/403, still JSON.
    anon = requests.get(f"{base}/api/v1/jobs/", timeout=ceiling(60))
    assert anon.status_code in {401, 403} and anon.json()["field"] is None
    # /healthz says which part is down.
    health = requests.get(f"{base}/healthz", timeout=ceiling(60))
    assert health.status_code == 503 and health.json()["database"]["ok"] is False


def _expect_console_503(resp: requests.Response) -> None:
    assert resp.status_code == 503, resp.text[:500]
    assert resp.headers["Content-Type"].startswith("text/html"), resp.headers
    assert resp.headers["Retry-After"] == "5"
    page = resp.text
    assert "The database is not answering" in page and "/static/css/console.css" in page, page[:800]
    assert "Server Error" not in page


@pytest.mark.slow
def test_console_pages_say_the_database_is_down_with_a_503(dead_db_server: str) -> None:
    base = dead_db_server
    signed_in = {"sessionid": "abc" * 10}  # reading the session needs the database
    for page in ("/", "/jobs/", "/cluster/", "/reports/", "/admin/"):
        _expect_console_503(requests.get(base + page, cookies=signed_in, timeout=10, allow_redirects=False))
    # Signing in needs the database as well.
    login = requests.get(base + "/login/", timeout=10)
    token = login.cookies.get("csrftoken")
    resp = requests.post(
        base + "/login/",
        data={"username": "someone", "password": "pw", "csrfmiddlewaretoken": token},
        cookies=login.cookies,
        headers={"Referer": base + "/login/"},
        timeout=10,
        allow_redirects=False,
    )
    _expect_console_503(resp)


# -- what fails outside the API's views: Django's handler500, in the same shape -------------


def _query_a_dead_database(request: HttpRequest) -> HttpResponse:
    """A plain Django view whose database refuses it: a real psycopg error, not a raised stand-in."""
    with psycopg.connect(DEAD_DATABASE.format(port=free_port()).replace("postgres://", "postgresql://")):
        return HttpResponse("unreachable")


def _fail(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("a bug")


handler500 = "npuportal.api.error_handling.server_error"
urlpatterns = [
    path("api/plain-db/", _query_a_dead_database),
    path("console-db/", _query_a_dead_database),
    path("api/plain-bug/", _fail),
    path("console-bug/", _fail),
]


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_failures_outside_the_api_views_still_answer_in_the_error_shape() -> None:
    client = Client(raise_request_exception=False)
    resp = client.get("/api/plain-db/")
    assert resp.status_code == 503 and resp.json()["field"] is None and resp["Retry-After"] == "5"
    resp = client.get("/api/plain-bug/")
    assert resp.status_code == 500
    assert resp.json() == {"error": "internal server error; the details are in the server's log", "field": None}
    resp = client.get("/console-bug/")  # not the API: Django's own page
    assert resp.status_code == 500 and resp["Content-Type"].startswith("text/html")


@override_settings(ROOT_URLCONF=__name__, DEBUG=False)
def test_a_console_view_whose_database_is_down_answers_the_consoles_503_page(db) -> None:
    resp = Client(raise_request_exception=False).get("/console-db/")
    assert resp.status_code == 503 and resp["Content-Type"].startswith("text/html") and resp["Retry-After"] == "5"
    page = resp.content.decode()
    assert "The database is not answering" in page and 'http-equiv="refresh" content="5"' in page
    assert "Server Error" not in page
