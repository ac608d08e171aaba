"""Single sign-on (OIDC) against a real provider: oidc-provider-mock, a subprocess on a free port.

The provider vouches for any subject typed on its page, as a misconfigured or permissive identity
provider might: what a person may do must come from the groups claim, never from the subject alone.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from quotas.directory.config import oidc_settings
from quotas.models import Membership, Team, UserProfile
from quotas.policies.versions import create_version
from tests.browser import page  # noqa: F401 - a fixture
from tests.conftest import free_port
from tests.waiting import stop_process, wait_for

MOCK = shutil.which("oidc-provider-mock") or str(Path(sys.executable).with_name("oidc-provider-mock"))
pytestmark = [
    pytest.mark.skipif(not Path(MOCK).exists(), reason="needs oidc-provider-mock (requirements.txt)"),
    pytest.mark.django_db(transaction=True),
]

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: sso-test}
spec:
  directory: {admins: hpc-admins}
  teams:
    - name: vision
      directory: {members: vision, leads: vision-leads}
    - name: nlp
      directory: {members: "cn=nlp,ou=groups,dc=example,dc=org"}
"""


class Provider:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.issuer = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "provider.log").open("ab")
        self._proc = subprocess.Popen([MOCK, "--port", str(self.port)], stdout=log, stderr=subprocess.STDOUT)

        def answers() -> bool:
            assert self._proc is not None
            assert self._proc.poll() is None, (self.workdir / "provider.log").read_text()[-2000:]
            return requests.get(f"{self.issuer}/.well-known/openid-configuration", timeout=5).ok

        wait_for(answers, ignore=(requests.ConnectionError,), message="oidc-provider-mock to answer")

    def set_claims(self, sub: str, **claims: object) -> None:
        response = requests.put(f"{self.issuer}/users/{sub}", json=claims, timeout=10)
        assert response.status_code == 204, response.text

    def stop(self) -> None:
        stop_process(self._proc)
        self._proc = None


@pytest.fixture
def provider(tmp_path: Path, settings: Any) -> Iterator[Provider]:
    idp = Provider(tmp_path / "idp")
    idp.start()
    try:
        env = {
            "NPUPORTAL_OIDC_ISSUER": idp.issuer,
            "NPUPORTAL_OIDC_CLIENT_ID": "npuportal",
            "NPUPORTAL_OIDC_CLIENT_SECRET": "npuportal-secret",
            "NPUPORTAL_OIDC_NAME": "Example SSO",
        }
        for key, value in oidc_settings(env).items():
            setattr(settings, key, value)
        settings.AUTHENTICATION_BACKENDS = [
            "axes.backends.AxesStandaloneBackend",
            "django.contrib.auth.backends.ModelBackend",
            "quotas.directory.oidc.DirectoryOIDCBackend",
        ]
        create_version(POLICY, author=None, comment="teams from single sign-on groups")
        yield idp
    finally:
        idp.stop()


def sso_sign_in(subject: str) -> tuple[Client, Any]:
    """The browser's round trip: the portal's redirect, the provider's page (subject typed), the callback."""
    client = Client()
    start = client.get("/oidc/authenticate/")
    assert start.status_code == 302, start.content[:300]
    at_provider = requests.post(start["Location"], data={"sub": subject}, allow_redirects=False, timeout=10)
    assert at_provider.status_code == 302, at_provider.text[:300]
    back = urlsplit(at_provider.headers["Location"])
    assert back.path == "/oidc/callback/"
    return client, client.get(f"{back.path}?{back.query}")


def teams_of(username: str) -> dict[str, str]:
    return dict(Membership.objects.filter(user__username=username).values_list("team__name", "role"))


def test_the_login_page_offers_single_sign_on(provider: Provider) -> None:
    login_page = Client().get("/login/")
    assert b"Sign in with Example SSO" in login_page.content
    assert b'href="/oidc/authenticate/"' in login_page.content


def test_sign_in_with_groups_from_the_claim(provider: Provider) -> None:
    provider.set_claims("u-1001", preferred_username="dana", email="dana@example.org", groups=["vision-leads"])
    client, response = sso_sign_in("u-1001")
    assert response.status_code == 302 and response["Location"] == "/", response.content[:300]
    user = get_user_model().objects.get(username="dana")
    assert user.email == "dana@example.org" and not user.is_staff
    assert teams_of("dana") == {"vision": "lead"}
    profile = UserProfile.objects.get(user=user)
    assert (profile.directory, profile.directory_id) == ("oidc", "u-1001")
    assert client.get("/jobs/").status_code == 200

    # A DN in the claim matches the team the policy names by DN; the lead group is gone: no longer vision.
    provider.set_claims("u-1001", preferred_username="dana", groups=["CN=nlp, OU=groups, DC=example, DC=org"])
    sso_sign_in("u-1001")
    assert teams_of("dana") == {"nlp": "member"}
    assert get_user_model().objects.filter(username="dana").count() == 1  # the same account, by its subject


def test_a_subject_with_no_mapped_group_gets_no_team(provider: Provider) -> None:
    provider.set_claims("stranger", groups=["marketing", "all-staff"])
    client, response = sso_sign_in("stranger")
    assert response.status_code == 302 and response["Location"] == "/"
    assert teams_of("stranger") == {}
    assert not get_user_model().objects.get(username="stranger").is_staff
    jobs = client.get("/jobs/")
    assert jobs.status_code == 403
    assert b"you belong to none" in jobs.content


def test_admins_come_from_the_admins_group_only(provider: Provider) -> None:
    provider.set_claims("ops-1", preferred_username="olu", groups=["hpc-admins"])
    sso_sign_in("ops-1")
    assert get_user_model().objects.get(username="olu").is_staff
    provider.set_claims("ops-1", preferred_username="olu", groups=[])
    sso_sign_in("ops-1")
    assert not get_user_model().objects.get(username="olu").is_staff


def test_a_subject_named_like_the_local_admin_does_not_become_it(provider: Provider) -> None:
    get_user_model().objects.create_user("admin", password="break-glass", is_staff=True, is_superuser=True)
    client, response = sso_sign_in("admin")
    assert response.status_code == 302 and response["Location"].startswith("/login/?sso=failed")
    assert "_auth_user_id" not in client.session
    login_page = client.get(response["Location"])
    assert b"Single sign-on did not sign you in" in login_page.content
    assert b"is a local admin account" in login_page.content
    profile = UserProfile.objects.filter(user__username="admin").first()
    assert profile is None or profile.directory == ""


def test_single_sign_on_is_off_unless_configured(db: None) -> None:
    assert Client().get("/oidc/authenticate/").status_code == 404
    assert b"Sign in with" not in Client().get("/login/").content


def test_teams_are_created_when_the_policy_names_them(provider: Provider) -> None:
    assert not Team.objects.filter(name="vision").exists()
    provider.set_claims("u-2", preferred_username="eve", groups=["vision"])
    sso_sign_in("u-2")
    assert Team.objects.filter(name="vision").exists() and teams_of("eve") == {"vision": "member"}
    assert json.loads(json.dumps(UserProfile.objects.get(user__username="eve").directory_groups)) == ["vision"]


@pytest.mark.browser
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="needs Debian's chromium at /usr/bin/chromium")
def test_single_sign_on_in_a_browser(provider: Provider, page: Any) -> None:  # noqa: F811
    """The button on the login page, the provider's page, and back on the dashboard with the team."""
    from playwright.sync_api import expect

    from tests.browser import snap

    provider.set_claims("u-77", preferred_username="mira", email="mira@example.org", groups=["vision"])
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with Example SSO").click()
    page.get_by_placeholder("sub").fill("u-77")  # the provider's own sign-in page
    page.get_by_role("button", name="Authorize").click()
    page.wait_for_url("**/")
    expect(page.get_by_role("heading", name="Dashboard")).to_be_visible()
    expect(page.locator("body")).to_contain_text("mira")
    expect(page.locator("#team-vision")).to_be_visible()
    snap(page, "signed in with single sign-on")
