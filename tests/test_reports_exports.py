"""The printable statement: HTML with print styles, and a PDF (WeasyPrint) with its charts drawn as SVG."""

from __future__ import annotations

import re

import pytest

from quotas.accounting import exports
from quotas.accounting.pdf_warmup import warm_up
from quotas.accounting.statement_charts import nice_ticks
from quotas.accounting.statements import close_month
from quotas.models import Statement
from tests.test_chargeback_harness import at, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


@pytest.fixture
def statement(world):  # noqa: F811
    world.job("alpha", "high", world.b4[:2], at("2025-03-02 00:00"), at("2025-03-03 12:00"))  # 72 h × ¥12 × 1.2
    close_month("2025-03")
    return Statement.objects.get(team__name="alpha", month="2025-03")


def test_the_printable_page_has_the_lines_the_total_and_print_styles(client, statement, world) -> None:  # noqa: F811
    client.force_login(world.lead_alpha)
    page = client.get("/reports/statement/alpha/2025-03/").content.decode()
    assert "@media print" in page and "1036.80 CNY" in page  # 72 × 12 × 1.2
    assert "vendor/plotly/plotly-cartesian.min.js" in page  # served from our static files, never a CDN


def test_the_pdf_draws_its_charts_itself_with_ticks_and_units(statement) -> None:
    """No browser in the PDF's path: starting chromium for two charts took 3-4 s of every PDF."""
    context = exports.statement_context(statement)
    charts, renderer = exports.chart_images(context)
    assert renderer == "svg" and [title for title, _ in charts] == ["Amount by chip model", "Device-hours per day"]
    cost, daily = (svg for _, svg in charts)
    assert cost.startswith("<svg") and ">910B4</text>" in cost and "amount (CNY)" in cost
    days = re.findall(r'text-anchor="middle">(\d\d)</text>', daily)
    assert days == [f"{d:02d}" for d in range(1, 32)], "a label under every day of March"
    assert "device-hours" in daily and "day of 2025-03" in daily
    pdf = exports.render_pdf(statement)
    assert pdf.startswith(b"%PDF") and len(pdf) > 10_000


def test_nice_ticks() -> None:
    assert nice_ticks(72) == [0, 20, 40, 60, 80]
    assert nice_ticks(1036.8) == [0, 250, 500, 750, 1000, 1250]
    assert nice_ticks(0) == [0, 1] and nice_ticks(3) == [0, 1, 2, 3]


def test_a_web_worker_warms_up_the_pdf_writer(statement) -> None:
    assert warm_up() > 0  # WeasyPrint imported, fonts found: the first statement is not the slow one


def test_the_pdf_answers_with_the_statement(client, statement, world) -> None:  # noqa: F811
    client.force_login(world.lead_alpha)
    response = client.get("/reports/statement/alpha/2025-03.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response.content.startswith(b"%PDF") and len(response.content) > 10_000
