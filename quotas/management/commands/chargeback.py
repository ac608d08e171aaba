"""``manage.py chargeback``: close a month, adjust a closed statement, export statements, preview, sweep.

Exit codes are a contract with scripts: 0 ok, 1 refused or invalid (the month
is not over, is not closed, has no rate), 2 usage error (bad arguments, unknown
team, malformed month or amount).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import CommandParser
from django.utils import timezone

from quotas.accounting.exports import to_csv, to_json
from quotas.accounting.records import record_closed_allocations
from quotas.accounting.statements import (
    CLUSTER,
    ChargebackError,
    ChargebackUsageError,
    adjust,
    close_month,
    compute_month,
    is_closed,
    parse_month,
    previous_month,
    statement_for,
)
from quotas.management.subcommands import SubcommandCommand
from quotas.models import Statement, Team
from scheduling.services.usage import UsageError

OK, REFUSED, USAGE = 0, 1, 2


class Command(SubcommandCommand):
    help = "Usage accounting and monthly chargeback: close, adjust, export, preview, sweep."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
        p = sub.add_parser("close", help="freeze every team's statement of an ended month (default: last month)")
        p.add_argument("--month", default=None, help="YYYY-MM on the policy's clock")
        p.add_argument("--actor", default=None, help="username recorded in the audit log")
        p = sub.add_parser("adjust", help="add an adjustment line to a closed statement")
        p.add_argument("--team", required=True, help=f"team name, or {CLUSTER} for the cluster's statement")
        p.add_argument("--month", required=True)
        p.add_argument("--amount", required=True, help="e.g. -120.50 (a credit) or 35 (a charge)")
        p.add_argument("--reason", required=True)
        p.add_argument("--actor", default=None, help="username recorded on the line and in the audit log")
        p = sub.add_parser("export", help="print closed statements as CSV or JSON")
        p.add_argument("--month", required=True)
        p.add_argument("--format", choices=["csv", "json"], default="csv")
        p.add_argument("--team", default=None, help=f"one team (or {CLUSTER}); default all")
        p = sub.add_parser("preview", help="price a month now without storing anything (running jobs up to now)")
        p.add_argument("--month", default=None, help="default: this month")
        p.add_argument("--json", action="store_true")
        sub.add_parser("sweep", help="write usage records of closed allocations (what beat runs every minute)")

    def _actor(self, username: str | None) -> Any:
        if not username:
            return None
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise self._fail(f"--actor: no user {username!r}", USAGE)
        return user

    def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (ChargebackUsageError, UsageError) as exc:
            raise self._fail(str(exc), USAGE) from exc
        except ChargebackError as exc:
            raise self._fail(str(exc), REFUSED) from exc

    def do_close(self, opts: dict[str, Any]) -> None:
        actor = self._actor(opts["actor"])
        result = self._run(close_month, opts["month"] or previous_month(), actor=actor)
        if result.already_closed:
            self.stdout.write(f"{result.month} already closed: nothing changed")
            return
        for warning in result.warnings:
            self.stdout.write(f"warning: {warning}")
        for s in result.statements:
            name = s.team.name if s.team_id else CLUSTER
            self.stdout.write(f"  {name:20} {s.total:>14} {s.currency}")
        self.stdout.write(f"closed {result.month}: {len(result.statements)} statements")

    def do_adjust(self, opts: dict[str, Any]) -> None:
        actor = self._actor(opts["actor"])
        line = self._run(adjust, opts["team"], opts["month"], opts["amount"], opts["reason"], actor=actor)
        statement = Statement.objects.get(pk=line.statement_id)
        self.stdout.write(
            f"adjusted {opts['team']} {statement.month} by {line.amount} {statement.currency}; "
            f"total now {statement.total} {statement.currency}"
        )

    def do_export(self, opts: dict[str, Any]) -> None:
        month, _ = self._run(parse_month, opts["month"], timezone.now())
        if not is_closed(month.label):
            raise self._fail(f"month {month.label} is not closed: export prints closed statements", REFUSED)
        if opts["team"]:
            if opts["team"] != CLUSTER and not Team.objects.filter(name=opts["team"]).exists():
                raise self._fail(f"--team: no team {opts['team']!r}", USAGE)
            found = statement_for(opts["team"], month.label)
            statements = [found] if found else []
        else:
            statements = list(Statement.objects.filter(month=month.label, closed_at__isnull=False))
        text = to_csv(statements) if opts["format"] == "csv" else to_json(statements)
        self.stdout.write(text, ending="")

    def do_preview(self, opts: dict[str, Any]) -> None:
        bill = self._run(compute_month, opts["month"], live=True)
        names = dict(Team.objects.values_list("id", "name"))
        rows = [
            {
                "team": names.get(line.team_id, CLUSTER) if line.team_id else CLUSTER,
                "kind": line.kind,
                "chip_model": line.chip_model,
                "vnpu_template": line.vnpu_template,
                "priority_class": line.priority_class,
                "device_hours": str(line.device_hours),
                "rate": str(line.rate),
                "multiplier": str(line.multiplier),
                "amount": str(line.amount),
                "description": line.description,
            }
            for line in bill.lines
        ]
        teams = sorted({r["team"] for r in rows})
        totals = {t: str(sum((Decimal(r["amount"]) for r in rows if r["team"] == t), Decimal("0.00"))) for t in teams}
        if opts["json"]:
            body = {
                "month": bill.month.label,
                "until": bill.until.isoformat(),
                "closed": is_closed(bill.month.label),
                "currency": bill.currency,
                "idle_mode": bill.idle_mode,
                "reserved_mode": bill.reserved_mode,
                "warnings": bill.warnings,
                "totals": totals,
                "lines": rows,
                "balance": bill.balance(),
                "not_charged": str(bill.not_charged),
            }
            self.stdout.write(json.dumps(body, indent=2))
            return
        self.stdout.write(f"{bill.month.label} up to {bill.until:%Y-%m-%d %H:%M} UTC (preview: nothing stored)")
        for warning in bill.warnings:
            self.stdout.write(f"warning: {warning}")
        for r in rows:
            what = r["chip_model"] + (f"/{r['vnpu_template']}" if r["vnpu_template"] else "")
            self.stdout.write(
                f"  {r['team']:14} {r['kind']:11} {what:18} {r['priority_class']:9} {r['device_hours']:>16} h "
                f"× {r['rate']} × {r['multiplier']} = {r['amount']:>12}"
            )
        for team, total in totals.items():
            self.stdout.write(f"  total {team:14} {total:>14} {bill.currency}")
        if bill.not_charged:
            self.stdout.write(f"  not charged ({bill.idle_mode}) {bill.not_charged:>14} {bill.currency}")
        for chip, b in bill.balance().items():
            self.stdout.write(
                f"  balance {chip:10} provisioned {b['provisioned_hours']} h = used {b['used_hours']} "
                f"+ reserved {b['reserved_unused_hours']} + unavailable {b['unavailable_hours']} "
                f"+ idle {b['idle_hours']}; {b['amount']} at the rate, charged {b['charged']}, "
                f"not charged {b['not_charged']}"
            )

    def do_sweep(self, opts: dict[str, Any]) -> None:
        written = record_closed_allocations()
        self.stdout.write(f"{written} usage record(s) written")
