"""Monthly statements: price a month, close it (frozen), adjust it, and watch budgets.

:func:`compute_month` is the one place a month is priced; the close stores
what it computes, the reports page and the budget check show it live. For a
month (on the policy's clock) and each rate-card period in it:

1. **usage** — every team's device-seconds per chip model, vNPU template and
   priority class (exact sums by the database), priced at the card's rate for
   the chip (or the template's own rate) × the class multiplier;
2. **unused reservations** (``reserved_mode`` other than ``hide``) — for each
   policy reservation covering a chip: ``ratio × healthy capacity`` minus what
   the reserved classes used there, at most the chip's idle time; charged to
   the reserved classes' users or to all users of the chip, by usage;
3. **idle** — healthy capacity minus usage minus the unused reservations
   charged above: hidden, a line on the cluster statement, or shared among
   teams by usage or by guarantee.

Modes come from the card in force at the start of the month and are stored
on each statement. docs/chargeback.md has worked examples of every rule.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import OuterRef, Subquery
from django.utils import timezone

from devices.models import Device, HealthEvent
from quotas.accounting.rates import (
    ONE,
    SECONDS_QUANTUM,
    ZERO,
    PricingPeriod,
    card_start,
    device_hours,
    line_amount,
    money,
    pricing_periods,
    split_exactly,
)
from quotas.accounting.records import (
    record_closed_allocations,
    record_open_allocations,
    seconds_of,
    usage_seconds,
)
from quotas.models import (
    AuditEvent,
    Budget,
    BudgetAlert,
    Membership,
    RateCard,
    Statement,
    StatementLine,
    Team,
)
from quotas.services import active_policy
from scheduling.engine.policy import Policy, zone
from scheduling.services.usage import Month, month_of

log = logging.getLogger(__name__)

KIND_ORDER = {"usage": 0, "reserved": 1, "idle": 2, "adjustment": 3}
CLUSTER = "@cluster"  # how the cluster's own statement is named in URLs, exports and the command line


class ChargebackError(Exception):
    """A refused chargeback action (exit code 1); the message says why in one sentence."""


class ChargebackUsageError(ChargebackError):
    """Bad input (exit code 2): an unknown team, a malformed month or amount."""


@dataclass
class BillLine:
    team_id: int | None  # None: the cluster's own statement
    kind: str
    chip_model: str = ""
    vnpu_template: str = ""
    priority_class: str = ""
    device_seconds: Decimal = ZERO
    rate: Decimal = ZERO
    multiplier: Decimal = ONE
    card_id: int | None = None
    description: str = ""

    @property
    def device_hours(self) -> Decimal:
        return device_hours(self.device_seconds)

    @property
    def amount(self) -> Decimal:
        return line_amount(self.device_hours, self.rate, self.multiplier)

    def sort_key(self) -> tuple[object, ...]:
        return (
            KIND_ORDER[self.kind],
            self.chip_model,
            self.vnpu_template,
            self.priority_class,
            self.card_id or 0,
            self.description,
        )


@dataclass
class ChipStats:
    """One chip model over the counted window, in device-seconds."""

    capacity: Decimal = ZERO
    used: Decimal = ZERO
    idle: Decimal = ZERO  # capacity - used, never below 0
    reserved_unused: Decimal = ZERO  # the part of idle charged as unused reservations


@dataclass
class MonthBill:
    month: Month
    until: datetime  # the end of the counted window: the month's end, or now
    currency: str
    idle_mode: str
    reserved_mode: str
    card_ids: list[int]
    policy_version: int | None
    timezone: str
    lines: list[BillLine] = field(default_factory=list)
    chips: dict[str, ChipStats] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return self.until >= self.month.end

    def lines_of(self, team_id: int | None) -> list[BillLine]:
        return [line for line in self.lines if line.team_id == team_id]

    def total_of(self, team_id: int | None) -> Decimal:
        return sum((line.amount for line in self.lines_of(team_id)), Decimal("0.00"))

    def team_ids(self) -> list[int]:
        return sorted({line.team_id for line in self.lines if line.team_id is not None})


# -- capacity -------------------------------------------------------------------


def healthy_capacity(start: datetime, end: datetime) -> dict[str, Decimal]:
    """Device-seconds per chip model that were there to be used in ``[start, end)``.

    Approximation (docs/chargeback.md, "Idle capacity"): every device that
    exists and is ``schedulable`` now counts for the whole window, minus the
    stretches its health history (``HealthEvent``) shows it degraded, failed or
    unknown. A device with no history counts as healthy throughout.
    """
    if end <= start:
        return {}
    usable = {str(h) for h in Device.USABLE_HEALTH}
    before = HealthEvent.objects.filter(device_id=OuterRef("pk"), at__lte=start).order_by("-at", "-id")
    devices = list(
        Device.objects.filter(schedulable=True)
        .annotate(at_start=Subquery(before.values("to_health")[:1]))
        .values_list("id", "chip_model", "at_start")
    )
    window = seconds_of(end - start)
    capacity: dict[str, Decimal] = defaultdict(lambda: ZERO)
    state: dict[int, tuple[str, datetime]] = {}
    for device_id, chip, at_start in devices:
        capacity[chip] += window
        state[device_id] = (at_start or Device.Health.HEALTHY, start)
    chip_of = {device_id: chip for device_id, chip, _ in devices}
    events = (
        HealthEvent.objects.filter(device_id__in=list(chip_of), at__gt=start, at__lt=end)
        .order_by("device_id", "at", "id")
        .values_list("device_id", "at", "to_health")
    )
    for device_id, at, to_health in events:
        health, since = state[device_id]
        if health not in usable:
            capacity[chip_of[device_id]] -= seconds_of(at - since)
        state[device_id] = (to_health, at)
    for device_id, (health, since) in state.items():
        if health not in usable:
            capacity[chip_of[device_id]] -= seconds_of(end - since)
    return dict(capacity)


def guarantees(policy: Policy, teams: dict[int, str]) -> dict[int, Decimal]:
    """Guaranteed devices of each team in the policy's base quota (``guaranteed.devices``)."""
    return {
        team_id: Decimal(str(policy.team(name).quota.guaranteed.get("devices", 0.0))) for team_id, name in teams.items()
    }


# -- pricing --------------------------------------------------------------------


class _Lines:
    def __init__(self) -> None:
        self.by_key: dict[tuple[object, ...], BillLine] = {}

    def add(self, line: BillLine) -> None:
        key = (
            line.team_id,
            line.kind,
            line.chip_model,
            line.vnpu_template,
            line.priority_class,
            line.rate,
            line.multiplier,
            line.card_id,
            line.description,
        )
        found = self.by_key.get(key)
        if found is None:
            self.by_key[key] = line
        else:
            found.device_seconds += line.device_seconds

    def sorted(self, names: dict[int, str]) -> list[BillLine]:
        lines = [line for line in self.by_key.values() if line.device_seconds > 0]
        return sorted(lines, key=lambda ln: (names.get(ln.team_id, "") if ln.team_id else "~", *ln.sort_key()))


def _card_at(at: datetime, policy: Policy) -> RateCard | None:
    tz = zone(policy.timezone)
    for card in RateCard.objects.order_by("-effective_from"):
        if card_start(card, tz) <= at:
            return card
    return None


def compute_month(
    label: str | None = None,
    *,
    now: datetime | None = None,
    live: bool = True,
    strict: bool = False,
    team_ids: list[int] | None = None,
) -> MonthBill:
    """Price ``label`` (default: this month) up to ``now`` or the month's end, whichever is first.

    ``live`` adds usage not recorded yet (running jobs up to now). ``strict``
    (the close) refuses a month with a stretch no card prices or a chip no card
    has a rate for; otherwise those are priced at 0 with a warning.
    ``team_ids`` restricts the bill to those teams' usage lines (no idle or
    reservation shares, which need every team): the budget check uses it.
    """
    active = active_policy()
    policy = active.policy
    tz = zone(policy.timezone)
    now = now or timezone.now()
    month = month_of(policy, now, label)
    until = max(min(month.end, now), month.start)
    periods = pricing_periods(month.start, until, tz)
    first = _card_at(month.start, policy)
    bill = MonthBill(
        month=month,
        until=until,
        currency=first.currency if first else "",
        idle_mode=first.idle_mode if first else RateCard.IdleMode.HIDE,
        reserved_mode=first.reserved_mode if first else RateCard.ReservedMode.HIDE,
        card_ids=sorted({p.card.pk for p in periods if p.card is not None}),
        policy_version=active.version,
        timezone=policy.timezone,
    )
    currencies = sorted({p.card.currency for p in periods if p.card is not None})
    if not bill.currency and currencies:
        bill.currency = currencies[0]
    if len(currencies) > 1:
        _problem(bill, strict, f"rate cards in {month.label} use several currencies ({', '.join(currencies)})")
    names = dict(Team.objects.values_list("id", "name"))
    lines = _Lines()
    for period in periods:
        if period.card is None:
            _problem(
                bill,
                strict,
                f"no rate card is in force from {period.start.astimezone(tz):%Y-%m-%d %H:%M} "
                f"to {period.end.astimezone(tz):%Y-%m-%d %H:%M} ({policy.timezone}): add one that starts earlier",
            )
        _price_period(bill, lines, period, month, policy, names, live=live, strict=strict, team_ids=team_ids)
    bill.lines = lines.sorted(names)
    return bill


def _problem(bill: MonthBill, strict: bool, message: str) -> None:
    if strict:
        raise ChargebackError(message)
    if message not in bill.warnings:
        bill.warnings.append(message)


def _rate(bill: MonthBill, period: PricingPeriod, chip: str, template: str, strict: bool) -> Decimal:
    price = period.price(chip, template)
    if price is None:
        if period.card is not None:
            _problem(bill, strict, f"rate card from {period.card.effective_from} has no rate for {chip}")
        return ZERO
    return price


def _price_period(
    bill: MonthBill,
    lines: _Lines,
    period: PricingPeriod,
    month: Month,
    policy: Policy,
    names: dict[int, str],
    *,
    live: bool,
    strict: bool,
    team_ids: list[int] | None,
) -> None:
    card_id = period.card.pk if period.card is not None else None
    usage = usage_seconds(month, period.start, period.end, live=live, team_ids=team_ids)
    used_chip: dict[str, Decimal] = defaultdict(lambda: ZERO)
    used_team: dict[int, Decimal] = defaultdict(lambda: ZERO)
    used_team_chip: dict[tuple[int, str], Decimal] = defaultdict(lambda: ZERO)
    used_class: dict[tuple[str, int, str], Decimal] = defaultdict(lambda: ZERO)  # (class, team, chip)
    for key in sorted(usage):
        held = usage[key] * key.device_share
        lines.add(
            BillLine(
                team_id=key.team_id,
                kind=StatementLine.Kind.USAGE,
                chip_model=key.chip_model,
                vnpu_template=key.vnpu_template,
                priority_class=key.priority_class,
                device_seconds=held,
                rate=_rate(bill, period, key.chip_model, key.vnpu_template, strict),
                multiplier=period.multiplier(key.priority_class),
                card_id=card_id,
            )
        )
        used_chip[key.chip_model] += held
        used_team[key.team_id] += held
        used_team_chip[(key.team_id, key.chip_model)] += held
        used_class[(key.priority_class, key.team_id, key.chip_model)] += held
    if team_ids is not None:
        return
    capacity = healthy_capacity(period.start, period.end)
    guaranteed = guarantees(policy, names) if bill.idle_mode == RateCard.IdleMode.SHARE_BY_GUARANTEE else {}
    for chip in sorted(set(capacity) | set(used_chip)):
        stats = bill.chips.setdefault(chip, ChipStats())
        cap, used = max(capacity.get(chip, ZERO), ZERO), used_chip.get(chip, ZERO)
        idle = max(cap - used, ZERO)
        stats.capacity += cap
        stats.used += used
        stats.idle += idle
        if idle <= 0:
            continue
        rate = _rate(bill, period, chip, "", strict)

        def charge(kind: str, team_id: int | None, seconds: Decimal, description: str) -> None:
            lines.add(
                BillLine(
                    team_id=team_id,
                    kind=kind,
                    chip_model=chip,  # noqa: B023 - called only inside this iteration
                    device_seconds=seconds,
                    rate=rate,  # noqa: B023 - called only inside this iteration
                    multiplier=ONE,
                    card_id=card_id,
                    description=description,
                )
            )

        if bill.reserved_mode != RateCard.ReservedMode.HIDE:
            for reservation in policy.reservations:
                if reservation.chip_models is not None and chip not in reservation.chip_models:
                    continue
                held_for = cap * Decimal(str(reservation.ratio))
                by_class: dict[int, Decimal] = defaultdict(lambda: ZERO)
                for (cls, team_id, c), seconds in used_class.items():
                    if c == chip and cls in reservation.priority_classes:
                        by_class[team_id] += seconds
                unused = min(max(held_for - sum(by_class.values(), ZERO), ZERO), idle)
                if unused <= 0:
                    continue
                if bill.reserved_mode == RateCard.ReservedMode.TO_CLASS_USERS:
                    weights, basis = dict(by_class), "by use of " + ", ".join(sorted(reservation.priority_classes))
                else:
                    weights = {t: s for (t, c), s in used_team_chip.items() if c == chip}
                    basis = f"by use of {chip}"
                parts = split_exactly(unused, weights, SECONDS_QUANTUM)
                if not parts:
                    continue  # nobody to charge: it stays idle
                for team_id, seconds in parts.items():
                    charge(StatementLine.Kind.RESERVED, team_id, seconds, f"reservation {reservation.name}, {basis}")
                idle -= sum(parts.values(), ZERO)
                stats.reserved_unused += sum(parts.values(), ZERO)
        if idle <= 0 or bill.idle_mode == RateCard.IdleMode.HIDE:
            continue
        if bill.idle_mode == RateCard.IdleMode.SEPARATE:
            charge(StatementLine.Kind.IDLE, None, idle, "idle capacity")
            continue
        if bill.idle_mode == RateCard.IdleMode.SHARE_BY_GUARANTEE:
            weights, basis = guaranteed, "shared by guaranteed devices"
        else:
            weights = {t: s for (t, c), s in used_team_chip.items() if c == chip}
            basis = f"shared by use of {chip}"
            if not any(w > 0 for w in weights.values()):
                weights, basis = dict(used_team), "shared by use of all chips"
        parts = split_exactly(idle, weights, SECONDS_QUANTUM)
        if not parts:
            charge(StatementLine.Kind.IDLE, None, idle, "idle capacity (no team to share it with)")
            continue
        for team_id, seconds in parts.items():
            charge(StatementLine.Kind.IDLE, team_id, seconds, f"idle capacity, {basis}")


# -- close, adjust ----------------------------------------------------------------


@dataclass
class CloseResult:
    month: str
    already_closed: bool
    statements: list[Statement] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def parse_month(label: str | None, now: datetime) -> tuple[Month, Policy]:
    from scheduling.services.usage import UsageError

    policy = active_policy().policy
    try:
        return month_of(policy, now, label), policy
    except UsageError as exc:
        raise ChargebackUsageError(str(exc)) from exc


def previous_month(now: datetime | None = None) -> str:
    """The label of the month before the one ``now`` is in, on the policy's clock."""
    now = now or timezone.now()
    policy = active_policy().policy
    current = month_of(policy, now)
    return month_of(policy, current.start - timedelta(microseconds=1)).label


def is_closed(label: str) -> bool:
    return Statement.objects.filter(team__isnull=True, month=label).exists()


def close_month(label: str | None = None, *, now: datetime | None = None, actor: object | None = None) -> CloseResult:
    """Freeze every team's statement (and the cluster's) for an ended month. A closed month is a no-op.

    Refused (``ChargebackError``) for the current or a future month, and when a
    stretch of the month or a chip used in it has no rate.
    """
    now = now or timezone.now()
    month, policy = parse_month(label or previous_month(now), now)
    if month.end > now:
        tz = zone(policy.timezone)
        raise ChargebackError(
            f"month {month.label} is not over yet: it ends {month.end.astimezone(tz):%Y-%m-%d %H:%M} "
            f"({policy.timezone}); only ended months can be closed"
        )
    if is_closed(month.label):
        return CloseResult(month.label, already_closed=True)
    # Records first, outside the close's transaction: they are true whether or not the close goes through.
    record_closed_allocations(policy=policy)
    record_open_allocations(month, policy=policy)
    bill = compute_month(month.label, now=now, live=False, strict=True)
    try:
        with transaction.atomic():
            statements = _store(bill, now)
            AuditEvent.objects.create(
                actor=actor if getattr(actor, "pk", None) else None,
                action="chargeback.close",
                target=f"month {month.label}",
                detail=", ".join(
                    f"{s.team.name if s.team_id else 'cluster'} {s.total} {s.currency}" for s in statements
                ),
            )
    except IntegrityError:
        if is_closed(month.label):
            return CloseResult(month.label, already_closed=True)
        raise
    log.info("closed month %s: %d statements", month.label, len(statements))
    return CloseResult(month.label, already_closed=False, statements=statements, warnings=bill.warnings)


def _store(bill: MonthBill, now: datetime) -> list[Statement]:
    teams = list(Team.objects.order_by("name"))
    statements: list[Statement] = []
    # The cluster's statement first: its unique (month) row is the month's lock against a second close.
    for team in [None, *teams]:
        statement = Statement.objects.create(
            team=team,
            month=bill.month.label,
            currency=bill.currency,
            idle_mode=bill.idle_mode,
            reserved_mode=bill.reserved_mode,
            rate_card_ids=bill.card_ids,
            policy_version=bill.policy_version,
            timezone=bill.timezone,
        )
        team_id = team.pk if team is not None else None
        StatementLine.objects.bulk_create(
            StatementLine(
                statement=statement,
                kind=line.kind,
                chip_model=line.chip_model,
                vnpu_template=line.vnpu_template,
                priority_class=line.priority_class,
                device_hours=line.device_hours,
                rate=line.rate,
                multiplier=line.multiplier,
                amount=line.amount,
                rate_card_id=line.card_id,
                description=line.description,
            )
            for line in bill.lines_of(team_id)
        )
        statement.total = bill.total_of(team_id)
        statement.closed_at = now
        statement.save(update_fields=["total", "closed_at"])
        statements.append(statement)
    return statements


def _money_limits(model: type, field: str) -> tuple[int, int]:
    """(decimal places, digits before the point) a money column holds, from the model's field."""
    column = model._meta.get_field(field)
    return column.decimal_places, column.max_digits - column.decimal_places


def parse_amount(text: str) -> Decimal:
    """An adjustment amount as the statement line's column can hold it, else why not (naming ``amount``).

    Its size is checked before anything is rounded: ``1e30`` would overflow ``Decimal``'s
    context in ``quantize`` (a traceback before) and the column in the database.
    """
    places, whole = _money_limits(StatementLine, "amount")
    try:
        amount = Decimal(str(text).strip())
    except (InvalidOperation, ValueError) as exc:
        raise ChargebackUsageError(f"amount: {text!r} is not a number like -120.50") from exc
    if not amount.is_finite():
        raise ChargebackUsageError(f"amount: {text!r} is not a number like -120.50")
    if amount == 0:
        raise ChargebackUsageError(f"amount: {text!r} must not be zero")
    if amount.adjusted() >= whole:
        raise ChargebackUsageError(
            f"amount: {text!r} is too large: at most {whole} digits before the point "
            f"(up to {Decimal(10) ** whole - Decimal(1).scaleb(-places)})"
        )
    if amount != amount.quantize(Decimal(1).scaleb(-places)):
        raise ChargebackUsageError(f"amount: {text!r} has more than {places} decimals")
    return amount


def statement_for(team_name: str, label: str) -> Statement | None:
    if team_name == CLUSTER:
        return Statement.objects.filter(team__isnull=True, month=label).first()
    return Statement.objects.filter(team__name=team_name, month=label).select_related("team").first()


def adjust(
    team_name: str, label: str, amount: str | Decimal, reason: str, *, actor: object | None = None
) -> StatementLine:
    """Add an adjustment line to a closed statement; its total becomes the sum of its lines again. Audited."""
    value = parse_amount(str(amount))
    reason = (reason or "").strip()
    if not reason:
        raise ChargebackUsageError("reason: say why the statement is corrected")
    if team_name != CLUSTER and not Team.objects.filter(name=team_name).exists():
        raise ChargebackUsageError(f"team: no team {team_name!r}")
    month, _ = parse_month(label, timezone.now())
    with transaction.atomic():
        found = statement_for(team_name, month.label)
        statement = Statement.objects.select_for_update().filter(pk=found.pk).order_by("pk").first() if found else None
        if statement is None:
            raise ChargebackError(f"month {month.label} is not closed: adjustments correct closed statements")
        line = StatementLine(
            statement=statement,
            kind=StatementLine.Kind.ADJUSTMENT,
            amount=money(value),
            description=reason[:300],
            actor=actor if getattr(actor, "pk", None) else None,
        )
        total = statement.lines_total() + line.amount
        _, whole = _money_limits(Statement, "total")
        if abs(total).adjusted() >= whole:  # checked before the line is written: a refusal stores nothing
            raise ChargebackUsageError(
                f"amount: {str(amount)!r} would make the statement's total {total}, "
                f"more than its {whole} digits before the point hold"
            )
        line.save()
        statement.total = statement.lines_total()
        statement.save(update_fields=["total"])
        AuditEvent.objects.create(
            actor=line.actor,
            action="chargeback.adjust",
            target=f"statement {team_name} {month.label}",
            detail=f"{value} {statement.currency}: {reason}; total now {statement.total}",
        )
    return line


# -- budgets ----------------------------------------------------------------------


def check_budgets(*, now: datetime | None = None) -> list[BudgetAlert]:
    """Alert each team whose month-to-date usage cost crossed a budget threshold, once per threshold and month.

    Usage cost only (idle and reservation shares are known at the close). The
    alert row is written in the same transaction that sends the mail, so a mail
    that fails is tried again on the next sweep, and one that was sent is never
    sent twice.
    """
    budgets = list(Budget.objects.select_related("team").order_by("team__name"))
    if not budgets:
        return []
    bill = compute_month(None, now=now, live=True, team_ids=[b.team_id for b in budgets])
    sent: list[BudgetAlert] = []
    for budget in budgets:
        if budget.monthly_amount <= 0:
            continue
        cost = bill.total_of(budget.team_id)
        done = set(
            BudgetAlert.objects.filter(team=budget.team, month=bill.month.label).values_list("threshold", flat=True)
        )
        crossed = [t for t in budget.thresholds() if t not in done and cost * 100 >= budget.monthly_amount * t]
        if not crossed:
            continue
        try:
            with transaction.atomic():
                alerts = [
                    BudgetAlert.objects.create(team=budget.team, month=bill.month.label, threshold=t, amount=cost)
                    for t in crossed
                ]
                _mail_alert(budget, bill, cost, crossed)
        except IntegrityError:
            continue  # another sweep sent it
        except Exception:  # the mail server: no alert row is kept, so the next sweep tries again
            log.exception("budget alert for %s could not be sent; retrying on the next sweep", budget.team.name)
            continue
        sent.extend(alerts)
    return sent


def alert_recipients(team: Team) -> list[str]:
    """The team's leads' e-mail addresses; the finance group's when no lead has one."""
    leads = Membership.objects.filter(team=team, role=Membership.Role.LEAD).exclude(user__email="")
    emails = sorted(set(leads.values_list("user__email", flat=True)))
    if not emails:
        users = get_user_model().objects.filter(groups__name="finance").exclude(email="")
        emails = sorted(set(users.values_list("email", flat=True)))
    return emails


def _mail_alert(budget: Budget, bill: MonthBill, cost: Decimal, crossed: list[int]) -> None:
    recipients = alert_recipients(budget.team)
    top = max(crossed)
    percent = (cost * 100 / budget.monthly_amount).quantize(Decimal("0.1"))
    subject = f"[npuportal] {budget.team.name}: {percent}% of the {bill.month.label} budget used"
    body = (
        f"Team {budget.team.name} has used {cost} {bill.currency} of its monthly budget of "
        f"{budget.monthly_amount} {bill.currency} in {bill.month.label} ({percent}%, past the {top}% threshold).\n"
        f"Usage cost so far, running jobs counted up to {bill.until:%Y-%m-%d %H:%M} UTC; idle and reservation "
        f"shares are added at the monthly close.\n"
    )
    if not recipients:
        log.warning("budget alert for %s: nobody to mail (no lead or finance e-mail)", budget.team.name)
        return
    send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, recipients, fail_silently=False)


# -- a team's cost in a month ------------------------------------------------------


@dataclass
class TeamCost:
    """What a team's month costs: its closed statement, or the usage priced so far (``npuctl usage``)."""

    month: str
    currency: str
    amount: Decimal
    by_chip: dict[str, Decimal]
    #: ``statement``: the closed statement (usage, idle and reservation shares, adjustments);
    #: ``usage so far``: usage priced live, running jobs up to now (shares come at the close).
    basis: str
    warnings: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, object]:
        return {
            "month": self.month,
            "currency": self.currency,
            "amount": str(self.amount),
            "by_chip": {chip: str(amount) for chip, amount in sorted(self.by_chip.items())},
            "basis": self.basis,
            "warnings": self.warnings,
        }


def team_cost(team: Team, label: str | None = None, *, now: datetime | None = None) -> TeamCost:
    """The team's cost in ``label`` (default: this month), in the rate card's currency.

    A closed month answers its statement as stored; any other month is priced by
    :func:`compute_month` for this team's usage only, as the budget check prices it.
    """
    now = now or timezone.now()
    month, _ = parse_month(label, now)
    statement = Statement.objects.filter(team=team, month=month.label, closed_at__isnull=False).first()
    if statement is not None:
        by_chip: dict[str, Decimal] = defaultdict(lambda: Decimal("0.00"))
        for chip, amount in statement.lines.values_list("chip_model", "amount"):
            by_chip[chip or "adjustment"] += Decimal(amount)
        return TeamCost(month.label, statement.currency, Decimal(statement.total), dict(by_chip), "statement")
    bill = compute_month(month.label, now=now, live=True, team_ids=[team.pk])
    by_chip = defaultdict(lambda: Decimal("0.00"))
    for line in bill.lines_of(team.pk):
        by_chip[line.chip_model] += line.amount
    return TeamCost(month.label, bill.currency, bill.total_of(team.pk), dict(by_chip), "usage so far", bill.warnings)
