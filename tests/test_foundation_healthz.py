"""``/healthz`` tells database, broker and tick age; 503 when one is bad."""

from __future__ import annotations

import pytest
from django.test import Client, override_settings

from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def test_healthz_is_503_until_a_tick_ran_then_ok(demo) -> None:
    client = Client()
    resp = client.get("/healthz")
    assert resp.status_code == 503
    body = resp.json()
    assert body["database"]["ok"] is True
    assert body["tick"]["ok"] is False
    run_tick()
    resp = client.get("/healthz")
    assert resp.status_code == 200, resp.json()
    body = resp.json()
    assert body["status"] == "ok"
    assert body["tick"]["age_s"] < 60
    assert body["tick"]["policy_version"] == 1
    assert body["broker"]["ok"] is True


def test_healthz_is_503_when_the_tick_is_stale(demo) -> None:
    run_tick()
    with override_settings(TICK_STALE_AFTER_S=-1):
        resp = Client().get("/healthz")
    assert resp.status_code == 503
    assert resp.json()["tick"]["ok"] is False


def test_healthz_is_503_when_the_broker_is_unreachable(demo) -> None:
    from npuportal.celery import app

    run_tick()
    # A Redis broker that is down (with Redis configured, no transport class is named: the URL says it).
    old = app.conf.broker_url, app.conf.broker_transport
    app.conf.broker_url, app.conf.broker_transport = "redis://127.0.0.1:1/0", None
    try:
        resp = Client().get("/healthz")
    finally:
        app.conf.broker_url, app.conf.broker_transport = old
    assert resp.status_code == 503
    assert resp.json()["broker"]["ok"] is False
