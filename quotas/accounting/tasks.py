"""Celery tasks of accounting: thin shells over ``quotas.accounting`` (beat entries in ``npuportal/celery.py``)."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.utils import timezone

from quotas.accounting.records import record_closed_allocations
from quotas.accounting.statements import ChargebackError, check_budgets, close_month, previous_month
from quotas.policies.versions import active_policy
from scheduling.services.usage import month_of

log = logging.getLogger(__name__)

#: How long after a month's end (policy clock) the close waits for late job reports.
CLOSE_GRACE = timedelta(minutes=30)


@shared_task(name="quotas.record_usage", ignore_result=True)
def record_usage() -> dict[str, int]:
    """Every minute: usage records of newly closed allocations, then the budget thresholds."""
    written = record_closed_allocations()
    alerts = check_budgets()
    return {"records": written, "alerts": len(alerts)}


@shared_task(name="quotas.close_month", ignore_result=True)
def close_month_task(month: str | None = None) -> dict[str, object]:
    """On the 1st at 00:30 (Celery's clock): close last month on the policy's clock; a closed month is a no-op.

    When the policy's clock is behind Celery's, its month may not be over yet
    at 00:30: the task then queues itself for 30 minutes after that month ends.
    """
    now = timezone.now()
    label = month or previous_month(now)
    try:
        result = close_month(label, now=now)
    except ChargebackError as exc:
        log.error("chargeback close of %s refused: %s", label, exc)
        return {"month": label, "error": str(exc)}
    if month is None:
        current = month_of(active_policy().policy, now)
        if current.end - now < timedelta(days=1):
            close_month_task.apply_async(kwargs={"month": current.label}, eta=current.end + CLOSE_GRACE)
    return {"month": result.month, "already_closed": result.already_closed, "statements": len(result.statements)}
