"""The printable statement: HTML with print styles, and a PDF (WeasyPrint) with its charts as images."""

from __future__ import annotations

import shutil

import pytest

from quotas.accounting import exports
from quotas.accounting.statements import close_month
from quotas.models import Statement
from tests.browser import CHROMIUM
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


def test_the_svg_fallback_draws_the_charts_when_chromium_is_missing(statement, settings) -> None:
    settings.CHROMIUM_PATH = "/nonexistent/chromium"
    context = exports.statement_context(statement)
    charts, renderer = exports.chart_images(context)
    assert renderer == "svg" and charts[0][1].startswith("<svg") and "910B4" in charts[0][1]
    pdf = exports.render_pdf(statement)
    assert pdf.startswith(b"%PDF")


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists() or shutil.which("chromium") is None, reason="needs /usr/bin/chromium")
def test_the_pdf_has_its_charts_drawn_by_kaleido(client, statement, world, monkeypatch) -> None:  # noqa: F811
    drawn: list[bytes] = []
    real = exports.kaleido_images

    def spy(figures: list, **kwargs: object) -> list[bytes]:
        drawn.extend(real(figures, **kwargs))
        return drawn

    monkeypatch.setattr(exports, "kaleido_images", spy)
    client.force_login(world.lead_alpha)
    response = client.get("/reports/statement/alpha/2025-03.pdf")
    assert response.status_code == 200 and response["Content-Type"] == "application/pdf"
    assert response.content.startswith(b"%PDF") and len(response.content) > 10_000
    assert len(drawn) == 2 and all(png.startswith(b"\x89PNG") for png in drawn)  # cost by chip, hours per day
