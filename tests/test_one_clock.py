"""One clock: every time a person reads — console, npuctl, events, mails — is on the policy's clock, labelled.

``--utc`` prints ISO 8601 in UTC for scripts; JSON keeps ISO instants.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.core import mail

from npuctl.main import main
from npuctl.tables import Clock
from quotas.policies.versions import active_policy
from scheduling.engine.policy import zone
from tests.test_chargeback_harness import at, world  # noqa: F401 - world is a fixture

SHANGHAI = ZoneInfo("Asia/Shanghai")


@pytest.fixture
def laptop_in_new_york() -> Iterator[None]:
    """This computer's own zone is New York for the test (``TZ``, applied with ``tzset``), then as it was."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = saved
        time.tzset()


def test_the_clock_prints_on_the_policys_zone_with_its_label_or_iso_utc() -> None:
    shanghai, utc = Clock(lambda: SHANGHAI), Clock(lambda: SHANGHAI, utc=True)
    assert shanghai.when("2026-12-02T00:15:00Z") == "12-02 08:15 CST"
    assert shanghai.when("2026-12-02T00:15:07+00:00", seconds=True) == "12-02 08:15:07 CST"
    assert utc.when("2026-12-02T08:15:07+08:00") == "2026-12-02T00:15:07Z"
    assert shanghai.when(None) == "-" and shanghai.when("not a time") == "not a time"
    berlin = Clock(lambda: ZoneInfo("Europe/Berlin"))  # the label follows daylight saving time
    assert berlin.when("2026-07-01T12:00:00Z") == "07-01 14:00 CEST" and berlin.when("2026-12-01T12:00:00Z").endswith(
        "13:00 CET"
    )
    asked = []
    lazy = Clock(lambda: asked.append(1) or SHANGHAI)  # type: ignore[func-returns-value]
    assert asked == [] and lazy.when(None) == "-" and asked == []  # nothing printed: nothing asked
    lazy.when("2026-12-02T00:15:00Z")
    lazy.when("2026-12-02T00:16:00Z")
    assert asked == [1]


class _Server(BaseHTTPRequestHandler):
    """A portal of one ended job whose clock is Asia/Shanghai (or, with ``clock = None``, one from before /clock/)."""

    clock: ClassVar[dict | None] = None
    queries: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        type(self).queries.append(self.path)
        if self.path.startswith("/api/v1/clock/"):
            status, body = (200, self.clock) if self.clock else (404, {"error": "no API endpoint", "field": None})
        else:
            ran = {"started_at": "2026-11-01T00:00:00Z", "ended_at": "2026-11-01T00:30:00Z", "device_hours": 0.5}
            job = {"id": 7, "name": "j", "team": "t", "state": "completed", "exit_code": 0, **ran}
            status, body = 200, {"next": None, "previous": None, "results": [job]}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _portal(clock: dict | None) -> Iterator[str]:
    _Server.clock, _Server.queries = clock, []
    server = HTTPServer(("127.0.0.1", 0), _Server)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


CST = {"timezone": "Asia/Shanghai", "abbreviation": "CST", "utc_offset": "+08:00", "now": "2026-12-02T08:00:00+08:00"}


def _history(capsys, monkeypatch, url: str, *argv: str) -> tuple[str, dict[str, list[str]]]:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("NPUPORTAL_URL", url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
    assert main(["history", *argv]) == 0
    jobs = next(q for q in _Server.queries if q.startswith("/api/v1/jobs/"))
    return capsys.readouterr().out, urllib.parse.parse_qs(urllib.parse.urlsplit(jobs).query)


def test_npuctl_reads_and_prints_times_on_the_policys_clock(capsys, monkeypatch, laptop_in_new_york) -> None:
    """Issue 26, 7: npuctl printed UTC, unlabelled, where the console shows CST (this computer's zone plays no part)."""
    with _portal(CST) as url:
        out, query = _history(capsys, monkeypatch, url, "--since", "2026-11-01", "--until", "2026-11-02")
    assert out.splitlines()[1].endswith("11-01 08:30 CST")
    # A date without a zone is midnight on the policy's clock: 2026-11-01 00:00 CST is 10-31 16:00 UTC.
    assert query["ended_after"] == ["2026-10-31T16:00:00Z"] and query["ended_before"] == ["2026-11-01T16:00:01Z"]


def test_utc_prints_iso_8601_for_scripts_and_reads_dates_in_utc(capsys, monkeypatch) -> None:
    with _portal(CST) as url:
        out, query = _history(capsys, monkeypatch, url, "--utc", "--since", "2026-11-01")
        assert out.splitlines()[1].endswith("2026-11-01T00:30:00Z")
        assert query["ended_after"] == ["2026-11-01T00:00:00Z"]
        assert not any(q.startswith("/api/v1/clock/") for q in _Server.queries)  # UTC needs no asking
        out, _ = _history(capsys, monkeypatch, url, "--since", "2026-11-01T00:00Z", "--json")
    assert json.loads(out)[0]["ended_at"] == "2026-11-01T00:30:00Z"  # JSON keeps the API's instants


def test_a_server_from_before_the_clock_endpoint_gets_this_computers_zone_labelled(
    capsys, monkeypatch, laptop_in_new_york
) -> None:
    with _portal(None) as url:
        out, _ = _history(capsys, monkeypatch, url, "--since", "2026-11-01T00:00Z")
    assert out.splitlines()[1].endswith("10-31 20:30 EDT")


@pytest.mark.django_db
def test_the_api_tells_the_policys_clock(demo, api, user_factory) -> None:
    client = api(user_factory("ann", team="training"))
    body = client.get("/api/v1/clock/").json()
    name = active_policy().policy.timezone
    assert body["timezone"] == name
    now = body["now"]
    from datetime import datetime

    moment = datetime.fromisoformat(now)
    local = moment.astimezone(zone(name))
    assert body["abbreviation"] == local.tzname() and now.endswith(body["utc_offset"])
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/clock/").status_code == 401


@pytest.mark.django_db
def test_a_walltime_event_reads_on_the_policys_clock(demo, user_factory) -> None:
    """Issue 26, 7: the walltime event said "UTC" among times shown in CST."""
    from quotas.models import Team
    from scheduling.services.jobs import JobSpec, submit_job
    from scheduling.services.tick import run_tick
    from scheduling.services.walltime import enforce_walltime

    user = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(name="w", command="sleep 600", chip_model="910B4", estimated_duration_s=60, max_duration_s=60)
    job = submit_job(team=Team.objects.get(name="training"), user=user, spec=spec)
    assert job.pk in run_tick().started
    job.refresh_from_db()
    assert enforce_walltime(now=job.started_at + timedelta(seconds=61)) == [job.pk]
    reached = (job.started_at + timedelta(seconds=60)).astimezone(zone(active_policy().policy.timezone))
    detail = job.events.last().detail
    assert f"(limit reached {reached:%Y-%m-%d %H:%M:%S} {reached.tzname()})" in detail, detail


@pytest.mark.django_db
@pytest.mark.clock
def test_a_budget_mail_counts_up_to_a_time_on_the_policys_clock(world) -> None:  # noqa: F811
    from quotas.accounting.statements import check_budgets
    from quotas.models import Budget

    Budget.objects.create(team=world.alpha, monthly_amount=Decimal("10.00"), alert_thresholds="50")
    world.job("alpha", "normal", world.b4[:2], at("2025-03-20 00:00"), None)
    assert check_budgets(now=at("2025-03-20 15:00"))
    assert "running jobs counted up to 2025-03-20 15:00 CST;" in mail.outbox[0].body, mail.outbox[0].body
