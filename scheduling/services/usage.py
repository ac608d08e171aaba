"""What a team used: device-hours per chip model in a calendar month, and what it holds right now.

Months are calendar months on the policy's wall clock (the clock quotas and
``deviceHoursPerMonth`` are written in). An allocation that spans the month
start is split there, and one still open counts up to now. The sums are done
by the database — one grouped query per question, however many allocations.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count, DateTimeField, DurationField, ExpressionWrapper, F, Q, Sum, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone

from quotas.models import Team
from scheduling.engine.policy import DEVICES, Policy, chip_resource, zone
from scheduling.models import Allocation, Job

MONTH_RE = re.compile(r"^(\d{4})-(\d{2})$")


class UsageError(ValueError):
    """Bad input for a usage question; ``field`` names the offending parameter."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Month:
    """A calendar month on the policy's clock: ``[start, end)`` as aware datetimes."""

    label: str  # "2026-11"
    start: datetime
    end: datetime


@dataclass
class TeamUsage:
    team: str
    month: str
    start: datetime
    end: datetime  # the end of the counted window: the month's end, or now for the current month
    device_hours: dict[str, float] = field(default_factory=dict)  # chip model -> card-equivalent hours
    total_device_hours: float = 0.0
    running_jobs: int = 0
    pending_jobs: int = 0

    def as_dict(self) -> dict[str, object]:
        return {
            "team": self.team,
            "month": self.month,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "device_hours": self.device_hours,
            "total_device_hours": self.total_device_hours,
            "running_jobs": self.running_jobs,
            "pending_jobs": self.pending_jobs,
        }


#: The months :func:`month_of` takes (2000-01 .. 9998-12), as a regular expression for the API schema.
MONTH_PATTERN = r"^(?:[2-8][0-9]{3}|9[0-8][0-9]{2}|99[0-8][0-9]|999[0-8])-(?:0[1-9]|1[0-2])$"


def month_of(policy: Policy, now: datetime, label: str | None = None) -> Month:
    """The month called ``label`` (``YYYY-MM``), or the one ``now`` falls in; on the policy's clock."""
    tz = zone(policy.timezone)
    if label is None or label == "":
        local = now.astimezone(tz)
        year, month = local.year, local.month
    else:
        match = MONTH_RE.match(label)
        if not match:
            raise UsageError("month", f"{label!r} is not a month like 2026-11")
        year, month = int(match.group(1)), int(match.group(2))
        if not 1 <= month <= 12 or not 2000 <= year <= 9998:
            raise UsageError("month", f"{label!r} is not a month between 2000-01 and 9998-12")
    start = datetime(year, month, 1, tzinfo=tz)
    end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=tz)
    return Month(label=f"{year:04d}-{month:02d}", start=start, end=end)


def _hours(value: timedelta | None) -> float:
    return round(value.total_seconds() / 3600.0, 3) if value else 0.0


def team_usage(team: Team, policy: Policy, *, month: str | None = None, now: datetime | None = None) -> TeamUsage:
    """Device-hours of ``team`` per chip model in ``month`` (default: this month), and its job counts now.

    Two queries: allocation time grouped by chip model, and the job counts.
    """
    now = now or timezone.now()
    period = month_of(policy, now, month)
    until = min(period.end, now)
    hours: dict[str, float] = {}
    if until > period.start:
        # Each allocation clipped to [period.start, until]; an open one runs until ``until``.
        clipped_end = Least(Coalesce(F("end"), Value(until), output_field=DateTimeField()), Value(until))
        clipped_start = Greatest(F("start"), Value(period.start), output_field=DateTimeField())
        held = ExpressionWrapper(
            (clipped_end - clipped_start) * F("device_share"),
            output_field=DurationField(),
        )
        rows = (
            Allocation.objects.filter(job__team=team, start__lt=until)
            .filter(Q(end__isnull=True) | Q(end__gt=period.start))
            .values("device__chip_model")
            .annotate(held=Sum(held))
            .order_by("device__chip_model")
        )
        for row in rows:
            hours[row["device__chip_model"]] = _hours(row["held"])
    counts = Job.objects.filter(team=team, state__in=[Job.State.RUNNING, Job.State.PENDING]).aggregate(
        running=Count("id", filter=Q(state=Job.State.RUNNING)),
        pending=Count("id", filter=Q(state=Job.State.PENDING)),
    )
    return TeamUsage(
        team=team.name,
        month=period.label,
        start=period.start,
        end=max(until, period.start).astimezone(period.start.tzinfo),
        device_hours=hours,
        total_device_hours=round(sum(hours.values()), 3),
        running_jobs=counts["running"] or 0,
        pending_jobs=counts["pending"] or 0,
    )


def devices_in_use(team: Team) -> dict[str, float]:
    """Card equivalents the team holds right now, by the policy's resource keys (``devices``, ``devices/<chip>``)."""
    used: dict[str, float] = {DEVICES: 0.0}
    rows = (
        Allocation.objects.filter(job__team=team, end__isnull=True)
        .values("device__chip_model")
        .annotate(share=Sum("device_share"))
        .order_by("device__chip_model")
    )
    for row in rows:
        share = round(float(row["share"] or 0.0), 3)
        used[chip_resource(row["device__chip_model"])] = share
        used[DEVICES] = round(used[DEVICES] + share, 3)
    return used
