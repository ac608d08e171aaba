"""Who spent the budget: a month's usage per team, user and job, priced so it adds up to the statements.

A statement's usage line is one team's device-hours of one chip (or vNPU
template) and priority class under one rate card. :func:`month_breakdown`
cuts each such line into the (user, job) pieces it is made of: the
device-seconds come from the same usage records (plus, for an open month,
what is not recorded yet), grouped by the database; the line's amount is
computed exactly as the statement computes it and then split among its pieces
by their device-seconds, to the cent, largest remainder first
(:func:`~quotas.accounting.rates.split_exactly`). So the per-user table, the
top jobs and the CSV exports add up to the statement's usage lines to the
cent, whatever the rounding of each piece.

Charges that belong to no user (unused reservations, idle capacity, other
capacity lines and adjustments) are taken as they are from the month's bill,
or from the closed statements, with an empty user.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal

from django.contrib.auth import get_user_model
from django.db.models import Case, Count, DateTimeField, Exists, F, FloatField, OuterRef, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Cast, Coalesce, Greatest, Least

from quotas.accounting.rates import (
    CENT,
    HOURS_PLACES,
    ONE,
    SECONDS_QUANTUM,
    ZERO,
    PricingPeriod,
    card_share,
    device_hours,
    line_amount,
    pricing_periods,
    split_exactly,
)
from quotas.accounting.records import as_datetime, seconds_of
from quotas.accounting.statements import MonthBill
from quotas.models import StatementLine, Team, UsageRecord
from scheduling.engine.policy import zone
from scheduling.models import Allocation, Job

TOP_JOBS = 10


@dataclass
class Piece:
    """One (team, user, job) share of one usage line: its device-hours and its part of the line's amount."""

    team: str
    user: str
    job_id: int | None
    job_name: str
    chip_model: str
    vnpu_template: str
    priority_class: str
    kind: str
    device_hours: Decimal
    rate: Decimal
    multiplier: Decimal
    amount: Decimal


@dataclass
class Breakdown:
    """A month's charges, piece by piece, for the teams asked (or all)."""

    pieces: list[Piece] = field(default_factory=list)

    def usage(self) -> list[Piece]:
        return [p for p in self.pieces if p.kind == StatementLine.Kind.USAGE]

    def per_user(self, job_counts: dict[tuple[str, str], int] | None = None) -> list[dict[str, object]]:
        """Usage per team and user, largest amount first within each team.

        ``jobs`` counts the jobs of job-level pieces, or comes from ``job_counts`` ((team, user) → jobs).
        """
        sums: dict[tuple[str, str], list[Decimal]] = defaultdict(lambda: [ZERO, ZERO])
        jobs: dict[tuple[str, str], set[int]] = defaultdict(set)
        for p in self.usage():
            entry = sums[(p.team, p.user)]
            entry[0] += p.device_hours
            entry[1] += p.amount
            if p.job_id is not None:
                jobs[(p.team, p.user)].add(p.job_id)
        counts = job_counts or {}
        rows = [
            {"team": t, "user": u, "device_hours": h, "amount": a, "jobs": counts.get((t, u), len(jobs[(t, u)]))}
            for (t, u), (h, a) in sums.items()
        ]
        return sorted(rows, key=lambda r: (r["team"], -r["amount"], r["user"]))  # type: ignore[operator]

    def per_job(self) -> list[dict[str, object]]:
        """Usage per job, largest amount first (ties: newest job first)."""
        sums: dict[int | None, dict[str, object]] = {}
        for p in self.usage():
            row = sums.get(p.job_id)
            if row is None:
                row = sums[p.job_id] = {
                    "job_id": p.job_id,
                    "name": p.job_name,
                    "team": p.team,
                    "user": p.user,
                    "priority_class": p.priority_class,
                    "devices": set(),
                    "device_hours": ZERO,
                    "amount": ZERO,
                }
            row["devices"].add((p.vnpu_template and f"{p.chip_model}/{p.vnpu_template}") or p.chip_model)  # type: ignore[attr-defined]
            row["device_hours"] += p.device_hours  # type: ignore[operator]
            row["amount"] += p.amount  # type: ignore[operator]
        rows = []
        for row in sums.values():
            row["devices"] = ", ".join(sorted(row["devices"]))  # type: ignore[call-overload]
            rows.append(row)
        return sorted(rows, key=lambda r: (-r["amount"], -(r["job_id"] or 0)))  # type: ignore[operator]


@dataclass(frozen=True, order=True)
class _Key:
    team_id: int
    user_id: int
    job_id: int
    chip_model: str
    vnpu_template: str
    priority_class: str
    device_share: Decimal


_RECORD_FIELDS = ("team_id", "user_id", "job_id", "chip_model", "vnpu_template", "priority_class", "device_share")
_ALLOCATION_FIELDS = (
    "job__team_id",
    "job__submitter_id",
    "job_id",
    "device__chip_model",
    "vnpu_template__name",
    "job__priority_class",
    "device_share",
)


def _grouped(queryset: QuerySet, fields: tuple[str, ...], held: object, *, by_job: bool) -> dict[_Key, Decimal]:
    """Grouped sums of ``held``; without ``by_job`` jobs are not told apart (job 0), far fewer rows."""
    found: dict[_Key, Decimal] = {}
    names = [f for i, f in enumerate(fields) if by_job or i != 2]
    for row in queryset.values(*names).annotate(held=Sum(held)).order_by():
        key = _Key(
            team_id=row[fields[0]],
            user_id=row[fields[1]] or 0,
            job_id=(row[fields[2]] or 0) if by_job else 0,
            chip_model=row[fields[3]] or "",
            vnpu_template=row[fields[4]] or "",
            priority_class=row[fields[5]] or "",
            device_share=card_share(row[fields[6]]),
        )
        found[key] = found.get(key, ZERO) + seconds_of(row["held"])
    return found


def usage_by_job(
    month_label: str,
    start: datetime,
    end: datetime,
    *,
    live: bool,
    team_ids: list[int] | None,
    by_job: bool = True,
    job_ids: list[int] | None = None,
) -> dict[_Key, Decimal]:
    """Seconds held in ``[start, end)`` per team, user, job, chip, template, class and card share.

    The same sources as :func:`quotas.accounting.records.usage_seconds` (records,
    and with ``live`` what is not recorded yet), one more level of grouping.
    ``job_ids`` keeps only those jobs.
    """
    if end <= start:
        return {}
    lo, hi = as_datetime(start), as_datetime(end)
    records = UsageRecord.objects.filter(month=month_label, start__lt=end, end__gt=start)
    if team_ids is not None:
        records = records.filter(team_id__in=team_ids)
    if job_ids is not None:
        records = records.filter(job_id__in=job_ids)
    found = _grouped(records, _RECORD_FIELDS, Least(F("end"), hi) - Greatest(F("start"), lo), by_job=by_job)
    if live:
        recorded = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), month=month_label)
        allocations = (
            Allocation.objects.filter(start__lt=end)
            .filter(Q(end__isnull=True) | Q(end__gt=start))
            .filter(~Exists(recorded))
        )
        if team_ids is not None:
            allocations = allocations.filter(job__team_id__in=team_ids)
        if job_ids is not None:
            allocations = allocations.filter(job_id__in=job_ids)
        open_end = Least(Coalesce(F("end"), hi, output_field=DateTimeField()), hi)
        held = open_end - Greatest(F("start"), lo)
        for key, seconds in _grouped(allocations, _ALLOCATION_FIELDS, held, by_job=by_job).items():
            found[key] = found.get(key, ZERO) + seconds
    return {k: v for k, v in found.items() if v > 0}


def _rate(period: PricingPeriod, chip: str, template: str) -> Decimal:
    price = period.price(chip, template)
    return ZERO if price is None else price


def month_breakdown(
    bill: MonthBill,
    *,
    closed: bool,
    team_ids: list[int] | None,
    by_job: bool = True,
    job_ids: list[int] | None = None,
) -> Breakdown:
    """The month of ``bill`` cut into pieces per team, user and job (see the module's docstring).

    ``by_job=False`` stops at users (one row per user and price instead of one per job: what the
    reports page needs, cheap at a million records). ``job_ids`` prices only those jobs, each
    line then split among them alone (the page's top jobs); no other charges are added then.
    """
    month = bill.month
    tz = zone(bill.timezone)
    team_names = dict(Team.objects.values_list("id", "name"))
    # (team, chip, template, class, rate, multiplier, card) -> {(user, job): device-seconds}: a statement line each
    lines: dict[tuple[int, str, str, str, Decimal, Decimal, int], dict[tuple[int, int], Decimal]] = defaultdict(
        lambda: defaultdict(lambda: ZERO)
    )
    for period in pricing_periods(month.start, bill.until, tz):
        card_id = period.card.pk if period.card is not None else 0
        for key, seconds in usage_by_job(
            month.label, period.start, period.end, live=not closed, team_ids=team_ids, by_job=by_job, job_ids=job_ids
        ).items():
            line = (
                key.team_id,
                key.chip_model,
                key.vnpu_template,
                key.priority_class,
                _rate(period, key.chip_model, key.vnpu_template),
                period.multiplier(key.priority_class),
                card_id,
            )
            lines[line][(key.user_id, key.job_id)] += seconds * key.device_share
    user_ids = {u for parts in lines.values() for u, _ in parts}
    found_jobs = {j for parts in lines.values() for _, j in parts}
    users = dict(get_user_model().objects.filter(pk__in=user_ids).values_list("id", "username"))
    jobs = dict(Job.objects.filter(pk__in=found_jobs).values_list("id", "name"))
    result = Breakdown()
    merged: dict[tuple[object, ...], Piece] = {}
    for (team_id, chip, template, cls, rate, multiplier, _card), parts in sorted(lines.items(), key=str):
        total_seconds = sum(parts.values(), ZERO)
        hours = device_hours(total_seconds)
        amount = line_amount(hours, rate, multiplier)
        # The line's seconds, hours and amount split among its pieces so each adds up exactly.
        seconds_split = split_exactly(total_seconds, parts, SECONDS_QUANTUM)
        hours_split = split_exactly(hours, seconds_split, HOURS_PLACES)
        amount_split = split_exactly(amount, seconds_split, CENT)
        for user_id, job_id in sorted(parts):
            piece_key = (team_id, user_id, job_id, chip, template, cls, rate, multiplier)
            piece = merged.get(piece_key)
            if piece is None:
                piece = merged[piece_key] = Piece(
                    team=team_names.get(team_id, "?"),
                    user=users.get(user_id, ""),
                    job_id=job_id or None,
                    job_name=jobs.get(job_id, ""),
                    chip_model=chip,
                    vnpu_template=template,
                    priority_class=cls,
                    kind=StatementLine.Kind.USAGE,
                    device_hours=ZERO,
                    rate=rate,
                    multiplier=multiplier,
                    amount=ZERO,
                )
            piece.device_hours += hours_split.get((user_id, job_id), ZERO)
            piece.amount += amount_split.get((user_id, job_id), ZERO)
    result.pieces = sorted(
        merged.values(), key=lambda p: (p.team, p.user, p.chip_model, p.vnpu_template, p.priority_class, p.job_id or 0)
    )
    if job_ids is None:
        result.pieces += _other_charges(bill, closed=closed, team_ids=team_ids, team_names=team_names)
    return result


def job_counts(bill: MonthBill, team_ids: list[int] | None) -> dict[tuple[str, str], int]:
    """(team, user) → jobs that held a device in the month's counted window (one grouped query)."""
    month = bill.month
    held = Allocation.objects.filter(job_id=OuterRef("pk"), start__lt=bill.until).filter(
        Q(end__isnull=True) | Q(end__gt=month.start)
    )
    jobs = Job.objects.filter(Exists(held))
    if team_ids is not None:
        jobs = jobs.filter(team_id__in=team_ids)
    rows = jobs.values("team__name", "submitter__username").annotate(n=Count("id")).order_by()
    return {(r["team__name"], r["submitter__username"] or ""): r["n"] for r in rows}


def _estimate(period: PricingPeriod, chip: str, template: str, cls: str) -> Case:
    """Price × multiplier of each row as a float, by the database: good enough to rank jobs."""
    by_template = [When(Q(**{chip: c, template: t}), then=Value(float(p))) for (c, t), p in period.prices.items() if t]
    by_chip = [When(Q(**{chip: c}), then=Value(float(p))) for (c, t), p in period.prices.items() if not t]
    price = Case(*by_template, *by_chip, default=Value(0.0), output_field=FloatField())
    factor = Case(
        *(When(Q(**{cls: k}), then=Value(float(m))) for k, m in period.multipliers.items()),
        default=Value(1.0),
        output_field=FloatField(),
    )
    return price * factor  # type: ignore[return-value]


def top_jobs(
    bill: MonthBill, *, closed: bool, team_ids: list[int] | None, n: int = TOP_JOBS
) -> list[dict[str, object]]:
    """The ``n`` costliest jobs of the month, without pricing every job.

    The database ranks jobs by an estimate (float device-seconds × the chip's price × the class's
    multiplier, summed per job, ``ORDER BY … LIMIT``); the candidates (``3 n`` from each rate-card
    period and source) are then priced exactly by :func:`month_breakdown`, each statement line
    split among the candidates alone. So a job's amount is its own share to the cent, and can
    differ by a cent from the per-job CSV, which splits whole lines among all jobs.
    """
    from quotas.accounting.records import EpochDiff

    month = bill.month
    candidates: set[int] = set()
    share = Cast(F("device_share"), FloatField())
    for period in pricing_periods(month.start, bill.until, zone(bill.timezone)):
        lo, hi = as_datetime(period.start), as_datetime(period.end)
        records = UsageRecord.objects.filter(month=month.label, start__lt=period.end, end__gt=period.start)
        if team_ids is not None:
            records = records.filter(team_id__in=team_ids)
        records = records.annotate(
            est=EpochDiff(Least(F("end"), hi), Greatest(F("start"), lo))
            * share
            * _estimate(period, "chip_model", "vnpu_template", "priority_class")
        )
        sources = [records]
        if not closed:
            recorded = UsageRecord.objects.filter(allocation_id=OuterRef("pk"), month=month.label)
            live = (
                Allocation.objects.filter(start__lt=period.end)
                .filter(Q(end__isnull=True) | Q(end__gt=period.start))
                .filter(~Exists(recorded))
            )
            if team_ids is not None:
                live = live.filter(job__team_id__in=team_ids)
            live_end = Least(Coalesce(F("end"), hi, output_field=DateTimeField()), hi)
            sources.append(
                live.annotate(
                    est=EpochDiff(live_end, Greatest(F("start"), lo))
                    * share
                    * _estimate(period, "device__chip_model", "vnpu_template__name", "job__priority_class")
                )
            )
        for queryset in sources:
            ranked = (
                queryset.filter(job_id__isnull=False)
                .values("job_id")
                .annotate(total=Sum("est"))
                .order_by("-total", "-job_id")
                .values_list("job_id", flat=True)
            )
            candidates.update(ranked[: 3 * n])
    if not candidates:
        return []
    exact = month_breakdown(bill, closed=closed, team_ids=team_ids, job_ids=sorted(candidates))
    return exact.per_job()[:n]


def _other_charges(
    bill: MonthBill, *, closed: bool, team_ids: list[int] | None, team_names: dict[int, str]
) -> list[Piece]:
    """Every charge of the month that is not usage, as the bill (open month) or the statements (closed) have it."""
    from quotas.accounting.statements import CLUSTER

    pieces = []
    if closed:
        rows = StatementLine.objects.filter(statement__month=bill.month.label).exclude(kind=StatementLine.Kind.USAGE)
        if team_ids is not None:
            rows = rows.filter(statement__team_id__in=team_ids)
        found = [
            (
                r.statement.team_id,
                r.kind,
                r.chip_model,
                r.vnpu_template,
                r.priority_class,
                r.device_hours,
                r.rate,
                r.multiplier,
                r.amount,
            )
            for r in rows.select_related("statement").order_by("statement__team__name", "id")
        ]
    else:
        found = [
            (
                ln.team_id,
                ln.kind,
                ln.chip_model,
                ln.vnpu_template,
                ln.priority_class,
                ln.device_hours,
                ln.rate,
                ln.multiplier,
                ln.amount,
            )
            for ln in bill.lines
            if ln.kind != StatementLine.Kind.USAGE and (team_ids is None or ln.team_id in team_ids)
        ]
    for team_id, kind, chip, template, cls, hours, rate, multiplier, amount in found:
        pieces.append(
            Piece(
                team=team_names.get(team_id, "?") if team_id else CLUSTER,
                user="",
                job_id=None,
                job_name="",
                chip_model=chip,
                vnpu_template=template,
                priority_class=cls,
                kind=kind,
                device_hours=hours,
                rate=rate,
                multiplier=multiplier if multiplier is not None else ONE,
                amount=amount,
            )
        )
    return pieces
