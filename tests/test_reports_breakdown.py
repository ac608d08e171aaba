"""Who spent the budget: the month per team, user and job, the CSV exports, and who may see them."""

from __future__ import annotations

import csv
import io
from datetime import timedelta
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from quotas.accounting.reports import report_data
from quotas.accounting.statements import close_month
from quotas.models import Budget, Statement
from tests.test_chargeback_harness import at, world  # noqa: F401 - world is a fixture

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


@pytest.fixture
def march(world):  # noqa: F811
    """alpha: the lead 20 device-hours of normal (¥240), a member 5 h of high (5 × 12 × 1.2 = ¥72);
    beta: 2 device-hours of a quarter-card vNPU, low (2 × 3 × 0.5 = ¥3). Closed, idle hidden."""
    world.job("alpha", "normal", world.b4[:2], at("2025-03-02 00:00"), at("2025-03-02 10:00"))
    member_job = world.job("alpha", "high", world.b4[2:3], at("2025-03-03 00:00"), at("2025-03-03 05:00"))
    member_job.submitter = world.member_alpha
    member_job.save(update_fields=["submitter"])
    world.job("beta", "low", world.p3[:1], at("2025-03-04 00:00"), at("2025-03-04 08:00"), template=world.vir02)
    Budget.objects.create(team=world.alpha, monthly_amount=Decimal("1000.00"))
    close_month("2025-03")
    world.member_job = member_job
    return world


def _finance() -> object:
    user = get_user_model().objects.create_user("fiona", password="pw-fiona")
    user.groups.add(Group.objects.get(name="finance"))
    return user


def _rows(response) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content[:200]
    assert response["Content-Type"].startswith("text/csv")
    return list(csv.DictReader(io.StringIO(response.content.decode())))


def test_a_lead_sees_their_teams_users_and_top_jobs(march) -> None:
    data = report_data("2025-03", teams=[march.alpha])
    assert data["has_usage"]
    assert [(u["team"], u["user"], u["jobs"], u["device_hours"], u["amount"]) for u in data["users"]] == [
        ("alpha", "lead-alpha", 1, "20.0", "240.00"),
        ("alpha", "member-alpha", 1, "5.0", "72.00"),
    ]
    jobs = data["top_jobs"]
    assert [(j["team"], j["user"], j["priority_class"], j["devices"], j["amount"]) for j in jobs] == [
        ("alpha", "lead-alpha", "normal", "910B4", "240.00"),
        ("alpha", "member-alpha", "high", "910B4", "72.00"),
    ]
    assert data["table"] == [
        {"team": "alpha", "device_hours": "25.0", "cost": "312.00", "budget": "1000.00", "budget_pct": "31"}
    ]


def test_finance_sees_every_team_and_the_cluster(march) -> None:
    data = report_data("2025-03")
    assert [r["team"] for r in data["table"]] == ["alpha", "beta"]  # idle hidden: no cluster charge
    assert data["table"][1] == {"team": "beta", "device_hours": "2.0", "cost": "3.00", "budget": "", "budget_pct": ""}
    assert {u["user"] for u in data["users"]} == {"lead-alpha", "member-alpha", "lead-beta"}


def test_pieces_add_up_to_the_statement_to_the_cent(world) -> None:  # noqa: F811
    """Three users' 100 s each: 0.333336 → ¥0.33 apiece, but the line is 0.083333 h × 12 = ¥1.00."""
    User = get_user_model()
    start = at("2025-03-05 00:00")
    for i, name in enumerate(("u1", "u2", "u3")):
        job = world.job("alpha", "normal", world.b4[i : i + 1], start, start + timedelta(seconds=100))
        job.submitter = User.objects.create_user(name)
        job.save(update_fields=["submitter"])
    close_month("2025-03")
    data = report_data("2025-03", teams=[world.alpha])
    amounts = sorted(Decimal(u["amount"]) for u in data["users"])
    assert amounts == [Decimal("0.33"), Decimal("0.33"), Decimal("0.34")]
    assert sum(amounts) == Statement.objects.get(team=world.alpha, month="2025-03").total == Decimal("1.00")


def test_a_month_with_nothing_used_says_so(world, client) -> None:  # noqa: F811
    data = report_data("2025-02", teams=[world.alpha])
    assert not data["has_usage"] and data["users"] == [] and data["top_jobs"] == []
    assert data["table"][0]["device_hours"] == "0.0" and data["table"][0]["cost"] == "0.00"
    client.force_login(world.lead_alpha)
    page = client.get("/reports/?month=2025-02").content.decode()
    assert "Nothing was used in 2025-02" in page and 'id="empty-month"' in page


def test_the_all_teams_csv_is_priced_row_by_row(march, client) -> None:
    client.force_login(_finance())
    rows = _rows(client.get("/reports/2025-03/all-teams.csv"))
    assert list(rows[0]) == [
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
    got = [(r["team"], r["user"], r["chip_model"], r["vnpu_template"], r["priority_class"], r["kind"]) for r in rows]
    assert got == [
        ("alpha", "lead-alpha", "910B4", "", "normal", "usage"),
        ("alpha", "member-alpha", "910B4", "", "high", "usage"),
        ("beta", "lead-beta", "310P3", "vir02", "low", "usage"),
    ]
    beta = rows[2]
    assert Decimal(beta["device_hours"]) == Decimal(2)  # 8 h × a quarter card
    assert (Decimal(beta["rate"]), Decimal(beta["multiplier"]), beta["amount"]) == (Decimal(3), Decimal("0.5"), "3.00")
    assert sum(Decimal(r["amount"]) for r in rows) == sum(s.total for s in Statement.objects.filter(month="2025-03"))


def test_a_lead_gets_their_team_and_jobs_csv_and_never_another_teams_rows(march, client) -> None:
    client.force_login(march.lead_alpha)
    rows = _rows(client.get("/reports/2025-03/team/alpha.csv"))
    assert {r["team"] for r in rows} == {"alpha"} and len(rows) == 2
    jobs = _rows(client.get("/reports/2025-03/jobs.csv"))
    assert [(j["team"], j["user"], j["amount"]) for j in jobs] == [
        ("alpha", "lead-alpha", "240.00"),
        ("alpha", "member-alpha", "72.00"),
    ]
    assert jobs[1]["job_id"] == str(march.member_job.pk) and jobs[1]["name"] == march.member_job.name
    assert Decimal(jobs[1]["device_hours"]) == Decimal(5)
    assert client.get("/reports/2025-03/team/beta.csv").status_code == 404
    assert client.get("/reports/2025-03/team/nosuchteam.csv").status_code == 404
    assert client.get("/reports/2025-03/team/@cluster.csv").status_code == 404
    assert client.get("/reports/2025-03/all-teams.csv").status_code == 403
    assert client.get("/reports/2025-13/jobs.csv").status_code == 404
    assert client.get("/reports/2999-01/jobs.csv").status_code == 404
    page = client.get("/reports/?month=2025-03").content.decode()
    assert "/reports/2025-03/team/alpha.csv" in page and "/reports/2025-03/jobs.csv" in page
    assert "beta" not in page and "all-teams.csv" not in page


def test_a_member_gets_403_and_finance_everything(march, client) -> None:
    client.force_login(march.member_alpha)
    assert client.get("/reports/2025-03/team/alpha.csv").status_code == 403
    assert client.get("/reports/2025-03/jobs.csv").status_code == 403
    assert client.get("/reports/2025-03/team/beta.csv").status_code == 404
    client.force_login(_finance())
    assert {r["team"] for r in _rows(client.get("/reports/2025-03/jobs.csv"))} == {"alpha", "beta"}
    assert {r["team"] for r in _rows(client.get("/reports/2025-03/team/beta.csv"))} == {"beta"}


def test_anonymous_is_sent_to_sign_in(march, client) -> None:
    response = client.get("/reports/2025-03/jobs.csv")
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_idle_on_the_cluster_statement_is_in_the_table_and_the_csv(client) -> None:
    from tests.test_chargeback_harness import build_world

    w = build_world(idle_mode="separate")
    w.job("alpha", "normal", w.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))  # ¥120
    w.job("alpha", "normal", w.b4[1:2], at("2025-03-03 00:00"), at("2025-03-03 05:00"))  # ¥60, same user
    close_month("2025-03")
    data = report_data("2025-03")
    assert data["users"][0]["jobs"] == 2 and data["users"][0]["amount"] == "180.00"
    cluster = data["table"][-1]
    assert cluster["team"] == "@cluster"
    assert cluster["cost"] == str(Statement.objects.get(team__isnull=True, month="2025-03").total)
    client.force_login(_finance())
    rows = _rows(client.get("/reports/2025-03/all-teams.csv"))
    # In a CSV the cluster's label is text a spreadsheet must not evaluate (docs/chargeback.md#exports).
    assert {r["kind"] for r in rows if r["team"] == "'@cluster"} == {"idle"}
    assert all(r["user"] == "" for r in rows if r["kind"] != "usage")
    assert sum(Decimal(r["amount"]) for r in rows) == sum(s.total for s in Statement.objects.filter(month="2025-03"))
