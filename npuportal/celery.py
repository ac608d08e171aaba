"""The Celery app shared by the web process, workers and beat."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "npuportal.settings")

app = Celery("npuportal")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
# Tasks kept in a domain package of an app (their registered names do not change with the module).
app.autodiscover_tasks(["quotas.accounting"])


@app.on_after_finalize.connect
def _periodic_tasks(sender: Celery, **_: object) -> None:
    """Beat's timetable lives in code so every deployment ticks the same way."""
    from django.conf import settings

    # Expiry drops ticks that queued up while no worker ran: a stale tick is worthless. A few seconds
    # of slack at least, though: with 1-s ticks a worker running 2-3 s behind dropped every one of them.
    sender.add_periodic_task(
        settings.TICK_INTERVAL_S,
        sender.signature("scheduling.tick", expires=max(settings.TICK_INTERVAL_S * 3, 10.0)),
        name="scheduling tick",
    )
    # A poll is idempotent and a late one still finds out what ended (one that overlaps a running
    # poll returns at once): with short intervals three of them were too little slack on a busy
    # machine, where every poll expired behind slow ones and finished jobs went unseen.
    poll_expiry = max(settings.AGENT_POLL_INTERVAL_S * 3, 30.0)
    sender.add_periodic_task(
        settings.AGENT_POLL_INTERVAL_S,
        sender.signature("devices.poll_agents", expires=poll_expiry),
        name="agent poll",
    )
    # The walltime backstop is one query when nothing is overdue; it runs as often as the poll.
    sender.add_periodic_task(
        settings.AGENT_POLL_INTERVAL_S,
        sender.signature("scheduling.enforce_walltime", expires=max(settings.AGENT_POLL_INTERVAL_S * 3, 10.0)),
        name="walltime backstop",
    )
    # Usage accounting (quotas/accounting/tasks.py): records of closed allocations and budget alerts every minute,
    # and the monthly chargeback close at 00:30 on the 1st (the task waits for the policy clock's month end).
    from celery.schedules import crontab

    sender.add_periodic_task(60.0, sender.signature("quotas.record_usage", expires=120), name="usage records")
    sender.add_periodic_task(
        crontab(minute=30, hour=0, day_of_month=1), sender.signature("quotas.close_month"), name="monthly close"
    )
