"""Who sees which statement: team isolation in the console and the API (404 for other teams, 403 for members)."""

from __future__ import annotations

import re
from datetime import datetime
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from quotas.accounting.statements import close_month
from quotas.policies.versions import active_policy
from tests.test_chargeback_harness import at, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


@pytest.fixture
def closed(world):  # noqa: F811
    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))  # ¥120.00
    world.job("beta", "high", world.b4[1:2], at("2025-03-02 00:00"), at("2025-03-02 05:00"))  # 5 × 12 × 1.2 = ¥72.00
    close_month("2025-03")
    return world


def _finance() -> object:
    user = get_user_model().objects.create_user("fiona", password="pw-fiona")
    user.groups.add(Group.objects.get(name="finance"))  # made by a data migration
    return user


CONSOLE = [
    "/reports/statement/{team}/2025-03.csv",
    "/reports/statement/{team}/2025-03/",
]
API = [
    "/api/v1/reports/statements/{team}/2025-03/",
    "/api/v1/reports/statements/{team}/2025-03/?format=csv",
]


def test_a_lead_sees_their_statement_and_not_another_teams(client, api, closed) -> None:
    client.force_login(closed.lead_alpha)
    for path in CONSOLE:
        assert client.get(path.format(team="alpha")).status_code == 200
        assert client.get(path.format(team="beta")).status_code == 404
        assert client.get(path.format(team="@cluster")).status_code == 404
        assert client.get(path.format(team="nosuchteam")).status_code == 404
    assert client.get("/reports/statement/beta/2025-03.pdf").status_code == 404
    lead = api(closed.lead_alpha)
    for path in API:
        assert lead.get(path.format(team="alpha")).status_code == 200
        assert lead.get(path.format(team="beta")).status_code == 404
        assert lead.get(path.format(team="@cluster")).status_code == 404
    body = lead.get("/api/v1/reports/statements/alpha/2025-03/").json()
    assert body["total"] == "120.00" and body["lines"][0]["amount"] == "120.00"
    listed = lead.get("/api/v1/reports/statements/?month=2025-03").json()
    assert [s["team"] for s in listed] == ["alpha"]
    csv = lead.get("/api/v1/reports/statements/?month=2025-03&format=csv").content.decode()
    assert "alpha," in csv and "beta," not in csv


def test_a_member_who_is_not_lead_gets_403(client, api, closed) -> None:
    client.force_login(closed.member_alpha)
    assert client.get("/reports/").status_code == 403
    for path in CONSOLE:
        assert client.get(path.format(team="alpha")).status_code == 403
        assert client.get(path.format(team="beta")).status_code == 404
    member = api(closed.member_alpha)
    assert member.get("/api/v1/reports/statements/alpha/2025-03/").status_code == 403
    assert member.get("/api/v1/reports/statements/beta/2025-03/").status_code == 404
    assert member.get("/api/v1/reports/statements/?month=2025-03").json() == []


def test_finance_and_admins_see_every_team_and_the_cluster(client, api, closed, user_factory) -> None:
    for user in (_finance(), user_factory("ops", staff=True)):
        client.force_login(user)
        for team in ("alpha", "beta", "@cluster"):
            assert client.get(f"/reports/statement/{team}/2025-03.csv").status_code == 200
        page = client.get("/reports/?month=2025-03").content.decode()
        assert "alpha" in page and "beta" in page
        listed = api(user).get("/api/v1/reports/statements/?month=2025-03").json()
        assert sorted(s["team"] for s in listed) == ["@cluster", "alpha", "beta"]


def test_the_reports_page_of_a_lead_names_no_other_team(client, closed) -> None:
    client.force_login(closed.lead_alpha)
    page = client.get("/reports/?month=2025-03")
    assert page.status_code == 200
    text = page.content.decode()
    assert "alpha" in text and "beta" not in text and "@cluster" not in text
    assert client.get("/reports/").status_code == 200  # this month, live
    # The page says which clock its months, days and times are on, as the job pages do.
    zone_name = active_policy().policy.timezone
    assert f"Months and days on the policy clock ({zone_name})." in text
    assert f"Times are {zone_name}, the policy's clock." in text
    counted = re.search(r'Counted up to <time datetime="([^"]+)" title="[^"]+">([^<]+)</time>', text)
    assert counted, text
    local = datetime.fromisoformat(counted[1]).astimezone(ZoneInfo(zone_name))
    assert counted[2] == f"{local:%Y-%m-%d %H:%M} {local.tzname()}"


def test_anonymous_users_log_in_first(client, api, closed) -> None:
    assert client.get("/reports/").status_code == 302
    assert client.get("/reports/statement/alpha/2025-03.csv").status_code == 302
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/reports/statements/alpha/2025-03/").status_code in (401, 403)


def test_bad_input_is_an_error_not_a_crash(client, api, closed, user_factory) -> None:
    admin = user_factory("ops", staff=True)
    client.force_login(admin)
    assert client.get("/reports/?month=2025-13").status_code == 400
    assert client.get("/reports/statement/alpha/2025-04.csv").status_code == 404  # not closed
    assert client.get("/reports/statement/al%00pha/2025-03.csv").status_code == 404
    admin_api = api(admin)
    assert admin_api.get("/api/v1/reports/statements/?month=bad").status_code == 400
    assert admin_api.get("/api/v1/reports/statements/alpha/2025-13/").status_code == 400
    assert admin_api.get("/api/v1/reports/statements/al%00pha/2025-03/").status_code == 404
    assert admin_api.get("/api/v1/reports/statements/alpha/2025-04/").status_code == 404
    assert admin_api.get("/api/v1/reports/nothing-here/").status_code == 404


def test_the_console_the_api_and_the_command_export_the_same_csv(client, api, closed) -> None:
    from io import StringIO

    from django.core.management import call_command

    out = StringIO()
    call_command("chargeback", "export", "--month", "2025-03", "--team", "beta", stdout=out)
    client.force_login(closed.lead_beta)
    console = client.get("/reports/statement/beta/2025-03.csv").content.decode()
    from_api = api(closed.lead_beta).get("/api/v1/reports/statements/beta/2025-03/?format=csv").content.decode()
    assert console == from_api == out.getvalue()
    assert "beta,2025-03,CNY,usage,910B4,,high,5.000000,12.0000,1.200,72.00," in console


def test_rate_cards_page_staff_add_finance_read_leads_forbidden(client, closed, user_factory) -> None:
    client.force_login(closed.lead_alpha)
    assert client.get("/reports/rates/").status_code == 403
    client.force_login(_finance())
    assert client.get("/reports/rates/").status_code == 200
    assert client.post("/reports/rates/", {"effective_from": "2099-01-01"}).status_code == 403
    client.force_login(user_factory("ops", staff=True))
    form = {
        "effective_from": "2025-03-15",  # inside closed March: refused
        "currency": "CNY",
        "idle_mode": "separate",
        "reserved_mode": "hide",
        "rates": "910B4 13.50\n310P3 3\n310P3 vir02 0.9",
        "multipliers": "critical 2\nlow 0.25",
        "comment": "new prices",
    }
    page = client.post("/reports/rates/", form)
    assert page.status_code == 200 and "are closed" in page.content.decode()
    form["effective_from"] = "2025-04-01"
    assert client.post("/reports/rates/", form).status_code == 302
    from quotas.models import AuditEvent, RateCard

    card = RateCard.objects.get(effective_from="2025-04-01")
    assert {(r.chip_model, r.vnpu_template, str(r.price_per_device_hour)) for r in card.rates.all()} == {
        ("910B4", "", "13.5000"),
        ("310P3", "", "3.0000"),
        ("310P3", "vir02", "0.9000"),
    }
    assert AuditEvent.objects.filter(action="chargeback.ratecard").exists()
    form["rates"] = "910B4 -1"
    form["effective_from"] = "2025-05-01"
    assert "a price is &gt;= 0" in client.post("/reports/rates/", form).content.decode()


def test_a_rate_card_that_priced_a_closed_month_is_read_only_in_the_admin(client, closed, user_factory) -> None:
    admin = get_user_model().objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(admin)
    page = client.get(f"/admin/quotas/ratecard/{closed.card.pk}/change/")
    assert page.status_code == 200 and 'name="_save"' not in page.content.decode()
    from tests.test_chargeback_harness import make_card

    fresh = make_card("2026-01-01")
    assert 'name="_save"' in client.get(f"/admin/quotas/ratecard/{fresh.pk}/change/").content.decode()
    assert client.get("/admin/quotas/statement/").status_code == 200
    assert client.get("/admin/quotas/usagerecord/").status_code == 200
