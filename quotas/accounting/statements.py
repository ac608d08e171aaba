"""Monthly statements: price a month, close it (frozen), adjust it, and watch budgets.

:func:`compute_month` is the one place a month is priced; the close stores
what it computes, the reports page and the budget check show it live. For a
month (on the policy's clock) and each rate-card period in it:

1. **usage** — every team's device-seconds per chip model, vNPU template and
   priority class (exact sums by the database), priced at the card's rate for
   the chip (or the template's own rate) × the class multiplier;
2. **capacity** — per chip model, the device-seconds its cards were in the
   inventory (``devices.services.inventory``: a card added on the 20th counts
   from the 20th, one removed on the 10th stops there). It splits exactly into
   used, **unused reservations** (``reserved_mode`` other than ``hide``:
   ``ratio × available`` minus what the reserved classes used, at most what is
   free), **unavailable** (the free part of cards cordoned, draining, down,
   unhealthy or disabled: a line per status) and **idle** (usable, unused);
3. unavailable and idle follow ``idle_mode``: not charged (``hide``, still
   counted in the balance), lines on the cluster statement, or shared among
   teams by usage or by guarantee.

The free capacity's lines share ``provisioned × rate`` minus the usage at the
chip's rate to the cent, so a month charges (plus what ``hide`` leaves not
charged) exactly provisioned × rate, up to what class multipliers and template
rates add: :class:`ChipStats` is that balance, stored on the cluster statement.
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
from django.db.models import F, OuterRef, Q, Subquery
from django.utils import timezone

from devices.models import InventoryEvent
from devices.services import inventory
from quotas.accounting.rates import (
    CENT,
    ONE,
    SECONDS_QUANTUM,
    ZERO,
    PricingPeriod,
    card_share,
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
from quotas.policies.versions import active_policy
from scheduling.engine.policy import Policy, zone
from scheduling.models import Allocation
from scheduling.services.usage import Month, month_of

log = logging.getLogger(__name__)

KIND_ORDER = {"usage": 0, "reserved": 1, "unavailable": 2, "idle": 3, "adjustment": 4}
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
    #: Capacity lines carry their share of the chip's amount split to the cent (the month balances).
    fixed_amount: Decimal | None = None

    @property
    def device_hours(self) -> Decimal:
        return device_hours(self.device_seconds)

    @property
    def amount(self) -> Decimal:
        if self.fixed_amount is not None:
            return self.fixed_amount
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
    """One chip model's balance over the counted window: device-seconds, and amounts in the currency.

    ``provisioned = used + reserved_unused + unavailable + idle`` exactly (unless jobs ran on
    cards the inventory did not have: a warning). ``amount`` is provisioned × rate (per pricing
    period, to the cent); ``charged`` what the statements charge for the chip and ``not_charged``
    what they do not (idle and unavailable in ``hide``): ``charged + not_charged = amount +
    pricing_difference``, the difference being what class multipliers and vNPU template rates add
    to (or take from) usage at the chip's rate.
    """

    provisioned: Decimal = ZERO
    used: Decimal = ZERO
    reserved_unused: Decimal = ZERO
    unavailable_by_status: dict[str, Decimal] = field(default_factory=dict)
    unavailable_by_cause: dict[str, Decimal] = field(default_factory=dict)
    idle: Decimal = ZERO
    rates: list[Decimal] = field(default_factory=list)
    amount: Decimal = Decimal("0.00")
    pricing_difference: Decimal = Decimal("0.00")
    charged: Decimal = Decimal("0.00")
    not_charged: Decimal = Decimal("0.00")

    @property
    def capacity(self) -> Decimal:
        """Provisioned device-seconds (the name the reports page used)."""
        return self.provisioned

    @property
    def unavailable(self) -> Decimal:
        return sum(self.unavailable_by_status.values(), ZERO)

    def as_dict(self) -> dict[str, object]:
        """The balance as the JSON export and the closed cluster statement keep it (decimal strings, hours)."""

        def hours(seconds: Decimal) -> str:
            return str(device_hours(seconds))

        return {
            "provisioned_hours": hours(self.provisioned),
            "used_hours": hours(self.used),
            "reserved_unused_hours": hours(self.reserved_unused),
            "unavailable_hours": hours(self.unavailable),
            "unavailable_by_status": {k: hours(v) for k, v in sorted(self.unavailable_by_status.items())},
            "unavailable_by_cause": {k: hours(v) for k, v in sorted(self.unavailable_by_cause.items())},
            "idle_hours": hours(self.idle),
            "rate": str(self.rates[0]) if len(set(self.rates)) == 1 else None,
            "rates": [str(r) for r in self.rates],
            "amount": str(self.amount),
            "pricing_difference": str(self.pricing_difference),
            "charged": str(self.charged),
            "not_charged": str(self.not_charged),
        }


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

    @property
    def not_charged(self) -> Decimal:
        """What the month's capacity is worth and no statement charges (idle and unavailable in ``hide``)."""
        return sum((s.not_charged for s in self.chips.values()), Decimal("0.00"))

    def balance(self) -> dict[str, dict[str, object]]:
        """Per chip model, :meth:`ChipStats.as_dict`: what the cluster statement stores at the close."""
        return {chip: stats.as_dict() for chip, stats in sorted(self.chips.items())}


# -- capacity -------------------------------------------------------------------


@dataclass
class Capacity:
    """What the inventory history says about one chip model over a window, in device-seconds.

    ``provisioned``: time its cards were in the inventory (first event to ``removed``).
    ``unavailable``: the free part of cards in any status but ``usable`` (usage on a cordoned
    card is usage, not unavailable), by status and by cause.
    """

    provisioned: Decimal = ZERO
    unavailable_by_status: dict[str, Decimal] = field(default_factory=dict)
    unavailable_by_cause: dict[str, Decimal] = field(default_factory=dict)

    @property
    def unavailable(self) -> Decimal:
        return sum(self.unavailable_by_status.values(), ZERO)


def _overlap(a_start: datetime, a_end: datetime, b_start: datetime, b_end: datetime) -> Decimal:
    return seconds_of(max(min(a_end, b_end) - max(a_start, b_start), timedelta(0)))


def provisioned_capacity(start: datetime, end: datetime) -> dict[str, Capacity]:
    """Per chip model, what its cards were in ``[start, end)``, from the inventory history.

    A card counts from its first ``InventoryEvent`` to its ``removed`` one (a card added on the
    20th counts from the 20th). In a stretch it was not ``usable`` (cordoned, draining, down,
    unhealthy, disabled), the part jobs did not hold is unavailable; jobs' allocations there
    (at their card share, open ones up to ``end``) stay usage.
    """
    found: dict[str, Capacity] = defaultdict(Capacity)
    out_of_service: list[inventory.Stretch] = []
    for stretch in inventory.stretches(start, end):
        found[stretch.chip_model].provisioned += seconds_of(stretch.end - stretch.start)
        if stretch.status != inventory.Status.USABLE:
            out_of_service.append(stretch)
    if not out_of_service:
        return dict(found)
    held: dict[int, list[tuple[datetime, datetime, Decimal]]] = defaultdict(list)
    allocations = (
        Allocation.objects.filter(device_id__in={s.device_id for s in out_of_service}, start__lt=end)
        .filter(Q(end__isnull=True) | Q(end__gt=start))
        .values_list("device_id", "start", "end", "device_share")
    )
    for device_id, a_start, a_end, share in allocations:
        held[device_id].append((a_start, min(a_end or end, end), card_share(share)))
    for stretch in out_of_service:
        length = seconds_of(stretch.end - stretch.start)
        used = sum(
            (_overlap(a, b, stretch.start, stretch.end) * share for a, b, share in held.get(stretch.device_id, [])),
            ZERO,
        )
        free = max(length - used, ZERO)
        if free <= 0:
            continue
        chip = found[stretch.chip_model]
        chip.unavailable_by_status[stretch.status] = chip.unavailable_by_status.get(stretch.status, ZERO) + free
        cause = stretch.cause or stretch.status
        chip.unavailable_by_cause[cause] = chip.unavailable_by_cause.get(cause, ZERO) + free
    return dict(found)


def used_before_joining(start: datetime, end: datetime) -> dict[str, int]:
    """Per chip model, how many allocations in ``[start, end)`` began before their card joined the inventory.

    A data error (a job on a card that did not exist yet): the close warns, and that usage has no
    provisioned time under it.
    """
    first = InventoryEvent.objects.filter(device_id=OuterRef("device_id")).order_by("at", "id").values("at")[:1]
    rows = (
        Allocation.objects.filter(start__lt=end)
        .filter(Q(end__isnull=True) | Q(end__gt=start))
        .annotate(joined=Subquery(first))
        .filter(Q(joined__isnull=True) | Q(start__lt=F("joined")))
        .values_list("device__chip_model", flat=True)
    )
    counts: dict[str, int] = defaultdict(int)
    for chip in rows:
        counts[chip] += 1
    return dict(counts)


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
            return
        if found.fixed_amount is not None or line.fixed_amount is not None:
            found.fixed_amount = found.amount + line.amount
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
    for line in bill.lines:
        if line.chip_model in bill.chips:
            bill.chips[line.chip_model].charged += line.amount
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
    capacity = provisioned_capacity(period.start, period.end)
    for chip, count in sorted(used_before_joining(period.start, period.end).items()):
        _warn(bill, f"{count} allocation(s) on {chip} began before their card joined the inventory (a data error)")
    guaranteed = guarantees(policy, names) if bill.idle_mode == RateCard.IdleMode.SHARE_BY_GUARANTEE else {}
    for chip in sorted(set(capacity) | set(used_chip)):
        weights_of_chip = {t: s for (t, c), s in used_team_chip.items() if c == chip}
        _price_capacity(
            bill,
            lines,
            period,
            policy,
            chip,
            capacity.get(chip, Capacity()),
            used_chip.get(chip, ZERO),
            used_class,
            weights_of_chip,
            dict(used_team),
            guaranteed,
            strict=strict,
        )


@dataclass
class _Piece:
    """A part of a chip's free capacity and who pays it (``charged`` False: hidden, counted as not charged)."""

    kind: str
    team_id: int | None
    seconds: Decimal
    description: str
    charged: bool = True


def _split_signed(total: Decimal, weights: dict[int, Decimal], quantum: Decimal) -> dict[int, Decimal]:
    """:func:`split_exactly` for a total of either sign (a rounding remainder can be negative)."""
    if total < 0:
        return {k: -v for k, v in split_exactly(-total, weights, quantum).items()}
    return split_exactly(total, weights, quantum)


def _price_capacity(
    bill: MonthBill,
    lines: _Lines,
    period: PricingPeriod,
    policy: Policy,
    chip: str,
    cap: Capacity,
    used: Decimal,
    used_class: dict[tuple[str, int, str], Decimal],
    weights_of_chip: dict[int, Decimal],
    used_team: dict[int, Decimal],
    guaranteed: dict[int, Decimal],
    *,
    strict: bool,
) -> None:
    """Split one chip's provisioned time in a period into unused reservations, unavailable and idle, and price it.

    The free capacity (provisioned − used) is worth ``money(provisioned × rate)`` minus the usage
    lines at the chip's rate; that amount is split to the cent among the pieces by their time, so
    the month charges (or shows as not charged) provisioned × rate exactly.
    """
    card_id = period.card.pk if period.card is not None else None
    stats = bill.chips.setdefault(chip, ChipStats())
    rate = _rate(bill, period, chip, "", strict)
    unavailable = cap.unavailable
    free = cap.provisioned - used - unavailable
    if free < 0:
        _warn(
            bill,
            f"{chip}: jobs held {device_hours(used)} device-hours but the inventory provisioned only "
            f"{device_hours(cap.provisioned - unavailable)} usable ones from "
            f"{_on_clock(period.start, bill.timezone)} (jobs on cards the inventory did not have)",
        )
    idle = max(free, ZERO)
    stats.provisioned += cap.provisioned
    stats.used += used
    for target, source in (
        (stats.unavailable_by_status, cap.unavailable_by_status),
        (stats.unavailable_by_cause, cap.unavailable_by_cause),
    ):
        for key, seconds in source.items():
            target[key] = target.get(key, ZERO) + seconds
    if rate not in stats.rates:
        stats.rates.append(rate)
    pieces: list[_Piece] = []

    if bill.reserved_mode != RateCard.ReservedMode.HIDE and idle > 0:
        for reservation in policy.reservations:
            if reservation.chip_models is not None and chip not in reservation.chip_models:
                continue
            held_for = (cap.provisioned - unavailable) * Decimal(str(reservation.ratio))
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
                weights, basis = dict(weights_of_chip), f"by use of {chip}"
            parts = split_exactly(unused, weights, SECONDS_QUANTUM)
            for team_id, seconds in parts.items():
                pieces.append(
                    _Piece(StatementLine.Kind.RESERVED, team_id, seconds, f"reservation {reservation.name}, {basis}")
                )
            idle -= sum(parts.values(), ZERO)
            stats.reserved_unused += sum(parts.values(), ZERO)
    stats.idle += idle

    # Idle and unavailable follow the idle mode; unavailable always on lines of its own, per status.
    free_parts = [(StatementLine.Kind.IDLE, "idle capacity", idle)] + [
        (StatementLine.Kind.UNAVAILABLE, f"unavailable: {status}", seconds)
        for status, seconds in sorted(cap.unavailable_by_status.items())
    ]
    if bill.idle_mode == RateCard.IdleMode.SHARE_BY_GUARANTEE:
        weights, basis = guaranteed, "shared by guaranteed devices"
    else:
        weights, basis = weights_of_chip, f"shared by use of {chip}"
        if not any(w > 0 for w in weights.values()):
            weights, basis = used_team, "shared by use of all chips"
    for kind, what, seconds in free_parts:
        if seconds <= 0:
            continue
        if bill.idle_mode == RateCard.IdleMode.HIDE:
            pieces.append(_Piece(kind, None, seconds, what, charged=False))
            continue
        if bill.idle_mode == RateCard.IdleMode.SEPARATE:
            pieces.append(_Piece(kind, None, seconds, what))
            continue
        parts = split_exactly(seconds, weights, SECONDS_QUANTUM)
        if not parts:
            pieces.append(_Piece(kind, None, seconds, f"{what} (no team to share it with)"))
            continue
        pieces.extend(_Piece(kind, team_id, part, f"{what}, {basis}") for team_id, part in parts.items())

    # The balance: provisioned × rate, less the usage lines at the chip's rate, is what the pieces are worth.
    amount = line_amount(device_hours(cap.provisioned), rate, ONE)
    usage_lines = [
        ln
        for ln in lines.by_key.values()
        if ln.kind == StatementLine.Kind.USAGE and ln.chip_model == chip and ln.card_id == card_id
    ]
    at_rate = sum((line_amount(ln.device_hours, rate, ONE) for ln in usage_lines), Decimal("0.00"))
    stats.amount += amount
    stats.pricing_difference += sum((ln.amount for ln in usage_lines), Decimal("0.00")) - at_rate
    worth = amount - at_rate
    shares = _split_signed(worth, {i: p.seconds for i, p in enumerate(pieces)}, CENT)
    if not shares:
        stats.not_charged += worth  # nothing free to carry it (a card fully used, or a data error)
    for i, piece in enumerate(pieces):
        value = shares.get(i, Decimal("0.00"))
        if not piece.charged:
            stats.not_charged += value
            continue
        lines.add(
            BillLine(
                team_id=piece.team_id,
                kind=piece.kind,
                chip_model=chip,
                device_seconds=piece.seconds,
                rate=rate,
                multiplier=ONE,
                card_id=card_id,
                description=piece.description,
                fixed_amount=value,
            )
        )


def _warn(bill: MonthBill, message: str) -> None:
    if message not in bill.warnings:
        bill.warnings.append(message)


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
            balance=bill.balance() if team is None else {},
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


def _on_clock(moment: datetime, timezone_name: str) -> str:
    """``moment`` as people read it, on the policy's clock with its zone: ``2026-12-01 08:00 CST``."""
    local = moment.astimezone(zone(timezone_name))
    return f"{local:%Y-%m-%d %H:%M} {local.tzname() or timezone_name}"


def _mail_alert(budget: Budget, bill: MonthBill, cost: Decimal, crossed: list[int]) -> None:
    recipients = alert_recipients(budget.team)
    top = max(crossed)
    percent = (cost * 100 / budget.monthly_amount).quantize(Decimal("0.1"))
    subject = f"[npuportal] {budget.team.name}: {percent}% of the {bill.month.label} budget used"
    body = (
        f"Team {budget.team.name} has used {cost} {bill.currency} of its monthly budget of "
        f"{budget.monthly_amount} {bill.currency} in {bill.month.label} ({percent}%, past the {top}% threshold).\n"
        f"Usage cost so far, running jobs counted up to {_on_clock(bill.until, bill.timezone)}; idle and reservation "
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
