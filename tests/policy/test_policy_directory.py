"""The policy's directory fields: ``teams[].directory`` and ``spec.directory``, and how groups match."""

from __future__ import annotations

from datetime import UTC

import pytest

from quotas.directory.groups import Groups, mapped_groups, roles_for
from scheduling.engine.policy import dump_policy, parse_policy, semantic_diff, validate_policy

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: d}
spec:
  directory: {finance: finance-staff, admins: "cn=hpc-admins,ou=groups,dc=example,dc=org"}
  teams:
    - name: vision
      directory: {members: vision, leads: vision-leads}
    - name: nlp
      directory: {members: "CN=nlp, OU=groups, DC=example, DC=org"}
    - name: local
"""


def test_directory_fields_round_trip_and_show_in_the_diff() -> None:
    policy = parse_policy(POLICY)
    assert policy.teams["vision"].directory is not None
    assert policy.teams["vision"].directory.leads == "vision-leads"
    assert policy.teams["local"].directory is None
    assert policy.directory.finance == "finance-staff"
    assert parse_policy(dump_policy(policy)) == policy
    changed = parse_policy(
        POLICY.replace("leads: vision-leads", "leads: vision-admins").replace("finance-staff", "fin")
    )
    assert semantic_diff(policy, changed) == [
        "team vision: directory.leads vision-leads → vision-admins",
        "directory.finance finance-staff → fin",
    ]


@pytest.mark.parametrize(
    ("fragment", "path", "reason"),
    [
        ("directory: {leads: x}", "spec.teams[2].directory.members", "required"),
        ("directory: {members: x, lead: y}", "spec.teams[2].directory.lead", "did you mean 'leads'?"),
        ('directory: {members: "cn=,x"}', "spec.teams[2].directory.members", "is not a DN"),
        ('directory: {members: " ml "}', "spec.teams[2].directory.members", "without spaces around it"),
        ("directory: {members: 7}", "spec.teams[2].directory.members", "must be a string"),
        ("directory: ml", "spec.teams[2].directory", "must be a mapping"),
    ],
)
def test_a_bad_team_directory_names_the_field_and_the_reason(fragment: str, path: str, reason: str) -> None:
    issues = validate_policy(POLICY.replace("    - name: local", f"    - name: local\n      {fragment}"))
    errors = [(i.path, i.message) for i in issues if i.severity == "error"]
    assert any(p == path and reason in m for p, m in errors), errors


def test_a_bad_spec_directory_names_the_field() -> None:
    issues = validate_policy(POLICY.replace("{finance: finance-staff,", "{finanse: finance-staff,"))
    assert [(i.path, i.severity) for i in issues] == [("spec.directory.finanse", "error")]


def test_groups_match_by_cn_or_dn_without_regard_to_case_or_spaces() -> None:
    policy = parse_policy(POLICY)
    by_dn = roles_for(policy, Groups.of(["cn=nlp,ou=groups,dc=example,dc=org"]))
    by_cn = roles_for(policy, Groups.of(["NLP"]))
    assert by_dn.teams == by_cn.teams == {"nlp": "member"}
    lead = roles_for(policy, Groups.of(["cn=Vision-Leads,ou=groups,dc=example,dc=org", "vision"]))
    assert lead.teams == {"vision": "lead"}
    assert lead.finance is False and lead.admin is False
    admin = roles_for(policy, Groups.of(["hpc-admins"]))
    assert admin.admin is True and admin.teams == {}
    nobody = roles_for(policy, Groups.of(["marketing", "cn=vision-fans,ou=groups,dc=example,dc=org"]))
    assert nobody.teams == {} and nobody.admin is False
    assert mapped_groups(policy) == [
        "vision",
        "vision-leads",
        "CN=nlp, OU=groups, DC=example, DC=org",
        "finance-staff",
        "cn=hpc-admins,ou=groups,dc=example,dc=org",
    ]


def test_without_spec_directory_finance_and_admin_are_not_the_directorys_to_decide() -> None:
    line = '  directory: {finance: finance-staff, admins: "cn=hpc-admins,ou=groups,dc=example,dc=org"}\n'
    assert line in POLICY
    policy = parse_policy(POLICY.replace(line, ""))
    roles = roles_for(policy, Groups.of(["finance-staff", "hpc-admins", "vision"]))
    assert roles.finance is None and roles.admin is None and roles.teams == {"vision": "member"}


DATED = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: dated}
spec:
  timezone: Asia/Shanghai
  teams:
    - name: vision
      quota: {max: {devices: 32}}
      schedules:
        - name: request-7
          between: "00:00-24:00"
          dates: {from: 2026-12-10, until: 2026-12-20}
          quota: {max: {devices: 48}}
        - name: nights
          between: "20:00-08:00"
          quota: {max: {devices: 40}}
"""


@pytest.mark.parametrize(
    ("utc", "cap", "schedule"),
    [
        ("2026-12-09T15:59:00", 40, "nights"),  # 23:59 on 9 December in Shanghai: before the dates
        ("2026-12-09T16:00:00", 48, "request-7"),  # 00:00 on the 10th, local
        ("2026-12-15T04:00:00", 48, "request-7"),  # midday within the dates
        ("2026-12-20T15:59:00", 48, "request-7"),  # 23:59 on the 20th: the last date is included
        ("2026-12-20T16:00:00", 40, "nights"),  # 00:00 on the 21st: over
        ("2026-12-21T04:00:00", 32, None),  # midday after: the base quota
    ],
)
def test_a_dated_schedule_is_in_force_on_its_local_dates_only(utc: str, cap: float, schedule: str | None) -> None:
    from datetime import datetime

    from scheduling.engine.policy import quota_at

    quota, in_force = quota_at(parse_policy(DATED), "vision", datetime.fromisoformat(utc).replace(tzinfo=UTC))
    assert (quota.max["devices"], in_force) == (cap, schedule)


def test_dated_schedules_round_trip_are_checked_and_show_in_the_diff() -> None:
    policy = parse_policy(DATED)
    assert parse_policy(dump_policy(policy)) == policy
    later = parse_policy(DATED.replace("until: 2026-12-20", "until: 2026-12-24"))
    assert semantic_diff(policy, later) == [
        "team vision: schedule request-7: dates 2026-12-10 to 2026-12-20 → 2026-12-10 to 2026-12-24"
    ]
    assert [(i.path, i.message) for i in validate_policy(DATED.replace("until: 2026-12-20", "until: 2026-12-01"))] == [
        ("spec.teams[0].schedules[0].dates.until", "2026-12-01 is before from (2026-12-10)")
    ]
    assert [i.path for i in validate_policy(DATED.replace("until: 2026-12-20", "until: soon"))] == [
        "spec.teams[0].schedules[0].dates.until"
    ]
    # A dated schedule overlapping a weekly one is what it is for: no overlap warning.
    assert validate_policy(DATED) == []
