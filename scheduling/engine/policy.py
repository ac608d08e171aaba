"""The scheduling policy as the engine sees it: typed, validated, time-aware.

The YAML format (``apiVersion: npuportal/v1``, ``kind: SchedulingPolicy``) is a
contract with admins and their scripts; this module is the one place that turns
that text into immutable objects, so the engine, the simulator, the dry run and
the console can never disagree about what a policy means.

This is the public face: callers import from here only. Behind it, one layer on
another with no way back: the table of fields (:mod:`policy_fields`: how each
field is read, written back, shown and compared), the records and the quota in
force over time (:mod:`policy_model`), and on those reading the text
(:mod:`policy_parse`), writing it back (:mod:`policy_dump`) and comparing
versions (:mod:`policy_diff`). Everything here is pure (stdlib + PyYAML): no Django.
"""

from __future__ import annotations

from scheduling.engine.policy_diff import diff_policies, semantic_diff
from scheduling.engine.policy_dump import dump_policy
from scheduling.engine.policy_fields import API_VERSION, KIND
from scheduling.engine.policy_model import (
    DEVICES,
    DirectoryRoles,
    Ordering,
    Policy,
    PolicyError,
    PolicyIssue,
    PriorityClass,
    Quota,
    Reservation,
    Schedule,
    Severity,
    TeamDirectory,
    TeamPolicy,
    as_policy_time,
    chip_resource,
    effective_quotas,
    merge_quota,
    policy_clock,
    quota_at,
    quota_for_team,
    quota_to_json,
    week_grid,
    zone,
)
from scheduling.engine.policy_parse import load_policy, parse_policy, validate_policy

__all__ = [
    "API_VERSION",
    "DEVICES",
    "KIND",
    "DirectoryRoles",
    "Ordering",
    "Policy",
    "PolicyError",
    "PolicyIssue",
    "PriorityClass",
    "Quota",
    "Reservation",
    "Schedule",
    "Severity",
    "TeamDirectory",
    "TeamPolicy",
    "as_policy_time",
    "chip_resource",
    "diff_policies",
    "dump_policy",
    "effective_quotas",
    "load_policy",
    "merge_quota",
    "parse_policy",
    "policy_clock",
    "quota_at",
    "quota_for_team",
    "quota_to_json",
    "semantic_diff",
    "validate_policy",
    "week_grid",
    "zone",
]
