"""A team's members through the API (``/api/v1/teams/NAME/members/``) and ``npuctl team``: the same
rules as the team page (``tests/test_team_self_service.py``), for scripts and the command line."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth import get_user_model

from quotas.models import AuditEvent, Membership
from quotas.models.tenancy import TeamInvitation
from quotas.policies.versions import active_policy, create_version
from scheduling.services.snapshot import member_limits

pytestmark = pytest.mark.django_db

MEMBERS = "/api/v1/teams/training/members/"


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Own throttle counters and policy cache (see conftest)."""


@pytest.fixture
def people(demo, user_factory) -> dict[str, Any]:
    return {
        "lead": user_factory("leo", team="training", role="lead"),
        "member": user_factory("ann", team="training"),
        "other": user_factory("bob", team="research"),
        "admin": user_factory("ada", staff=True),
    }


def test_a_lead_adds_a_member_sets_role_and_limits_and_the_tick_reads_them(people: dict[str, Any], api: Any) -> None:
    get_user_model().objects.create_user("nia", password="x")
    lead = api(people["lead"])
    added = lead.post(MEMBERS, {"who": "nia"}, format="json")
    assert added.status_code == 201, added.json()
    assert added.json()["detail"] == "nia is now a member of training."
    assert added.json()["member"]["username"] == "nia" and added.json()["invited"] is None
    changed = lead.patch(f"{MEMBERS}nia/", {"max_devices": 4, "max_jobs": 2}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["member"]["limits"] == "at most 4 cards at once, at most 2 jobs at once"
    assert member_limits()[("training", "nia")] == (4.0, 2)
    # A limit left out stays; null lifts one.
    lead.patch(f"{MEMBERS}nia/", {"max_jobs": None}, format="json")
    assert member_limits()[("training", "nia")] == (4.0, None)
    promoted = lead.patch(f"{MEMBERS}nia/", {"role": "lead"}, format="json")
    assert promoted.json()["member"]["role"] == "lead"
    listed = {m["username"]: m for m in lead.get(MEMBERS).json()}
    assert listed["nia"]["role"] == "lead" and listed["nia"]["max_devices"] == 4.0
    assert listed["ann"]["limits"] == "no limit beyond the team's"
    actions = set(AuditEvent.objects.filter(target="training").values_list("action", flat=True))
    assert {"team.member_add", "team.member_limits", "team.member_role"} <= actions


def test_an_unknown_address_is_invited_and_the_link_is_given(people: dict[str, Any], api: Any) -> None:
    resp = api(people["lead"]).post(MEMBERS, {"who": "Newcomer@Example.org", "role": "member"}, format="json")
    assert resp.status_code == 201, resp.json()
    body = resp.json()
    assert body["member"] is None and body["invited"] == "newcomer@example.org"
    assert "Their link, to pass on" in body["detail"] and "/invite/" in body["detail"]
    assert TeamInvitation.objects.filter(team__name="training", email="newcomer@example.org").exists()


def test_bad_changes_name_the_field_and_change_nothing(people: dict[str, Any], api: Any) -> None:
    lead = api(people["lead"])
    resp = lead.patch(f"{MEMBERS}ann/", {"role": "boss", "max_devices": -3, "max_jobs": 1.5}, format="json")
    assert resp.status_code == 400
    assert resp.json()["details"] == {"role": ["lead or member"]}
    resp = lead.patch(f"{MEMBERS}ann/", {"role": "lead", "max_devices": -3, "max_jobs": 1.5}, format="json")
    assert resp.status_code == 400
    details = resp.json()["details"]
    assert details["max_devices"][0].startswith("a number from 1 to") and "whole number" in details["max_jobs"][0]
    ann = Membership.objects.get(user=people["member"], team__name="training")
    assert (ann.role, ann.max_devices, ann.max_jobs) == ("member", None, None)  # the role did not change either
    above = lead.patch(f"{MEMBERS}ann/", {"max_devices": 30}, format="json")
    assert above.status_code == 400
    assert above.json()["details"]["max_devices"] == ["30 is above the team's own maximum of 24 cards"]
    assert lead.patch(f"{MEMBERS}ann/", {"maxDevices": 2}, format="json").json()["field"] == "maxDevices"
    nothing = lead.patch(f"{MEMBERS}ann/", {}, format="json")
    assert nothing.status_code == 200 and nothing.json()["detail"] == "Nothing to change for ann."
    assert lead.post(MEMBERS, {"who": ""}, format="json").json()["details"] == {
        "who": ["a username, or an e-mail address to invite"]
    }
    again = lead.post(MEMBERS, {"who": "ann"}, format="json")
    assert again.status_code == 409 and again.json()["details"] == {"who": ["ann is already in training"]}
    assert lead.patch(f"{MEMBERS}nobody/", {"role": "lead"}, format="json").status_code == 404


def test_members_and_other_teams_cannot_change_it_and_the_last_lead_stays(people: dict[str, Any], api: Any) -> None:
    before = Membership.objects.filter(team__name="training").count()
    assert api(people["member"]).post(MEMBERS, {"who": "bob"}, format="json").status_code == 403
    assert api(people["member"]).delete(f"{MEMBERS}leo/").status_code == 403
    assert api(people["other"]).get(MEMBERS).status_code == 404
    assert api(people["other"]).delete(f"{MEMBERS}ann/").status_code == 404
    assert Membership.objects.filter(team__name="training").count() == before
    Membership.objects.filter(team__name="training", role="lead").exclude(user=people["lead"]).delete()
    last = api(people["lead"]).delete(f"{MEMBERS}leo/")
    assert last.status_code == 409 and "the team's only lead" in last.json()["details"]["member"][0]
    demoted = api(people["lead"]).patch(f"{MEMBERS}leo/", {"role": "member"}, format="json")
    assert demoted.status_code == 409 and "no lead" in demoted.json()["details"]["role"][0]
    removed = api(people["admin"]).delete(f"{MEMBERS}ann/")
    assert removed.status_code == 200 and removed.json()["detail"] == "ann is no longer in training."
    assert not Membership.objects.filter(user=people["member"], team__name="training").exists()


def test_a_directory_team_refuses_membership_but_keeps_limits(people: dict[str, Any], api: Any) -> None:
    text = active_policy().record.yaml_text.replace(
        "    - name: training\n", "    - name: training\n      directory: {members: ml-training}\n", 1
    )
    create_version(text, author=people["admin"], comment="training from the directory")
    lead = api(people["lead"])
    refused = lead.post(MEMBERS, {"who": "bob"}, format="json")
    assert refused.status_code == 409 and "come from the directory" in refused.json()["details"]["team"][0]
    assert lead.patch(f"{MEMBERS}ann/", {"role": "lead"}, format="json").status_code == 409
    assert lead.patch(f"{MEMBERS}ann/", {"max_devices": 2}, format="json").status_code == 200


def test_npuctl_team_lists_adds_sets_and_removes(
    people: dict[str, Any], live_server: Any, monkeypatch: Any, capsys: Any
) -> None:
    from npuctl.main import main
    from quotas.access.tokens import issue_token

    get_user_model().objects.create_user("nia", password="x")
    _, key = issue_token(people["lead"], "cli")
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", key)

    def run(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    code, out, err = run("team", "add", "nia")
    assert (code, out.strip()) == (0, "nia is now a member of training."), err
    code, out, err = run("team", "set", "nia", "--max-devices", "4", "--max-jobs", "none")
    assert (code, out.strip()) == (0, "nia: at most 4 cards at once."), err
    code, out, err = run("team")
    assert code == 0 and "USER" in out and "LIMITS" in out, err
    row = next(line for line in out.splitlines() if line.startswith("nia "))
    assert "member" in row and "at most 4 cards at once" in row
    code, out, err = run("team", "set", "nia", "--max-devices", "lots")
    assert code == 1 and out == "" and "max_devices" in err, (out, err)
    code, out, err = run("team", "remove", "nia")
    assert (code, out.strip()) == (0, "nia is no longer in training."), err
    assert not Membership.objects.filter(user__username="nia").exists()


def test_a_member_removed_a_moment_before_is_not_found_not_a_bad_request(people: dict[str, Any], api: Any) -> None:
    """Two requests remove one member at once (the API's fuzzing runs a lead and an admin side by
    side): the second finds the membership gone after its own look-up. That is a 404, as for a member
    never there, not a 400 that blames the request."""
    from rest_framework.exceptions import NotFound

    from quotas.api.views import _member_refusal
    from quotas.models import Team
    from quotas.tenancy.members import MemberError, remove_member

    team = Team.objects.get(name="training")
    gone = Membership.objects.get(team=team, user=people["member"])
    assert api(people["lead"]).delete(f"{MEMBERS}ann/").status_code == 200
    with pytest.raises(MemberError) as refused:
        remove_member(people["lead"], team, gone.pk)  # the second request, past the view's look-up
    assert refused.value.gone and refused.value.errors == {"member": "no such member of training"}
    answer = _member_refusal(refused.value)
    assert isinstance(answer, NotFound) and answer.status_code == 404
    assert api(people["lead"]).delete(f"{MEMBERS}ann/").status_code == 404
