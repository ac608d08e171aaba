"""Finance and a team lead read the reports page in chromium: units on every axis, charts inside their
cards at 1024 px, idle capacity on its own chart, the month-to-date tables, the CSV links, and a month
with nothing in it that says so. Each step leaves a screenshot in the artifacts folder."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from quotas.accounting.statements import previous_month
from quotas.policies.versions import active_policy
from quotas.tenancy.roles import FINANCE_GROUP
from scheduling.services.usage import month_of
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.clock]

CHARTS = ("daily", "cost", "idle", "utilisation", "quota", "waits")

# Each drawn chart's SVG is no wider than its card: nothing cut off at the right edge.
OVERFLOWING = """() => [...document.querySelectorAll('.chart')].filter(c => {
  const svg = c.querySelector('.main-svg');
  return svg && svg.getBoundingClientRect().right > c.getBoundingClientRect().right + 1;
}).map(c => c.id)"""


def _empty_month() -> str:
    """A month long before the demo's history."""
    return month_of(active_policy().policy, timezone.now() - timedelta(days=400)).label


def _drawn_or_said(page, chart: str) -> None:  # noqa: F811
    expect(page.locator(f"#chart-{chart} .main-svg, #chart-{chart} .chart-empty").first).to_be_visible()


def test_finance_reads_every_teams_costs_with_units(demo, user_factory, page) -> None:  # noqa: F811
    finance = user_factory("fiona")
    finance.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    page.set_viewport_size({"width": 1024, "height": 900})
    login(page, "fiona", "pw-fiona")
    last = previous_month()
    page.goto(f"/reports/?month={last}")
    for chart in CHARTS:
        _drawn_or_said(page, chart)
    expect(page.locator("#chart-cost .ytitle")).to_contain_text("CNY")
    expect(page.locator("#chart-daily .ytitle")).to_have_text("device-hours")
    expect(page.locator("#chart-waits .ytitle")).to_contain_text("hours")
    # The demo charges idle capacity on the cluster statement: drawn on its own chart, not among the teams.
    expect(page.locator("#chart-idle .ytitle")).to_contain_text("CNY")
    expect(page.locator("#chart-cost .xtick")).to_have_count(3)  # inference, research, training
    assert "cluster" not in page.locator("#chart-cost").inner_text()
    assert page.evaluate(OVERFLOWING) == []
    snap(page, "finance-charts-1024px")

    table = page.locator("#team-table")
    for team in ("inference", "research", "training", "@cluster"):
        expect(table).to_contain_text(team)
    expect(page.locator("#team-table thead")).to_contain_text("Cost (CNY)")
    expect(page.locator("#user-table")).to_contain_text("lead-research")
    expect(page.locator("#top-jobs tbody tr").first).to_be_visible()
    exports = page.locator("#exports")
    expect(exports.get_by_role("link", name="all teams")).to_have_attribute("href", f"/reports/{last}/all-teams.csv")
    expect(exports.get_by_role("link", name="training", exact=True)).to_have_attribute(
        "href", f"/reports/{last}/team/training.csv"
    )
    page.locator("#team-table").scroll_into_view_if_needed()
    snap(page, "finance-month-to-date-tables")
    with page.expect_download() as download:
        exports.get_by_role("link", name="all teams").click()
    text = open(download.value.path()).read()
    assert text.startswith("month,team,user,chip_model,vnpu_template,priority_class,kind,device_hours,rate,")
    assert ",lead-research," in text and ",idle," in text

    page.set_viewport_size({"width": 1600, "height": 900})
    page.wait_for_timeout(300)  # Plotly's responsive resize
    assert page.evaluate(OVERFLOWING) == []
    snap(page, "finance-charts-1600px")

    empty = _empty_month()
    page.goto(f"/reports/?month={empty}")
    expect(page.locator("#empty-month")).to_contain_text(f"Nothing was used in {empty}")
    expect(page.locator("#chart-daily .chart-empty")).to_contain_text(f"No usage in {empty}")
    expect(page.locator("#chart-cost .chart-empty")).to_be_visible()
    expect(page.locator("#chart-waits .chart-empty")).to_contain_text("No job started")
    snap(page, "finance-empty-month")


def test_a_lead_sees_who_spent_their_budget_and_nothing_of_other_teams(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("rosa", team="research", role="lead")
    page.set_viewport_size({"width": 1024, "height": 900})
    login(page, "rosa", "pw-rosa")
    last = previous_month()
    page.goto(f"/reports/?month={last}")
    for chart in CHARTS:
        _drawn_or_said(page, chart)
    expect(page.locator("#chart-cost .ytitle")).to_contain_text("CNY")
    expect(page.locator("#chart-idle .chart-empty")).to_be_visible()  # the cluster's charges are finance's
    assert page.evaluate(OVERFLOWING) == []
    snap(page, "lead-charts")

    expect(page.locator("#team-table tbody tr")).to_have_count(1)
    expect(page.locator("#team-table")).to_contain_text("research")
    expect(page.locator("#user-table")).to_contain_text("lead-research")
    expect(page.locator("#top-jobs tbody tr").first).to_contain_text("research")
    exports = page.locator("#exports")
    expect(exports.get_by_role("link", name="research", exact=True)).to_have_attribute(
        "href", f"/reports/{last}/team/research.csv"
    )
    expect(exports.get_by_role("link", name="all teams")).to_have_count(0)
    page.locator("#top-jobs").scroll_into_view_if_needed()
    snap(page, "lead-user-and-job-tables")
    text = page.content()
    assert "training" not in text and "inference" not in text and "@cluster" not in text
    with page.expect_download() as download:
        exports.get_by_role("link", name="jobs of research").click()
    jobs = open(download.value.path()).read()
    assert jobs.startswith("month,job_id,name,team,user,priority_class,devices,device_hours,amount,currency")
    assert "training" not in jobs and "inference" not in jobs and ",research," in jobs
    assert page.goto(f"/reports/{last}/team/training.csv").status == 404

    page.goto(f"/reports/?month={_empty_month()}")
    expect(page.locator("#empty-month")).to_contain_text("by research")
    snap(page, "lead-empty-month")
