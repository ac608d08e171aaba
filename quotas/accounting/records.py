"""Usage records: every allocation interval, split at month boundaries, written once by a sweep.

Nothing in the scheduler calls into accounting: allocations are closed in many
places (a job finishes, fails, is cancelled, requeued, preempted or evicted),
and all of them set ``Allocation.end``. :func:`record_closed_allocations` runs
every minute (Celery beat) and at the monthly close, and writes a
:class:`~quotas.models.UsageRecord` for each month an allocation with an end
touched, unless that (allocation, month) already has one: a unique key, so a
retried or concurrent sweep never counts an interval twice.

Months are calendar months on the active policy's clock. A still-running
allocation is only recorded at a month close, for the months that are over
(:func:`record_open_allocations`), so a job running across midnight of the
1st is charged to both months; the rest is written once it ends. Live views
add what is not recorded yet (:func:`usage_seconds` with ``live=True``), so
nothing is stored for running jobs before the close.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.db.models import (
    DateTimeField,
    Exists,
    F,
    FloatField,
    Func,
    OuterRef,
    Q,
    QuerySet,
    Sum,
    Value,
)
from django.db.models.functions import Coalesce, Greatest, Least

from quotas.accounting.rates import card_share
from quotas.models import UsageRecord
from quotas.policies.versions import active_policy
from scheduling.engine.policy import Policy
from scheduling.models import Allocation
from scheduling.services.usage import Month, month_of

BATCH = 2000


class EpochDiff(Func):
    """Seconds from ``start`` to ``end`` as a float, computed by the database (for charts, not bills).

    PostgreSQL: ``EXTRACT(EPOCH FROM end - start)``; SQLite: the difference of
    Julian days × 86400. Both are native (no per-row Python function), so a
    grouped sum over a million rows stays in the database's C code.
    """

    output_field = FloatField()
    arity = 2

    def as_sql(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        return super().as_sql(
            compiler,
            connection,
            template="CAST(EXTRACT(EPOCH FROM (%(expressions)s)) AS double precision)",
            arg_joiner=" - ",
            **extra,
        )

    def as_sqlite(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        end, start = self.source_expressions
        end_sql, end_params = compiler.compile(end)
        start_sql, start_params = compiler.compile(start)
        return f"((julianday({end_sql}) - julianday({start_sql})) * 86400.0)", (*end_params, *start_params)


def as_datetime(value: datetime) -> Value:
    return Value(value, output_field=DateTimeField())


def seconds_of(value: timedelta | None) -> Decimal:
    """A duration as exact decimal seconds (microseconds kept)."""
    if not value:
        return Decimal(0)
    return Decimal(value.days * 86400 + value.seconds) + Decimal(value.microseconds) / Decimal(1_000_000)


def months_overlapping(policy: Policy, start: datetime, end: datetime) -> list[Month]:
    """The policy-clock months ``[start, end]`` touches; one month for an empty interval."""
    months = [month_of(policy, start)]
    while months[-1].end < end:
        months.append(month_of(policy, months[-1].end))
    return months


def _pieces(policy: Policy, row: dict[str, object], *, up_to: Month | None = None) -> list[UsageRecord]:
    start: datetime = row["start"]  # type: ignore[assignment]
    end: datetime | None = row["end"]  # type: ignore[assignment]
    if up_to is not None:
        end = up_to.end if end is None else min(end, up_to.end)
    assert end is not None
    end = max(end, start)
    share = card_share(row["device_share"])  # type: ignore[arg-type]
    records = []
    for month in months_overlapping(policy, start, end):
        if up_to is not None and month.start >= up_to.end:
            break
        records.append(
            UsageRecord(
                allocation_id=row["id"],
                month=month.label,
                team_id=row["job__team_id"],
                user_id=row["job__submitter_id"],
                job_id=row["job_id"],
                chip_model=row["device__chip_model"],
                vnpu_template=row["vnpu_template__name"] or "",
                device_share=share,
                priority_class=row["job__priority_class"],
                start=max(start, month.start),
                end=min(end, month.end),
            )
        )
    return records


_FIELDS = (
    "id",
    "start",
    "end",
    "device_share",
    "device__chip_model",
    "vnpu_template__name",
    "job_id",
    "job__team_id",
    "job__submitter_id",
    "job__priority_class",
)


def unrecorded_closed_allocations() -> QuerySet[Allocation]:
    """Allocations with an end and no record reaching that end (their last month is not written yet)."""
    done = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), end__gte=OuterRef("end"))
    return Allocation.objects.filter(end__isnull=False).filter(~Exists(done))


def _write(policy: Policy, queryset: QuerySet[Allocation], *, up_to: Month | None = None) -> int:
    written = 0
    last = 0
    while True:
        rows = list(queryset.filter(id__gt=last).order_by("id").values(*_FIELDS)[:BATCH])
        if not rows:
            return written
        last = rows[-1]["id"]
        records = [r for row in rows for r in _pieces(policy, row, up_to=up_to)]
        # Existing (allocation, month) pairs are skipped by the unique key: a retry counts nothing twice.
        UsageRecord.objects.bulk_create(records, ignore_conflicts=True, batch_size=BATCH)
        written += len(records)


def record_closed_allocations(*, policy: Policy | None = None) -> int:
    """Write the usage records of every closed allocation that has none yet; returns the pieces attempted.

    Idempotent and safe to run concurrently: the unique (allocation, month) key
    drops duplicates.
    """
    policy = policy or active_policy().policy
    return _write(policy, unrecorded_closed_allocations())


def record_open_allocations(month: Month, *, policy: Policy | None = None) -> int:
    """At a month close: record still-open allocations up to the end of ``month`` (and earlier months).

    The part after the month is written by the sweep once the allocation ends.
    """
    policy = policy or active_policy().policy
    missing = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), month=month.label)
    open_ones = Allocation.objects.filter(start__lt=month.end).filter(Q(end__isnull=True) | Q(end__gt=month.end))
    return _write(policy, open_ones.filter(~Exists(missing)), up_to=month)


@dataclass(frozen=True, order=True)
class UsageKey:
    """What a stretch of usage is priced by: who, which chip (and slice), which class, which card share."""

    team_id: int
    chip_model: str
    vnpu_template: str
    priority_class: str
    device_share: Decimal


def _group(queryset: QuerySet, names: dict[str, str], held: object) -> dict[UsageKey, Decimal]:
    rows = queryset.values(*names.values()).annotate(held=Sum(held)).order_by()
    found: dict[UsageKey, Decimal] = {}
    for row in rows:
        key = UsageKey(
            team_id=row[names["team_id"]],
            chip_model=row[names["chip_model"]] or "",
            vnpu_template=row[names["vnpu_template"]] or "",
            priority_class=row[names["priority_class"]] or "",
            device_share=card_share(row[names["device_share"]]),
        )
        found[key] = found.get(key, Decimal(0)) + seconds_of(row["held"])
    return found


def usage_seconds(
    month: Month,
    start: datetime,
    end: datetime,
    *,
    live: bool = False,
    team_ids: list[int] | None = None,
) -> dict[UsageKey, Decimal]:
    """Exact seconds held in ``[start, end)`` (inside ``month``), grouped by :class:`UsageKey`.

    Multiply by ``key.device_share`` for device-seconds. ``live`` adds what is
    not recorded yet: allocations still open (counted up to ``end``) and closed
    ones the sweep has not reached. The sums are done by the database: one
    grouped query per source, whatever the number of records.
    """
    if end <= start:
        return {}
    lo, hi = as_datetime(start), as_datetime(end)
    records = UsageRecord.objects.filter(month=month.label, start__lt=end, end__gt=start)
    if team_ids is not None:
        records = records.filter(team_id__in=team_ids)
    held = Least(F("end"), hi) - Greatest(F("start"), lo)
    found = _group(
        records,
        {
            "team_id": "team_id",
            "chip_model": "chip_model",
            "vnpu_template": "vnpu_template",
            "priority_class": "priority_class",
            "device_share": "device_share",
        },
        held,
    )
    if live:
        recorded = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), month=month.label)
        allocations = (
            Allocation.objects.filter(start__lt=end)
            .filter(Q(end__isnull=True) | Q(end__gt=start))
            .filter(~Exists(recorded))
        )
        if team_ids is not None:
            allocations = allocations.filter(job__team_id__in=team_ids)
        open_end = Least(Coalesce(F("end"), hi, output_field=DateTimeField()), hi)
        more = _group(
            allocations,
            {
                "team_id": "job__team_id",
                "chip_model": "device__chip_model",
                "vnpu_template": "vnpu_template__name",
                "priority_class": "job__priority_class",
                "device_share": "device_share",
            },
            open_end - Greatest(F("start"), lo),
        )
        for key, seconds in more.items():
            found[key] = found.get(key, Decimal(0)) + seconds
    return {k: v for k, v in found.items() if v > 0}
