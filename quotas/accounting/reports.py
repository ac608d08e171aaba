"""The numbers behind the reports page: every chart's data, aggregated by the database.

One call, :func:`report_data`, answers everything the page draws for one month
and a set of teams (a lead's teams, or all for finance):

- ``daily``: device-hours per team and day (each interval cut at the policy
  clock's midnights by ``CASE`` expressions, one grouped query per source);
- ``cost``: amount per team and chip model (the closed statements' lines, or
  the live bill of an open month);
- ``utilisation``: capacity, used, unused reservation and idle device-hours per
  chip model;
- ``quota``: device-hours used against the guarantee and the monthly cap;
- ``waits``: wait time (submit → start) per priority class as box statistics,
  with quartiles picked by window functions in the database;
- ``table``, ``users``, ``top_jobs``: the month to date per team (device-hours,
  cost, budget used), per user and the costliest jobs — who spent the budget
  (:mod:`quotas.accounting.breakdown`, which adds up to the statements).

Python only loops over grouped rows (teams × days, chips, classes), never over
usage records.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from django.db import connection
from django.db.models import Aggregate, Case, Count, Exists, F, FloatField, OuterRef, Q, QuerySet, Sum, When, Window
from django.db.models.functions import Cast, Coalesce, Greatest, Least, RowNumber

from quotas.accounting.breakdown import TOP_JOBS, Breakdown, job_counts, month_breakdown, top_jobs
from quotas.accounting.rates import SECONDS_PER_HOUR, ZERO
from quotas.accounting.records import EpochDiff, as_datetime
from quotas.accounting.statements import MonthBill, compute_month, is_closed
from quotas.models import Budget, StatementLine, Team, UsageRecord
from quotas.policies.versions import active_policy
from scheduling.engine.policy import zone
from scheduling.models import Allocation, Job
from scheduling.services.usage import Month

CLUSTER_LABEL = "cluster (idle)"


def month_days(month: Month, until: datetime) -> list[tuple[str, datetime, datetime]]:
    """The month's days on the policy clock, up to ``until``: (label, start, end)."""
    tz = month.start.tzinfo
    days = []
    day = month.start
    while day < until:
        nxt = datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(days=1)
        nxt = datetime(nxt.year, nxt.month, nxt.day, tzinfo=tz)  # midnight again across a DST change
        days.append((day.strftime("%Y-%m-%d"), day, min(nxt, until)))
        day = nxt
    return days


def _daily_sums(
    queryset: QuerySet, team_field: str, start: object, end: object, share: object, days: list
) -> list[dict[str, Any]]:
    columns = {}
    for i, (_, lo, hi) in enumerate(days):
        lo_v, hi_v = as_datetime(lo), as_datetime(hi)
        columns[f"d{i}"] = Sum(
            Case(
                When(
                    Q(**{f"{start}__lt": hi}) & Q(**{f"{end}__gt": lo}),
                    then=EpochDiff(Least(F(end), hi_v), Greatest(F(start), lo_v)) * share,
                ),
                output_field=FloatField(),  # no ELSE: SUM skips the NULLs instead of adding 30 zeros a row
            )
        )
    return list(queryset.values(team_field).annotate(**columns).order_by(team_field))


def daily_device_hours(month: Month, until: datetime, team_ids: list[int] | None) -> dict[str, Any]:
    """Device-hours per team and policy-clock day: records plus what is not recorded yet."""
    days = month_days(month, until)
    names = dict(Team.objects.values_list("id", "name"))
    result: dict[str, list[float]] = {}
    if days:
        records = UsageRecord.objects.filter(month=month.label, start__lt=until, end__gt=month.start)
        live = (
            Allocation.objects.filter(start__lt=until)
            .filter(Q(end__isnull=True) | Q(end__gt=month.start))
            .filter(~Exists(UsageRecord.objects.filter(allocation_id=OuterRef("pk"), month=month.label)))
            .annotate(live_end=Coalesce(F("end"), as_datetime(until)))
        )
        if team_ids is not None:
            records = records.filter(team_id__in=team_ids)
            live = live.filter(job__team_id__in=team_ids)
        share = Cast(F("device_share"), FloatField())
        rows = _daily_sums(records, "team_id", "start", "end", share, days)
        rows += _daily_sums(live, "job__team_id", "start", "live_end", share, days)
        for row in rows:
            team = names.get(row.get("team_id") or row.get("job__team_id"), "?")
            values = result.setdefault(team, [0.0] * len(days))
            for i in range(len(days)):
                values[i] += float(row[f"d{i}"] or 0.0) / 3600.0
    return {
        "days": [d[0] for d in days],
        "teams": {team: [round(v, 3) for v in values] for team, values in sorted(result.items())},
    }


def cost_by_team_and_chip(bill: MonthBill, closed: bool, team_ids: list[int] | None) -> dict[str, Any]:
    """Amounts per team and chip model: the closed statements' lines, or the live bill's."""
    names = dict(Team.objects.values_list("id", "name"))
    cost: dict[str, dict[str, float]] = {}
    if closed:
        lines = StatementLine.objects.filter(statement__month=bill.month.label)
        if team_ids is not None:
            lines = lines.filter(statement__team_id__in=team_ids)
        rows = lines.values("statement__team_id", "chip_model").annotate(amount=Sum("amount")).order_by()
        for row in rows:
            team = names.get(row["statement__team_id"], CLUSTER_LABEL)
            chip = row["chip_model"] or "adjustment"
            cost.setdefault(team, {})[chip] = round(float(row["amount"] or 0), 2)
    else:
        for line in bill.lines:
            if team_ids is not None and line.team_id not in team_ids:
                continue
            team = names.get(line.team_id, CLUSTER_LABEL) if line.team_id else CLUSTER_LABEL
            chip = line.chip_model or "adjustment"
            bucket = cost.setdefault(team, {})
            bucket[chip] = round(bucket.get(chip, 0.0) + float(line.amount), 2)
    chips = sorted({chip for per in cost.values() for chip in per})
    # The cluster's own charges (idle, unavailable capacity) are drawn on their own chart, so team costs
    # stay readable: ``team_names`` are the bars of the cost chart, ``idle`` the cluster's per chip.
    return {
        "teams": dict(sorted(cost.items())),
        "team_names": sorted(t for t in cost if t != CLUSTER_LABEL),
        "idle": cost.get(CLUSTER_LABEL, {}),
        "chips": chips,
        "currency": bill.currency,
    }


def utilisation(bill: MonthBill) -> dict[str, Any]:
    chips = sorted(bill.chips)

    def hours(values: list[Decimal]) -> list[float]:
        return [round(float(v / SECONDS_PER_HOUR), 3) for v in values]

    stats = [bill.chips[c] for c in chips]
    capacity = [s.capacity for s in stats]
    return {
        "chips": chips,
        "capacity": hours(capacity),
        "used": hours([s.used for s in stats]),
        "reserved_unused": hours([s.reserved_unused for s in stats]),
        "unavailable": hours([s.unavailable for s in stats]),
        "idle": hours([s.idle for s in stats]),  # idle excludes unused reservations and unavailable
        # idle and unavailable in `hide`: shown, not charged (the month's balance, docs/chargeback.md)
        "not_charged": [float(s.not_charged) for s in stats],
        "utilisation_pct": [round(float(s.used * 100 / s.capacity), 1) if s.capacity > 0 else 0.0 for s in stats],
    }


def quota_vs_usage(bill: MonthBill, teams: list[Team]) -> dict[str, Any]:
    """Device-hours used per team against guarantee × hours so far and the monthly device-hour cap."""
    policy = active_policy().policy
    window_h = (bill.until - bill.month.start).total_seconds() / 3600.0
    used: dict[int, Decimal] = {}
    for line in bill.lines:
        if line.kind == StatementLine.Kind.USAGE and line.team_id is not None:
            used[line.team_id] = used.get(line.team_id, Decimal(0)) + line.device_hours
    rows = []
    for team in sorted(teams, key=lambda t: t.name):
        quota = policy.team(team.name).quota
        guaranteed = float(quota.guaranteed.get("devices", 0.0))
        rows.append(
            {
                "team": team.name,
                "used": round(float(used.get(team.pk, Decimal(0))), 3),
                "guaranteed": round(guaranteed * window_h, 3),
                "cap": quota.device_hours_per_month,
            }
        )
    return {
        "teams": [r["team"] for r in rows],
        "used": [r["used"] for r in rows],
        "guaranteed": [r["guaranteed"] for r in rows],
        "cap": [r["cap"] for r in rows],
    }


QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)


class WaitQuantiles(Aggregate):
    """PostgreSQL: ``percentile_disc`` of the five box-plot quantiles in one sorted pass per group."""

    function = "percentile_disc"
    template = "%(function)s(ARRAY[0, 0.25, 0.5, 0.75, 1]::double precision[]) WITHIN GROUP (ORDER BY %(expressions)s)"

    def __init__(self, expression: object) -> None:
        from django.contrib.postgres.fields import ArrayField

        super().__init__(expression, output_field=ArrayField(FloatField()))


def _wait_quantiles_portable(jobs: QuerySet, counts: dict[str, int]) -> dict[str, list[float]]:
    """Any database: rank the waits per class with a window function and keep the quantiles' ranks.

    Nearest rank, the same as ``percentile_disc``: quantile p of n values is the
    value of rank max(1, ⌈p·n⌉).
    """
    wanted: dict[str, dict[int, list[int]]] = {}
    condition = Q()
    for cls, n in counts.items():
        positions: dict[int, list[int]] = {}
        for i, q in enumerate(QUANTILES):
            positions.setdefault(max(1, math.ceil(q * n)), []).append(i)
        wanted[cls] = positions
        condition |= Q(priority_class=cls, rank__in=list(positions))
    ranked = jobs.annotate(
        wait=EpochDiff(F("started_at"), F("submitted_at")),
        rank=Window(RowNumber(), partition_by=[F("priority_class")], order_by=[F("wait").asc(), F("id").asc()]),
    )
    stats: dict[str, list[float]] = {cls: [0.0] * len(QUANTILES) for cls in counts}
    for cls, rank, wait in ranked.filter(condition).values_list("priority_class", "rank", "wait"):
        for i in wanted[cls].get(rank, []):
            stats[cls][i] = float(wait or 0.0)
    return stats


def wait_times(month: Month, until: datetime, team_ids: list[int] | None) -> dict[str, Any]:
    """Per priority class: minimum, quartiles (nearest rank) and maximum of the wait in minutes; n jobs."""
    jobs = Job.objects.filter(started_at__gte=month.start, started_at__lt=until)
    if team_ids is not None:
        jobs = jobs.filter(team_id__in=team_ids)
    if connection.vendor == "postgresql":
        rows = (
            jobs.values("priority_class")
            .annotate(n=Count("id"), q=WaitQuantiles(EpochDiff(F("started_at"), F("submitted_at"))))
            .order_by()
        )
        counts = {r["priority_class"]: r["n"] for r in rows}
        stats = {r["priority_class"]: [float(v) for v in r["q"]] for r in rows}
    else:
        counts = dict(jobs.values("priority_class").annotate(n=Count("id")).values_list("priority_class", "n"))
        stats = _wait_quantiles_portable(jobs, counts) if counts else {}
    order = {pc.name: pc.rank for pc in active_policy().policy.priority_classes}
    classes = {}
    for cls, values in sorted(stats.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])):
        minutes = [round(max(v, 0.0) / 60.0, 2) for v in values]
        classes[cls] = dict(zip(("min", "q1", "median", "q3", "max"), minutes, strict=True)) | {"n": counts[cls]}
    return {"classes": classes}


def _money(value: Decimal) -> str:
    return f"{value:.2f}"


def _hours(value: Decimal) -> str:
    return f"{value:.1f}"


def team_table(breakdown: Breakdown, teams: list[Team], *, with_cluster: bool) -> list[dict[str, Any]]:
    """Per team: device-hours used, everything charged to it (usage and its shares), its budget and % used."""
    hours: dict[str, Decimal] = {}
    cost: dict[str, Decimal] = {}
    for piece in breakdown.pieces:
        if piece.kind == StatementLine.Kind.USAGE:
            hours[piece.team] = hours.get(piece.team, ZERO) + piece.device_hours
        cost[piece.team] = cost.get(piece.team, ZERO) + piece.amount
    budgets = dict(Budget.objects.filter(team__in=teams).values_list("team__name", "monthly_amount"))
    rows = []
    for team in sorted(teams, key=lambda t: t.name):
        budget = budgets.get(team.name)
        spent = cost.get(team.name, ZERO)
        rows.append(
            {
                "team": team.name,
                "device_hours": _hours(hours.get(team.name, ZERO)),
                "cost": _money(spent),
                "budget": _money(budget) if budget is not None else "",
                "budget_pct": f"{spent * 100 / budget:.0f}" if budget else "",
            }
        )
    if with_cluster:
        from quotas.accounting.statements import CLUSTER

        if cost.get(CLUSTER):
            rows.append(
                {"team": CLUSTER, "device_hours": "", "cost": _money(cost[CLUSTER]), "budget": "", "budget_pct": ""}
            )
    return rows


def month_pieces(label: str, teams: list[Team] | None) -> tuple[MonthBill, Breakdown]:
    """A month's bill (every team's, so shares are right) and its breakdown for ``teams`` (None: all)."""
    closed = is_closed(label)
    bill = compute_month(label, live=not closed)
    return bill, month_breakdown(bill, closed=closed, team_ids=None if teams is None else [t.pk for t in teams])


def report_data(label: str | None, *, now: datetime | None = None, teams: list[Team] | None = None) -> dict[str, Any]:
    """Everything the reports page draws for ``label`` (default this month); ``teams`` None means all teams."""
    team_ids = None if teams is None else [t.pk for t in teams]
    closed = bool(label) and is_closed(label or "")
    bill = compute_month(label, now=now, live=not closed)
    month = bill.month
    shown = list(Team.objects.order_by("name")) if teams is None else teams
    tz = zone(bill.timezone)
    breakdown = month_breakdown(bill, closed=closed, team_ids=team_ids, by_job=False)
    users = breakdown.per_user(job_counts(bill, team_ids))
    jobs = top_jobs(bill, closed=closed, team_ids=team_ids, n=TOP_JOBS)
    return {
        "month": month.label,
        "timezone": bill.timezone,
        "window": [month.start.isoformat(), bill.until.astimezone(tz).isoformat()],
        "closed": closed,
        "complete": bill.complete,
        "currency": bill.currency,
        "idle_mode": bill.idle_mode,
        "reserved_mode": bill.reserved_mode,
        "warnings": bill.warnings,
        "daily": daily_device_hours(month, bill.until, team_ids),
        "cost": cost_by_team_and_chip(bill, closed, team_ids),
        "utilisation": utilisation(bill),
        "quota": quota_vs_usage(bill, shown),
        "waits": wait_times(month, bill.until, team_ids),
        "table": team_table(breakdown, shown, with_cluster=teams is None),
        "users": [{**u, "device_hours": _hours(u["device_hours"]), "amount": _money(u["amount"])} for u in users],
        "top_jobs": [{**j, "device_hours": _hours(j["device_hours"]), "amount": _money(j["amount"])} for j in jobs],
        "has_usage": bool(users),
    }
