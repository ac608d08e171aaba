"""``feasibility.never_runnable``: the one answer to "can this job ever run here?" (no database)."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from scheduling.engine.feasibility import Request, never_runnable
from scheduling.engine.policy import parse_policy
from scheduling.engine.snapshot import DeviceState, NodeState, VnpuTemplate

DEMO_TEXT = (Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text()
DEMO = parse_policy(DEMO_TEXT)
#: The demo without its reservation (a quarter of the 910B4 cards held for critical).
UNRESERVED = parse_policy(
    DEMO_TEXT.replace(
        "  reservations:\n"
        "    - {name: online-inference, ratio: 0.25, chipModels: [910B4], forPriorityClasses: [critical]}\n",
        "",
    )
)


def _node(name: str, chip: str, cards: int, ring: int, first_id: int, usable: bool = True) -> NodeState:
    return NodeState(
        name,
        [DeviceState(first_id + i, name, i, chip, f"ring{i // ring}", 32768, 20, 7, usable) for i in range(cards)],
        schedulable=usable,
    )


# The demo's inventory: two 8-card 910B4 servers, one 910A server of two 4-card rings, four 310P3.
NODES = [
    _node("b4-1", "910B4", 8, 8, 0),
    _node("b4-2", "910B4", 8, 8, 100),
    _node("a-1", "910A", 8, 4, 200),
    _node("p3-1", "310P3", 4, 4, 300),
]
TEMPLATES = {("310P3", "vir02"): VnpuTemplate("310P3", "vir02", 6144, 2, 2)}


def _why(**fields: object) -> tuple[str, str] | None:
    request = Request(**{"team": "training", "num_devices": 1, "duration_s": 3600, **fields})  # type: ignore[arg-type]
    found = never_runnable(DEMO, request, NODES, TEMPLATES)
    return (found.field, found.reason) if found else None


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        # More cards than any pool it may use holds: said before how the cards would have to lie.
        ({"num_devices": 25}, "num_devices", "no chip model has that many cards (910B4: 16, 910A: 8, 310P3: 4)"),
        ({"num_devices": 17, "chip_model": "910B4"}, "num_devices", "a 17-card job; the cluster has 16 cards of 910B4"),
        ({"num_devices": 9, "chip_model": "910A"}, "num_devices", "the cluster has 8 cards of 910A"),
        ({"num_devices": 12}, "num_devices", "no chip model fits it"),
        ({"num_devices": 12, "chip_model": "910B4"}, "num_devices", "whole 8-card 910B4 nodes"),
        ({"num_devices": 6, "chip_model": "910A"}, "num_devices", "whole 4-card rings"),
        ({"num_devices": 1, "chip_model": "H100"}, "chip_model", "no H100 devices"),
        ({"vnpu_template": "vir99"}, "vnpu_template", "vir99"),
        ({"priority_class": "critical"}, "priority_class", "may never use class 'critical'"),
        (
            {"duration_s": 8 * 86400, "estimated_duration_s": 8 * 86400},
            "estimated_duration_s",
            "an 8 d run is more than team training's 7 d limit on run time",
        ),
        ({"duration_s": 8 * 86400, "estimated_duration_s": 3600}, "max_duration_s", "7 d limit on run time"),
        (
            {"team": "inference", "num_devices": 16, "chip_model": "910B4"},
            "num_devices",
            "a 16-card job is more than team inference may ever hold (10 cards",
        ),
        ({"team": "research", "num_devices": 16, "chip_model": "910B4"}, "num_devices", "may ever hold (12 cards"),
        # The demo holds a quarter of the 910B4 cards for critical: a normal job gets 12 of 16 at most.
        (
            {"num_devices": 16, "chip_model": "910B4"},
            "num_devices",
            "reservation online-inference holds 4 of the 16 910B4 cards for critical: "
            "a normal job can have at most 12 of them",
        ),
    ],
)
def test_jobs_that_can_never_run_are_named_with_the_field_and_the_reason(fields, field, words) -> None:
    found = _why(**fields)
    assert found is not None, fields
    assert found[0] == field, found
    assert words in found[1], found


@pytest.mark.parametrize(
    "fields",
    [
        {"num_devices": 8, "chip_model": "910B4"},  # one whole server, within the 12 the reservation leaves
        {"num_devices": 8},  # any chip model
        {"num_devices": 4, "chip_model": "910A"},  # one ring
        {"vnpu_template": "vir02"},
        {"team": "inference", "num_devices": 8, "chip_model": "910B4"},
        {"team": "inference", "priority_class": "critical"},
    ],
)
def test_jobs_that_can_run_some_day_pass(fields) -> None:
    assert _why(**fields) is None


def test_sick_or_cordoned_cards_still_count_a_missing_one_does_not() -> None:
    sick = [_node("b4-1", "910B4", 8, 8, 0, usable=False), NODES[1]]
    request = Request(team="training", num_devices=16, chip_model="910B4", duration_s=60)
    assert never_runnable(UNRESERVED, request, sick, {}) is None  # comes back when the node is healthy
    assert never_runnable(UNRESERVED, request, [NODES[1]], {}) is not None  # the node was removed


def test_a_time_of_day_window_that_allows_more_makes_the_job_possible() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text()
    # inference: 12 devices at most, 16 in business hours; 910B4 capped at 10 in both.
    policy = parse_policy(text.replace("max: {devices: 12, devices/910B4: 10}", "max: {devices: 12}"))
    # critical: the class the demo's 910B4 reservation is for, so all 16 cards may be its.
    request = Request(team="inference", num_devices=16, chip_model="910B4", priority_class="critical", duration_s=60)
    assert never_runnable(policy, request, NODES, {}) is None  # 16 within business hours
    night_only = parse_policy(
        text.replace("max: {devices: 12, devices/910B4: 10}", "max: {devices: 8}").replace(
            "max: {devices: 16}}}", "max: {devices: 8}}}"
        )
    )
    assert never_runnable(night_only, request, NODES, {}) is not None


def test_a_dated_window_counts_until_its_last_day_and_not_after() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text()
    # inference: 8 cards at most, 16 on 2027-03-10..12 only (an approved quota request).
    dated = (
        '{name: request-1, dates: {from: "2027-03-10", until: "2027-03-12"}, between: "00:00-24:00",'
        " quota: {max: {devices: 16}}}"
    )
    policy = parse_policy(
        text.replace("max: {devices: 12, devices/910B4: 10}", "max: {devices: 8}")
        .replace(
            '{name: business-hours, days: [mon, tue, wed, thu, fri], between: "09:00-18:00",\n'
            "           quota: {guaranteed: {devices: 8}, max: {devices: 16}}}",
            dated,
        )
        .replace('\n        - {name: night, between: "22:00-06:00", quota: {max: {devices: 6}}}', "")
    )
    assert [s.name for s in policy.team("inference").schedules] == ["request-1"]
    ask = {"team": "inference", "num_devices": 16, "chip_model": "910B4", "priority_class": "critical"}
    for today in (None, date(2027, 3, 1), date(2027, 3, 12)):  # before and on its last day: some day it can
        assert never_runnable(policy, Request(**ask, duration_s=60, today=today), NODES, {}) is None, today
    # The day after, nothing lets inference hold 16 cards again: refused, naming the field.
    found = never_runnable(policy, Request(**ask, duration_s=60, today=date(2027, 3, 13)), NODES, {})
    assert found is not None and found.field == "num_devices"
    assert "more than team inference may ever hold (8 cards" in found.reason


def test_a_reserved_class_may_have_every_card() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text()
    # training may use critical here: the reservation is its own, so all 16 cards may be its.
    allowed = "allowedPriorityClasses: [critical, high, normal, low]"
    policy = parse_policy(text.replace("allowedPriorityClasses: [high, normal, low]", allowed))
    request = Request(team="training", num_devices=16, chip_model="910B4", priority_class="critical", duration_s=60)
    assert never_runnable(policy, request, NODES, {}) is None


# -- in the tick: a job larger than the reservations leave it holds nothing --------------


def _reserved_world() -> tuple:
    """Two 8-card 910B4 servers, a quarter (4 cards) held for high; 5 of n1's cards busy for 1 h more."""
    from engine_factory import Cluster, job, policy, quota, snapshot

    from scheduling.engine.policy import Reservation

    cl = Cluster().node("n1").node("n2")
    running = [job(1, "b", 5, slots=[cl.dev(f"n1/{i}") for i in range(5)], started=-600, est=4200.0)]
    pol = policy(
        {"a": quota(), "b": quota()},
        reservations=[Reservation("online", 0.25, frozenset({"910B4"}), frozenset({"high"}))],
    )
    return cl, running, pol, job, snapshot


def test_a_job_larger_than_the_reservations_leave_waits_without_a_hold_and_is_never_runnable() -> None:
    from scheduling.engine import reasons
    from scheduling.engine.decide import decide

    cl, running, pol, job, snapshot = _reserved_world()
    # 16 normal cards: 12 at most ever (4 of 16 held for high). A 2-card, 2-hour job behind it.
    pending = [job(10, "a", 16, submitted=-3600), job(11, "a", 2, submitted=-60, est=7200.0)]
    out = decide(snapshot(pol, cl, pending, running))
    assert out.waiting[10].reason == reasons.NEVER_RUNNABLE
    assert "a normal job can have at most 12" in out.waiting[10].detail
    # It holds no card: the small job starts now though it runs past the big one's would-be shadow time.
    assert [s.job_id for s in out.starts] == [11]


def test_a_job_within_what_the_reservations_leave_waits_for_now() -> None:
    from scheduling.engine import reasons
    from scheduling.engine.decide import decide

    cl, running, pol, job, snapshot = _reserved_world()
    # 8 normal cards, within the 12 the reservation ever leaves. 11 are free, but 4 of them are
    # held for high while no high job runs: it waits for the reservation, not for ever.
    out = decide(snapshot(pol, cl, [job(10, "a", 8, submitted=-3600)], running))
    assert out.waiting[10].reason == reasons.RESERVED_CAPACITY
    assert "online: 4 held for high" in out.waiting[10].detail


def test_a_job_only_a_dated_window_allowed_is_never_runnable_once_the_window_is_over() -> None:
    """Accepted while an approved request let its team hold 16 cards, it waits for its team's
    maximum during the window's dates and before them, and can never run the day after."""
    from datetime import timedelta

    from engine_factory import NOW, Cluster, job, snapshot

    from scheduling.engine import reasons
    from scheduling.engine.decide import decide

    pol = parse_policy(
        "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nmetadata: {name: t}\n"
        "spec:\n  timezone: Asia/Shanghai\n  teams:\n"
        "    - name: a\n      quota: {max: {devices: 8}}\n      schedules:\n"
        "        - {name: request-1, dates: {from: '2026-02-27', until: '2026-03-01'}, between: '00:00-24:00',"
        " quota: {max: {devices: 16}}}\n"
        "    - name: b\n      quota: {max: {devices: 16}}\n"
    )
    cl = Cluster().node("n1").node("n2")
    busy = [job(1, "b", 8, slots=[cl.dev(f"n1/{i}") for i in range(8)], started=-600, est=7200.0)]

    def wait_at(now: object) -> str:
        out = decide(snapshot(pol, cl, [job(10, "a", 16, submitted=-3600)], busy, now=now))  # type: ignore[arg-type]
        return out.waiting[10].reason

    # NOW is 2026-03-02 18:00 in Shanghai: the window ended the day before.
    assert wait_at(NOW) == reasons.NEVER_RUNNABLE
    assert wait_at(NOW - timedelta(days=1)) == reasons.RESOURCES  # in the window: 8 cards are busy
    assert wait_at(NOW - timedelta(days=4)) == reasons.QUOTA_MAX_DEVICES  # before it: for now
