"""What leaves the policy module: effective quotas JSON, canonical YAML, diffs."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduling.engine.durations import format_duration, parse_duration
from scheduling.engine.policy import (
    Policy,
    diff_policies,
    dump_policy,
    effective_quotas,
    parse_policy,
    semantic_diff,
    validate_policy,
)
from scheduling.engine.schedules import format_between, parse_between

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples/policies/default.yaml").read_text()


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(EXAMPLE)


# -- effective quotas --------------------------------------------------------------


def test_effective_quotas_json_shape(policy: Policy) -> None:
    at = datetime(2026, 11, 27, 15, 30, tzinfo=UTC)  # Friday 23:30 in Shanghai
    out = effective_quotas(policy, at)
    assert json.loads(json.dumps(out)) == out
    assert out == {
        "at": "2026-11-27T23:30:00+08:00",
        "teams": {
            "inference": {
                "schedule": "night",
                "guaranteed": {"devices": 4},
                "max": {"devices": 4, "devices/910B4": 12},
                "maxConcurrentJobs": 20,
                "deviceHoursPerMonth": 5000,
                "maxJobDuration": "24h",
                "allowedPriorityClasses": ["critical", "high", "normal"],
            },
            "training": {
                "schedule": None,
                "guaranteed": {"devices": 16},
                "max": {"devices": 32},
                "maxConcurrentJobs": None,
                "deviceHoursPerMonth": None,
                "maxJobDuration": None,
                "allowedPriorityClasses": None,
            },
        },
    }


def test_effective_quotas_for_chosen_teams(policy: Policy) -> None:
    at = datetime(2026, 11, 27, 2, 0, tzinfo=UTC)  # Friday 10:00 in Shanghai
    out = effective_quotas(policy, at, teams=["inference", "newcomer", "*"])
    teams: dict[str, Any] = out["teams"]  # type: ignore[assignment]
    assert list(teams) == ["inference", "newcomer", "*"]
    assert teams["inference"]["schedule"] == "business-hours"
    assert teams["inference"]["guaranteed"] == {"devices": 12}
    assert (
        teams["newcomer"]
        == teams["*"]
        == {
            "schedule": None,
            "guaranteed": {"devices": 0},
            "max": {"devices": 8},
            "maxConcurrentJobs": None,
            "deviceHoursPerMonth": None,
            "maxJobDuration": None,
            "allowedPriorityClasses": None,
        }
    )


def test_effective_quotas_fractional_duration_is_seconds() -> None:
    text = EXAMPLE.replace("maxJobDuration: 24h", "maxJobDuration: 90.5")
    out = effective_quotas(parse_policy(text), datetime(2026, 11, 27, 5, tzinfo=UTC), ["inference"])
    assert out["teams"]["inference"]["maxJobDuration"] == 90.5  # type: ignore[index]


# -- canonical YAML ------------------------------------------------------------------


def test_dump_is_canonical_and_round_trips(policy: Policy) -> None:
    text = dump_policy(policy)
    assert parse_policy(text) == policy
    assert dump_policy(parse_policy(text)) == text
    assert validate_policy(text) == []
    assert 'between: "22:00-06:00"' in text
    assert "maxJobDuration: 24h" in text


def test_dump_writes_every_section_even_defaults() -> None:
    text = dump_policy(parse_policy("apiVersion: npuportal/v1\nkind: SchedulingPolicy\nspec: {}\n"))
    doc = yaml.safe_load(text)
    assert list(doc["spec"]) == [
        "timezone",
        "priorityClasses",
        "ordering",
        "placement",
        "backfill",
        "preemption",
        "reservations",
        "departments",
        "teams",
        "defaults",
    ]
    assert doc["spec"]["preemption"] == {"gracePeriod": "2m", "onPreempt": "requeue"}
    assert doc["spec"]["defaults"] == {"shares": 1}


def test_dump_keeps_schedule_nulls() -> None:
    text = EXAMPLE.replace("quota: {max: {devices: 4}}", "quota: {max: {devices: null}, maxConcurrentJobs: null}")
    policy = parse_policy(text)
    again = parse_policy(dump_policy(policy))
    assert again == policy
    assert again.teams["inference"].schedules[1].quota == {"max": {"devices": None}, "maxConcurrentJobs": None}


_name = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
_amount = st.integers(0, 64).map(float) | st.sampled_from([0.5, 1.25, 2.75])
_chip = st.sampled_from(["910B3", "910B4", "310P3"])
_duration = st.sampled_from([60, 90, 3600, 5400, 86400, 7 * 86400, 1.5, "1h30m", "15m"])
_between = st.tuples(st.integers(0, 23), st.sampled_from([0, 15, 30]), st.integers(0, 24)).map(
    lambda t: f"{t[0]:02d}:{t[1]:02d}-{t[2]:02d}:00"
)


@st.composite
def _quota(draw: st.DrawFn, classes: list[str], partial: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = draw(st.lists(st.sampled_from(["devices", "devices/910B4", "devices/310P3"]), unique=True, max_size=3))
    if keys:
        guaranteed = {k: draw(_amount) for k in keys}
        caps = {k: guaranteed[k] + draw(_amount) for k in keys}
        if draw(st.booleans()):
            out["guaranteed"] = guaranteed
            if partial:  # a schedule that raises a guarantee also raises its cap (else it may be invalid)
                out["max"] = caps
        if not partial and draw(st.booleans()):
            out["max"] = caps
        elif partial and "max" not in out and draw(st.booleans()):
            out["max"] = {k: None if draw(st.booleans()) else caps[k] for k in keys}
    if draw(st.booleans()):
        out["maxConcurrentJobs"] = draw(st.none() | st.integers(0, 50)) if partial else draw(st.integers(0, 50))
    if draw(st.booleans()):
        out["deviceHoursPerMonth"] = draw(_amount)
    if draw(st.booleans()):
        out["maxJobDuration"] = draw(_duration.filter(lambda d: d != 0))
    if draw(st.booleans()):
        out["allowedPriorityClasses"] = draw(st.lists(st.sampled_from(classes), unique=True, min_size=1))
    return out


@st.composite
def policy_docs(draw: st.DrawFn) -> dict[str, Any]:
    classes = draw(st.lists(_name, unique=True, min_size=1, max_size=5))
    class_entries: list[dict[str, Any]] = []
    default = draw(st.sampled_from([None, *classes]))
    for rank, name in enumerate(classes):
        entry: dict[str, Any] = {"name": name}
        lower = classes[rank + 1 :]
        if lower and draw(st.booleans()):
            entry["preempts"] = draw(st.lists(st.sampled_from(lower), unique=True, min_size=1))
        if draw(st.booleans()):
            entry["preemptible"] = draw(st.booleans())
        if name == default:
            entry["default"] = True
        if draw(st.booleans()):
            entry["starvationAfter"] = draw(_duration)
        class_entries.append(entry)
    departments = draw(st.lists(_name, unique=True, max_size=3))
    teams = []
    for name in draw(st.lists(_name.filter(lambda n: n != "*"), unique=True, max_size=4)):
        team: dict[str, Any] = {"name": name, "shares": draw(_amount)}
        if departments and draw(st.booleans()):
            team["department"] = draw(st.sampled_from(departments))
        team["quota"] = draw(_quota(classes, partial=False))
        schedules = []
        for sname in draw(st.lists(_name, unique=True, max_size=3)):
            schedule: dict[str, Any] = {"name": sname, "between": draw(_between)}
            if draw(st.booleans()):
                schedule["days"] = draw(
                    st.lists(
                        st.sampled_from(["mon", "tue", "wed", "thu", "fri", "sat", "sun"]), unique=True, min_size=1
                    )
                )
            schedule["quota"] = draw(_quota(classes, partial=True))
            schedules.append(schedule)
        team["schedules"] = schedules
        teams.append(team)
    reservations = []
    for rname in draw(st.lists(_name, unique=True, max_size=2)):
        reservation: dict[str, Any] = {
            "name": rname,
            "ratio": draw(st.sampled_from([0, 0.1, 0.25, 0.3])),
            "forPriorityClasses": draw(st.lists(st.sampled_from(classes), unique=True, min_size=1)),
        }
        if draw(st.booleans()):
            reservation["chipModels"] = draw(st.lists(_chip, unique=True, min_size=1))
        reservations.append(reservation)
    return {
        "apiVersion": "npuportal/v1",
        "kind": "SchedulingPolicy",
        "metadata": {"name": draw(_name)},
        "spec": {
            "timezone": draw(st.sampled_from(["UTC", "Asia/Shanghai", "Europe/Berlin", "America/New_York"])),
            "priorityClasses": class_entries,
            "ordering": {
                "weights": {
                    "priorityClass": draw(_amount),
                    "age": draw(_amount),
                    **({"duration": draw(_amount)} if draw(st.booleans()) else {}),
                },
                "maxAge": draw(_duration),
                "usageHalfLife": draw(_duration),
                **({"longJob": draw(_duration)} if draw(st.booleans()) else {}),
            },
            "placement": {"strategy": draw(st.sampled_from(["binpack", "spread"]))},
            "backfill": draw(st.booleans()),
            "preemption": {"gracePeriod": draw(_duration), "onPreempt": draw(st.sampled_from(["requeue", "cancel"]))},
            **({"starvation": {"after": draw(_duration)}} if draw(st.booleans()) else {}),
            "reservations": reservations,
            "departments": [{"name": d, "shares": draw(_amount)} for d in departments],
            "teams": teams,
            "defaults": {"shares": draw(_amount), "quota": draw(_quota(classes, partial=False))},
        },
    }


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy_docs())
def test_dump_parse_round_trip(doc: dict[str, Any]) -> None:
    policy = parse_policy(yaml.safe_dump(doc, sort_keys=False))
    text = dump_policy(policy)
    assert parse_policy(text) == policy
    assert dump_policy(parse_policy(text)) == text
    assert semantic_diff(policy, parse_policy(text)) == []


# -- diffs ---------------------------------------------------------------------------


def test_diff_policies_is_a_unified_diff() -> None:
    new = EXAMPLE.replace("max: {devices: 16, devices/910B4: 12}", "max: {devices: 24, devices/910B4: 12}")
    diff = diff_policies(EXAMPLE, new, old_name="v3", new_name="v4")
    assert diff.startswith("--- v3\n+++ v4\n@@ ")
    assert "-        max: {devices: 16, devices/910B4: 12}\n" in diff
    assert "+        max: {devices: 24, devices/910B4: 12}\n" in diff
    assert diff_policies(EXAMPLE, EXAMPLE) == ""
    assert diff_policies("a: 1", "a: 2") == "--- old\n+++ new\n@@ -1 +1 @@\n-a: 1\n+a: 2\n"


@pytest.mark.parametrize(
    ("old", "new", "lines"),
    [
        (
            "max: {devices: 16, devices/910B4: 12}",
            "max: {devices: 24, devices/910B4: 12}",
            ["team inference: max.devices 16 → 24"],
        ),
        (
            "max: {devices: 16, devices/910B4: 12}",
            "max: {devices: 16}",
            ["team inference: max.devices/910B4 12 → no cap"],
        ),
        (
            "guaranteed: {devices: 8}",
            "guaranteed: {devices: 8, devices/910B4: 2}",
            ["team inference: guaranteed.devices/910B4 none → 2"],
        ),
        ("ratio: 0.3", "ratio: 0.4", ["reservation online-inference: ratio 0.3 → 0.4"]),
        ("chipModels: [910B4], ", "", ["reservation online-inference: chipModels [910B4] → all chips"]),
        ("    - name: training\n", "    - name: research\n", ["team research: added", "team training: removed"]),
        ("        maxConcurrentJobs: 20\n", "", ["team inference: maxConcurrentJobs 20 → unlimited"]),
        ("maxJobDuration: 24h", "maxJobDuration: 48h", ["team inference: maxJobDuration 24h → 2d"]),
        (
            "allowedPriorityClasses: [critical, high, normal]",
            "allowedPriorityClasses: [normal, high]",
            ["team inference: allowedPriorityClasses [critical, high, normal] → [high, normal]"],
        ),
        (
            'between: "22:00-06:00"',
            'between: "23:00-06:00"',
            ["team inference: schedule night: between 22:00-06:00 → 23:00-06:00"],
        ),
        (
            "days: [mon, tue, wed, thu, fri]",
            "days: [mon, tue]",
            ["team inference: schedule business-hours: days mon, tue, wed, thu, fri → mon, tue"],
        ),
        (
            "quota: {max: {devices: 4}}",
            "quota: {max: {devices: 6}, maxConcurrentJobs: 2}",
            [
                "team inference: schedule night: max.devices 4 → 6",
                "team inference: schedule night: maxConcurrentJobs (base) → 2",
            ],
        ),
        (
            "quota: {guaranteed: {devices: 12}, max: {devices: 24}}",
            "quota: {max: {devices: 24}}",
            ["team inference: schedule business-hours: guaranteed.devices 12 → (base)"],
        ),
        (
            '        - {name: night, between: "22:00-06:00", quota: {max: {devices: 4}}}\n',
            "",
            ["team inference: schedule night removed"],
        ),
        ("shares: 30", "shares: 35", ["team inference: shares 30 → 35"]),
        ("department: ai-lab\n      shares: 50", "shares: 50", ["team training: department ai-lab → none"]),
        ("{name: ai-lab, shares: 100}", "{name: ai-lab, shares: 120}", ["department ai-lab: shares 100 → 120"]),
        ("timezone: Asia/Shanghai", "timezone: UTC", ["timezone: Asia/Shanghai → UTC"]),
        ("strategy: binpack", "strategy: spread", ["placement.strategy: binpack → spread"]),
        ("backfill: true", "backfill: false", ["backfill: true → false"]),
        ("gracePeriod: 120s", "gracePeriod: 5m", ["preemption.gracePeriod: 2m → 5m"]),
        (
            "  backfill: true\n",
            "  backfill: true\n  starvation: {after: 24h}\n",
            ["starvation.after: off → 24h"],
        ),
        (
            "{name: high, preempts: [low]}",
            "{name: high, preempts: [low], starvationAfter: 2h}",
            ["priority class high: starvationAfter (the policy's) → 2h"],
        ),
        ("fairShare: 5000", "fairShare: 6000", ["ordering.weights.fairShare: 5000 → 6000"]),
        ("maxAge: 7d", "maxAge: 14d", ["ordering.maxAge: 7d → 14d"]),
        (
            "maxAge: 7d",
            "maxAge: 7d\n    longJob: 1d",
            ["ordering.longJob: 7d → 24h"],
        ),
        ("fairShare: 5000", "fairShare: 5000, duration: 20000", ["ordering.weights.duration: 0 → 20000"]),
        (
            "{name: high, preempts: [low]}",
            "{name: high, preempts: [low], preemptible: false}",
            ["priority class high: preemptible true → false"],
        ),
        ("{name: high, preempts: [low]}", "{name: high}", ["priority class high: preempts [low] → []"]),
        (
            "{name: normal, default: true}",
            "{name: normal}\n    - {name: batch, default: true}",
            ["priority class batch: added", "default priority class: normal → batch"],
        ),
        ("max: {devices: 8}}", "max: {devices: 4}}", ["defaults: max.devices 8 → 4"]),
        # meaning unchanged: no lines
        ("gracePeriod: 120s", "gracePeriod: 2m", []),
        ("maxAge: 7d", "maxAge: 168h", []),
        ("  backfill: true\n", "", []),  # omitted = the default, true
    ],
)
def test_semantic_diff_lines(old: str, new: str, lines: list[str]) -> None:
    assert old in EXAMPLE
    before = parse_policy(EXAMPLE)
    after = parse_policy(EXAMPLE.replace(old, new, 1))
    assert semantic_diff(before, after) == lines


def test_semantic_diff_of_schedule_order_and_additions() -> None:
    swapped = EXAMPLE.replace(
        '        - {name: business-hours, days: [mon, tue, wed, thu, fri], between: "09:00-18:00",\n'
        "           quota: {guaranteed: {devices: 12}, max: {devices: 24}}}\n"
        '        - {name: night, between: "22:00-06:00", quota: {max: {devices: 4}}}\n',
        '        - {name: night, between: "22:00-06:00", quota: {max: {devices: 4}}}\n'
        '        - {name: weekend, days: [sat, sun], between: "00:00-24:00"}\n'
        '        - {name: business-hours, days: [mon, tue, wed, thu, fri], between: "09:00-18:00",\n'
        "           quota: {guaranteed: {devices: 12}, max: {devices: 24}}}\n",
    )
    assert semantic_diff(parse_policy(EXAMPLE), parse_policy(swapped)) == [
        "team inference: schedule weekend added (sat, sun 00:00-24:00)",
        "team inference: schedule order business-hours, night → night, business-hours (the first matching schedule"
        " wins)",
    ]


# -- durations and windows ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("24h", 86400),
        ("7d", 604800),
        ("1h30m", 5400),
        ("1d2h3m4s", 93784),
        (120, 120),
        (1.5, 1.5),
        ("120", 120),
        ("0.5h", 1800),
        (" 2h 5m ", 7500),
        ("0s", 0),
        ("1w", 604800),
        ("2:00:00", 7200),
        ("1-12:00", 129600),
    ],
)
def test_parse_duration(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "bad", ["", "7days", "h", "30m1h", "1h1h", "-5s", "1y", "1:60", True, None, [1], float("nan"), -1]
)
def test_parse_duration_rejects(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (90, "90s"),
        (120, "2m"),
        (5400, "90m"),
        (3600, "1h"),
        (86400, "24h"),
        (172800, "2d"),
        (604800, "7d"),
        (129600, "36h"),
        (1.5, 1.5),
    ],
)
def test_format_duration(seconds: float, text: object) -> None:
    assert format_duration(seconds) == text
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    ("text", "window"),
    [
        ("09:00-18:00", (540, 1080)),
        ("22:00-06:00", (1320, 360)),
        ("18:00-24:00", (1080, 1440)),
        ("00:00-00:00", (0, 0)),
        ("9:30-17:00", (570, 1020)),
    ],
)
def test_parse_between(text: str, window: tuple[int, int]) -> None:
    assert parse_between(text) == window
    assert parse_between(format_between(*window)) == window
