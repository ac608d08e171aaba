"""Every validation rule: the exact path, a reason, the severity; all at once."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduling.engine.policy import (
    PolicyError,
    PolicyIssue,
    load_policy,
    parse_policy,
    validate_policy,
)

# A small valid policy; each case below breaks one thing in a copy of it.
BASE: dict[str, Any] = {
    "apiVersion": "npuportal/v1",
    "kind": "SchedulingPolicy",
    "metadata": {"name": "t"},
    "spec": {
        "timezone": "Asia/Shanghai",
        "priorityClasses": [
            {"name": "critical", "preempts": ["normal", "low"], "preemptible": False},
            {"name": "high", "preempts": ["low"]},
            {"name": "normal", "default": True},
            {"name": "low"},
        ],
        "reservations": [{"name": "online", "ratio": 0.3, "chipModels": ["910B4"], "forPriorityClasses": ["critical"]}],
        "departments": [{"name": "ai-lab", "shares": 100}],
        "teams": [
            {
                "name": "inference",
                "department": "ai-lab",
                "shares": 30,
                "quota": {"guaranteed": {"devices": 8}, "max": {"devices": 16}},
                "schedules": [
                    {
                        "name": "day",
                        "days": ["mon", "tue"],
                        "between": "09:00-18:00",
                        "quota": {"max": {"devices": 20}},
                    }
                ],
            },
            {"name": "training", "quota": {"guaranteed": {"devices": 16}, "max": {"devices": 32}}},
        ],
        "defaults": {"shares": 1, "quota": {"max": {"devices": 8}}},
    },
}


def text_of(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def mutate(path: str, value: Any) -> str:
    """BASE with the value at a ``spec.teams[0].shares``-style path replaced.

    ``...`` deletes the key; an index one past a list's end appends.
    """
    doc = copy.deepcopy(BASE)
    parts = path.replace("[", ".").replace("]", "").split(".")
    node: Any = doc
    for part in parts[:-1]:
        node = node[int(part)] if isinstance(node, list) else node[part]
    last = parts[-1]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    elif isinstance(node, list) and key == len(node):
        node.append(value)
    else:
        node[key] = value
    return text_of(doc)


def test_base_is_valid() -> None:
    assert validate_policy(text_of(BASE), chip_models=["910B4"]) == []


ERROR_CASES: list[tuple[str, Any, str, str]] = [
    # (mutated path, new value, expected issue path, reason substring)
    # -- top level
    ("apiVersion", "npuportal/v2", "apiVersion", "must be 'npuportal/v1', got 'npuportal/v2'"),
    ("kind", "Policy", "kind", "must be 'SchedulingPolicy'"),
    ("apiVersion", ..., "apiVersion", "required"),
    ("spec", ..., "spec", "required"),
    ("spec", [1, 2], "spec", "must be a mapping, got a list"),
    ("metadata", {"name": "x", "labels": {}}, "metadata.labels", "unknown field"),
    ("metadata.name", 42, "metadata.name", "must be a string, got 42"),
    ("spec.teamz", [], "spec.teamz", "unknown field (did you mean 'teams'?)"),
    # -- schema and types
    ("spec.teams[0].shares", "abc", "spec.teams[0].shares", "must be a number >= 0, got 'abc'"),
    ("spec.teams[0].shares", -1, "spec.teams[0].shares", "must be a number >= 0, got -1"),
    ("spec.teams[0].shares", True, "spec.teams[0].shares", "must be a number >= 0, got true"),
    ("spec.teams[0].shares", float("inf"), "spec.teams[0].shares", "must be a number >= 0"),
    ("spec.teams[0].qouta", {}, "spec.teams[0].qouta", "unknown field (did you mean 'quota'?)"),
    ("spec.teams[0].colour", "red", "spec.teams[0].colour", "unknown field (expected one of: name,"),
    ("spec.teams[0].name", ..., "spec.teams[0].name", "required"),
    ("spec.teams[0].name", 7, "spec.teams[0].name", "must be a string, got 7 (quote it: '7')"),
    ("spec.teams[0].name", "", "spec.teams[0].name", "must be a non-empty string"),
    ("spec.teams[0].name", "*", "spec.teams[0].name", "'*' is reserved for spec.defaults"),
    ("spec.teams", {"inference": {}}, "spec.teams", "must be a list, got a mapping"),
    ("spec.teams[0].quota", 8, "spec.teams[0].quota", "must be a mapping, got 8"),
    ("spec.teams[0].quota.maxConcurrentJobs", 2.5, "spec.teams[0].quota.maxConcurrentJobs", "must be an integer >= 0"),
    ("spec.teams[0].quota.maxConcurrentJobs", -1, "spec.teams[0].quota.maxConcurrentJobs", "must be an integer >= 0"),
    ("spec.teams[0].quota.deviceHoursPerMonth", "many", "spec.teams[0].quota.deviceHoursPerMonth", "got 'many'"),
    (
        "spec.teams[0].quota.allowedPriorityClasses",
        "high",
        "spec.teams[0].quota.allowedPriorityClasses",
        "must be a list",
    ),
    (
        "spec.teams[0].quota.guaranteed.devices",
        -2,
        "spec.teams[0].quota.guaranteed.devices",
        "must be a number >= 0, got -2",
    ),
    ("spec.teams[0].quota.max.devices", None, "spec.teams[0].quota.max.devices", "must be a number >= 0, got null"),
    ("spec.defaults.name", "x", "spec.defaults.name", "unknown field"),
    ("spec.defaults.shares", -3, "spec.defaults.shares", "must be a number >= 0"),
    ("spec.departments[0].shares", -1, "spec.departments[0].shares", "must be a number >= 0"),
    ("spec.departments[0].name", ..., "spec.departments[0].name", "required"),
    # -- resource keys
    ("spec.teams[0].quota.max.gpus", 4, "spec.teams[0].quota.max.gpus", "unknown resource 'gpus': resource keys are"),
    ("spec.teams[0].quota.max.device", 4, "spec.teams[0].quota.max.device", "did you mean 'devices'?"),
    ("spec.teams[0].quota.max.devices/", 4, "spec.teams[0].quota.max.devices/", "unknown resource"),
    ("spec.teams[0].quota.max.devices/a/b", 4, "spec.teams[0].quota.max.devices/a/b", "unknown resource"),
    # -- durations
    ("spec.ordering", {"maxAge": "7days"}, "spec.ordering.maxAge", "'7days' is not a duration"),
    ("spec.ordering", {"usageHalfLife": 0}, "spec.ordering.usageHalfLife", "must be a duration > 0"),
    ("spec.ordering", {"maxAge": "30m1h"}, "spec.ordering.maxAge", "is not a duration"),
    ("spec.ordering", {"longJob": 0}, "spec.ordering.longJob", "must be a duration > 0"),
    ("spec.ordering", {"weights": {"duration": -1}}, "spec.ordering.weights.duration", "must be a number >= 0"),
    ("spec.preemption", {"gracePeriod": -1}, "spec.preemption.gracePeriod", "must be a duration >= 0, got -1"),
    ("spec.starvation", {"after": 0}, "spec.starvation.after", "must be a duration > 0, got 0"),
    ("spec.starvation", {"after": "a day"}, "spec.starvation.after", "'a day' is not a duration"),
    ("spec.starvation", {}, "spec.starvation.after", "required"),
    ("spec.starvation", {"after": "24h", "hold": True}, "spec.starvation.hold", "unknown field"),
    ("spec.starvation", "24h", "spec.starvation", "must be a mapping"),
    ("spec.priorityClasses[0].starvationAfter", "-2h", "spec.priorityClasses[0].starvationAfter", "is not a duration"),
    ("spec.teams[0].quota.maxJobDuration", "-5m", "spec.teams[0].quota.maxJobDuration", "'-5m' is not a duration"),
    ("spec.teams[0].quota.maxJobDuration", "0s", "spec.teams[0].quota.maxJobDuration", "must be a duration > 0"),
    ("spec.teams[0].quota.maxJobDuration", [1], "spec.teams[0].quota.maxJobDuration", "must be a duration"),
    # -- times and days
    (
        "spec.teams[0].schedules[0].between",
        "25:00-06:00",
        "spec.teams[0].schedules[0].between",
        "'25:00-06:00' is not HH:MM-HH:MM",
    ),
    ("spec.teams[0].schedules[0].between", "9-17", "spec.teams[0].schedules[0].between", "'9-17' is not HH:MM-HH:MM"),
    ("spec.teams[0].schedules[0].between", "10:00-24:30", "spec.teams[0].schedules[0].between", "is not HH:MM-HH:MM"),
    ("spec.teams[0].schedules[0].between", "24:00-06:00", "spec.teams[0].schedules[0].between", "is not HH:MM-HH:MM"),
    ("spec.teams[0].schedules[0].between", "09:60-10:00", "spec.teams[0].schedules[0].between", "is not HH:MM-HH:MM"),
    ("spec.teams[0].schedules[0].between", 900, "spec.teams[0].schedules[0].between", "must be a string like"),
    ("spec.teams[0].schedules[0].between", ..., "spec.teams[0].schedules[0].between", "required"),
    (
        "spec.teams[0].schedules[0].days",
        ["monday"],
        "spec.teams[0].schedules[0].days[0]",
        "unknown day 'monday' (did you mean 'mon'?)",
    ),
    ("spec.teams[0].schedules[0].days", ["mon", "xyz"], "spec.teams[0].schedules[0].days[1]", "unknown day 'xyz'"),
    ("spec.teams[0].schedules[0].days", [], "spec.teams[0].schedules[0].days", "must not be empty"),
    ("spec.teams[0].schedules[0].days", "mon", "spec.teams[0].schedules[0].days", "must be a list"),
    ("spec.teams[0].schedules[0].name", ..., "spec.teams[0].schedules[0].name", "required"),
    ("spec.teams[0].schedules[0].when", "x", "spec.teams[0].schedules[0].when", "unknown field"),
    # -- enums, booleans, weights
    (
        "spec.timezone",
        "Asia/Shangai",
        "spec.timezone",
        "unknown timezone 'Asia/Shangai' (did you mean 'Asia/Shanghai'?)",
    ),
    ("spec.timezone", "Mars/Olympus", "spec.timezone", "unknown timezone 'Mars/Olympus'"),
    ("spec.timezone", "../etc/passwd", "spec.timezone", "unknown timezone"),
    (
        "spec.placement",
        {"strategy": "binpak"},
        "spec.placement.strategy",
        "must be one of binpack, spread, got 'binpak' (did you mean 'binpack'?)",
    ),
    ("spec.placement", "binpack", "spec.placement", "must be a mapping"),
    (
        "spec.preemption",
        {"onPreempt": "kill"},
        "spec.preemption.onPreempt",
        "must be one of requeue, cancel, got 'kill'",
    ),
    ("spec.backfill", "sometimes", "spec.backfill", "must be true or false, got 'sometimes'"),
    ("spec.ordering", {"weights": {"age": -5}}, "spec.ordering.weights.age", "must be a number >= 0, got -5"),
    ("spec.ordering", {"weights": {"fairShare": "lots"}}, "spec.ordering.weights.fairShare", "must be a number >= 0"),
    ("spec.ordering", {"weights": {"agee": 1}}, "spec.ordering.weights.agee", "unknown field (did you mean 'age'?)"),
    # -- ratios
    ("spec.reservations[0].ratio", 1.0, "spec.reservations[0].ratio", "must be a number in [0, 1), got 1.0"),
    ("spec.reservations[0].ratio", -0.1, "spec.reservations[0].ratio", "must be a number in [0, 1)"),
    ("spec.reservations[0].ratio", ..., "spec.reservations[0].ratio", "required"),
    ("spec.reservations[0].chipModels", [], "spec.reservations[0].chipModels", "must not be empty"),
    ("spec.reservations[0].forPriorityClasses", [], "spec.reservations[0].forPriorityClasses", "must not be empty"),
    ("spec.reservations[0].chipModels", [910], "spec.reservations[0].chipModels[0]", "quote it"),
    # -- priority classes
    ("spec.priorityClasses", [], "spec.priorityClasses", "must not be empty"),
    (
        "spec.priorityClasses[0].preempts",
        ["normall"],
        "spec.priorityClasses[0].preempts[0]",
        "unknown priority class 'normall' (did you mean 'normal'?)",
    ),
    (
        "spec.priorityClasses[1].preempts",
        ["high"],
        "spec.priorityClasses[1].preempts[0]",
        "a class cannot preempt itself",
    ),
    (
        "spec.priorityClasses[1].preempts",
        ["critical"],
        "spec.priorityClasses[1].preempts[0]",
        "cannot preempt higher class 'critical'",
    ),
    (
        "spec.priorityClasses[3].default",
        True,
        "spec.priorityClasses[3].default",
        "only one class may be the default (already 'normal')",
    ),
    ("spec.priorityClasses[3].name", "high", "spec.priorityClasses[3].name", "duplicate priority class 'high'"),
    ("spec.priorityClasses[1].preemptible", "no", "spec.priorityClasses[1].preemptible", "must be true or false"),
    (
        "spec.reservations[0].forPriorityClasses",
        ["critcal"],
        "spec.reservations[0].forPriorityClasses[0]",
        "unknown priority class 'critcal' (did you mean 'critical'?)",
    ),
    (
        "spec.teams[0].quota.allowedPriorityClasses",
        ["normal", "urgent"],
        "spec.teams[0].quota.allowedPriorityClasses[1]",
        "unknown priority class 'urgent'",
    ),
    (
        "spec.teams[0].schedules[0].quota",
        {"allowedPriorityClasses": ["batch"]},
        "spec.teams[0].schedules[0].quota.allowedPriorityClasses[0]",
        "unknown priority class 'batch'",
    ),
    # -- departments and duplicates
    (
        "spec.teams[0].department",
        "ai-lb",
        "spec.teams[0].department",
        "unknown department 'ai-lb' (did you mean 'ai-lab'?)",
    ),
    ("spec.teams[0].department", "zzz", "spec.teams[0].department", "unknown department 'zzz' (known: ai-lab)"),
    ("spec.teams[1].name", "inference", "spec.teams[1].name", "duplicate team 'inference' (also spec.teams[0])"),
    ("spec.departments", [{"name": "ai-lab"}, {"name": "ai-lab"}], "spec.departments[1].name", "duplicate department"),
    (
        "spec.reservations[1]",
        {"name": "online", "ratio": 0.1, "forPriorityClasses": ["high"]},
        "spec.reservations[1].name",
        "duplicate reservation 'online'",
    ),
    (
        "spec.teams[0].schedules[1]",
        {"name": "day", "between": "20:00-21:00"},
        "spec.teams[0].schedules[1].name",
        "duplicate schedule 'day'",
    ),
    # -- max below guaranteed
    ("spec.teams[1].quota.max.devices", 8, "spec.teams[1].quota.max.devices", "must be >= guaranteed.devices (16)"),
    (
        "spec.teams[1].quota",
        {"guaranteed": {"devices/910B4": 4}, "max": {"devices/910B4": 2}},
        "spec.teams[1].quota.max.devices/910B4",
        "must be >= guaranteed.devices/910B4 (4)",
    ),
    (
        "spec.teams[0].schedules[0].quota",
        {"guaranteed": {"devices": 12}, "max": {"devices": 10}},
        "spec.teams[0].schedules[0].quota.max.devices",
        "must be >= guaranteed.devices (12)",
    ),
    (
        "spec.teams[0].schedules[0].quota",
        {"guaranteed": {"devices": 20}},
        "spec.teams[0].schedules[0].quota.guaranteed.devices",
        "must be <= max.devices (16, from the base quota)",
    ),
    (
        "spec.teams[0].schedules[0].quota",
        {"max": {"devices": -1}},
        "spec.teams[0].schedules[0].quota.max.devices",
        "must be a number >= 0",
    ),
    # -- reservation ratios per chip
    (
        "spec.reservations[1]",
        {"name": "more", "ratio": 0.8, "chipModels": ["910B4"], "forPriorityClasses": ["high"]},
        "spec.reservations",
        "ratios for chip 910B4 sum to 1.1 (online, more); they must stay below 1",
    ),
    (
        "spec.reservations",
        [
            {"name": "a", "ratio": 0.5, "forPriorityClasses": ["high"]},
            {"name": "b", "ratio": 0.5, "forPriorityClasses": ["critical"]},
        ],
        "spec.reservations",
        "ratios for all chips sum to 1",
    ),
]


@pytest.mark.parametrize(
    ("mutated", "value", "path", "reason"), ERROR_CASES, ids=[c[2] + ":" + c[3][:30] for c in ERROR_CASES]
)
def test_error_rule(mutated: str, value: Any, path: str, reason: str) -> None:
    issues = validate_policy(mutate(mutated, value))
    errors = [i for i in issues if i.severity == "error"]
    assert any(i.path == path and reason in i.message for i in errors), "\n".join(map(str, issues))
    policy, _ = load_policy(mutate(mutated, value))
    assert policy is None


WARNING_CASES: list[tuple[str, Any, str, str]] = [
    (
        "spec.teams[0].schedules[1]",
        {"name": "late", "days": ["tue"], "between": "17:00-20:00"},
        "spec.teams[0].schedules[1]",
        "overlaps schedule 'day' (e.g. tue 17:00); 'day' wins where both apply",
    ),
    (
        "spec.teams[0].schedules[1]",
        {"name": "inner", "days": ["mon"], "between": "10:00-11:00"},
        "spec.teams[0].schedules[1]",
        "schedule 'inner' is never in force",
    ),
    (
        "spec.teams[0].schedules[1]",
        {"name": "night", "days": ["sun"], "between": "22:00-09:30"},
        "spec.teams[0].schedules[1]",
        "overlaps schedule 'day' (e.g. mon 09:00)",
    ),
    ("spec.priorityClasses[1].preempts", ["normal"], "spec.priorityClasses[0].preempts[0]", None),
    (
        "spec.priorityClasses[3].preemptible",
        False,
        "spec.priorityClasses[0].preempts[1]",
        "'low' is not preemptible, so this has no effect",
    ),
    (
        "spec.teams[0].quota.allowedPriorityClasses",
        ["critical"],
        "spec.teams[0].quota.allowedPriorityClasses",
        "does not include the default class 'normal'",
    ),
    (
        "spec.teams[0].quota.allowedPriorityClasses",
        [],
        "spec.teams[0].quota.allowedPriorityClasses",
        "is empty, so the team cannot run any job",
    ),
    (
        "spec.teams[0].quota.allowedPriorityClasses",
        ["high", "high"],
        "spec.teams[0].quota.allowedPriorityClasses[1]",
        "'high' is listed twice",
    ),
    (
        "spec.teams[1].quota",
        {"guaranteed": {"devices/910B4": 40}, "max": {"devices": 32}},
        "spec.teams[1].quota.guaranteed.devices/910B4",
        "exceeds max.devices (32)",
    ),
]


@pytest.mark.parametrize(("mutated", "value", "path", "reason"), WARNING_CASES)
def test_warning_rule(mutated: str, value: Any, path: str, reason: str | None) -> None:
    text = mutate(mutated, value)
    issues = validate_policy(text)
    if reason is None:  # the mutation is fine: no issue at all
        assert issues == []
        return
    assert [i for i in issues if i.severity == "error"] == []
    assert any(i.path == path and reason in i.message and i.severity == "warning" for i in issues), "\n".join(
        map(str, issues)
    )
    policy, _ = load_policy(text)
    assert policy is not None  # warnings never block


@pytest.mark.parametrize(
    ("chip_models", "path", "reason"),
    [
        (["910B3"], "spec.reservations[0].chipModels[0]", "unknown chip model '910B4' (did you mean '910B3'?)"),
        (["310P"], "spec.reservations[0].chipModels[0]", "unknown chip model '910B4' (known: 310P)"),
        ([], "spec.reservations[0].chipModels[0]", "unknown chip model '910B4' (no chip models defined)"),
    ],
)
def test_unknown_chip_models(chip_models: list[str], path: str, reason: str) -> None:
    issues = validate_policy(text_of(BASE), chip_models=chip_models)
    assert PolicyIssue(path, reason, "error") in issues


def test_unknown_chip_model_in_quota_keys() -> None:
    text = mutate("spec.teams[0].schedules[0].quota", {"max": {"devices/910C": 2}})
    assert validate_policy(text) == []  # without chip_models any chip name goes
    issues = validate_policy(text, chip_models=["910B4"])
    assert [str(i) for i in issues] == [
        "spec.teams[0].schedules[0].quota.max.devices/910C: unknown chip model '910C' (did you mean '910B4'?)"
    ]


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        # base: 8 + 16 guaranteed all week
        (
            {"devices": 23},
            "guaranteed devices sum to 24 at mon 00:00 (base quotas), above the cluster's healthy capacity of 23",
        ),
        ({"devices": 24}, None),
    ],
)
def test_capacity_warning(capacity: dict[str, float], message: str | None) -> None:
    issues = validate_policy(text_of(BASE), capacity=capacity)
    expected = [] if message is None else [PolicyIssue("spec.teams", message, "warning")]
    assert issues == expected


def test_capacity_warning_at_schedule_times() -> None:
    text = mutate("spec.teams[0].schedules[0].quota", {"guaranteed": {"devices": 12}, "max": {"devices": 20}})
    (issue,) = validate_policy(text, capacity={"devices": 26})
    assert issue == PolicyIssue(
        "spec.teams",
        "guaranteed devices sum to 28 at mon 09:00 (schedules in force: inference/day), above the cluster's"
        " healthy capacity of 26",
        "warning",
    )
    assert validate_policy(text, capacity={"devices": 28}) == []


def test_capacity_warning_per_chip() -> None:
    doc = copy.deepcopy(BASE)
    doc["spec"]["teams"][1]["quota"]["guaranteed"]["devices/910B4"] = 6
    doc["spec"]["teams"][0]["quota"]["guaranteed"]["devices/910B4"] = 6
    issues = validate_policy(text_of(doc), capacity={"devices": 100, "devices/910B4": 10})
    assert [(i.path, i.severity) for i in issues] == [("spec.teams", "warning")]
    assert "guaranteed devices/910B4 sum to 12" in issues[0].message


def test_many_errors_are_reported_at_once() -> None:
    doc = copy.deepcopy(BASE)
    doc["apiVersion"] = "v0"
    doc["spec"]["timezone"] = "Nowhere/City"
    doc["spec"]["teams"][0]["shares"] = "abc"
    doc["spec"]["teams"][0]["qouta"] = doc["spec"]["teams"][0].pop("quota")
    doc["spec"]["teams"][0]["schedules"][0]["between"] = "25:00-06:00"
    doc["spec"]["teams"][1]["quota"]["max"]["devices"] = 4
    doc["spec"]["reservations"][0]["ratio"] = 2
    doc["spec"]["placement"] = {"strategy": "random"}
    issues = validate_policy(text_of(doc))
    assert {i.path for i in issues if i.severity == "error"} == {
        "apiVersion",
        "spec.timezone",
        "spec.teams[0].shares",
        "spec.teams[0].qouta",
        "spec.teams[0].schedules[0].between",
        "spec.teams[1].quota.max.devices",
        "spec.reservations[0].ratio",
        "spec.placement.strategy",
    }
    with pytest.raises(PolicyError) as caught:
        parse_policy(text_of(doc))
    assert len(caught.value.issues) == 8
    assert "spec.teams[1].quota.max.devices: must be >= guaranteed.devices (16)" in str(caught.value)


def test_issue_str_and_equality() -> None:
    issue = PolicyIssue("spec.teams[1].quota.max.devices", "must be >= guaranteed.devices (16)", "error", line=40)
    assert str(issue) == "spec.teams[1].quota.max.devices: must be >= guaranteed.devices (16)"
    assert issue == PolicyIssue("spec.teams[1].quota.max.devices", "must be >= guaranteed.devices (16)", "error")
    assert str(PolicyIssue("", "the policy is empty")) == "the policy is empty"


# -- raw text: YAML errors, duplicates, line numbers -------------------------------

HEADER = "apiVersion: npuportal/v1\nkind: SchedulingPolicy\n"


@pytest.mark.parametrize(
    ("text", "path", "reason", "line"),
    [
        (HEADER + "spec:\n  teams: [\n", "", "YAML syntax error at line 5", 5),
        (
            HEADER + "spec:\n  timezone: UTC\n    foo: bar\n",
            "",
            "YAML syntax error at line 5, column 8: mapping values are not allowed",
            5,
        ),
        (HEADER + "spec:\n\tteams: []\n", "", "YAML syntax error at line 4", 4),
        ("", "", "the policy is empty", None),
        ("# only a comment\n", "", "the policy is empty", None),
        ("- a\n- b\n", "", "must be a mapping, got a list", 1),
        (HEADER + "spec: {}\n---\nspec: {}\n", "", "YAML syntax error", 4),
        (HEADER + "spec:\n  backfill: true\n  backfill: false\n", "spec.backfill", "duplicate key", 5),
        (HEADER + "spec: !!python/object:os.system {}\n", "spec", "unsupported YAML tag", 3),
        (HEADER + "spec: {timezone: !!python/name:os.system ''}\n", "spec.timezone", "cannot read value", 3),
        (HEADER + "spec: {1: x}\n", "spec", "keys must be strings, got 1", 3),
        (HEADER + "spec:\n  teams: &t [*t]\n", "spec.teams[0]", "recursive YAML alias", 4),
    ],
)
def test_text_level_errors(text: str, path: str, reason: str, line: int | None) -> None:
    issues = validate_policy(text)
    assert any(i.path == path and reason in i.message for i in issues), "\n".join(map(str, issues))
    match = next(i for i in issues if i.path == path and reason in i.message)
    if line is not None:
        assert match.line == line


def test_recursive_alias_is_reported_not_crashing() -> None:
    text = HEADER + "spec:\n  defaults: &d\n    shares: 1\n    quota: *d\n"
    issues = validate_policy(text)
    assert any(i.severity == "error" for i in issues)


def test_merge_key_in_an_aliased_mapping_is_not_a_duplicate() -> None:
    text = HEADER + (
        "spec:\n"
        "  teams:\n"
        "    - {name: a, quota: &q {<<: {max: {devices: 8}}, max: {devices: 4}}}\n"
        "    - {name: b, quota: *q}\n"
    )
    policy = parse_policy(text)
    assert policy.teams["a"].quota.max == policy.teams["b"].quota.max == {"devices": 4}


def test_alias_bomb_is_cut_short() -> None:
    lines = [HEADER, "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"]
    for n in range(1, 9):
        prev = f"*a{n - 1}"
        lines.append(f"x{n}: &a{n} [{', '.join([prev] * 10)}]\n")
    issues = validate_policy("".join(lines) + "spec: {}\n")
    assert any("more than" in i.message for i in issues)


def test_yaml_merge_keys_are_supported() -> None:
    text = HEADER + (
        "spec:\n"
        "  defaults: {shares: 1, quota: &q {max: {devices: 8}, maxConcurrentJobs: 3}}\n"
        "  teams:\n"
        "    - {name: a, quota: {<<: *q, maxConcurrentJobs: 5}}\n"
    )
    policy = parse_policy(text)
    assert policy.teams["a"].quota.max == {"devices": 8}
    assert policy.teams["a"].quota.max_concurrent_jobs == 5


def test_issues_carry_lines_in_document_order() -> None:
    text = (
        HEADER
        + "spec:\n"  # 3
        + "  timezone: Nowhere\n"  # 4
        + "  teams:\n"  # 5
        + "    - name: a\n"  # 6
        + "      shares: abc\n"  # 7
        + "      quota:\n"  # 8
        + "        max: {devices: 2}\n"  # 9
        + "        guaranteed: {devices: 4}\n"  # 10
        + "    - shares: 1\n"  # 11
    )
    issues = validate_policy(text)
    assert [(i.path, i.line) for i in issues] == [
        ("spec.timezone", 4),
        ("spec.teams[0].shares", 7),
        ("spec.teams[0].quota.max.devices", 9),
        ("spec.teams[1].name", 11),  # missing: the line of its mapping
    ]


def test_fixture_file_lists_all_its_errors() -> None:
    from pathlib import Path

    text = (Path(__file__).parent / "fixtures" / "many_errors.yaml").read_text()
    issues = validate_policy(text, chip_models=["910B4"])
    assert [(str(i), i.severity, i.line) for i in issues] == [
        ("spec.timezone: unknown timezone 'Asia/Beijing' (did you mean 'Asia/Shanghai'?)", "error", 5),
        (
            "spec.priorityClasses[1].preempts[0]: cannot preempt higher class 'critical' (classes are listed highest"
            " first)",
            "error",
            8,
        ),
        ("spec.priorityClasses[2].default: only one class may be the default (already 'high')", "error", 9),
        (
            "spec.placement.strategy: must be one of binpack, spread, got 'packed' (did you mean 'binpack'?)",
            "error",
            10,
        ),
        ("spec.reservations[0].ratio: must be a number in [0, 1), got 1.5", "error", 12),
        ("spec.reservations[0].chipModels[0]: unknown chip model '910B9' (did you mean '910B4'?)", "error", 12),
        ("spec.teams[0].department: unknown department 'research' (no departments defined)", "error", 15),
        ("spec.teams[0].quota.max.devices: must be >= guaranteed.devices (16)", "error", 18),
        ("spec.teams[0].schedules[0].days[2]: unknown day 'fry' (did you mean 'fri'?)", "error", 20),
        ("spec.teams[0].schedules[1].between: '22:00-6:00pm' is not HH:MM-HH:MM", "error", 21),
        ("spec.teams[1].qouta: unknown field (did you mean 'quota'?)", "error", 24),
    ]


# -- robustness --------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 100) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_load_policy_never_raises_on_any_text(text: str) -> None:
    policy, issues = load_policy(text)
    assert policy is None or not any(i.severity == "error" for i in issues)


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(
        [
            "spec",
            "spec.teams",
            "spec.teams[0]",
            "spec.teams[0].quota",
            "spec.teams[0].schedules[0]",
            "spec.teams[0].schedules[0].quota",
            "spec.priorityClasses[1]",
            "spec.reservations[0]",
            "spec.ordering",
            "spec.defaults",
            "metadata",
            "spec.teams[0].quota.max",
        ]
    ),
    _json,
)
def test_load_policy_never_raises_on_any_structure(path: str, value: Any) -> None:
    policy, issues = load_policy(mutate(path, value))
    assert (policy is None) == any(i.severity == "error" for i in issues)
    for issue in issues:
        assert issue.message and issue.severity in ("error", "warning")
