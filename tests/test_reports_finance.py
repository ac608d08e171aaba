"""Finance reads the reports without surprises: links only to what the reader may open, grand totals,
an idle row that says what it is, a closed month headed as closed, the Statements menu on the last
closed month, and a quota heatmap whose colours mean something when the quota never changes."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from quotas.accounting.statements import close_month
from tests.test_chargeback_harness import at, build_world, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def _finance() -> object:
    user = get_user_model().objects.create_user("fiona", password="pw-fiona")
    user.groups.add(Group.objects.get(name="finance"))
    return user


def _jobs(w) -> tuple[object, object]:  # type: ignore[no-untyped-def]
    alpha = w.job("alpha", "normal", w.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))  # 10 h, ¥120.00
    beta = w.job("beta", "high", w.b4[1:2], at("2025-03-02 00:00"), at("2025-03-02 05:00"))  # 5 h × 1.2, ¥72.00
    return alpha, beta


@pytest.fixture
def closed(world):  # noqa: F811
    _jobs(world)
    close_month("2025-03")
    return world


def _page(client, user, month: str = "2025-03") -> str:  # type: ignore[no-untyped-def]
    client.force_login(user)
    response = client.get(f"/reports/?month={month}")
    assert response.status_code == 200
    return response.content.decode()


def _top_job_cells(html: str) -> list[str]:
    table = html.split('id="top-jobs"', 1)[1].split("</table>", 1)[0]
    return re.findall(r"<tr><td>(.*?)</td>", table)


def test_finance_sees_the_top_jobs_without_links_it_could_not_open(client, closed) -> None:
    html = _page(client, _finance())
    cells = _top_job_cells(html)
    assert len(cells) == 2 and all(c.isdigit() for c in cells), cells  # the job's number, not a link
    for cell in cells:
        assert client.get(f"/jobs/{cell}/").status_code == 404, "finance cannot open a job's page"


def test_a_lead_gets_links_to_their_own_teams_jobs(client, closed) -> None:
    cells = _top_job_cells(_page(client, closed.lead_alpha))
    assert len(cells) == 1 and cells[0].startswith('<a href="/jobs/'), cells
    job = re.search(r"/jobs/(\d+)/", cells[0]).group(1)
    assert client.get(f"/jobs/{job}/").status_code == 200


def test_the_per_team_and_per_user_tables_have_a_grand_total(client, closed) -> None:
    html = _page(client, _finance())
    team_total = re.search(r'<tr id="team-total">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r'<th class="num">([^<]*)</th>', team_total) == ["15.0", "192.00"]
    user_total = re.search(r'<tr id="user-total">(.*?)</tr>', html, re.S).group(1)
    assert re.findall(r'<th class="num">([^<]*)</th>', user_total) == ["2", "15.0", "192.00"]


def test_a_closed_month_is_not_headed_month_to_date(client, closed) -> None:
    html = _page(client, _finance())
    assert '<h2 id="month-heading">2025-03, closed</h2>' in html and "Month to date</h2>" not in html


def test_the_statements_menu_opens_the_last_closed_month(client, closed) -> None:
    close_month("2025-04")  # nothing used in April: its statements exist all the same
    for user in (_finance(), closed.lead_alpha):
        client.force_login(user)
        assert 'href="/reports/statements/">Statements</a>' in client.get("/reports/").content.decode()
        response = client.get("/reports/statements/")
        assert response.status_code == 302 and response["Location"] == "/reports/?month=2025-04#statements"
        html = client.get(response["Location"].split("#")[0]).content.decode()
        assert 'id="statements"' in html and "/reports/statement/alpha/2025-04/" in html
    client.force_login(closed.member_alpha)
    assert client.get("/reports/statements/").status_code == 403, "a member sees no costs"


def test_the_idle_row_says_what_it_is_and_why_it_has_no_device_hours(client, db) -> None:
    w = build_world(idle_mode="separate")
    _jobs(w)
    close_month("2025-03")
    html = _page(client, _finance())
    row = re.search(r'<tr id="cluster-row">(.*?)</tr>', html, re.S).group(1)
    assert "idle and unavailable capacity" in row and '<td class="num muted">—</td>' in row
    note = re.search(r'<p class="muted" id="cluster-note">(.*?)</p>', html, re.S).group(1)
    assert "charged to nobody" in note and "no device-hours of use because no job ran on those cards" in note
    cost = re.findall(r'<td class="num">([\d.]+)</td>', row)[0]
    team_total = re.search(r'<tr id="team-total">(.*?)</tr>', html, re.S).group(1)
    totals = re.findall(r'<th class="num">([^<]*)</th>', team_total)
    assert totals[0] == "15.0", "the idle row adds no device-hours"
    assert float(totals[1]) == pytest.approx(192.00 + float(cost)), "but its cost is in the total"


def test_a_constant_quota_is_said_in_words_and_scaled_from_zero(client, demo, user_factory) -> None:
    client.force_login(user_factory("lena", team="training", role="lead"))
    html = client.get("/quota/").content.decode()
    maps = json.loads(re.search(r'<script id="heatmaps" type="application/json">(.*?)</script>', html, re.S).group(1))
    assert maps["training"]["constant"] == 24  # the demo's training team: max 24 at every hour
    assert "zmin: 0, zmax: top" in html and 'id="heatmap-note-training"' in html
