"""Prices in force, and the rounding rules every amount goes through.

A rate card is in force from 00:00 of its ``effective_from`` date on the
policy's clock until the next card's date. A month is priced in *periods*: the
month cut at every card boundary inside it, so usage on each side of a rate
change is priced by the card in force at that instant.

Rounding (docs/chargeback.md, "Rounding"): device-seconds are exact (microsecond
durations × the card share, rounded to a millionth of a card); a line's
``device_hours`` is its device-seconds / 3600 rounded half-up to 6 places; its
``amount`` is ``device_hours × rate × multiplier`` rounded half-up to the cent.
Totals are sums of line amounts, never re-rounded.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, time
from decimal import ROUND_DOWN, ROUND_HALF_UP, Decimal
from typing import TypeVar
from zoneinfo import ZoneInfo

from quotas.models import RateCard

CENT = Decimal("0.01")
HOURS_PLACES = Decimal("0.000001")  # device_hours: 6 places
SECONDS_QUANTUM = Decimal("0.000001")  # device-seconds split among teams: to the micro-device-second
SHARE_QUANTUM = Decimal("0.000001")  # a card share: to the millionth of a card
ZERO = Decimal("0")
ONE = Decimal("1")
SECONDS_PER_HOUR = Decimal(3600)

K = TypeVar("K", bound=Hashable)


def money(value: Decimal) -> Decimal:
    """Round to the cent, half up (0.005 → 0.01)."""
    return value.quantize(CENT, rounding=ROUND_HALF_UP)


def device_hours(device_seconds: Decimal) -> Decimal:
    """Device-seconds as device-hours, rounded half up to 6 places."""
    return (device_seconds / SECONDS_PER_HOUR).quantize(HOURS_PLACES, rounding=ROUND_HALF_UP)


def line_amount(hours: Decimal, rate: Decimal, multiplier: Decimal) -> Decimal:
    """The amount of one line: its printed hours × rate × multiplier, rounded half up to the cent."""
    return money(hours * rate * multiplier)


def card_share(value: float | Decimal) -> Decimal:
    """An allocation's card equivalent as an exact decimal, to a millionth of a card (0.125 stays 0.125)."""
    if isinstance(value, Decimal):
        return value.quantize(SHARE_QUANTUM, rounding=ROUND_HALF_UP)
    return Decimal(repr(float(value))).quantize(SHARE_QUANTUM, rounding=ROUND_HALF_UP)


def split_exactly(total: Decimal, weights: Mapping[K, Decimal], quantum: Decimal) -> dict[K, Decimal]:
    """Split ``total`` in proportion to ``weights`` so the parts add up to ``total`` exactly.

    Largest remainder: every part is first rounded down to ``quantum``; the
    quanta left over go one each to the parts with the largest remainders (ties
    to the earlier key in sorted order, so the split is reproducible). Keys with
    zero weight get nothing; with no positive weight at all the result is empty.
    """
    positive = {k: w for k, w in weights.items() if w > 0}
    whole = sum(positive.values(), ZERO)
    if not positive or total <= 0:
        return {}
    total = total.quantize(quantum, rounding=ROUND_DOWN)
    parts: dict[K, Decimal] = {}
    remainders: list[tuple[Decimal, str, K]] = []
    for key in sorted(positive, key=str):
        exact = total * positive[key] / whole
        part = exact.quantize(quantum, rounding=ROUND_DOWN)
        parts[key] = part
        remainders.append((exact - part, str(key), key))
    left = int(((total - sum(parts.values(), ZERO)) / quantum).to_integral_value())
    remainders.sort(key=lambda r: (-r[0], r[1]))
    for _, _, key in remainders[:left]:
        parts[key] += quantum
    return parts


@dataclass
class PricingPeriod:
    """A stretch of a month under one rate card (``card`` ``None``: no card was in force yet)."""

    start: datetime
    end: datetime
    card: RateCard | None
    prices: dict[tuple[str, str], Decimal] = field(default_factory=dict)  # (chip, template) -> price
    multipliers: dict[str, Decimal] = field(default_factory=dict)  # class -> multiplier

    def price(self, chip_model: str, vnpu_template: str = "") -> Decimal | None:
        """The template's own rate, else the chip's; ``None`` when the card has neither."""
        if vnpu_template and (chip_model, vnpu_template) in self.prices:
            return self.prices[(chip_model, vnpu_template)]
        return self.prices.get((chip_model, ""))

    def multiplier(self, priority_class: str) -> Decimal:
        return self.multipliers.get(priority_class, ONE)


def card_start(card: RateCard, tz: ZoneInfo) -> datetime:
    """The instant a card takes effect: 00:00 of its date on the policy's clock."""
    return datetime.combine(card.effective_from, time(0), tzinfo=tz)


def pricing_periods(start: datetime, end: datetime, tz: ZoneInfo) -> list[PricingPeriod]:
    """``[start, end)`` cut at every rate-card boundary inside it, each piece with the card in force."""
    if end <= start:
        return []
    cards = list(RateCard.objects.prefetch_related("rates", "multipliers").order_by("effective_from"))
    bounds = [(card_start(c, tz), c) for c in cards]
    current: RateCard | None = None
    cuts: list[tuple[datetime, RateCard | None]] = []
    for at, card in bounds:
        if at <= start:
            current = card
        elif at < end:
            cuts.append((at, card))
    periods: list[PricingPeriod] = []
    edges = [(start, current), *cuts]
    for i, (at, card) in enumerate(edges):
        stop = edges[i + 1][0] if i + 1 < len(edges) else end
        period = PricingPeriod(start=at, end=stop, card=card)
        if card is not None:
            period.prices = {(r.chip_model, r.vnpu_template): r.price_per_device_hour for r in card.rates.all()}
            period.multipliers = {m.priority_class: m.multiplier for m in card.multipliers.all()}
        periods.append(period)
    return periods
