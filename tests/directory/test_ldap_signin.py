"""Sign-in with LDAP against a real slapd: teams from groups, a wrong password, a move, the sync.

The directory (tests/directory/slapd.py) has three people and the policy's groups: ``vision`` (ana),
``vision-leads`` (ben) and ``nlp`` (cy, named in the policy by its DN), and ``hpc-finance`` (nobody).
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from quotas.directory.config import ldap_settings
from quotas.models import AuditEvent, Membership, Team, UserProfile
from quotas.policies.versions import create_version
from tests.directory.slapd import BASE, SERVICE_DN, SERVICE_PASSWORD, Slapd, requires_slapd, self_signed

pytestmark = [requires_slapd, pytest.mark.django_db(transaction=True)]

POLICY = f"""\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {{name: directory-test}}
spec:
  directory: {{finance: hpc-finance}}
  teams:
    - name: vision
      directory: {{members: vision, leads: vision-leads}}
    - name: nlp
      directory: {{members: "cn=nlp,ou=groups,{BASE}"}}
    - name: local-team
"""


@pytest.fixture
def directory(tmp_path: Path, settings: Any) -> Iterator[Slapd]:
    server = Slapd(tmp_path / "slapd")
    server.start()
    try:
        server.add_user("ana", "ana-pw", given="Ana", surname="Silva")
        server.add_user("ben", "ben-pw", given="Ben", surname="Okafor")
        server.add_user("cy", "cy-pw", given="Cy", surname="Tan")
        server.add_group("vision", ["ana", "ben"])
        server.add_group("vision-leads", ["ben"])
        server.add_group("nlp", ["cy"])
        server.add_group("hpc-finance", [])
        env = {
            "NPUPORTAL_LDAP_URL": server.url,
            "NPUPORTAL_LDAP_BIND_DN": SERVICE_DN,
            "NPUPORTAL_LDAP_BIND_PASSWORD": SERVICE_PASSWORD,
            "NPUPORTAL_LDAP_USER_DN_TEMPLATE": f"uid=%(user)s,ou=people,{BASE}",
            "NPUPORTAL_LDAP_GROUP_SEARCH_BASE": f"ou=groups,{BASE}",
        }
        for key, value in ldap_settings(env).items():
            setattr(settings, key, value)
        settings.AUTHENTICATION_BACKENDS = [
            "axes.backends.AxesStandaloneBackend",
            "quotas.directory.ldap.DirectoryLDAPBackend",
            "django.contrib.auth.backends.ModelBackend",
        ]
        Team.objects.create(name="local-team")
        create_version(POLICY, author=None, comment="teams from the directory")
        yield server
    finally:
        server.stop()


def sign_in(username: str, password: str) -> tuple[Client, Any]:
    client = Client()
    response = client.post("/login/", {"username": username, "password": password})
    return client, response


def teams_of(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("team__name", "role"))


def test_a_directory_person_signs_in_and_gets_the_team_of_their_group(directory: Slapd) -> None:
    client, response = sign_in("ana", "ana-pw")
    assert response.status_code == 302 and response["Location"] == "/", response.content[:500]
    user = get_user_model().objects.get(username="ana")
    assert (user.first_name, user.last_name, user.email) == ("Ana", "Silva", "ana@example.org")
    assert not user.has_usable_password()  # the directory keeps the password, not the portal
    assert teams_of("ana") == {"vision": "member"}
    profile = UserProfile.objects.get(user=user)
    assert profile.directory == "ldap" and profile.directory_id == directory.user_dn("ana")
    assert "vision" in profile.directory_groups
    page = client.get("/jobs/")
    assert page.status_code == 200  # a team member works with jobs
    events = list(AuditEvent.objects.filter(target="ana").values_list("action", "detail"))
    assert ("directory.join", "joined team vision as member (LDAP sign-in)") in events

    _, response = sign_in("ben", "ben-pw")
    assert response.status_code == 302
    assert teams_of("ben") == {"vision": "lead"}


def test_a_team_named_by_its_dn_and_a_team_without_directory_groups(directory: Slapd) -> None:
    user_factory_team = Team.objects.get(name="local-team")
    _, response = sign_in("cy", "cy-pw")
    assert response.status_code == 302
    assert teams_of("cy") == {"nlp": "member"}
    # A membership of a team the directory does not run is left to its lead: a sign-in keeps it.
    cy = get_user_model().objects.get(username="cy")
    Membership.objects.create(user=cy, team=user_factory_team, role="member")
    sign_in("cy", "cy-pw")
    assert teams_of("cy") == {"nlp": "member", "local-team": "member"}


def test_a_wrong_password_signs_nobody_in_and_counts_toward_the_lock(directory: Slapd, settings: Any) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    client, response = sign_in("ana", "not-her-password")
    assert response.status_code == 200
    assert b"Wrong username or password" in response.content
    assert "_auth_user_id" not in client.session
    assert not get_user_model().objects.filter(username="ana").exists()
    sign_in("ana", "still-wrong")
    sign_in("ana", "wrong-again")
    _, locked = sign_in("ana", "ana-pw")  # the right password, but the account is locked now
    assert locked.status_code == 429
    assert b"locked" in locked.content.lower()


def test_moving_a_person_between_groups_changes_their_team_at_the_next_sign_in(directory: Slapd) -> None:
    sign_in("ana", "ana-pw")
    assert teams_of("ana") == {"vision": "member"}
    directory.set_members("vision", ["ben"])
    directory.set_members("nlp", ["cy", "ana"])
    assert teams_of("ana") == {"vision": "member"}  # nothing changes until she signs in (or a sync)
    _, response = sign_in("ana", "ana-pw")
    assert response.status_code == 302
    assert teams_of("ana") == {"nlp": "member"}
    details = list(AuditEvent.objects.filter(target="ana").order_by("id").values_list("detail", flat=True))
    assert "left team vision: not in its directory group (LDAP sign-in)" in details
    assert "joined team nlp as member (LDAP sign-in)" in details


def test_finance_comes_from_the_group_the_policy_names(directory: Slapd) -> None:
    sign_in("cy", "cy-pw")
    cy = get_user_model().objects.get(username="cy")
    assert not cy.groups.filter(name="finance").exists()
    directory.set_members("hpc-finance", ["cy"])
    sign_in("cy", "cy-pw")
    assert cy.groups.filter(name="finance").exists()
    directory.set_members("hpc-finance", [])
    sign_in("cy", "cy-pw")
    assert not cy.groups.filter(name="finance").exists()


def test_directory_sync_creates_members_and_marks_a_removed_person_inactive(directory: Slapd) -> None:
    from scheduling.models import Job

    sign_in("ana", "ana-pw")
    ana = get_user_model().objects.get(username="ana")
    job = Job.objects.create(
        team=Team.objects.get(name="vision"),
        submitter=ana,
        name="ana-before-leaving",
        priority_class="normal",
        submitted_at=timezone.now(),
    )
    out = StringIO()
    call_command("directory", "sync", stdout=out)
    text = out.getvalue()
    assert "new account: ben" in text and "new account: cy" in text, text
    assert teams_of("ben") == {"vision": "lead"} and teams_of("cy") == {"nlp": "member"}

    directory.set_members("vision", ["ben"])
    directory.delete_user("ana")
    out = StringIO()
    call_command("directory", "sync", stdout=out)
    assert "ana: no longer in the directory: inactive (jobs and history kept)" in out.getvalue(), out.getvalue()
    ana.refresh_from_db()
    assert not ana.is_active
    assert Job.objects.filter(pk=job.pk, submitter=ana).exists()  # her jobs and history stay
    assert AuditEvent.objects.filter(target="ana", action="directory.left").exists()
    # A second sync changes nothing more.
    out = StringIO()
    call_command("directory", "sync", stdout=out)
    assert "nothing to change" in out.getvalue(), out.getvalue()
    # Gone from the directory, she cannot sign in.
    _, response = sign_in("ana", "ana-pw")
    assert response.status_code == 200 and b"Wrong username or password" in response.content


def test_the_local_admin_signs_in_beside_the_directory_and_is_not_taken_over(directory: Slapd) -> None:
    get_user_model().objects.create_user("root-admin", password="break-glass", is_staff=True, is_superuser=True)
    directory.add_user("root-admin", "directory-pw")
    _, response = sign_in("root-admin", "break-glass")
    assert response.status_code == 302  # the local password works
    _, refused = sign_in("root-admin", "directory-pw")
    assert refused.status_code == 200 and b"Wrong username or password" in refused.content
    profile = UserProfile.objects.filter(user__username="root-admin").first()
    assert profile is None or profile.directory == ""


def test_sync_without_ldap_configured_says_so_with_exit_2(db: None, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        call_command("directory", "sync")
    assert exited.value.code == 2


def test_settings_name_the_variable_that_cannot_work() -> None:
    from quotas.directory.config import LdapConfigError

    with pytest.raises(LdapConfigError, match="NPUPORTAL_LDAP_GROUP_SEARCH_BASE"):
        ldap_settings({"NPUPORTAL_LDAP_URL": "ldap://x", "NPUPORTAL_LDAP_USER_DN_TEMPLATE": "uid=%(user)s,dc=x"})
    with pytest.raises(LdapConfigError, match="NPUPORTAL_LDAP_USER_DN_TEMPLATE: must contain"):
        ldap_settings({"NPUPORTAL_LDAP_URL": "ldap://x", "NPUPORTAL_LDAP_USER_DN_TEMPLATE": "uid=ana,dc=x"})
    with pytest.raises(LdapConfigError, match="NPUPORTAL_LDAP_URL"):
        ldap_settings({"NPUPORTAL_LDAP_URL": "http://x"})
    assert ldap_settings({}) == {}


@pytest.mark.parametrize("mode", ["starttls", "ldaps"])
def test_sign_in_over_tls_checks_the_servers_certificate(tmp_path: Path, settings: Any, mode: str) -> None:
    """StartTLS on ldap://, and ldaps://, against the CA the site names; a wrong CA signs nobody in."""
    server = Slapd(tmp_path / "slapd-tls", tls=True)
    server.start()
    try:
        server.add_user("ana", "ana-pw")
        server.add_group("vision", ["ana"])
        settings.AUTHENTICATION_BACKENDS = [
            "axes.backends.AxesStandaloneBackend",
            "quotas.directory.ldap.DirectoryLDAPBackend",
            "django.contrib.auth.backends.ModelBackend",
        ]
        create_version(POLICY, author=None, comment="teams from the directory")

        def configure(ca_file: Path) -> None:
            env = {
                "NPUPORTAL_LDAP_URL": server.ldaps_url if mode == "ldaps" else server.url,
                "NPUPORTAL_LDAP_START_TLS": "1" if mode == "starttls" else "",
                "NPUPORTAL_LDAP_CA_FILE": str(ca_file),
                "NPUPORTAL_LDAP_BIND_DN": SERVICE_DN,
                "NPUPORTAL_LDAP_BIND_PASSWORD": SERVICE_PASSWORD,
                "NPUPORTAL_LDAP_USER_DN_TEMPLATE": f"uid=%(user)s,ou=people,{BASE}",
                "NPUPORTAL_LDAP_GROUP_SEARCH_BASE": f"ou=groups,{BASE}",
            }
            for key, value in ldap_settings(env).items():
                setattr(settings, key, value)

        self_signed(tmp_path / "other-key.pem", tmp_path / "other-ca.pem")  # another authority's
        configure(tmp_path / "other-ca.pem")
        client, refused = sign_in("ana", "ana-pw")
        assert refused.status_code == 200 and b"The directory could not check your password" in refused.content
        assert "_auth_user_id" not in client.session
        configure(server.ca_file)
        _, response = sign_in("ana", "ana-pw")
        assert response.status_code == 302, response.content[:300]
        assert teams_of("ana") == {"vision": "member"}
    finally:
        server.stop()


def test_a_directory_that_does_not_answer_is_said_so_and_the_local_admin_still_signs_in(directory: Slapd) -> None:
    get_user_model().objects.create_user("root-admin", password="break-glass", is_staff=True, is_superuser=True)
    directory.stop()
    client, response = sign_in("ana", "ana-pw")
    assert response.status_code == 200 and "_auth_user_id" not in client.session
    assert b"The directory could not check your password (Can&#x27;t contact LDAP server)" in response.content
    _, local = sign_in("root-admin", "break-glass")
    assert local.status_code == 302
