"""A team lead opens the reports page in a real chromium: Plotly draws the charts, no other team is named."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from quotas.accounting.statements import previous_month
from tests.browser import login, page, requires_chromium  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.clock]


def test_a_lead_sees_their_charts_and_no_other_team(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("rosa", team="research", role="lead")
    login(page, "rosa", "pw-rosa")
    last = previous_month()  # the demo closed it, with a month of research usage
    page.goto(f"/reports/?month={last}")
    for chart in ("daily", "cost", "utilisation", "quota", "waits"):
        expect(page.locator(f"#chart-{chart} .main-svg").first).to_be_visible()
    assert page.locator("#chart-cost .main-svg").count() >= 1
    statements = page.locator("#statements")
    expect(statements).to_contain_text("research")
    text = page.content()
    assert "training" not in text and "inference" not in text and "@cluster" not in text

    page.goto("/reports/")  # this month, live: capacity is there whatever has run so far
    expect(page.locator("#chart-utilisation .main-svg").first).to_be_visible()
    assert "training" not in page.content() and "inference" not in page.content()

    page.goto(f"/reports/statement/research/{last}/")
    expect(page.locator("#total")).to_contain_text("CNY")
    expect(page.locator("#chart-cost .main-svg").first).to_be_visible()
    assert page.goto(f"/reports/statement/training/{last}/").status == 404
