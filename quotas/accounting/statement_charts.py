"""The PDF statement's charts, drawn as SVG by the portal itself.

Two bar charts (amount by chip model, device-hours per day) with a titled, ticked value axis,
a label under every bar (every day of the month) and the unit on each axis. They are drawn here,
as vector graphics WeasyPrint lays out directly: drawing the same charts with Plotly as PNG needed
a headless chromium per PDF, which took 3-4 s of the 4-7 s a one-page statement took.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

#: Bar colours, as the console's own charts (accent blue, ok green).
BLUE, GREEN = "#0b5cad", "#1a7f37"
_MUTED, _LINE = "#57606a", "#d0d7de"


def nice_ticks(peak: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``peak``: 0, 20, 40, ... (steps of 1, 2, 2.5 or 5 × 10^n)."""
    if peak <= 0:
        return [0.0, 1.0]
    rough = peak / count
    power = 10 ** math.floor(math.log10(rough))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= rough)
    steps = math.ceil(peak / step - 1e-9)
    return [round(i * step, 10) for i in range(steps + 1)]


def _number(value: float) -> str:
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.2f}".rstrip("0").rstrip(".")


def bar_chart(
    title: str,
    labels: list[str],
    values: list[float],
    *,
    x_title: str,
    y_title: str,
    color: str = BLUE,
    width: int = 900,
    height: int = 300,
) -> str:
    """One bar per label, a value axis with round ticks and grid lines; an ``<svg>`` element."""
    left, right, top, bottom = 70, 16, 34, 52
    plot_w, plot_h = width - left - right, height - top - bottom
    ticks = nice_ticks(max([v for v in values if v > 0] or [0.0]))
    ceiling = ticks[-1]
    step = plot_w / max(1, len(labels))
    label_size = 11 if step >= 24 else 9
    parts = [
        f'<text x="{left}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
        # the value axis: grid lines with their values, and its title turned up the left side
        *(
            f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{_LINE}"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="10" text-anchor="end" fill="{_MUTED}">'
            f"{_number(tick)}</text>"
            for tick in ticks
            for y in [top + plot_h - plot_h * tick / ceiling]
        ),
        f'<text transform="translate(16 {top + plot_h / 2:.1f}) rotate(-90)" font-size="11" text-anchor="middle" '
        f'fill="{_MUTED}">{escape(y_title)}</text>',
    ]
    for i, (label, value) in enumerate(zip(labels, values, strict=False)):
        h = plot_h * max(value, 0.0) / ceiling
        x = left + i * step
        parts.append(
            f'<rect x="{x + step * 0.12:.1f}" y="{top + plot_h - h:.1f}" width="{step * 0.76:.1f}" height="{h:.1f}" '
            f'fill="{color}"><title>{escape(str(label))}: {_number(value)}</title></rect>'
        )
        parts.append(
            f'<text x="{x + step / 2:.1f}" y="{top + plot_h + 14}" font-size="{label_size}" text-anchor="middle">'
            f"{escape(str(label))}</text>"
        )
    parts.append(
        f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="{_MUTED}"/>'
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 8}" font-size="11" text-anchor="middle" fill="{_MUTED}">'
        f"{escape(x_title)}</text>"
    )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, sans-serif">{"".join(parts)}</svg>'
    )


def statement_charts(context: dict[str, Any]) -> list[tuple[str, str]]:
    """The statement's charts as ``(title, <svg>)``: amount by chip model, and its team's device-hours per day."""
    statement = context["statement"]
    cost = context["cost_chart"]
    charts = [
        (
            "Amount by chip model",
            bar_chart(
                f"Amount by chip model ({statement.currency})",
                cost["x"],
                cost["y"],
                x_title="chip model",
                y_title=f"amount ({statement.currency})",
            ),
        )
    ]
    daily = context["daily_chart"]
    if daily["x"]:
        charts.append(
            (
                "Device-hours per day",
                bar_chart(
                    "Device-hours per day",
                    daily["x"],
                    daily["y"],
                    x_title=f"day of {statement.month} ({statement.timezone})",
                    y_title="device-hours",
                    color=GREEN,
                ),
            )
        )
    return charts
