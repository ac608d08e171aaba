"""Closed statements out: CSV, JSON, a printable HTML page and a PDF with its charts.

The same rows feed the console download, the API and ``manage.py chargeback
export``, so the three can never disagree. Amounts are written as decimal
strings ("1843.20"), never floats. Every CSV goes through
:mod:`npuportal.csv_export`: a name that starts like a spreadsheet formula gets
a ``'`` in front, numbers stay numbers.

The PDF is the printable page rendered by WeasyPrint; its two charts are
Plotly figures turned into PNG by kaleido, driving Debian's chromium
(``/usr/bin/chromium``, or the ``CHROMIUM_PATH`` setting). Where kaleido or chromium is
missing the same charts are drawn as plain inline SVG bars instead, so a
statement always prints.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import os
from collections.abc import Iterable
from decimal import Decimal
from html import escape
from typing import Any

from django.conf import settings
from django.template.loader import render_to_string
from django.utils import timezone

from npuportal import csv_export
from quotas.accounting.breakdown import Breakdown
from quotas.accounting.reports import daily_device_hours
from quotas.accounting.statements import CLUSTER
from quotas.models import Statement, StatementLine
from quotas.services import active_policy
from scheduling.services.usage import month_of

log = logging.getLogger(__name__)
# kaleido, choreographer and WeasyPrint narrate every step at INFO: keep the console's log readable.
for _chatty in ("kaleido", "choreographer", "weasyprint", "fontTools"):
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


def _figures(context: dict[str, Any]) -> list[tuple[str, Any]]:
    import plotly.graph_objects as go

    currency = context["statement"].currency
    cost = go.Figure(go.Bar(x=context["cost_chart"]["x"], y=context["cost_chart"]["y"], marker_color="#0b5cad"))
    cost.update_layout(title=f"Amount by chip model ({currency})", margin={"l": 60, "r": 20, "t": 50, "b": 40})
    figures = [("Amount by chip model", cost)]
    if context["daily_chart"]["x"]:
        daily = go.Figure(go.Bar(x=context["daily_chart"]["x"], y=context["daily_chart"]["y"], marker_color="#1a7f37"))
        daily.update_layout(title="Device-hours per day", margin={"l": 60, "r": 20, "t": 50, "b": 40})
        figures.append(("Device-hours per day", daily))
    return figures


def chromium_path() -> str:
    """Debian's chromium, unless the settings name another (``CHROMIUM_PATH``)."""
    return str(getattr(settings, "CHROMIUM_PATH", "/usr/bin/chromium"))


def kaleido_images(figures: list[Any], *, width: int = 900, height: int = 320) -> list[bytes]:
    """PNG images of Plotly figures, all in one headless chromium session (kaleido v1 + choreographer)."""
    import kaleido

    async def render() -> list[bytes]:
        images = []
        async with kaleido.Kaleido(path=chromium_path(), mathjax=False) as k:
            for fig in figures:
                opts = {"format": "png", "width": width, "height": height, "scale": 1}
                images.append(await k.calc_fig(fig, opts=opts))
        return images

    return asyncio.run(render())


def svg_bars(title: str, x: list[str], y: list[float], *, width: int = 900, height: int = 300) -> str:
    """A plain SVG bar chart: the fallback when chromium cannot draw the Plotly figure."""
    left, bottom, top = 60, 40, 36
    plot_w, plot_h = width - left - 20, height - bottom - top
    peak = max([v for v in y if v > 0] or [1.0])
    step = plot_w / max(1, len(x))
    bars = []
    for i, (label, value) in enumerate(zip(x, y, strict=False)):
        h = plot_h * max(value, 0.0) / peak
        bx = left + i * step + step * 0.1
        bars.append(
            f'<rect x="{bx:.1f}" y="{top + plot_h - h:.1f}" width="{step * 0.8:.1f}" height="{h:.1f}" fill="#0b5cad">'
            f"<title>{escape(str(label))}: {value:g}</title></rect>"
        )
        if len(x) <= 16 or i % max(1, len(x) // 16) == 0:
            bars.append(
                f'<text x="{bx + step * 0.4:.1f}" y="{height - bottom + 16}" font-size="11" '
                f'text-anchor="middle">{escape(str(label))}</text>'
            )
    axis = (
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#57606a"/>'
        f'<text x="{left - 6}" y="{top + 4}" font-size="11" text-anchor="end">{peak:g}</text>'
        f'<text x="{left - 6}" y="{top + plot_h}" font-size="11" text-anchor="end">0</text>'
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f'<text x="{left}" y="22" font-size="15" font-weight="bold">{escape(title)}</text>{axis}{"".join(bars)}</svg>'
    )


def chart_images(context: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    """The statement's charts as (title, <img> or <svg> HTML), and which renderer drew them."""
    figures = _figures(context)
    try:
        if not os.path.exists(chromium_path()):
            raise FileNotFoundError(chromium_path())
        pngs = kaleido_images([f for _, f in figures])
        return [
            (title, f'<img alt="{escape(title)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">')
            for (title, _), png in zip(figures, pngs, strict=True)
        ], "kaleido"
    except Exception as exc:  # chromium or kaleido unavailable: plain SVG, the statement still prints
        log.warning("statement charts: kaleido unavailable (%s); drawing plain SVG bars", exc)
        charts = [("Amount by chip model", context["cost_chart"])]
        if context["daily_chart"]["x"]:
            charts.append(("Device-hours per day", context["daily_chart"]))
        return [(title, svg_bars(title, data["x"], data["y"])) for title, data in charts], "svg"


def render_pdf(statement: Statement) -> bytes:
    """The printable statement as a PDF (WeasyPrint), charts included as images."""
    import weasyprint

    context = statement_context(statement)
    charts, renderer = chart_images(context)
    html = render_to_string("reports/statement_print.html", {**context, "charts": charts, "pdf": True})
    log.debug("statement %s: charts drawn by %s", statement, renderer)
    return weasyprint.HTML(string=html).write_pdf()
