"""Closing a month, immutability, adjustments, the ``chargeback`` command (exit codes), budgets, beat."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from decimal import Decimal
from io import StringIO
from pathlib import Path

import pytest
from django.core import mail
from django.core.management import call_command
from django.utils import timezone

from quotas.accounting.statements import ChargebackError, adjust, check_budgets, close_month
from quotas.models import (
    AuditEvent,
    Budget,
    BudgetAlert,
    ClosedStatementError,
    Statement,
    StatementLine,
)
from scheduling.services.usage import month_of
from tests.test_chargeback_harness import at, lines_of, total_of, world  # noqa: F401 - world is a fixture
from tests.waiting import ceiling

pytestmark = [pytest.mark.django_db, pytest.mark.clock]
ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("chargeback", *args, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def test_closing_twice_is_a_no_op(world) -> None:  # noqa: F811
    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))  # 10 h × ¥12 = ¥120
    code, out, _ = run("close", "--month", "2025-03")
    assert code == 0 and "closed 2025-03: 3 statements" in out and "alpha" in out
    ids = sorted(Statement.objects.values_list("id", "total"))
    code, out, _ = run("close", "--month", "2025-03")
    assert code == 0 and "already closed" in out
    assert sorted(Statement.objects.values_list("id", "total")) == ids
    assert close_month("2025-03").already_closed
    assert AuditEvent.objects.filter(action="chargeback.close", target="month 2025-03").count() == 1
    assert total_of("alpha", "2025-03") == "120.00"


def test_closing_the_current_or_a_future_month_is_refused(world) -> None:  # noqa: F811
    from quotas.policies.versions import active_policy

    policy = active_policy().policy
    now = timezone.now()
    this = month_of(policy, now).label
    future = month_of(policy, month_of(policy, now).end + timedelta(days=40)).label
    for label in (this, future):
        code, _, err = run("close", "--month", label)
        assert code == 1 and f"month {label} is not over yet" in err
    assert not Statement.objects.exists()
    code, _, err = run("close", "--month", "2025-13")
    assert code == 2 and "not a month" in err
    code, _, err = run("close", "--month", "March")
    assert code == 2


def test_a_month_without_a_rate_card_is_refused_with_the_reason(world) -> None:  # noqa: F811
    code, _, err = run("close", "--month", "2024-12")  # the only card starts 2025-01-01
    assert code == 1 and "no rate card is in force from 2024-12-01 00:00" in err
    assert not Statement.objects.exists()


def test_a_chip_without_a_rate_is_refused(world) -> None:  # noqa: F811
    world.card.rates.filter(chip_model="310P3").delete()
    world.job("beta", "low", world.p3[:1], at("2025-03-02 00:00"), at("2025-03-02 01:00"))
    code, _, err = run("close", "--month", "2025-03")
    assert code == 1 and "has no rate for 310P3" in err


def test_closed_statements_are_immutable(world) -> None:  # noqa: F811
    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))
    close_month("2025-03")
    statement = Statement.objects.get(team__name="alpha", month="2025-03")
    line = statement.lines.get()
    statement.total = Decimal("1.00")
    with pytest.raises(ClosedStatementError):
        statement.save()
    with pytest.raises(ClosedStatementError):
        statement.save(update_fields=["total"])  # only ever to the sum of its lines
    with pytest.raises(ClosedStatementError):
        statement.delete()
    line.amount = Decimal("0.01")
    with pytest.raises(ClosedStatementError):
        line.save()
    with pytest.raises(ClosedStatementError):
        line.delete()
    with pytest.raises(ClosedStatementError):
        StatementLine.objects.create(statement=statement, kind="usage", amount=Decimal("5.00"))
    with pytest.raises(ClosedStatementError):
        Statement.objects.filter(month="2025-03").update(total=0)
    with pytest.raises(ClosedStatementError):
        StatementLine.objects.filter(statement=statement).update(amount=0)
    with pytest.raises(ClosedStatementError):
        Statement.objects.filter(month="2025-03").delete()
    assert total_of("alpha", "2025-03") == "120.00"


def test_an_adjustment_is_a_line_and_the_total_is_the_sum_of_the_lines(world) -> None:  # noqa: F811
    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))  # ¥120.00
    close_month("2025-03")
    code, out, _ = run(
        "adjust", "--team", "alpha", "--month", "2025-03", "--amount", "-20.50", "--reason", "node down 2 h",
        "--actor", "lead-alpha",
    )  # fmt: skip
    assert code == 0 and "total now 99.50 CNY" in out  # 120.00 − 20.50
    assert lines_of("alpha", "2025-03")[-1] == ("adjustment", "", "", "", "0.000000", "0.0000", "1.000", "-20.50")
    event = AuditEvent.objects.get(action="chargeback.adjust")
    assert event.target == "statement alpha 2025-03" and "node down 2 h" in event.detail
    assert event.actor.username == "lead-alpha"
    adjust("alpha", "2025-03", "5", "late report")
    statement = Statement.objects.get(team__name="alpha", month="2025-03")
    assert statement.total == Decimal("104.50") == statement.lines_total()


def test_adjust_and_export_refuse_what_is_not_there(world) -> None:  # noqa: F811
    assert run("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "5", "--reason", "x")[0] == 1
    with pytest.raises(ChargebackError, match="not closed"):
        adjust("alpha", "2025-03", "5", "x")
    close_month("2025-03")
    assert run("adjust", "--team", "nobody", "--month", "2025-03", "--amount", "5", "--reason", "x")[0] == 2
    assert run("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "5.001", "--reason", "x")[0] == 2
    assert run("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "abc", "--reason", "x")[0] == 2
    assert run("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "5", "--reason", " ")[0] == 2
    # The amount and the total must fit the columns (14 digits, 2 after the point), checked before rounding.
    code, _, err = run("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "1e30", "--reason", "x")
    assert code == 2 and "at most 12 digits before the point" in err
    most = ("adjust", "--team", "alpha", "--month", "2025-03", "--amount", "999999999999.99", "--reason", "x")
    assert run(*most)[0] == 0
    lines = StatementLine.objects.count()
    code, _, err = run(*most)
    assert code == 2 and "would make the statement's total" in err and StatementLine.objects.count() == lines
    assert run("export", "--month", "2025-04")[0] == 1  # not closed
    assert run("export", "--month", "2025-03", "--team", "nobody")[0] == 2
    # From the command line, argparse's own errors (a missing option, a bad --format) exit 2 as well.
    for args in (["adjust", "--team", "alpha"], ["export", "--month", "2025-03", "--format", "xml"], []):
        done = subprocess.run(
            [sys.executable, "manage.py", "chargeback", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=ceiling(120),
        )
        assert done.returncode == 2, done.stderr


def test_export_csv_and_json(world) -> None:  # noqa: F811
    world.job("alpha", "high", world.p3[:1], at("2025-03-05 00:00"), at("2025-03-05 08:00"), template=world.vir02)
    world.job("beta", "low", world.b4[:1], at("2025-03-06 00:00"), at("2025-03-06 03:00"))
    close_month("2025-03")
    code, out, _ = run("export", "--month", "2025-03", "--format", "csv")
    rows = out.strip().splitlines()
    assert code == 0 and rows[0].startswith("team,month,currency,kind,chip_model,vnpu_template,priority_class")
    # 2 device-hours × ¥3 × 1.2 = ¥7.20 and 3 × ¥12 × 0.5 = ¥18.00
    assert any(r.startswith("alpha,2025-03,CNY,usage,310P3,vir02,high,2.000000,3.0000,1.200,7.20,") for r in rows)
    assert any(r.startswith("beta,2025-03,CNY,usage,910B4,,low,3.000000,12.0000,0.500,18.00,") for r in rows)
    code, out, _ = run("export", "--month", "2025-03", "--format", "json", "--team", "beta")
    body = json.loads(out)
    assert code == 0 and [s["team"] for s in body] == ["beta"]
    assert body[0]["total"] == "18.00" and body[0]["lines"][0]["amount"] == "18.00"


def test_preview_prints_a_month_without_storing_it(world) -> None:  # noqa: F811
    world.job("alpha", "normal", world.b4[:1], at("2025-03-02 00:00"), at("2025-03-02 10:00"))
    code, out, _ = run("preview", "--month", "2025-03", "--json")
    body = json.loads(out)
    assert code == 0 and body["totals"]["alpha"] == "120.00" and not body["closed"]
    # The world's rate card hides idle: 4 × 744 − 10 h of 910B4 and 2 × 744 h of 310P3 are shown, not charged.
    assert body["balance"]["910B4"]["provisioned_hours"] == "2976.000000"
    assert body["not_charged"] == str(Decimal(4 * 744 - 10) * 12 + Decimal(2 * 744) * 3) + ".00"
    code, text, _ = run("preview", "--month", "2025-03")
    assert "not charged (hide)" in text and "balance 910B4" in text
    assert not Statement.objects.exists()


# -- budgets ---------------------------------------------------------------------------------


def test_budget_alerts_once_per_threshold_and_month(world) -> None:  # noqa: F811
    Budget.objects.create(team=world.alpha, monthly_amount=Decimal("1000.00"), alert_thresholds="50, 80,100")
    world.job("alpha", "normal", world.b4[:2], at("2025-03-01 00:00"), at("2025-03-01 10:00"))
    # 20 device-hours × ¥12 = ¥240 of ¥1000: 24%, below every threshold.
    assert check_budgets(now=at("2025-03-20 00:00")) == []
    # A job still running counts up to now: 2 cards from 20 March 00:00, now 20 March 15:00 → 30 h × ¥12 = ¥360.
    world.job("alpha", "normal", world.b4[2:], at("2025-03-20 00:00"), None)
    sent = check_budgets(now=at("2025-03-20 15:00"))  # ¥600 = 60%: the 50% alert
    assert [a.threshold for a in sent] == [50] and len(mail.outbox) == 1
    assert mail.outbox[0].to == ["lead-alpha@example.com"] and "60.0%" in mail.outbox[0].subject
    assert check_budgets(now=at("2025-03-20 16:00")) == []  # ¥624: still 50% only, no second mail
    assert len(mail.outbox) == 1
    # 20 March 15:00 → 23 March 05:00 = 62 h more × 2 cards × ¥12 = ¥1488 → ¥2088 (208.8%): 80% and 100% in one mail.
    sent = check_budgets(now=at("2025-03-23 05:00"))
    assert sorted(a.threshold for a in sent) == [80, 100] and len(mail.outbox) == 2
    assert check_budgets(now=at("2025-03-25 00:00")) == []
    assert BudgetAlert.objects.filter(team=world.alpha, month="2025-03").count() == 3
    # A new month starts again from zero: April's first alert is sent again.
    assert [a.threshold for a in check_budgets(now=at("2025-04-04 00:00"))] == [50, 80, 100]


# -- Celery ----------------------------------------------------------------------------------


def test_beat_runs_the_sweep_every_minute_and_the_close_on_the_first() -> None:
    from celery.schedules import crontab

    from npuportal.celery import app

    app.finalize()
    entries = {e["task"]: e["schedule"] for e in app.conf.beat_schedule.values()}
    assert "quotas.record_usage" in entries and "quotas.close_month" in entries
    minute = entries["quotas.record_usage"]
    assert getattr(minute, "run_every", minute) in (60, 60.0, timedelta(seconds=60))
    assert entries["quotas.close_month"] == crontab(minute=30, hour=0, day_of_month=1)


def test_the_close_task_closes_last_month_and_is_a_no_op_after(world) -> None:  # noqa: F811
    from quotas.accounting.tasks import close_month_task

    result = close_month_task("2025-03")
    assert result == {"month": "2025-03", "already_closed": False, "statements": 3}
    assert close_month_task("2025-03")["already_closed"] is True
    assert "not over yet" in close_month_task("2099-01")["error"]


def test_a_budget_mail_that_fails_is_sent_on_the_next_sweep(world, monkeypatch) -> None:  # noqa: F811
    from quotas.accounting import statements

    Budget.objects.create(team=world.alpha, monthly_amount=Decimal("100.00"))
    world.job("alpha", "normal", world.b4[:1], at("2025-03-01 00:00"), at("2025-03-01 10:00"))  # ¥120: 120%

    def down(*args: object, **kwargs: object) -> None:
        raise ConnectionRefusedError("smtp down")

    monkeypatch.setattr(statements, "send_mail", down)
    assert check_budgets(now=at("2025-03-02 00:00")) == []
    assert not BudgetAlert.objects.exists()
    monkeypatch.undo()
    assert sorted(a.threshold for a in check_budgets(now=at("2025-03-02 00:00"))) == [50, 80, 100]
    assert len(mail.outbox) == 1
