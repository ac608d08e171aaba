"""The policy format's table of fields drives reading, writing back, the quota JSON and the diff.

Every row round-trips (parse → dump → parse) with its example value, in a team's quota, in a
schedule's override and in ``spec.ordering``, and shows in the semantic diff under its label. The
tables cover every attribute of the records they fill, and the parser, the exporter and the JSON
know no field the tables do not list: adding a field is adding its row.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from scheduling.engine.policy import (
    Ordering,
    Policy,
    Quota,
    dump_policy,
    effective_quotas,
    parse_policy,
    semantic_diff,
    validate_policy,
)
from scheduling.engine.policy_fields import ORDERING_FIELDS, QUOTA_FIELDS, SPEC_FIELDS, PolicyField, section_keys

CLASSES = [{"name": "high", "preempts": ["normal"]}, {"name": "normal", "default": True}]


def _document(*, quota: dict[str, Any] | None = None, night: dict[str, Any] | None = None, **spec: Any) -> str:
    team: dict[str, Any] = {"name": "t", "quota": quota or {}}
    if night is not None:
        team["schedules"] = [{"name": "night", "between": "20:00-08:00", "quota": night}]
    body = {"priorityClasses": CLASSES, **spec, "teams": [team]}
    return yaml.safe_dump({"apiVersion": "npuportal/v1", "kind": "SchedulingPolicy", "spec": body})


def _nested(f: PolicyField) -> dict[str, Any]:
    """``{"weights": {"age": 500}}`` for ``weights.age``: the row's example where the YAML puts it."""
    return {f.group: {f.key: f.example}} if f.group else {f.yaml: f.example}


def _round_trip(text: str) -> Policy:
    policy = parse_policy(text)
    again = parse_policy(dump_policy(policy))
    assert again == policy
    assert dump_policy(again) == dump_policy(policy)
    return policy


@pytest.mark.parametrize("f", QUOTA_FIELDS, ids=lambda f: f.yaml)
def test_every_quota_field_round_trips_and_shows_in_the_diff(f: PolicyField) -> None:
    base = _round_trip(_document())
    changed = _round_trip(_document(quota={f.yaml: f.example}))
    assert getattr(changed.teams["t"].quota, f.attr) != getattr(Quota(), f.attr)
    assert f.yaml in yaml.safe_load(dump_policy(changed))["spec"]["teams"][0]["quota"]
    lines = semantic_diff(base, changed)
    assert lines and all(line.startswith(f"team t: {f.yaml}") for line in lines), lines
    shown = effective_quotas(changed, datetime(2026, 11, 27, 12, tzinfo=UTC))["teams"]["t"]  # type: ignore[index]
    assert shown[f.yaml] == f.write(getattr(changed.teams["t"].quota, f.attr), ["high", "normal"])


@pytest.mark.parametrize("f", QUOTA_FIELDS, ids=lambda f: f.yaml)
def test_every_quota_field_round_trips_in_a_schedule_and_shows_in_the_diff(f: PolicyField) -> None:
    base = _round_trip(_document(night={}))
    changed = _round_trip(_document(night={f.yaml: f.example}))
    assert f.yaml in changed.teams["t"].schedules[0].quota
    lines = semantic_diff(base, changed)
    assert lines and all(line.startswith(f"team t: schedule night: {f.yaml}") for line in lines), lines
    assert all("(base) →" in line for line in lines)


@pytest.mark.parametrize("f", QUOTA_FIELDS, ids=lambda f: f.yaml)
def test_a_null_in_a_schedule_reads_as_the_rows_unset_word(f: PolicyField) -> None:
    if f.resources:
        night = {f.yaml: {"devices": None}}
        base = _round_trip(_document(quota={f.yaml: {"devices": 2}}, night={}))
    else:
        night = {f.yaml: None}
        base = _round_trip(_document(quota={f.yaml: f.example}, night={}))
    changed = _round_trip(_document(quota=base_quota(base), night=night))
    assert semantic_diff(base, changed)[-1].endswith(f"(base) → {f.unset}")


def base_quota(policy: Policy) -> dict[str, Any]:
    return yaml.safe_load(dump_policy(policy))["spec"]["teams"][0]["quota"]


@pytest.mark.parametrize("f", ORDERING_FIELDS, ids=lambda f: f.yaml)
def test_every_ordering_field_round_trips_and_shows_in_the_diff(f: PolicyField) -> None:
    base = _round_trip(_document())
    changed = _round_trip(_document(ordering=_nested(f)))
    before, after = getattr(Ordering(), f.attr), getattr(changed.ordering, f.attr)
    assert after != before
    assert semantic_diff(base, changed) == [f"ordering.{f.yaml}: {f.show(before, [])} → {f.show(after, [])}"]


def _shown(f: PolicyField, value: object) -> str:
    return f.unset if value is None else f.show(value, [])


@pytest.mark.parametrize("f", SPEC_FIELDS, ids=lambda f: f.yaml)
def test_every_spec_setting_round_trips_and_shows_in_the_diff(f: PolicyField) -> None:
    base = _round_trip(_document())
    changed = _round_trip(_document(**_nested(f)))
    before, after = getattr(base, f.attr), getattr(changed, f.attr)
    assert before == f.default and after != before
    assert semantic_diff(base, changed) == [f"{f.yaml}: {_shown(f, before)} → {_shown(f, after)}"]


def test_a_spec_setting_left_out_or_null_takes_its_default_unless_null_is_refused() -> None:
    for f in SPEC_FIELDS:
        text = _document(**({f.group: {f.key: None}} if f.group else {f.yaml: None}))
        issues = [i for i in validate_policy(text) if i.severity == "error"]
        if f.null == "read":
            assert [i.path for i in issues] == [f"spec.{f.yaml}"], f.yaml
        else:
            assert not issues and getattr(parse_policy(text), f.attr) == f.default, f.yaml


@pytest.mark.parametrize(("fields", "record"), [(QUOTA_FIELDS, Quota), (ORDERING_FIELDS, Ordering)])
def test_the_tables_cover_every_attribute_once(fields: tuple[PolicyField, ...], record: type) -> None:
    attrs = [f.attr for f in fields]
    assert sorted(attrs) == sorted(field.name for field in dataclasses.fields(record))
    assert len({f.yaml for f in fields}) == len(fields)
    assert all(f.example is not None for f in fields)


def test_the_parser_the_export_and_the_json_know_the_tables_fields_only() -> None:
    """A key the table does not list is refused by name, with the table's keys as the choices."""
    issues = validate_policy(_document(quota={"gpus": 3}, ordering={"weights": {"agee": 1}, "maxAgee": "1d"}))
    messages = {issue.path: issue.message for issue in issues}
    assert (
        messages["spec.teams[0].quota.gpus"]
        == "unknown field (expected one of: " + ", ".join(section_keys(QUOTA_FIELDS)) + ")"
    )
    assert messages["spec.ordering.weights.agee"] == "unknown field (did you mean 'age'?)"
    assert messages["spec.ordering.maxAgee"] == "unknown field (did you mean 'maxAge'?)"
    policy = parse_policy(_document())
    shown = effective_quotas(policy, datetime(2026, 11, 27, 12, tzinfo=UTC))["teams"]["t"]  # type: ignore[index]
    assert list(shown) == ["schedule", *(f.yaml for f in QUOTA_FIELDS)]
    full = parse_policy(_document(quota={f.yaml: f.example for f in QUOTA_FIELDS}))
    assert list(base_quota(full)) == [f.yaml for f in QUOTA_FIELDS]
    ordering = yaml.safe_load(dump_policy(full))["spec"]["ordering"]
    assert list(ordering) == [k for k in section_keys(ORDERING_FIELDS) if k not in ("longJob",)]
    assert list(ordering["weights"]) == [f.key for f in ORDERING_FIELDS if f.group == "weights" and not f.omit_default]
