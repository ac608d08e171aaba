"""Limits on what one request may carry (docs/api.md#limits): one test per limit, each refusing with
the field and the limit named and writing nothing, and each moved by its setting."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client, override_settings

from devices.agent.environment import MAX_ENV_BYTES
from scheduling.models import Job, JobEvent
from scheduling.services.jobs import MAX_PATH_CHARS
from tests.waiting import ceiling

pytestmark = pytest.mark.django_db

ROOT = Path(__file__).resolve().parent.parent
JOB = {"name": "ok", "command": "sleep 1", "team": "training", "num_devices": 1, "estimated_duration_s": 60}
MB = 1000 * 1000


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Own throttle counters and policy cache (see conftest)."""


@pytest.fixture
def member(demo, user_factory):
    return user_factory("max", team="training")


def _post(client, body: dict):  # type: ignore[no-untyped-def]
    return client.post("/api/v1/jobs/", body, format="json")


def _written() -> tuple[int, int]:
    return Job.objects.count(), JobEvent.objects.count()


def _refused(resp, field: str, *words: str) -> dict:  # type: ignore[no-untyped-def]
    """A 400 in the one error shape naming ``field``, whose sentence holds each of ``words``."""
    assert resp.status_code == 400, resp.content[:300]
    body = resp.json()
    assert body["field"] == field and body["error"].startswith(f"{field}: "), body
    assert list(body["details"]) == [field]
    for word in words:
        assert word in body["error"], body["error"]
    return body


def test_the_2mb_command_times_100_is_a_400_and_writes_nothing(member, api) -> None:
    """The incident: a 1.9 MB command × ``array: 100`` once wrote 197 MB and answered 199 MB."""
    before = _written()
    resp = _post(api(member), {**JOB, "command": "echo " + "x" * (2 * MB), "array": 100})
    _refused(resp, "command", "2,000,005 bytes", "at most 65,536 bytes (64 KiB)")
    assert len(resp.content) < 1000
    assert _written() == before


def test_command_limit_counts_utf8_bytes_and_follows_its_setting(member, api) -> None:
    client = api(member)
    before = _written()
    _refused(_post(client, {**JOB, "command": "x" * 65537}), "command", "65,537 bytes", "65,536 bytes (64 KiB)")
    # 32,769 characters, but two bytes each: what the database and the agent take is bytes.
    _refused(_post(client, {**JOB, "command": "é" * 32769}), "command", "65,538 bytes")
    assert _written() == before
    at_limit = _post(client, {**JOB, "command": "x" * 65536})
    assert at_limit.status_code == 201, at_limit.content[:300]
    assert Job.objects.get(pk=at_limit.json()["id"]).command == "x" * 65536
    with override_settings(MAX_COMMAND_BYTES=100):
        _refused(_post(client, {**JOB, "command": "x" * 101}), "command", "101 bytes", "at most 100 bytes")
        assert _post(client, {**JOB, "command": "x" * 100}).status_code == 201


def test_command_must_be_text_the_database_and_a_process_can_hold(member) -> None:
    """Paths past the API's types (resubmit, the load generator) get the same refusal, not a database error."""
    from quotas.models import Team
    from scheduling.services.jobs import JobSpec, SubmissionError, submit_job

    team = Team.objects.get(name="training")
    for command, why in (("echo \x00 hi", "NUL"), ("echo \ud800", "lone surrogate")):
        with pytest.raises(SubmissionError, match=why) as caught:
            submit_job(team=team, user=member, spec=JobSpec(name="t", command=command))
        assert caught.value.field == "command"
    assert not Job.objects.filter(name="t").exists()


def test_name_limit_holds_for_the_longest_copy_of_an_array(member, api) -> None:
    client = api(member)
    before = _written()
    _refused(_post(client, {**JOB, "name": "n" * 201}), "name", "200 characters")
    _refused(_post(client, {**JOB, "name": "n" * 198, "array": 10}), "name", "at most 200 characters")  # n…n[9]
    assert _written() == before
    assert _post(client, {**JOB, "name": "n" * 197, "array": 10}).status_code == 201


def test_array_size_limit_follows_its_setting(member, api) -> None:
    client = api(member)
    before = _written()
    _refused(_post(client, {**JOB, "array": 1001}), "array", "1,001 copies", "at most 1,000")
    _refused(_post(client, {**JOB, "array": 10**12}), "array", "1,000,000,000,000 copies")  # nothing built for them
    assert _written() == before
    with override_settings(MAX_ARRAY=5):
        _refused(_post(client, {**JOB, "array": 6}), "array", "at most 5 in one array")
        made = _post(client, {**JOB, "array": 5})
    assert made.status_code == 201 and len(made.json()) == 5


def test_total_bytes_of_one_submission_are_bounded(member, api) -> None:
    """Each copy within the command limit, the array within its count: the product is what is refused."""
    client = api(member)
    before = _written()
    command = "x" * (60 * 1024)
    resp = _post(client, {**JOB, "name": "big", "array": 200, "command": command})
    _refused(resp, "array", "200 copies of 61,448 bytes each", "12,289,600 bytes", "at most 8,388,608 bytes (8 MiB)")
    assert _written() == before
    assert _post(client, {**JOB, "name": "big", "array": 100, "command": command}).status_code == 201
    with override_settings(MAX_SUBMIT_BYTES=1000):
        _refused(_post(client, {**JOB, "array": 101, "command": "x" * 5}), "array", "at most 1,000 bytes")
        # One job counts too (a limit set below the command limit): then its command is at fault.
        _refused(_post(client, {**JOB, "command": "x" * 1000}), "command", "the job is 1,002 bytes", "1,000 bytes")


def test_env_cwd_and_output_count_in_the_bytes_of_one_submission(member, api) -> None:
    """1,000 copies with 16 KiB of ``env`` each would store about 16 MiB: over the bound, like long commands."""
    client = api(member)
    before = _written()
    env = {"BIG": "x" * (MAX_ENV_BYTES - len("BIG="))}  # the env limit exactly: 16,384 bytes
    resp = _post(client, {**JOB, "array": 1000, "env": env})
    _refused(
        resp,
        "array",
        "1,000 copies of 16,398 bytes each (command, name, env, cwd and output)",  # 7 + 7 (ok[999]) + 16,384
        "16,398,000 bytes (15.6 MiB)",
        "at most 8,388,608 bytes (8 MiB)",
    )
    assert _written() == before
    path = "/" + "p" * (MAX_PATH_CHARS - 1)
    with override_settings(MAX_SUBMIT_BYTES=3000):
        # 7 (command) + 5 (ok[1]) + 1,024 + 1,024 = 2,060 bytes a copy.
        _refused(_post(client, {**JOB, "array": 2, "cwd": path, "output": path}), "array", "2 copies of 2,060 bytes")
        # One job over it: the part to shorten is named.
        _refused(_post(client, {**JOB, "env": {"A": "x" * 3000}}), "env", "the job is 3,011 bytes")
        assert _written() == before
        assert _post(client, {**JOB, "cwd": path, "output": path}).status_code == 201


def test_a_body_over_the_request_limit_is_413_in_the_error_shape(member, api) -> None:
    client = api(member)
    before = _written()
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert limit == settings.MAX_REQUEST_BYTES == 2560 * 1024
    raw = json.dumps({**JOB, "command": "x" * (3 * MB)})
    resp = client.post("/api/v1/jobs/", raw, content_type="application/json")
    assert resp.status_code == 413, resp.content[:300]
    assert resp["Content-Type"] == "application/json"
    message = f"the request body is {len(raw):,} bytes (2.9 MiB); at most 2,621,440 bytes (2.5 MiB) are accepted"
    assert resp.json() == {"error": f"body: {message}", "field": "body", "details": {"body": [message]}}
    # A form body is read by Django itself: the same answer.
    form = client.post("/api/v1/jobs/", {**JOB, "command": "x" * (3 * MB)})
    assert form.status_code == 413 and form.json()["field"] == "body"
    # Every endpoint that reads a body, and the limit is the setting's.
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        token = client.post("/api/v1/tokens/", {"name": "x" * 2000}, format="json")
        assert token.status_code == 413 and "at most 1,000 bytes are accepted" in token.json()["error"]
    assert _written() == before


def test_a_parser_error_caused_by_a_too_big_body_is_413_too() -> None:
    from django.core.exceptions import RequestDataTooBig
    from django.test import RequestFactory
    from rest_framework.exceptions import ParseError

    from npuportal.api.error_handling import exception_handler

    request = RequestFactory().post("/api/v1/jobs/", data="{}", content_type="application/json")
    try:
        try:
            raise RequestDataTooBig("too big")
        except RequestDataTooBig as inner:
            raise ParseError("could not parse") from inner
    except ParseError as wrapped:
        response = exception_handler(wrapped, {"request": request})
    assert response is not None and response.status_code == 413 and response.data["field"] == "body"
    plain = exception_handler(ParseError("JSON parse error"), {"request": request})
    assert plain is not None and plain.status_code == 400


def _job_columns_read(sql: str) -> str:
    """The SQL with the list's bounded read of the command (``SUBSTR(command, 1, 201)``) taken out."""
    return re.sub(r'SUBSTR(?:ING)?\("scheduling_job"\."command", 1, 201\)', "", sql, flags=re.IGNORECASE)


def test_a_list_page_carries_a_preview_of_each_command_and_its_bytes_stay_bounded(member, api) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = api(member)
    command = "python train.py" + " --flag" * 9360 + "!"  # 65,536 bytes
    assert len(command) == 65536
    made = _post(client, {**JOB, "name": "n" * 195, "array": 40, "command": command})
    assert made.status_code == 201
    # The array's answer is a list too: each copy with the preview, not 40 copies of the command.
    assert len(made.content) < 40 * 1500, len(made.content)
    assert all("command" not in job for job in made.json())
    with CaptureQueriesContext(connection) as ctx:
        page = client.get(f"/api/v1/jobs/?limit=1000&array_id={made.json()[0]['array_id']}")
    assert page.status_code == 200
    rows = page.json()["results"]
    assert len(rows) == 40
    assert len(page.content) < 40 * 1500, len(page.content)  # ~2.6 MB of commands before
    preview = rows[0]["command_preview"]
    assert len(preview) == 200 and preview.endswith("…") and command.startswith(preview[:-1])
    assert "command" not in rows[0]
    job_sql = [q["sql"] for q in ctx.captured_queries if '"scheduling_job"' in q["sql"]]
    assert job_sql and all('"command"' not in _job_columns_read(sql) for sql in job_sql), job_sql
    # The job itself has the whole command; a short one is its own preview.
    assert client.get(f"/api/v1/jobs/{rows[0]['id']}/").json()["command"] == command
    short = _post(client, {**JOB, "command": "sleep 1"}).json()
    assert client.get("/api/v1/jobs/?limit=1").json()["results"][0]["command_preview"] == "sleep 1" == short["command"]


def test_every_list_page_is_bounded_by_the_row_limit(member, api, monkeypatch) -> None:
    from npuportal.api import pagination
    from scheduling.api.views import JobPagination

    assert pagination.LimitOffsetPagination.max_limit == JobPagination.max_limit == 1000
    client = api(member)
    assert _post(client, {**JOB, "array": 4}).status_code == 201
    monkeypatch.setattr(pagination.LimitOffsetPagination, "max_limit", 3)
    monkeypatch.setattr(JobPagination, "max_limit", 3)
    for path in ("/api/v1/devices/", "/api/v1/jobs/"):
        resp = client.get(f"{path}?limit=100000")  # above the limit: refused, naming it
        assert resp.status_code == 400 and resp.json()["field"] == "limit", resp.content
        page = client.get(f"{path}?limit=3").json()
        assert len(page["results"]) == 3 and page["next"], path


def test_console_job_lists_do_not_read_commands(member, api) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    _post(api(member), {**JOB, "array": 5, "command": "echo " + "y" * 60000})
    browser = Client()
    browser.force_login(member)
    for path in ("/jobs/", "/"):
        with CaptureQueriesContext(connection) as ctx:
            page = browser.get(path)
        assert page.status_code == 200
        assert b"yyyy" not in page.content
        job_sql = [q["sql"] for q in ctx.captured_queries if 'FROM "scheduling_job"' in q["sql"]]
        assert job_sql and all('"command"' not in sql for sql in job_sql), path


def test_console_form_refuses_a_command_over_the_limit_by_its_field(member) -> None:
    browser = Client()
    browser.force_login(member)
    before = _written()
    form = {
        "team": member.memberships.get().team.pk, "name": "long", "command": "x" * 70000,
        "priority_class": "normal", "num_devices": 1, "estimated_duration_s": 60,
    }  # fmt: skip
    page = browser.post("/jobs/new/", form)
    assert page.status_code == 200
    assert "is 70,000 bytes (68.4 KiB); at most 65,536 bytes (64 KiB) are allowed" in page.content.decode()
    assert _written() == before


def _settings_error(**env: str) -> str:
    """Import the settings in a fresh interpreter with ``env``; the error it stops with ('' if none)."""
    run = subprocess.run(
        [sys.executable, "-c", "import npuportal.settings"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_output=True,
        text=True,
        timeout=ceiling(120),
    )
    return "" if run.returncode == 0 else run.stderr.strip().splitlines()[-1]


def test_limit_settings_are_checked_at_start_up() -> None:
    assert _settings_error(NPUPORTAL_MAX_COMMAND_BYTES="131071", NPUPORTAL_MAX_ARRAY="50") == ""
    too_long = _settings_error(NPUPORTAL_MAX_COMMAND_BYTES="200000")
    assert too_long.endswith("NPUPORTAL_MAX_COMMAND_BYTES='200000': expected a number of at most 131071"), too_long
    assert "NPUPORTAL_MAX_ARRAY='0': expected a number of at least 1" in _settings_error(NPUPORTAL_MAX_ARRAY="0")
    assert "NPUPORTAL_MAX_SUBMIT_BYTES='lots'" in _settings_error(NPUPORTAL_MAX_SUBMIT_BYTES="lots")
    small = _settings_error(NPUPORTAL_MAX_REQUEST_BYTES="100000")
    assert "NPUPORTAL_MAX_REQUEST_BYTES=100000: expected at least twice NPUPORTAL_MAX_COMMAND_BYTES (131072)" in small
