"""Team self-service (members, roles, limits, invitations) and quota change requests, end to end
through the console's pages, the API and ``npuctl``, on the demo's teams and policy.

Dates are built from today on the policy's clock, so the tests hold on any day.
"""

from __future__ import annotations

import re
from datetime import datetime, time, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.utils import timezone

from quotas.models import AuditEvent, Membership, Policy, QuotaRequest, Team
from quotas.policies.versions import active_policy, create_version
from scheduling.engine.policy import as_policy_time, quota_at, zone
from scheduling.services.snapshot import member_limits

pytestmark = pytest.mark.django_db


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


def signed_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def policy_today() -> Any:
    return as_policy_time(active_policy().policy, timezone.now()).date()


def at_local_noon(day: Any) -> datetime:
    policy = active_policy().policy
    return datetime.combine(day, time(12, 0), tzinfo=zone(policy.timezone))


# -- members ------------------------------------------------------------------------------


def test_a_lead_adds_a_member_sets_limits_and_the_tick_reads_them(people: dict[str, Any]) -> None:
    newcomer = get_user_model().objects.create_user("nia", password="x")
    client = signed_in(people["lead"])
    page = client.post("/team/training/", {"action": "add", "who": "nia", "role": "member"}, follow=True)
    assert b"nia is now a member of training." in page.content
    membership = Membership.objects.get(user=newcomer, team__name="training")
    page = client.post(
        "/team/training/",
        {"action": "limits", "member": membership.pk, "max_devices": "4", "max_jobs": "2"},
        follow=True,
    )
    assert b"nia: at most 4 cards at once, at most 2 jobs at once." in page.content
    assert member_limits()[("training", "nia")] == (4.0, 2)
    actions = set(AuditEvent.objects.filter(target="training").values_list("action", flat=True))
    assert {"team.member_add", "team.member_limits"} <= actions


def test_bad_limits_name_the_field_and_change_nothing(people: dict[str, Any]) -> None:
    membership = Membership.objects.get(user=people["member"], team__name="training")
    page = signed_in(people["lead"]).post(
        "/team/training/", {"action": "limits", "member": membership.pk, "max_devices": "-3", "max_jobs": "1.5"}
    )
    assert page.status_code == 400
    assert b"max_devices: a number from 1 to" in page.content and b"max_jobs: a whole number" in page.content
    membership.refresh_from_db()
    assert (membership.max_devices, membership.max_jobs) == (None, None)
    # Inside the team's quota: training may hold 24 cards (the demo policy), so 30 would never bite.
    above = signed_in(people["lead"]).post(
        "/team/training/", {"action": "limits", "member": membership.pk, "max_devices": "30"}
    )
    assert above.status_code == 400 and b"30 is above the team&#x27;s own maximum of 24 cards" in above.content


def test_members_see_the_list_but_only_leads_change_it_and_other_teams_see_nothing(people: dict[str, Any]) -> None:
    member_view = signed_in(people["member"]).get("/team/training/")
    assert member_view.status_code == 200 and b"leo" in member_view.content and b"Set limits" not in member_view.content
    refused = signed_in(people["member"]).post("/team/training/", {"action": "add", "who": "bob"})
    assert refused.status_code == 400 and b"only the leads of training" in refused.content
    assert signed_in(people["other"]).get("/team/training/").status_code == 404
    assert not Membership.objects.filter(user=people["other"], team__name="training").exists()


def test_the_last_lead_stays_and_removing_keeps_the_history(people: dict[str, Any]) -> None:
    lead_membership = Membership.objects.get(user=people["lead"], team__name="training")
    Membership.objects.filter(team__name="training", role="lead").exclude(pk=lead_membership.pk).delete()
    page = signed_in(people["lead"]).post("/team/training/", {"action": "remove", "member": lead_membership.pk})
    assert page.status_code == 400 and b"the team&#x27;s only lead" in page.content
    member = Membership.objects.get(user=people["member"], team__name="training")
    page = signed_in(people["lead"]).post("/team/training/", {"action": "remove", "member": member.pk}, follow=True)
    assert b"ann is no longer in training." in page.content


def test_an_invitation_joins_the_team_at_first_sign_in(people: dict[str, Any]) -> None:
    page = signed_in(people["lead"]).post("/team/training/", {"action": "add", "who": "Kim@Example.org"}, follow=True)
    assert b"kim@example.org" in page.content.lower() and b"invited" in page.content
    kim = get_user_model().objects.create_user("kim", password="kim-pw", email="kim@example.org")
    assert not Membership.objects.filter(user=kim).exists()
    Client().post("/login/", {"username": "kim", "password": "kim-pw"})
    assert Membership.objects.get(user=kim).team.name == "training"


def test_an_invitation_link_makes_an_account_once(people: dict[str, Any], settings: Any) -> None:
    settings.EMAIL_HOST = "mail.example.org"
    page = signed_in(people["lead"]).post("/team/training/", {"action": "add", "who": "noa@example.org"}, follow=True)
    text = page.content.decode()
    assert "Their link, to pass on (valid 14 days): http://testserver/invite/" in text
    found = re.search(r"http://testserver(/invite/[^/\s<]+/)", text)
    assert found, text
    link = found.group(1)
    assert len(mail.outbox) == 1 and link in mail.outbox[0].body and mail.outbox[0].to == ["noa@example.org"]
    invitee = Client()
    form = invitee.get(link)
    assert b"Join the team training" in form.content and b"Make your account" in form.content
    weak = invitee.post(link, {"username": "noa", "password1": "1234", "password2": "1234"})
    assert weak.status_code == 400 and b"No account was made" in weak.content
    assert not get_user_model().objects.filter(username="noa").exists()
    made = invitee.post(link, {"username": "noa", "password1": "violet-harbour-97", "password2": "violet-harbour-97"})
    assert made.status_code == 302 and made["Location"] == "/team/training/"
    noa = get_user_model().objects.get(username="noa")
    assert noa.email == "noa@example.org" and Membership.objects.get(user=noa).team.name == "training"
    assert "_auth_user_id" in invitee.session  # signed in
    again = Client().get(link)
    assert again.status_code == 410 and b"no longer open" in again.content
    assert Client().get("/invite/not-a-secret/").status_code == 410


def test_a_directory_team_says_so_and_refuses_membership_changes(people: dict[str, Any]) -> None:
    text = active_policy().record.yaml_text.replace(
        "    - name: training\n", "    - name: training\n      directory: {members: ml-training}\n", 1
    )
    create_version(text, author=people["admin"], comment="training from the directory")
    page = signed_in(people["lead"]).get("/team/training/")
    assert b"Membership of this team comes from the directory" in page.content and b"ml-training" in page.content
    assert b"Add a member" not in page.content
    refused = signed_in(people["lead"]).post("/team/training/", {"action": "add", "who": "bob"})
    assert b"training&#x27;s members come from the directory" in refused.content
    member = Membership.objects.get(user=people["member"], team__name="training")
    limits = signed_in(people["lead"]).post(
        "/team/training/", {"action": "limits", "member": member.pk, "max_devices": "2"}, follow=True
    )
    assert b"ann: at most 2 cards at once" in limits.content  # limits stay the lead's


# -- quota requests -------------------------------------------------------------------------


def file_via_api(api: Any, user: Any, **overrides: Any) -> Any:
    today = policy_today()
    body = {
        "team": "training",
        "field": "max",
        "resource": "devices",
        "change": "+16",
        "first_day": str(today + timedelta(days=3)),
        "last_day": str(today + timedelta(days=5)),
        "justification": "paper deadline",
        **overrides,
    }
    return api(user).post("/api/v1/quota-requests/", body, format="json")


def test_a_lead_files_an_admin_approves_and_the_change_is_in_force_on_its_dates_only(
    people: dict[str, Any], api: Any, settings: Any
) -> None:
    settings.EMAIL_HOST = "mail.example.org"
    people["lead"].email = "leo@example.org"
    people["lead"].save()
    filed = file_via_api(api, people["lead"])
    assert filed.status_code == 201, filed.content
    body = filed.json()
    assert body["summary"].startswith("+16 devices max, ") and body["state"] == "pending"
    versions_before = Policy.objects.count()

    page = signed_in(people["admin"]).get(f"/quota/requests/{body['id']}/")
    assert b"Dry run: the last 7 days with this change" in page.content
    assert b'id="dry-run"' in page.content

    decided = api(people["admin"]).post(f"/api/v1/quota-requests/{body['id']}/approve/", {}, format="json")
    assert decided.status_code == 200, decided.content
    assert decided.json()["state"] == "approved"
    assert Policy.objects.count() == versions_before + 1
    active = active_policy()
    assert active.record is not None
    assert active.record.comment.startswith(f"quota request #{body['id']} (+16 devices max")
    assert "by leo, approved by ada: paper deadline" in active.record.comment
    today = policy_today()
    inside = quota_at(active.policy, "training", at_local_noon(today + timedelta(days=4)))
    before = quota_at(active.policy, "training", at_local_noon(today + timedelta(days=2)))
    after = quota_at(active.policy, "training", at_local_noon(today + timedelta(days=6)))
    assert inside[0].max["devices"] == 24 + 16 and inside[1] == f"request-{body['id']}"
    assert before[0].max["devices"] == 24 and after[0].max["devices"] == 24
    assert len(mail.outbox) == 1 and "approved" in mail.outbox[0].subject and mail.outbox[0].to == ["leo@example.org"]
    dashboard = signed_in(people["lead"]).get("/")
    assert f"Quota request #{body['id']} for training".encode() in dashboard.content
    # Its schedule is not among today's windows: its dates start in three days.
    assert f"request-{body['id']} 00:00".encode() not in dashboard.content
    # Decided once: a second decision is a conflict and changes nothing.
    again = api(people["admin"]).post(f"/api/v1/quota-requests/{body['id']}/refuse/", {"reason": "x"}, format="json")
    assert again.status_code == 409 and Policy.objects.count() == versions_before + 1


def test_bad_requests_name_each_field_and_store_nothing(people: dict[str, Any], api: Any) -> None:
    today = policy_today()
    resp = file_via_api(
        api,
        people["lead"],
        field="most",
        resource="devices/NoSuchChip",
        change="lots",
        first_day=str(today + timedelta(days=5)),
        last_day=str(today + timedelta(days=1)),
        justification="",
    )
    assert resp.status_code == 400
    text = str(resp.json()["details"])
    for name in ("field", "resource", "change", "last_day", "justification"):
        assert name in text, text
    assert QuotaRequest.objects.count() == 0
    # Not a lead of the team: refused.
    assert file_via_api(api, people["member"]).status_code == 403
    assert file_via_api(api, people["other"]).status_code == 403
    # Research has no cap on 910B4... a max the team lacks cannot be raised, said up front.
    resp = file_via_api(api, people["lead"], resource="devices/910B4")
    assert resp.status_code == 400 and "no cap on devices/910B4" in str(resp.json())


def test_a_refusal_needs_a_reason_and_the_lead_reads_it(people: dict[str, Any], api: Any) -> None:
    filed = file_via_api(api, people["lead"]).json()
    no_reason = signed_in(people["admin"]).post(f"/quota/requests/{filed['id']}/", {"decision": "refuse", "reason": ""})
    assert no_reason.status_code == 400 and b"reason: say why" in no_reason.content
    signed_in(people["admin"]).post(
        f"/quota/requests/{filed['id']}/", {"decision": "refuse", "reason": "the cluster is full that week"}
    )
    assert QuotaRequest.objects.get(pk=filed["id"]).state == "refused"
    dashboard = signed_in(people["lead"]).get("/")
    assert b"was refused: the cluster is full that week" in dashboard.content
    assert b"is filed" not in signed_in(people["other"]).get("/quota/requests/").content
    assert signed_in(people["other"]).get(f"/quota/requests/{filed['id']}/").status_code in (403, 404)


def test_npuctl_quota_request_files_one(
    people: dict[str, Any], live_server: Any, monkeypatch: Any, capsys: Any
) -> None:
    from npuctl.main import main
    from quotas.access.tokens import issue_token

    _, key = issue_token(people["lead"], "cli")
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", key)
    today = policy_today()
    code = main(
        [
            "quota",
            "request",
            "--max",
            "devices=+8",
            "--from",
            str(today + timedelta(days=1)),
            "--until",
            str(today + timedelta(days=2)),
            "--reason",
            "demo day",
        ]
    )
    out, err = capsys.readouterr()
    assert code == 0, (out, err)
    filed = QuotaRequest.objects.get()
    assert (filed.team.name, filed.field, filed.resource, filed.change) == ("training", "max", "devices", 8.0)
    assert f"quota request #{filed.pk} filed for training: +8 devices max" in out
    assert Team.objects.get(name="training").quota_requests.count() == 1
