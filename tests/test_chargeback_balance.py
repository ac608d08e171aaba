"""A month that balances: capacity from the inventory history, worked out by hand, in every idle mode.

The harness's cluster (tests/test_chargeback_harness.py: 4× 910B4 on ``b4-node`` at ¥12, 2× 310P3 on
``p3-node`` at ¥3, all in the inventory since 2025-01-01; alpha guaranteed 3 devices, beta 1), plus,
in March 2025 (744 h, policy clock Asia/Shanghai):

- ``old-node``, 2× 910B4 since January, removed on 10 March 00:00: 2 × 9 days × 24 h = 432 h;
- ``new-node``, 2× 910B4 joining on 20 March 00:00: 2 × 12 days × 24 h = 576 h;
- b4[3] failed from 15 March 00:00 to 16 March 00:00: 24 h unhealthy, nothing ran on it;
- ``p3-node`` cordoned from 5 March 00:00 to 8 March 00:00: 2 cards × 72 h = 144 h, of which
  alpha's job held 24 h on p3[0] (usage, not unavailable): 120 h unavailable.

Jobs (all class ``normal``, multiplier 1): alpha 2× b4 for 36 h (72 h) and p3[0] for 36 h; beta a
new-node card for 24 h and an old-node card for 48 h (72 h of 910B4 in all).
"""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from devices.models import Device, InventoryEvent, Node
from quotas.accounting.exports import to_json
from quotas.accounting.rates import money
from quotas.accounting.records import record_closed_allocations
from quotas.accounting.reports import report_data
from quotas.accounting.statements import close_month, compute_month
from quotas.models import RateCard, Statement
from tests.test_chargeback_harness import JOINED, at, build_world, lines_of, total_of

pytestmark = [pytest.mark.django_db, pytest.mark.clock]

B4, P3 = Decimal("12.0000"), Decimal("3.0000")
H = 24  # hours in a day

# 910B4: provisioned, used, unavailable, idle (device-hours)
B4_PROVISIONED = 4 * 31 * H + 2 * 9 * H + 2 * 12 * H  # b4-node all month, old-node to the 10th, new-node from the 20th
B4_USED = 2 * 36 + 24 + 48  # alpha 2 cards × 36 h; beta 24 h on new-node, 48 h on old-node
B4_UNHEALTHY = 1 * H  # b4[3], one day
B4_IDLE = B4_PROVISIONED - B4_USED - B4_UNHEALTHY
# 310P3
P3_PROVISIONED = 2 * 31 * H
P3_USED = 36  # alpha on p3[0]
P3_CORDONED = 2 * 3 * H - 24  # 2 cards × 3 days, less alpha's 24 h on p3[0] while cordoned
P3_IDLE = P3_PROVISIONED - P3_USED - P3_CORDONED


def hours(value: int) -> str:
    return f"{Decimal(value):.6f}"


def line(kind: str, chip: str, cls: str, device_hours: int, rate: Decimal) -> tuple[str, ...]:
    return (kind, chip, "", cls, hours(device_hours), str(rate), "1.000", str(money(Decimal(device_hours) * rate)))


def event(device: Device, when: str | object, status: str, cause: str = "") -> None:
    InventoryEvent.objects.create(
        device=device,
        node_name=device.node.name,
        chip_model=device.chip_model,
        at=at(when) if isinstance(when, str) else when,
        status=status,
        cause=cause,
    )


def build_month(idle_mode: str) -> object:
    world = build_world(idle_mode=idle_mode)
    old = Node.objects.create(name="old-node")
    new = Node.objects.create(name="new-node")
    olds = [Device.objects.create(node=old, index=i, chip_model="910B4", ai_cores=20) for i in range(2)]
    news = [Device.objects.create(node=new, index=i, chip_model="910B4", ai_cores=20) for i in range(2)]
    for card in olds:
        event(card, JOINED, "usable")
        event(card, "2025-03-10 00:00", "removed", "node removed")
    for card in news:
        event(card, "2025-03-20 00:00", "usable")
    event(world.b4[3], "2025-03-15 00:00", "unhealthy", "failed")
    event(world.b4[3], "2025-03-16 00:00", "usable")
    for card in world.p3:
        event(card, "2025-03-05 00:00", "cordoned", "node cordoned")
        event(card, "2025-03-08 00:00", "usable")
    world.job("alpha", "normal", world.b4[:2], at("2025-03-02 00:00"), at("2025-03-03 12:00"))  # 36 h × 2
    world.job("alpha", "normal", world.p3[:1], at("2025-03-04 12:00"), at("2025-03-06 00:00"))  # 36 h, 24 cordoned
    world.job("beta", "normal", news[:1], at("2025-03-21 00:00"), at("2025-03-22 00:00"))  # 24 h
    world.job("beta", "normal", olds[:1], at("2025-03-01 00:00"), at("2025-03-03 00:00"))  # 48 h
    return world


USAGE = {
    "alpha": [line("usage", "310P3", "normal", P3_USED, P3), line("usage", "910B4", "normal", 72, B4)],
    "beta": [line("usage", "910B4", "normal", 72, B4)],
}

# Unavailable and idle of each chip, per mode, as (team, device-hours) — the shares worked out by hand.
# share-by-usage: 910B4 use alpha 72 : beta 72 = 1 : 1; 310P3 only alpha used. By guarantee: 3 : 1.
SHARES = {
    "separate": {None: {"b4_unav": B4_UNHEALTHY, "b4_idle": B4_IDLE, "p3_unav": P3_CORDONED, "p3_idle": P3_IDLE}},
    "share-by-usage": {
        "alpha": {"b4_unav": B4_UNHEALTHY // 2, "b4_idle": B4_IDLE // 2, "p3_unav": P3_CORDONED, "p3_idle": P3_IDLE},
        "beta": {"b4_unav": B4_UNHEALTHY // 2, "b4_idle": B4_IDLE // 2},
    },
    "share-by-guarantee": {
        "alpha": {
            "b4_unav": B4_UNHEALTHY * 3 // 4,
            "b4_idle": B4_IDLE * 3 // 4,
            "p3_unav": P3_CORDONED * 3 // 4,
            "p3_idle": P3_IDLE * 3 // 4,
        },
        "beta": {
            "b4_unav": B4_UNHEALTHY // 4,
            "b4_idle": B4_IDLE // 4,
            "p3_unav": P3_CORDONED // 4,
            "p3_idle": P3_IDLE // 4,
        },
    },
}


def expected_lines(mode: str, team: str | None) -> list[tuple[str, ...]]:
    found = list(USAGE.get(team, [])) if team else []
    shares = SHARES.get(mode, {}).get(team)
    if shares:
        # Kinds in statement order (usage, reserved, unavailable, idle), chips alphabetically within a kind.
        if "p3_unav" in shares:
            found.append(line("unavailable", "310P3", "", shares["p3_unav"], P3))
        found.append(line("unavailable", "910B4", "", shares["b4_unav"], B4))
        if "p3_idle" in shares:
            found.append(line("idle", "310P3", "", shares["p3_idle"], P3))
        found.append(line("idle", "910B4", "", shares["b4_idle"], B4))
    return found


def test_the_hand_computed_hours() -> None:
    # The figures the lines below are built from, spelled out once.
    assert (B4_PROVISIONED, B4_USED, B4_UNHEALTHY, B4_IDLE) == (3984, 144, 24, 3816)
    assert (P3_PROVISIONED, P3_USED, P3_CORDONED, P3_IDLE) == (1488, 36, 120, 1332)


@pytest.mark.parametrize("mode", [m.value for m in RateCard.IdleMode])
def test_each_line_and_the_balance_of_a_hand_computed_month(mode: str) -> None:
    build_month(mode)
    record_closed_allocations()
    bill = compute_month("2025-03", live=False, strict=True)  # what the close prices
    assert bill.warnings == []
    b4, p3 = bill.chips["910B4"], bill.chips["310P3"]
    seconds = Decimal(3600)
    assert (b4.provisioned, b4.used, b4.unavailable, b4.idle, b4.reserved_unused) == (
        B4_PROVISIONED * seconds,
        B4_USED * seconds,
        B4_UNHEALTHY * seconds,
        B4_IDLE * seconds,
        0,
    )
    assert b4.unavailable_by_status == {"unhealthy": B4_UNHEALTHY * seconds}
    assert b4.unavailable_by_cause == {"failed": B4_UNHEALTHY * seconds}
    assert (p3.provisioned, p3.used, p3.unavailable, p3.idle) == (
        P3_PROVISIONED * seconds,
        P3_USED * seconds,
        P3_CORDONED * seconds,
        P3_IDLE * seconds,
    )
    assert p3.unavailable_by_status == {"cordoned": P3_CORDONED * seconds}

    close_month("2025-03")
    for team in ("alpha", "beta", None):
        assert lines_of(team, "2025-03") == expected_lines(mode, team), (mode, team)

    # The balance: provisioned × rate = what the month's statements charge + what hide leaves not charged.
    provisioned_value = Decimal(B4_PROVISIONED) * B4 + Decimal(P3_PROVISIONED) * P3
    assert provisioned_value == Decimal("52272")  # 3984 × 12 + 1488 × 3
    charged = sum((s.total for s in Statement.objects.filter(month="2025-03")), Decimal("0.00"))
    usage = Decimal(72 + 72) * B4 + Decimal(P3_USED) * P3  # 1728 + 108 = 1836
    if mode == "hide":
        not_charged = Decimal(B4_UNHEALTHY + B4_IDLE) * B4 + Decimal(P3_CORDONED + P3_IDLE) * P3
        assert charged == usage and not_charged == Decimal("50436")
    else:
        not_charged = Decimal(0)
    assert charged + not_charged == provisioned_value
    assert bill.not_charged == not_charged

    # The cluster statement keeps the balance; the JSON export shows it per chip model.
    cluster = Statement.objects.get(team__isnull=True, month="2025-03")
    exported = {row["team"]: row for row in json.loads(to_json(Statement.objects.filter(month="2025-03")))}
    assert exported["alpha"]["balance"] == {}
    balance = exported["@cluster"]["balance"]
    assert balance == cluster.balance
    assert balance["910B4"] == {
        "provisioned_hours": hours(B4_PROVISIONED),
        "used_hours": hours(B4_USED),
        "reserved_unused_hours": hours(0),
        "unavailable_hours": hours(B4_UNHEALTHY),
        "unavailable_by_status": {"unhealthy": hours(B4_UNHEALTHY)},
        "unavailable_by_cause": {"failed": hours(B4_UNHEALTHY)},
        "idle_hours": hours(B4_IDLE),
        "rate": "12.0000",
        "rates": ["12.0000"],
        "amount": str(money(Decimal(B4_PROVISIONED) * B4)),
        "pricing_difference": "0.00",
        "charged": str(
            money(Decimal(B4_PROVISIONED) * B4) - (money(Decimal(B4_UNHEALTHY + B4_IDLE) * B4) if mode == "hide" else 0)
        ),
        "not_charged": str(money(Decimal(B4_UNHEALTHY + B4_IDLE) * B4) if mode == "hide" else Decimal("0.00")),
    }
    assert balance["310P3"]["unavailable_by_cause"] == {"node cordoned": hours(P3_CORDONED)}
    assert exported["@cluster"]["not_charged"] == str(not_charged.quantize(Decimal("0.01")))
    # The reports page's numbers show the split and what was not charged.
    util = report_data("2025-03")["utilisation"]
    assert util["chips"] == ["310P3", "910B4"]
    assert util["capacity"] == [P3_PROVISIONED, B4_PROVISIONED] and util["used"] == [P3_USED, B4_USED]
    assert util["unavailable"] == [P3_CORDONED, B4_UNHEALTHY] and util["idle"] == [P3_IDLE, B4_IDLE]
    hidden = [(P3_CORDONED + P3_IDLE) * 3, (B4_UNHEALTHY + B4_IDLE) * 12] if mode == "hide" else [0, 0]
    assert util["not_charged"] == hidden
    assert total_of(None, "2025-03") == str(
        sum((Decimal(ln[-1]) for ln in expected_lines(mode, None)), Decimal("0.00"))
    )


# -- rounding: odd times, an odd rate, class multipliers, a rate change, reservations ---------------


@pytest.mark.parametrize("reserved_mode", [m.value for m in RateCard.ReservedMode])
@pytest.mark.parametrize("mode", [m.value for m in RateCard.IdleMode])
def test_odd_figures_still_balance_to_the_cent(mode: str, reserved_mode: str) -> None:
    from quotas.models import Rate

    world = build_world(idle_mode=mode, reserved_mode=reserved_mode, reservation=True)
    Rate.objects.filter(rate_card=world.card, chip_model="910B4").update(price_per_device_hour=Decimal("12.3457"))
    later = RateCard.objects.create(effective_from="2025-03-17", currency="CNY", idle_mode=mode)
    later.rates.create(chip_model="910B4", price_per_device_hour=Decimal("11.1111"))
    later.rates.create(chip_model="310P3", price_per_device_hour=Decimal("2.7183"))
    late = Node.objects.create(name="late-node")
    card = Device.objects.create(node=late, index=0, chip_model="910B4", ai_cores=20)
    event(card, "2025-03-20 07:13:27", "usable")
    event(world.b4[1], "2025-03-11 03:17:41", "draining", "node draining")
    event(world.b4[1], "2025-03-12 19:02:09", "usable")
    world.job("alpha", "critical", world.b4[:2], at("2025-03-11 01:07:13"), at("2025-03-11 09:41:59"))
    world.job("beta", "low", [card], at("2025-03-21 10:10:10"), at("2025-03-22 01:01:01"))
    world.job("beta", "high", world.p3[:1], at("2025-03-16 22:59:59"), at("2025-03-17 03:03:03"), template=world.vir02)
    world.job("alpha", "normal", world.b4[2:3], at("2025-03-16 20:00:01"), at("2025-03-17 04:00:02"))
    close_month("2025-03")
    cluster = Statement.objects.get(team__isnull=True, month="2025-03")
    charged = sum((s.total for s in Statement.objects.filter(month="2025-03")), Decimal("0.00"))
    amount = sum((Decimal(c["amount"]) for c in cluster.balance.values()), Decimal("0.00"))
    difference = sum((Decimal(c["pricing_difference"]) for c in cluster.balance.values()), Decimal("0.00"))
    not_charged = sum((Decimal(c["not_charged"]) for c in cluster.balance.values()), Decimal("0.00"))
    # Before 17 March (00:00 policy clock): 910B4 4 cards × 16 days, at ¥12.3457; from then 4 × 15 days +
    # the late card from 20 March 07:13:27 to the end (11 d 16 h 46 min 33 s), at ¥11.1111.
    late_hours = Decimal(11 * 86400 + 16 * 3600 + 46 * 60 + 33) / 3600
    b4_amount = money(Decimal(4 * 16 * H) * Decimal("12.3457")) + money(
        (Decimal(4 * 15 * H) + late_hours.quantize(Decimal("0.000001"))) * Decimal("11.1111")
    )
    p3_amount = money(Decimal(2 * 16 * H) * Decimal("3.0000")) + money(Decimal(2 * 15 * H) * Decimal("2.7183"))
    assert amount == b4_amount + p3_amount
    assert charged + not_charged == amount + difference
    if mode != "hide":
        assert not_charged == 0
    # The draining card's free time is its own line (not in hide): 1 d 15 h 44 min 28 s, less alpha's job on it.
    unavailable = Decimal(cluster.balance["910B4"]["unavailable_by_status"]["draining"])
    drain = Decimal(86400 + 15 * 3600 + 44 * 60 + 28)
    held = Decimal((9 * 3600 + 41 * 60 + 59) - (3 * 3600 + 17 * 60 + 41))  # the job from when draining began
    assert unavailable == ((drain - held) / 3600).quantize(Decimal("0.000001"))


def test_a_job_on_a_card_before_it_joined_is_a_warning() -> None:
    world = build_world(idle_mode="separate")
    late = Node.objects.create(name="late-node")
    card = Device.objects.create(node=late, index=0, chip_model="910B4", ai_cores=20)
    event(card, "2025-03-20 00:00", "usable")
    world.job("alpha", "normal", [card], at("2025-03-19 00:00"), at("2025-03-21 00:00"))
    bill = compute_month("2025-03", live=True)
    assert any("began before their card joined the inventory" in w for w in bill.warnings), bill.warnings
    # 24 h before the card existed: used exceeds what was usable by nothing else here, so the chip's
    # free time is still provisioned − used − unavailable; no line charges negative time.
    assert all(line.device_seconds > 0 for line in bill.lines)


def test_a_card_without_history_is_not_provisioned() -> None:
    world = build_world(idle_mode="separate")
    Device.objects.create(node=world.b4[0].node, index=9, chip_model="910B4", ai_cores=20)  # no InventoryEvent
    bill = compute_month("2025-03", live=True)
    assert bill.chips["910B4"].provisioned == Decimal(4 * 31 * H * 3600)
