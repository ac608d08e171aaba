"""Two ticks at the same moment on PostgreSQL never hand one device to two jobs."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import IntegrityError, connection

from scheduling.models import Allocation, Job
from scheduling.services import tick as tick_module
from tests.conftest import requires_postgres
from tests.waiting import ceiling

pytestmark = [requires_postgres, pytest.mark.django_db(transaction=True)]


def _race(n_threads: int = 2) -> list[BaseException | tick_module.TickResult]:
    """Run ticks in threads that all enter the tick at the same instant."""
    barrier = threading.Barrier(n_threads)
    results: list[BaseException | tick_module.TickResult] = []

    def worker() -> None:
        try:
            barrier.wait()
            results.append(tick_module.run_tick())
        except BaseException as exc:
            results.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=worker) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(ceiling(120))
    return results


def _slow_decide(monkeypatch, meet: threading.Barrier | None = None) -> None:
    """Widen the race window: both ticks have read the same state before either writes.

    With ``meet``, each tick waits there until every tick has read its snapshot, however slow the machine
    (only without the lock: with it the others wait before they read, so they could never meet there);
    without, each sleeps half a second.
    """
    real = tick_module.decide

    def slow(snapshot):
        import time

        if meet is not None:
            meet.wait(timeout=ceiling(60))
        else:
            time.sleep(0.5)
        return real(snapshot)

    monkeypatch.setattr(tick_module, "decide", slow)


def _submit_many(user_factory, api) -> None:
    lead = user_factory("racer", team="training", role="lead")
    client = api(lead)
    for i in range(12):
        resp = client.post(
            "/api/v1/jobs/",
            {"name": f"r{i}", "command": "true", "num_devices": 2, "chip_model": "910B4", "estimated_duration_s": 60},
            format="json",
        )
        assert resp.status_code == 201


def test_concurrent_ticks_do_not_double_allocate(demo, user_factory, api, monkeypatch) -> None:
    _submit_many(user_factory, api)
    _slow_decide(monkeypatch)
    results = _race(3)
    assert all(isinstance(r, tick_module.TickResult) for r in results), results
    started = [job for r in results for job in r.started]  # type: ignore[union-attr]
    assert len(started) == len(set(started)), "a job was started twice"
    per_device = Counter(Allocation.objects.filter(end__isnull=True).values_list("device_id", flat=True))
    assert per_device and max(per_device.values()) == 1
    # 16 cards of 910B4, 4 of them reserved for the critical class by the demo policy: 12 / 2 per job.
    assert Job.objects.filter(state="running").count() == len(started) == 6


def test_without_the_lock_the_race_is_real(demo, user_factory, api, monkeypatch) -> None:
    """Shows the test above can fail: with the lock removed, the ticks collide."""
    _submit_many(user_factory, api)
    _slow_decide(monkeypatch, meet=threading.Barrier(2))
    monkeypatch.setattr(tick_module, "_lock_cluster", lambda: None)
    results = _race(2)
    collided = any(isinstance(r, IntegrityError) for r in results)
    started = [job for r in results if isinstance(r, tick_module.TickResult) for job in r.started]
    assert collided or len(started) != len(set(started))
