"""The documented example is a contract: it must parse, to exactly these values."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduling.engine.policy import (
    DEVICES,
    Ordering,
    Policy,
    PriorityClass,
    Quota,
    TeamPolicy,
    chip_resource,
    dump_policy,
    parse_policy,
    validate_policy,
)

ROOT = Path(__file__).resolve().parents[2]

CONTRACT = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: default}
spec:
  timezone: Asia/Shanghai
  priorityClasses:                 # highest first
    - {name: critical, preempts: [normal, low], preemptible: false}
    - {name: high, preempts: [low]}
    - {name: normal, default: true}
    - {name: low}
  ordering:
    weights: {priorityClass: 10000, fairShare: 5000, age: 1000, jobSize: 0}
    maxAge: 7d
    usageHalfLife: 7d
  placement: {strategy: binpack}   # binpack | spread
  backfill: true
  preemption: {gracePeriod: 120s, onPreempt: requeue}   # requeue | cancel
  reservations:
    - {name: online-inference, ratio: 0.3, chipModels: [910B4], forPriorityClasses: [critical]}
  departments:
    - {name: ai-lab, shares: 100}
  teams:
    - name: inference
      department: ai-lab
      shares: 30
      quota:
        guaranteed: {devices: 8}
        max: {devices: 16, devices/910B4: 12}
        maxConcurrentJobs: 20
        deviceHoursPerMonth: 5000
        maxJobDuration: 24h
        allowedPriorityClasses: [critical, high, normal]
      schedules:                   # first match wins; fields it omits keep the base quota
        - {name: business-hours, days: [mon, tue, wed, thu, fri], between: "09:00-18:00",
           quota: {guaranteed: {devices: 12}, max: {devices: 24}}}
        - {name: night, between: "22:00-06:00", quota: {max: {devices: 4}}}
    - name: training
      department: ai-lab
      shares: 50
      quota: {guaranteed: {devices: 16}, max: {devices: 32}}
  defaults:                        # teams the policy does not name
    shares: 1
    quota: {guaranteed: {devices: 0}, max: {devices: 8}}
"""

MINIMAL = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
spec: {}
"""


@pytest.fixture(scope="module")
def policy() -> Policy:
    return parse_policy(CONTRACT)


def test_example_file_is_the_contract_verbatim() -> None:
    assert (ROOT / "examples/policies/default.yaml").read_text() == CONTRACT


def test_contract_has_no_issues_at_all() -> None:
    assert validate_policy(CONTRACT, chip_models=["910B4", "910B3"]) == []


def test_contract_top_level(policy: Policy) -> None:
    assert policy.name == "default"
    assert policy.timezone == "Asia/Shanghai"
    assert policy.ordering == Ordering(10000, 5000, 1000, 0, 7 * 86400, 7 * 86400)
    assert policy.placement_strategy == "binpack"
    assert policy.backfill is True
    assert policy.grace_period_s == 120
    assert policy.on_preempt == "requeue"
    assert policy.departments == {"ai-lab": 100}


def test_contract_priority_classes(policy: Policy) -> None:
    assert policy.priority_classes == (
        PriorityClass("critical", 0, frozenset({"normal", "low"}), preemptible=False),
        PriorityClass("high", 1, frozenset({"low"})),
        PriorityClass("normal", 2, default=True),
        PriorityClass("low", 3),
    )
    assert policy.default_class.name == "normal"
    assert policy.class_by_name("high") == policy.priority_classes[1]
    assert policy.class_by_name("nope") is None


def test_contract_reservation(policy: Policy) -> None:
    (r,) = policy.reservations
    assert (r.name, r.ratio, r.chip_models, r.priority_classes) == (
        "online-inference",
        0.3,
        frozenset({"910B4"}),
        frozenset({"critical"}),
    )


def test_contract_teams(policy: Policy) -> None:
    assert list(policy.teams) == ["inference", "training"]
    inference = policy.teams["inference"]
    assert (inference.department, inference.shares) == ("ai-lab", 30)
    assert inference.quota == Quota(
        guaranteed={DEVICES: 8},
        max={DEVICES: 16, chip_resource("910B4"): 12},
        max_concurrent_jobs=20,
        device_hours_per_month=5000,
        max_job_duration_s=86400,
        allowed_priority_classes=frozenset({"critical", "high", "normal"}),
    )
    business, night = inference.schedules
    assert (business.name, business.days, business.start_min, business.end_min) == (
        "business-hours",
        frozenset({0, 1, 2, 3, 4}),
        9 * 60,
        18 * 60,
    )
    assert business.quota == {"guaranteed": {DEVICES: 12}, "max": {DEVICES: 24}}
    assert (night.name, night.days, night.start_min, night.end_min) == ("night", None, 22 * 60, 6 * 60)
    assert night.quota == {"max": {DEVICES: 4}}
    training = policy.teams["training"]
    assert training == TeamPolicy("training", "ai-lab", 50, Quota({DEVICES: 16}, {DEVICES: 32}))


def test_contract_defaults(policy: Policy) -> None:
    assert policy.defaults == TeamPolicy("*", None, 1, Quota({DEVICES: 0}, {DEVICES: 8}))
    assert policy.team("somebody-else") is policy.defaults


def test_minimal_policy_gets_every_default() -> None:
    policy = parse_policy(MINIMAL)
    assert policy.name == "default"
    assert policy.timezone == "UTC"
    assert [(pc.name, pc.rank, pc.preempts, pc.preemptible, pc.default) for pc in policy.priority_classes] == [
        ("critical", 0, frozenset({"normal", "low"}), False, False),
        ("high", 1, frozenset({"low"}), True, False),
        ("normal", 2, frozenset(), True, True),
        ("low", 3, frozenset(), True, False),
    ]
    assert policy.ordering == Ordering()
    assert policy.ordering.max_age_s == policy.ordering.usage_half_life_s == 7 * 86400
    assert (policy.placement_strategy, policy.backfill) == ("binpack", True)
    assert (policy.grace_period_s, policy.on_preempt) == (120, "requeue")
    assert policy.reservations == ()
    assert policy.departments == {}
    assert policy.teams == {}
    assert policy.defaults == TeamPolicy("*", None, 1, Quota())


def test_null_sections_mean_omitted() -> None:
    text = MINIMAL.replace("spec: {}", "spec:\n  teams:\n  reservations:\n  ordering:\n")
    assert parse_policy(text) == parse_policy(MINIMAL)


def test_team_without_quota_is_unlimited() -> None:
    policy = parse_policy(MINIMAL.replace("spec: {}", "spec: {teams: [{name: a}]}"))
    assert policy.teams["a"] == TeamPolicy("a", None, 1, Quota())
    quota = policy.teams["a"].quota
    assert quota.guaranteed == {} and quota.max == {}
    assert quota.max_concurrent_jobs is quota.device_hours_per_month is quota.max_job_duration_s is None
    assert quota.allowed_priority_classes is None


@pytest.mark.parametrize(
    ("classes", "default"),
    [
        ("[{name: a}, {name: normal}, {name: b}]", "normal"),
        ("[{name: a}, {name: b}, {name: c}]", "c"),
        ("[{name: a, default: true}, {name: normal}]", "a"),
        ("[{name: only}]", "only"),
    ],
)
def test_default_class_resolution(classes: str, default: str) -> None:
    policy = parse_policy(MINIMAL.replace("spec: {}", f"spec: {{priorityClasses: {classes}}}"))
    assert policy.default_class.name == default
    assert [pc.name for pc in policy.priority_classes if pc.default] == [default]


def test_resolve_class_and_may_preempt(policy: Policy) -> None:
    assert policy.resolve_class(None).name == "normal"
    assert policy.resolve_class("gone-since").name == "normal"
    assert policy.resolve_class("low").name == "low"
    assert policy.may_preempt("critical", "normal")
    assert policy.may_preempt("high", "low")
    assert not policy.may_preempt("high", "normal")
    assert not policy.may_preempt("low", "critical")
    assert policy.may_preempt("critical", None)  # no class = default class "normal"


def test_canonical_dump_of_contract_round_trips(policy: Policy) -> None:
    text = dump_policy(policy)
    assert parse_policy(text) == policy
    assert dump_policy(parse_policy(text)) == text
