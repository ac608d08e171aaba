"""The Celery side of health and lifecycle: periodic tasks and the poll task's overlap guard."""

from __future__ import annotations

import pytest
from django.core.cache import cache

from devices import tasks as device_tasks
from scheduling import tasks as scheduling_tasks


def test_beat_runs_the_poll_and_the_walltime_backstop() -> None:
    from npuportal.celery import app

    app.finalize()
    scheduled = {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {"scheduling.tick", "devices.poll_agents", "scheduling.enforce_walltime"} <= scheduled


def test_a_late_poll_still_runs() -> None:
    """Polls expire no sooner than 30 s after they are sent, however short the interval (a late poll still helps)."""
    from django.conf import settings

    from npuportal.celery import app

    app.finalize()
    (poll,) = [e for e in app.conf.beat_schedule.values() if e["task"] == "devices.poll_agents"]
    assert poll["options"]["expires"] == max(settings.AGENT_POLL_INTERVAL_S * 3, 30.0) >= 30.0


@pytest.mark.django_db
def test_poll_task_skips_while_another_poll_runs(demo) -> None:
    cache.delete(device_tasks.POLL_LOCK)
    result = device_tasks.poll_agents()
    assert result["polled"] == 0, "the demo without agents has nothing to poll"
    assert cache.get(device_tasks.POLL_LOCK) is None, "the guard is released"
    cache.add(device_tasks.POLL_LOCK, 1, timeout=30)
    try:
        assert device_tasks.poll_agents() == {"skipped": True}
    finally:
        cache.delete(device_tasks.POLL_LOCK)


@pytest.mark.django_db
def test_walltime_task_with_nothing_overdue(demo) -> None:
    assert scheduling_tasks.enforce_walltime() == {"stopped": 0}
