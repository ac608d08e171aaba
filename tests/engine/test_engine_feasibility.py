"""``feasibility.never_runnable``: the one answer to "can this job ever run here?" (no database)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.engine.feasibility import Request, never_runnable
from scheduling.engine.policy import parse_policy
from scheduling.engine.snapshot import DeviceState, NodeState, VnpuTemplate

DEMO = parse_policy((Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text())


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
        ({"num_devices": 25}, "num_devices", "no chip model has that many (910B4: 16, 910A: 8, 310P3: 4)"),
        ({"num_devices": 17, "chip_model": "910B4"}, "num_devices", "asks for 17 devices; the cluster has 16 of 910B4"),
        ({"num_devices": 9, "chip_model": "910A"}, "num_devices", "the cluster has 8 of 910A"),
        ({"num_devices": 12}, "num_devices", "no chip model fits it"),
        ({"num_devices": 12, "chip_model": "910B4"}, "num_devices", "whole 8-card 910B4 nodes"),
        ({"num_devices": 6, "chip_model": "910A"}, "num_devices", "whole 4-card rings"),
        ({"num_devices": 1, "chip_model": "H100"}, "chip_model", "no H100 devices"),
        ({"vnpu_template": "vir99"}, "vnpu_template", "vir99"),
        ({"priority_class": "critical"}, "priority_class", "may never use class 'critical'"),
        ({"duration_s": 8 * 86400, "estimated_duration_s": 8 * 86400}, "estimated_duration_s", "maxJobDuration"),
        ({"duration_s": 8 * 86400, "estimated_duration_s": 3600}, "max_duration_s", "maxJobDuration"),
        ({"team": "inference", "num_devices": 16, "chip_model": "910B4"}, "num_devices", "may ever hold (10"),
        ({"team": "research", "num_devices": 16, "chip_model": "910B4"}, "num_devices", "may ever hold (12"),
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
        {"num_devices": 16, "chip_model": "910B4"},  # two whole servers, within training's 24
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
    assert never_runnable(DEMO, request, sick, {}) is None  # comes back when the node is healthy
    assert never_runnable(DEMO, request, [NODES[1]], {}) is not None  # the node was removed


def test_a_time_of_day_window_that_allows_more_makes_the_job_possible() -> None:
    text = (Path(__file__).resolve().parents[2] / "examples" / "policies" / "demo.yaml").read_text()
    # inference: 12 devices at most, 16 in business hours; 910B4 capped at 10 in both.
    policy = parse_policy(text.replace("max: {devices: 12, devices/910B4: 10}", "max: {devices: 12}"))
    request = Request(team="inference", num_devices=16, chip_model="910B4", duration_s=60)
    assert never_runnable(policy, request, NODES, {}) is None  # 16 within business hours
    night_only = parse_policy(
        text.replace("max: {devices: 12, devices/910B4: 10}", "max: {devices: 8}").replace(
            "max: {devices: 16}}}", "max: {devices: 8}}}"
        )
    )
    assert never_runnable(night_only, request, NODES, {}) is not None
