"""Console pages for usage and chargeback: the reports page, statement downloads, rate cards.

Who sees what: staff and the ``finance`` group see every team (and the
cluster's own statement); a team lead sees the teams they lead; a member who
leads no team sees no costs (403). Another team's statement is *not found*
(404), as everywhere in the console and the API, so names cannot be probed.
"""

from __future__ import annotations

import logging
import re
from datetime import date, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from quotas.accounting.exports import jobs_csv as jobs_csv_text
from quotas.accounting.exports import month_csv as month_csv_text
from quotas.accounting.exports import render_pdf, statement_context, to_csv
from quotas.accounting.reports import month_pieces, report_data
from quotas.accounting.statements import CLUSTER, statement_for
from quotas.models import AuditEvent, ClassMultiplier, Membership, Rate, RateCard, Statement, Team
from quotas.policies.versions import active_policy
from quotas.tenancy.roles import FINANCE_GROUP
from scheduling.engine.policy import zone
from scheduling.filters import visible_jobs
from scheduling.services.usage import UsageError, month_of

log = logging.getLogger(__name__)
TEAM_RE = re.compile(r"^(@cluster|[-a-zA-Z0-9_]{1,100})$")
MONTH_RE = re.compile(r"^\d{4}-\d{2}$")


def is_finance(user: Any) -> bool:
    """Staff, or in the ``finance`` group: sees every team's usage and costs."""
    if not getattr(user, "is_authenticated", False):
        return False
    return bool(user.is_staff) or user.groups.filter(name=FINANCE_GROUP).exists()


def led_teams(user: Any) -> list[Team]:
    return list(Team.objects.filter(memberships__user=user, memberships__role=Membership.Role.LEAD).order_by("name"))


def report_teams(user: Any) -> list[Team] | None:
    """The teams whose reports ``user`` may see; ``None`` means all. Raises 403 for everyone else."""
    if is_finance(user):
        return None
    teams = led_teams(user)
    if not teams:
        raise PermissionDenied("usage and costs are for team leads and finance")
    return teams


def visible_statement(user: Any, team_name: str, month: str) -> Statement:
    """The closed statement of ``team_name`` for ``month`` if ``user`` may see it; 404 / 403 otherwise."""
    if not TEAM_RE.match(team_name) or not MONTH_RE.match(month):
        raise Http404("no such statement")
    if team_name == CLUSTER:
        if not is_finance(user):
            raise Http404("no such statement")
    else:
        team = Team.objects.filter(name=team_name).first()
        if team is None:
            raise Http404("no such statement")
        if not is_finance(user):
            role = Membership.objects.filter(user=user, team=team).values_list("role", flat=True).first()
            if role is None:
                raise Http404("no such statement")
            if role != Membership.Role.LEAD:
                raise PermissionDenied("only the team's leads and finance see its statements")
    statement = statement_for(team_name, month)
    if statement is None or not statement.is_closed:
        raise Http404("no closed statement for that team and month")
    return statement


def _forbidden(request: HttpRequest, message: str) -> HttpResponse:
    return render(request, "reports/forbidden.html", {"message": message}, status=403)


def _neighbours(label: str) -> tuple[str, str | None]:
    policy = active_policy().policy
    month = month_of(policy, timezone.now(), label)
    before = month_of(policy, month.start - timedelta(microseconds=1)).label
    current = month_of(policy, timezone.now())
    after = month_of(policy, month.end).label if month.end <= current.start else None
    return before, after


@login_required
def reports_index(request: HttpRequest) -> HttpResponse:
    try:
        teams = report_teams(request.user)
    except PermissionDenied as exc:
        return _forbidden(request, str(exc))
    label = request.GET.get("month") or None
    try:
        data = report_data(label, teams=teams)
    except UsageError as exc:
        return render(request, "reports/forbidden.html", {"message": str(exc), "title": "Bad month"}, status=400)
    before, after = _neighbours(data["month"])
    until = datetime.fromisoformat(data["window"][1])
    statements = Statement.objects.filter(month=data["month"], closed_at__isnull=False).select_related("team")
    if teams is not None:
        statements = statements.filter(team__in=teams)
    rows = [
        {"label": s.team.name if s.team_id else CLUSTER, "statement": s}
        for s in sorted(statements, key=lambda s: (s.team_id is None, s.team.name if s.team_id else ""))
    ]
    # A job is linked only for a reader who may open its page (finance reads costs, not jobs).
    ids = [j["job_id"] for j in data["top_jobs"] if j.get("job_id")]
    openable = set(visible_jobs(request.user).filter(pk__in=ids).values_list("pk", flat=True)) if ids else set()
    for job in data["top_jobs"]:
        job["link"] = job.get("job_id") in openable
    return render(
        request,
        "reports/index.html",
        {
            "data": data,
            "until": until,
            "statements": rows,
            "before": before,
            "after": after,
            "finance": teams is None,
            "team_names": [t.name for t in teams] if teams is not None else None,
            "team_total": table_total(data["table"]),
            "user_total": user_total(data["users"]),
        },
    )


def table_total(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The per-team table's grand total: device-hours used and everything charged (the idle row included)."""
    hours = sum((Decimal(r["device_hours"]) for r in rows if r["device_hours"]), Decimal("0"))
    cost = sum((Decimal(r["cost"]) for r in rows if r["cost"]), Decimal("0"))
    return {"device_hours": f"{hours:.1f}", "cost": f"{cost:.2f}"}


def user_total(rows: list[dict[str, Any]]) -> dict[str, str]:
    """The per-user table's grand total: jobs, device-hours and cost."""
    return {
        "jobs": str(sum(int(r["jobs"]) for r in rows)),
        "device_hours": f"{sum((Decimal(r['device_hours']) for r in rows), Decimal('0')):.1f}",
        "amount": f"{sum((Decimal(r['amount']) for r in rows), Decimal('0')):.2f}",
    }


@login_required
def statements_latest(request: HttpRequest) -> HttpResponse:
    """The menu's *Statements*: the reports of the last month with closed statements the reader may see."""
    try:
        teams = report_teams(request.user)
    except PermissionDenied as exc:
        return _forbidden(request, str(exc))
    closed = Statement.objects.filter(closed_at__isnull=False)
    if teams is not None:
        closed = closed.filter(team__in=teams)
    month = closed.order_by("-month").values_list("month", flat=True).first()
    if month is None:  # nothing closed yet: last month, whose page says its statements are to come
        policy = active_policy().policy
        month = month_of(policy, month_of(policy, timezone.now()).start - timedelta(microseconds=1)).label
    return redirect(f"{reverse('reports')}?month={month}#statements")


def _csv(text: str, filename: str) -> HttpResponse:
    response = HttpResponse(text, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


def _month_label(month: str) -> str:
    """``month`` as a month the reports can show (not in the future), else 404."""
    if not MONTH_RE.match(month):
        raise Http404("no such month")
    policy = active_policy().policy
    try:
        found = month_of(policy, timezone.now(), month)
    except UsageError as exc:
        raise Http404(str(exc)) from exc
    if found.start > timezone.now():
        raise Http404("that month has not begun")
    return found.label


@login_required
def month_csv(request: HttpRequest, month: str) -> HttpResponse:
    """Every team's charges of the month, per user: finance and admins only."""
    if not is_finance(request.user):
        raise PermissionDenied("the all-teams export is for finance")
    label = _month_label(month)
    bill, breakdown = month_pieces(label, None)
    return _csv(month_csv_text(label, bill.currency, breakdown), f"usage-{label}.csv")


@login_required
def team_csv(request: HttpRequest, month: str, team: str) -> HttpResponse:
    """One team's charges of the month, per user: its leads and finance (another team: 404)."""
    if not TEAM_RE.match(team) or team == CLUSTER:
        raise Http404("no such team")
    found = Team.objects.filter(name=team).first()
    if found is None:
        raise Http404("no such team")
    if not is_finance(request.user):
        role = Membership.objects.filter(user=request.user, team=found).values_list("role", flat=True).first()
        if role is None:
            raise Http404("no such team")
        if role != Membership.Role.LEAD:
            raise PermissionDenied("only the team's leads and finance see its costs")
    label = _month_label(month)
    bill, breakdown = month_pieces(label, [found])
    return _csv(month_csv_text(label, bill.currency, breakdown), f"usage-{team}-{label}.csv")


@login_required
def jobs_csv(request: HttpRequest, month: str) -> HttpResponse:
    """The month's jobs with their device-hours and cost: a lead's teams, or all for finance."""
    teams = report_teams(request.user)
    label = _month_label(month)
    bill, breakdown = month_pieces(label, teams)
    return _csv(jobs_csv_text(label, bill.currency, breakdown), f"jobs-{label}.csv")


@login_required
def statement_csv(request: HttpRequest, team: str, month: str) -> HttpResponse:
    statement = visible_statement(request.user, team, month)
    response = HttpResponse(to_csv([statement]), content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="statement-{team.lstrip("@")}-{month}.csv"'
    return response


@login_required
def statement_pdf(request: HttpRequest, team: str, month: str) -> HttpResponse:
    statement = visible_statement(request.user, team, month)
    try:
        pdf = render_pdf(statement)
    except (ImportError, OSError) as exc:  # WeasyPrint or Debian's pango missing: the printable page still works
        log.error("statement PDF unavailable (%s): sending the printable page instead", exc)
        messages.error(request, "PDF output is not available on this server: print this page instead.")
        return redirect("reports-statement", team=team, month=month)
    response = HttpResponse(pdf, content_type="application/pdf")
    response["Content-Disposition"] = f'inline; filename="statement-{team.lstrip("@")}-{month}.pdf"'
    return response


@login_required
def statement_page(request: HttpRequest, team: str, month: str) -> HttpResponse:
    """The printable statement (``@media print`` styles); the PDF renders the same template."""
    statement = visible_statement(request.user, team, month)
    return render(request, "reports/statement_print.html", {**statement_context(statement), "pdf": False})


# -- rate cards -------------------------------------------------------------------


def _parse_rates(text: str) -> list[tuple[str, str, Decimal]]:
    """Lines of ``CHIP PRICE`` or ``CHIP TEMPLATE PRICE``."""
    rates = []
    for n, raw in enumerate(text.splitlines(), 1):
        parts = raw.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) not in (2, 3):
            raise ValueError(f"rates line {n}: write 'CHIP PRICE' or 'CHIP TEMPLATE PRICE'")
        try:
            price = Decimal(parts[-1])
        except InvalidOperation as exc:
            raise ValueError(f"rates line {n}: {parts[-1]!r} is not a price") from exc
        if not price.is_finite() or price < 0 or price != price.quantize(Decimal("0.0001")) or price >= 10**8:
            raise ValueError(f"rates line {n}: a price is >= 0 with at most 4 decimals")
        rates.append((parts[0], parts[1] if len(parts) == 3 else "", price))
    if not rates:
        raise ValueError("a rate card needs at least one rate")
    if len({(c, t) for c, t, _ in rates}) != len(rates):
        raise ValueError("rates: a chip (and template) may appear only once")
    return rates


def _parse_multipliers(text: str) -> list[tuple[str, Decimal]]:
    found = []
    for n, raw in enumerate(text.splitlines(), 1):
        parts = raw.split("#", 1)[0].split()
        if not parts:
            continue
        if len(parts) != 2:
            raise ValueError(f"multipliers line {n}: write 'CLASS FACTOR'")
        try:
            factor = Decimal(parts[1])
        except InvalidOperation as exc:
            raise ValueError(f"multipliers line {n}: {parts[1]!r} is not a number") from exc
        if not factor.is_finite() or factor < 0 or factor != factor.quantize(Decimal("0.001")) or factor >= 1000:
            raise ValueError(f"multipliers line {n}: a factor is >= 0 with at most 3 decimals")
        found.append((parts[0], factor))
    if len({c for c, _ in found}) != len(found):
        raise ValueError("multipliers: a class may appear only once")
    return found


def last_closed_month_end() -> date | None:
    """The first day after the newest closed month (a new card may not start before it)."""
    label = Statement.objects.filter(closed_at__isnull=False).order_by("-month").values_list("month", flat=True).first()
    if not label:
        return None
    policy = active_policy().policy
    return month_of(policy, timezone.now(), label).end.date()


@login_required
def rate_cards(request: HttpRequest) -> HttpResponse:
    """Rate cards, newest first; staff add a new one (cards that priced a closed month are never edited)."""
    if not is_finance(request.user):
        return _forbidden(request, "rate cards are for finance and admins")
    cards = list(RateCard.objects.prefetch_related("rates", "multipliers").order_by("-effective_from"))
    current = cards[0] if cards else None
    earliest = last_closed_month_end()
    form: dict[str, Any] = {
        "effective_from": "",
        "currency": current.currency if current else "CNY",
        "idle_mode": current.idle_mode if current else RateCard.IdleMode.SEPARATE,
        "reserved_mode": current.reserved_mode if current else RateCard.ReservedMode.HIDE,
        "comment": "",
        "rates": "\n".join(
            f"{r.chip_model} {r.vnpu_template + ' ' if r.vnpu_template else ''}{r.price_per_device_hour.normalize():f}"
            for r in (current.rates.all() if current else [])
        ),
        "multipliers": "\n".join(
            f"{m.priority_class} {m.multiplier.normalize():f}" for m in (current.multipliers.all() if current else [])
        ),
    }
    error = ""
    if request.method == "POST":
        if not request.user.is_staff:
            return _forbidden(request, "only admins add rate cards")
        form.update({k: request.POST.get(k, "").strip() for k in form})
        try:
            card = _create_card(form, earliest, request.user)
        except ValueError as exc:
            error = str(exc)
        else:
            messages.success(request, f"Rate card from {card.effective_from} saved.")
            return redirect("reports-rates")
    policy = active_policy().policy
    return render(
        request,
        "reports/rates.html",
        {
            "cards": cards,
            "form": form,
            "error": error,
            "earliest": earliest,
            "idle_modes": RateCard.IdleMode.choices,
            "reserved_modes": RateCard.ReservedMode.choices,
            "timezone": policy.timezone,
            "today": timezone.now().astimezone(zone(policy.timezone)).date(),
        },
    )


def _create_card(form: dict[str, Any], earliest: date | None, actor: Any) -> RateCard:
    try:
        effective = date.fromisoformat(form["effective_from"])
    except ValueError as exc:
        raise ValueError("effective from: a date like 2026-12-01") from exc
    if earliest is not None and effective < earliest:
        raise ValueError(
            f"effective from: months up to {earliest - timedelta(days=1)} are closed; start on or after {earliest}"
        )
    if RateCard.objects.filter(effective_from=effective).exists():
        raise ValueError(f"effective from: a card already starts on {effective}")
    currency = form["currency"].upper()
    if len(currency) != 3 or not currency.isalpha():
        raise ValueError("currency: a three-letter code like CNY")
    if form["idle_mode"] not in RateCard.IdleMode.values:
        raise ValueError("idle mode: unknown")
    if form["reserved_mode"] not in RateCard.ReservedMode.values:
        raise ValueError("reserved mode: unknown")
    rates = _parse_rates(form["rates"])
    multipliers = _parse_multipliers(form["multipliers"])
    with transaction.atomic():
        card = RateCard.objects.create(
            effective_from=effective,
            currency=currency,
            idle_mode=form["idle_mode"],
            reserved_mode=form["reserved_mode"],
            comment=form["comment"][:500],
        )
        Rate.objects.bulk_create(
            Rate(rate_card=card, chip_model=c, vnpu_template=t, price_per_device_hour=p) for c, t, p in rates
        )
        ClassMultiplier.objects.bulk_create(
            ClassMultiplier(rate_card=card, priority_class=c, multiplier=m) for c, m in multipliers
        )
        AuditEvent.objects.create(
            actor=actor,
            action="chargeback.ratecard",
            target=f"rate card from {effective}",
            detail=f"{currency}; idle {card.idle_mode}; reserved {card.reserved_mode}; "
            + ", ".join(f"{c}{'/' + t if t else ''} {p}" for c, t, p in rates),
        )
    return card
