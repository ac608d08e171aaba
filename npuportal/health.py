"""``/healthz``: is the database answering, is the broker reachable, is the tick alive."""

from __future__ import annotations

import time

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.utils import timezone


def _database() -> dict[str, object]:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
        return {"ok": True, "vendor": connection.vendor}
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:200]}


def _broker() -> dict[str, object]:
    from npuportal.celery import app

    url = settings.CELERY_BROKER_URL
    kind = url.split("://", 1)[0]
    try:
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=2)
        return {"ok": True, "transport": kind}
    except Exception as exc:
        return {"ok": False, "transport": kind, "error": str(exc)[:200]}


def _tick() -> dict[str, object]:
    from scheduling.models import TickRecord

    try:
        last = (
            TickRecord.objects.order_by("-started_at")
            .values_list("started_at", "duration_ms", "policy_version")
            .first()
        )
    except Exception as exc:
        return {"ok": False, "error": str(exc)[:200]}
    if last is None:
        return {"ok": False, "age_s": None, "error": "no tick has run yet"}
    age = (timezone.now() - last[0]).total_seconds()
    return {
        "ok": age <= settings.TICK_STALE_AFTER_S,
        "age_s": round(age, 1),
        "duration_ms": round(last[1], 1),
        "policy_version": last[2],
    }


def healthz(request: HttpRequest) -> JsonResponse:
    t0 = time.perf_counter()
    checks = {"database": _database()}
    checks["broker"] = _broker()
    checks["tick"] = _tick() if checks["database"]["ok"] else {"ok": False, "error": "database down"}
    ok = all(c["ok"] for c in checks.values())
    body = {"status": "ok" if ok else "fail", **checks, "checked_in_ms": round((time.perf_counter() - t0) * 1000, 1)}
    return JsonResponse(body, status=200 if ok else 503)
