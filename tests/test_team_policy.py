"""Changing one team's weight and base quota: the structural edit, the service, the console page and the API."""

from __future__ import annotations

import json
import math
from io import StringIO
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from quotas.models import AuditEvent, Policy, Team
from quotas.policies.team_policy import (
    MAX_DEVICE_UNITS,
    MAX_SHARES,
    NON_FIELD,
    TeamChangeError,
    change_team,
    read_amount,
    team_changed_yaml,
    team_overview,
)
from quotas.policies.versions import active_policy, parsed
from scheduling.engine.policy import Quota, parse_policy, semantic_diff

pytestmark = pytest.mark.clock

ROOT = Path(__file__).resolve().parent.parent
DEMO = (ROOT / "examples" / "policies" / "demo.yaml").read_text()


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Every test of this module with its own throttle counters and policy cache (see conftest)."""


# -- reading a number -----------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "value"),
    [(0, 0.0), (60, 60.0), (2.5, 2.5), ("60", 60.0), (" 2.5 ", 2.5), ("1e3", 1000.0), (".5", 0.5), ("7.", 7.0)],
)
def test_read_amount_accepts_numbers_and_their_text(raw, value) -> None:
    assert read_amount(raw, limit=MAX_SHARES) == value


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (-3, "must be a number >= 0, got -3"),
        ("-3", "must be a number >= 0, got -3"),
        ("abc", "must be a number >= 0, got 'abc'"),
        ("nan", "must be a number >= 0, got 'nan'"),
        ("inf", "must be a number >= 0, got 'inf'"),
        (math.inf, "must be a number >= 0, got inf"),
        ("1_000", "must be a number >= 0, got '1_000'"),
        ("", "must be a number >= 0, got ''"),
        (True, "must be a number >= 0, got True"),
        (None, "must be a number >= 0, got None"),
        ([1], "must be a number >= 0, got [1]"),
        (1e12, "must be at most 1000000, got 1e+12"),
        ("2000000", "must be at most 1000000, got 2000000"),
    ],
)
def test_read_amount_refuses_with_the_reason(raw, reason) -> None:
    with pytest.raises(ValueError) as info:
        read_amount(raw, limit=MAX_SHARES)
    assert str(info.value) == reason


# -- the structural edit (no database) ---------------------------------------------


def test_only_the_named_teams_weight_changes_even_where_the_same_text_appears_elsewhere() -> None:
    # Department and team both say `shares: 50`: a text replacement could not tell them apart.
    text = DEMO.replace("- {name: ai-lab, shares: 100}", "- {name: ai-lab, shares: 50}")
    before = parse_policy(text)
    after = parse_policy(team_changed_yaml(before, "training", shares=60))
    assert semantic_diff(before, after) == ["team training: shares 50 → 60"]
    assert after.departments["ai-lab"] == 50 and after.teams["training"].shares == 60
    assert after.teams["inference"] == before.teams["inference"]  # schedules and all


def test_quota_keys_merge_and_none_removes_them() -> None:
    before = parse_policy(DEMO)
    after = parse_policy(
        team_changed_yaml(
            before, "inference", guaranteed={"devices": 7}, maximum={"devices/910B4": None, "devices/910A": 4}
        )
    )
    quota = after.teams["inference"].quota
    assert dict(quota.guaranteed) == {"devices": 7}
    assert dict(quota.max) == {"devices": 12, "devices/910A": 4}
    assert quota.max_concurrent_jobs == 20 and quota.max_job_duration_s == 24 * 3600  # untouched fields stay
    assert [s.name for s in after.teams["inference"].schedules] == ["business-hours", "night"]
    assert after.teams["inference"].shares == before.teams["inference"].shares


def test_a_team_the_policy_does_not_name_gets_a_copy_of_the_defaults() -> None:
    before = parse_policy(DEMO)
    after = parse_policy(team_changed_yaml(before, "newbies", shares=5))
    team = after.teams["newbies"]
    assert (team.shares, team.department, team.quota) == (5, None, before.defaults.quota)
    assert list(after.teams)[-1] == "newbies"
    assert semantic_diff(before, after) == ["team newbies: added"]
    assert after.defaults == before.defaults


# -- the service (database) ----------------------------------------------------------


@pytest.mark.django_db
def test_a_valid_change_is_a_new_active_version_audited_with_its_comment(demo, user_factory) -> None:
    ops = user_factory("ops", staff=True)
    training_before = next(r for r in team_overview() if r.name == "training")
    result = change_team("training", shares="60", comment="  paper deadline ", author=ops, base_version=1)
    record = Policy.objects.get(is_active=True)
    assert record == result.record and (record.version, record.comment, record.author) == (2, "paper deadline", ops)
    assert result.changes == ["team training: shares 50 → 60"]
    assert (result.before.shares, result.after.shares) == (50, 60)
    assert parsed(record).teams["training"].shares == 60
    assert active_policy().version == 2
    assert AuditEvent.objects.filter(action="policy.activate", target="policy v2", actor=ops).exists()
    change = AuditEvent.objects.get(action="team.change")
    assert change.target == "team training" and change.detail == "policy v2: team training: shares 50 → 60"

    training_after = next(r for r in team_overview() if r.name == "training")
    assert training_before.norm_shares == pytest.approx(50 / 100)
    assert training_after.norm_shares == pytest.approx(60 / 110)
    assert training_after.fair_share != training_before.fair_share  # the demo has usage: the factor moves
    assert training_after.shares == 60


@pytest.mark.django_db
def test_invalid_fields_are_all_reported_and_nothing_is_stored(demo, user_factory) -> None:
    ops = user_factory("ops", staff=True)
    with pytest.raises(TeamChangeError) as info:
        change_team(
            "training",
            shares="abc",
            guaranteed={"devices": "-1"},
            maximum={"devices": str(MAX_DEVICE_UNITS * 10)},
            comment="",
            author=ops,
        )
    assert info.value.errors == {
        "shares": "must be a number >= 0, got 'abc'",
        "guaranteed.devices": "must be a number >= 0, got -1",
        "max.devices": "must be at most 100000, got 1000000.0",
        "comment": "say why you change the team: the comment is kept in the policy history",
    }
    assert info.value.field == "shares"
    assert Policy.objects.count() == 1 and not AuditEvent.objects.filter(action="team.change").exists()


@pytest.mark.parametrize(
    ("kwargs", "field", "reason"),
    [
        ({"shares": "  "}, "shares", "required: the team's fair-share weight, a number >= 0"),
        ({"shares": -3}, "shares", "must be a number >= 0, got -3"),
        ({"guaranteed": {"devices": 30}}, "max.devices", "must be >= guaranteed.devices (30)"),
        ({"maximum": {"gpus": 2}}, "max.gpus", "unknown resource 'gpus'"),
        ({"maximum": {"devices/H100": 2}}, "max.devices/H100", "unknown chip model 'H100'"),
        ({"shares": 50}, NON_FIELD, "nothing to change"),
        ({"shares": 55, "base_version": 7}, "base_version", "the active policy is now v1, not v7"),
        ({"shares": 55, "comment": "x" * 501}, "comment", "must be at most 500 characters"),
    ],
)
@pytest.mark.django_db
def test_refusals_name_the_field_and_store_nothing(demo, user_factory, kwargs, field, reason) -> None:
    ops = user_factory("ops", staff=True)
    with pytest.raises(TeamChangeError) as info:
        change_team("training", **{"comment": "why", **kwargs}, author=ops)
    assert field in info.value.errors and reason in info.value.errors[field], info.value.errors
    assert Policy.objects.count() == 1


@pytest.mark.django_db
def test_a_lowered_base_cap_that_breaks_a_schedule_is_reported_whole(demo, user_factory) -> None:
    from quotas.policies.versions import create_version

    ops = user_factory("ops", staff=True)
    text = DEMO.replace("quota: {guaranteed: {devices: 8}, max: {devices: 16}}", "quota: {guaranteed: {devices: 8}}")
    create_version(text, author=ops, comment="business hours: more guaranteed, same cap")
    with pytest.raises(TeamChangeError) as info:
        change_team("inference", guaranteed={"devices": 4}, maximum={"devices": 6}, comment="why", author=ops)
    assert info.value.errors == {
        NON_FIELD: "team inference: schedules[0].quota.guaranteed.devices: "
        "must be <= max.devices (6, from the base quota)"
    }
    assert Policy.objects.count() == 2


@pytest.mark.django_db
def test_a_new_team_gets_its_own_entry_and_the_others_keep_theirs(demo, user_factory) -> None:
    ops = user_factory("ops", staff=True)
    Team.objects.create(name="newbies")
    row = next(r for r in team_overview() if r.name == "newbies")
    assert (row.named, row.shares, row.department) == (False, 1, None)
    result = change_team("newbies", shares=10, comment="give them a voice", author=ops)
    assert result.changes == ["team newbies: added"]
    policy = parsed(result.record)
    assert policy.teams["newbies"].shares == 10 and policy.teams["newbies"].quota == policy.defaults.quota
    row = next(r for r in team_overview() if r.name == "newbies")
    assert row.named and row.shares == 10


@pytest.mark.django_db
def test_the_first_change_on_an_empty_cluster_starts_from_the_builtin_defaults(db, user_factory) -> None:
    ops = user_factory("ops", staff=True)
    Team.objects.create(name="solo")
    result = change_team("solo", shares=3, maximum={"devices": 8}, comment="first", author=ops)
    assert result.record.version == 1 and result.record.is_active
    assert parsed(result.record).teams["solo"].quota == Quota(max={"devices": 8.0})


@pytest.mark.django_db
def test_overview_agrees_with_sshare(demo) -> None:
    out = StringIO()
    call_command("sshare", "--json", stdout=out)
    sshare = {row["name"]: row for row in json.loads(out.getvalue())}
    rows = team_overview()
    assert {r.name for r in rows} == {"inference", "training", "research"}
    for row in rows:
        assert row.norm_shares == pytest.approx(sshare[row.name]["norm_shares"])
        assert row.fair_share == pytest.approx(sshare[row.name]["fair_share"], rel=1e-6)
        assert row.shares == sshare[row.name]["raw_shares"]
    assert {r.name: (r.members, r.leads) for r in rows} == {"inference": (1, 1), "training": (1, 1), "research": (1, 1)}


# -- the console page ------------------------------------------------------------------


@pytest.mark.django_db
def test_teams_pages_are_for_admins(demo, user_factory, client) -> None:
    user_factory("tom", team="training", role="lead")
    client.force_login(get_user_model().objects.get(username="tom"))
    assert client.get("/teams/").status_code == 403  # the console's own 403, not the admin's sign-in
    assert client.post("/teams/training/", {"shares": "5", "comment": "x"}).status_code == 403
    assert Policy.objects.count() == 1
    user_factory("ops", staff=True)
    client.force_login(get_user_model().objects.get(username="ops"))
    assert client.get("/teams/no-such-team/").status_code == 404
    page = client.get("/teams/").content.decode()
    assert 'id="team-training"' in page and "/teams/training/" in page
    assert 'href="/teams/"' in client.get("/").content.decode()  # in the admin navigation


@pytest.mark.django_db
def test_console_form_shows_the_error_next_to_the_field_and_keeps_unsent_fields(demo, user_factory, client) -> None:
    user_factory("ops", staff=True)
    client.force_login(get_user_model().objects.get(username="ops"))
    form = client.get("/teams/training/").content.decode()
    assert 'name="max__devices"' in form and 'value="24"' in form and 'name="max__devices__910B4"' in form

    resp = client.post("/teams/training/", {"shares": "-3", "comment": "why", "max__devices": "24"})
    body = resp.content.decode()
    assert resp.status_code == 200 and 'id="shares-error"' in body
    assert "Weight (shares): must be a number &gt;= 0, got -3" in body
    resp = client.post("/teams/training/", {"shares": "50", "max__devices": "8", "comment": "why"})
    assert "Max devices: must be &gt;= guaranteed.devices (10)" in resp.content.decode()
    assert Policy.objects.count() == 1

    # A post that leaves out the quota fields changes the weight only; it does not lift the caps.
    resp = client.post("/teams/training/", {"shares": "55", "comment": "only the weight", "base_version": "1"})
    assert resp.status_code == 302 and resp.url == "/teams/"
    training = active_policy().policy.teams["training"]
    assert training.shares == 55 and dict(training.quota.max) == {"devices": 24}
    listing = client.get("/teams/").content.decode()
    assert "Saved: team training: shares 50 → 55" in listing and "Share of the cluster 50.0 % → 52.4 %" in listing

    stale = client.post("/teams/training/", {"shares": "70", "comment": "late", "base_version": "1"})
    assert "the active policy is now v2, not v1" in stale.content.decode()
    assert Policy.objects.count() == 2


@pytest.mark.django_db
def test_lead_quota_page_shows_their_teams_fair_share_only(demo, user_factory, client) -> None:
    user_factory("tom", team="training", role="lead")
    client.force_login(get_user_model().objects.get(username="tom"))
    body = client.get("/quota/").content.decode()
    assert 'id="fair-share-training"' in body and 'id="fair-share-inference"' not in body


# -- the API -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_patch_changes_the_team_and_answers_its_new_fair_share(demo, user_factory, api) -> None:
    ops = user_factory("ops", staff=True)
    resp = api(ops).patch(
        "/api/v1/teams/training/",
        {"shares": 60, "max": {"devices/910A": 4}, "comment": "paper deadline", "base_version": 1},
        format="json",
    )
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["policy_version"] == 2 and body["team"] == "training"
    assert body["changes"] == ["team training: shares 50 → 60", "team training: max.devices/910A no cap → 4"]
    assert body["max"] == {"devices": 24, "devices/910A": 4} and body["guaranteed"] == {"devices": 10}
    assert body["fair_share"]["shares"] == 60
    assert body["fair_share"]["norm_shares"] == pytest.approx(60 / 110)
    assert Policy.objects.get(is_active=True).comment == "paper deadline"


@pytest.mark.parametrize(
    ("body", "field", "error"),
    [
        ({"shares": -3, "comment": "x"}, "shares", "shares: must be a number >= 0, got -3"),
        ({"shares": "abc", "comment": "x"}, "shares", "shares: must be a number >= 0, got 'abc'"),
        ({"shares": 1e9, "comment": "x"}, "shares", "shares: must be at most 1000000, got 1e+09"),
        ({"shares": 5}, "comment", "comment: This field is required."),
        ({"max": {"devices": -1}, "comment": "x"}, "max.devices", "max.devices: must be a number >= 0, got -1"),
        ({"guaranteed": {"devices": 99}, "comment": "x"}, "max.devices", "max.devices: must be >= guaranteed"),
        ({"shares": 50, "comment": "x"}, None, "nothing to change"),
    ],
)
@pytest.mark.django_db
def test_api_patch_refusals_have_the_standard_error_shape(demo, user_factory, api, body, field, error) -> None:
    ops = user_factory("ops", staff=True)
    resp = api(ops).patch("/api/v1/teams/training/", body, format="json")
    assert resp.status_code == 400
    answer = resp.json()
    assert answer["field"] == field and answer["error"].startswith(error) and "details" in answer
    assert Policy.objects.count() == 1


@pytest.mark.django_db
def test_teams_page_does_not_grow_queries_with_teams(demo, user_factory, client, django_assert_max_num_queries) -> None:
    from quotas.models import Membership

    ops = user_factory("ops", staff=True)
    client.force_login(get_user_model().objects.get(username="ops"))
    client.get("/teams/")
    with django_assert_max_num_queries(8):
        assert client.get("/teams/").status_code == 200
    for i in range(10):
        team = Team.objects.create(name=f"extra-{i}")
        Membership.objects.create(user=ops, team=team, role=Membership.Role.LEAD)
    with django_assert_max_num_queries(8):
        body = client.get("/teams/").content.decode()
    assert body.count('<tr id="team-') == 13
