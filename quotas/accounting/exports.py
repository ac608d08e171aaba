"""Closed statements out: CSV, JSON, a printable HTML page and a PDF with its charts.

The same rows feed the console download, the API and ``manage.py chargeback
export``, so the three can never disagree. Amounts are written as decimal
strings ("1843.20"), never floats. Every CSV goes through
:mod:`npuportal.csv_export`: a name that starts like a spreadsheet formula gets
a ``'`` in front, numbers stay numbers.

The PDF is the printable page rendered by WeasyPrint, its two charts drawn as
SVG by :mod:`quotas.accounting.statement_charts`: no browser, so a one-page
statement is ready in well under a second.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.template.loader import render_to_string
from django.utils import timezone

from npuportal import csv_export
from quotas.accounting.breakdown import Breakdown
from quotas.accounting.reports import daily_device_hours
from quotas.accounting.statements import CLUSTER
from quotas.models import Statement, StatementLine
from quotas.policies.versions import active_policy
from scheduling.services.usage import month_of

log = logging.getLogger(__name__)
# WeasyPrint and fontTools narrate every step at INFO: keep the console's log readable.
for _chatty in ("weasyprint", "fontTools"):
    logging.getLogger(_chatty).setLevel(logging.WARNING)

CSV_COLUMNS = [
    "team",
    "month",
    "currency",
    "kind",
    "chip_model",
    "vnpu_template",
    "priority_class",
    "device_hours",
    "rate",
    "multiplier",
    "amount",
    "description",
    "rate_card_id",
    "statement_total",
    "closed_at",
]


def team_label(statement: Statement) -> str:
    return statement.team.name if statement.team_id else CLUSTER


def statement_dict(statement: Statement, lines: Iterable[StatementLine] | None = None) -> dict[str, Any]:
    """A statement as the JSON export and the API give it; the cluster's carries the month's balance.

    ``balance`` (docs/api.md): per chip model, provisioned = used + unused reservations + unavailable +
    idle, the amount at the rate, what the statements charge and what they do not; empty on a team's.
    """
    lines = list(statement.lines.order_by("id")) if lines is None else list(lines)
    balance = statement.balance or {}
    not_charged = sum((Decimal(chip.get("not_charged", "0")) for chip in balance.values()), Decimal("0.00"))
    return {
        "team": team_label(statement),
        "month": statement.month,
        "currency": statement.currency,
        "idle_mode": statement.idle_mode,
        "reserved_mode": statement.reserved_mode,
        "rate_card_ids": statement.rate_card_ids,
        "policy_version": statement.policy_version,
        "timezone": statement.timezone,
        "total": str(statement.total),
        "closed_at": statement.closed_at.isoformat() if statement.closed_at else None,
        "lines": [
            {
                "kind": line.kind,
                "chip_model": line.chip_model,
                "vnpu_template": line.vnpu_template,
                "priority_class": line.priority_class,
                "device_hours": str(line.device_hours),
                "rate": str(line.rate),
                "multiplier": str(line.multiplier),
                "amount": str(line.amount),
                "description": line.description,
                "rate_card_id": line.rate_card_id,
            }
            for line in lines
        ],
        "balance": balance,
        "not_charged": str(not_charged),
    }


def _with_lines(statements: Iterable[Statement]) -> list[Statement]:
    return list(
        Statement.objects.filter(pk__in=[s.pk for s in statements])
        .select_related("team")
        .prefetch_related("lines")
        .order_by("month", "team__name")
    )


def to_json(statements: Iterable[Statement]) -> str:
    rows = [statement_dict(s, s.lines.all()) for s in _with_lines(statements)]
    return json.dumps(rows, indent=2) + "\n"


def to_csv(statements: Iterable[Statement]) -> str:
    out = io.StringIO()
    writer = csv_export.writer(out)
    writer.writerow(CSV_COLUMNS)
    for s in _with_lines(statements):
        for line in s.lines.all():
            writer.writerow(
                [
                    team_label(s),
                    s.month,
                    s.currency,
                    line.kind,
                    line.chip_model,
                    line.vnpu_template,
                    line.priority_class,
                    line.device_hours,
                    line.rate,
                    line.multiplier,
                    line.amount,
                    line.description,
                    line.rate_card_id or "",
                    s.total,
                    s.closed_at.isoformat() if s.closed_at else "",
                ]
            )
    return out.getvalue()


#: The month's charges for finance: one row per team, user, chip (or template), class, kind and price.
MONTH_CSV_COLUMNS = [
    "month",
    "team",
    "user",
    "chip_model",
    "vnpu_template",
    "priority_class",
    "kind",
    "device_hours",
    "rate",
    "multiplier",
    "amount",
    "currency",
]
#: A lead's jobs of the month, costliest first.
JOBS_CSV_COLUMNS = [
    "month",
    "job_id",
    "name",
    "team",
    "user",
    "priority_class",
    "devices",
    "device_hours",
    "amount",
    "currency",
]


def month_csv(month: str, currency: str, breakdown: Breakdown) -> str:
    """Usage per team and user (and the charges of no user: idle, reservations, adjustments) as CSV.

    Job-level pieces of the same user and price are summed; the amounts add up to the
    statements' lines to the cent (:mod:`quotas.accounting.breakdown`).
    """
    rows: dict[tuple[object, ...], list[Decimal]] = {}
    for p in breakdown.pieces:
        key = (p.team, p.user, p.chip_model, p.vnpu_template, p.priority_class, p.kind, p.rate, p.multiplier)
        entry = rows.setdefault(key, [Decimal(0), Decimal(0)])
        entry[0] += p.device_hours
        entry[1] += p.amount
    out = io.StringIO()
    writer = csv_export.writer(out)
    writer.writerow(MONTH_CSV_COLUMNS)
    for (team, user, chip, template, cls, kind, rate, multiplier), (hours, amount) in rows.items():
        writer.writerow([month, team, user, chip, template, cls, kind, hours, rate, multiplier, amount, currency])
    return out.getvalue()


def jobs_csv(month: str, currency: str, breakdown: Breakdown) -> str:
    out = io.StringIO()
    writer = csv_export.writer(out)
    writer.writerow(JOBS_CSV_COLUMNS)
    for job in breakdown.per_job():
        writer.writerow([month, *(job[c] if job[c] is not None else "" for c in JOBS_CSV_COLUMNS[1:-1]), currency])
    return out.getvalue()


# -- printable statement ------------------------------------------------------------


def statement_context(statement: Statement) -> dict[str, Any]:
    """What the printable page and the PDF show: the lines, subtotals per kind, and two charts' data."""
    lines = list(statement.lines.order_by("id"))
    by_kind: dict[str, Decimal] = {}
    by_chip: dict[str, Decimal] = {}
    for line in lines:
        by_kind[line.kind] = by_kind.get(line.kind, Decimal("0.00")) + line.amount
        chip = line.chip_model or "adjustment"
        by_chip[chip] = by_chip.get(chip, Decimal("0.00")) + line.amount
    daily: dict[str, Any] = {"days": [], "teams": {}}
    if statement.team_id:
        policy = active_policy().policy
        month = month_of(policy, timezone.now(), statement.month)
        daily = daily_device_hours(month, month.end, [statement.team_id])
    hours = daily["teams"].get(statement.team.name, []) if statement.team_id else []
    return {
        "statement": statement,
        "team_label": team_label(statement),
        "lines": lines,
        "subtotals": [(StatementLine.Kind(k).label, v) for k, v in by_kind.items()],
        # The cluster statement's month balance per chip model, and what `hide` left not charged.
        "balance": statement.balance or {},
        "not_charged": statement_dict(statement, lines)["not_charged"],
        "cost_chart": {"x": list(by_chip), "y": [float(v) for v in by_chip.values()]},
        "daily_chart": {"x": [d[8:] for d in daily["days"]], "y": hours},
    }


def chart_images(context: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    """The statement's charts as (title, ``<svg>`` HTML), and what drew them (``svg``: the portal itself)."""
    from quotas.accounting.statement_charts import statement_charts

    return statement_charts(context), "svg"


def render_pdf(statement: Statement) -> bytes:
    """The printable statement as a PDF (WeasyPrint), its charts as SVG."""
    import weasyprint

    context = statement_context(statement)
    charts, renderer = chart_images(context)
    html = render_to_string("reports/statement_print.html", {**context, "charts": charts, "pdf": True})
    log.debug("statement %s: charts drawn by %s", statement, renderer)
    return weasyprint.HTML(string=html).write_pdf()
