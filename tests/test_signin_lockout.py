"""Brute force on sign-in and on API tokens is bounded: django-axes locks, the bad-token throttle.

Everything goes over HTTP through Django's test client (and a real chromium for the page), with
the settings the site runs with: 10 failures per account and per address, 15 minutes' cool-off,
20 bad tokens per address and minute. Time is pinned where a count or a clock time is asserted.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import time_machine
from axes.models import AccessAttempt, AccessFailureLog, AccessLog
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache.backends.redis import RedisCache
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from npuportal.api import token_throttle
from quotas.access.tokens import issue_token
from quotas.models import AuditEvent
from tests.browser import ROOT, page, requires_chromium  # noqa: F401 - page is a fixture
from tests.conftest import requires_redis
from tests.waiting import ceiling

#: An instant at the start of a minute, so fixed one-minute windows are not crossed by accident.
T0 = datetime(2026, 11, 18, 9, 0, 0, tzinfo=UTC)
LIMIT = 10


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    yield


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice", password="right-horse-battery")


@pytest.fixture
def boss(db):
    return get_user_model().objects.create_superuser("boss", password="boss-password-1")


def signed_in(client: Client) -> bool:
    return "_auth_user_id" in client.session


def hammer(client: Client, path: str, username: str, times: int) -> list[int]:
    return [client.post(path, {"username": username, "password": f"guess-{i}"}).status_code for i in range(times)]


def test_settings_are_the_documented_ones() -> None:
    assert settings.AUTHENTICATION_BACKENDS[0] == "axes.backends.AxesStandaloneBackend"
    assert settings.MIDDLEWARE[-1] == "axes.middleware.AxesMiddleware"
    assert settings.AXES_FAILURE_LIMIT == LIMIT
    assert settings.AXES_COOLOFF_TIME == timedelta(minutes=15)
    assert settings.AXES_LOCKOUT_PARAMETERS == ["username", "ip_address"]
    assert settings.API_BAD_TOKEN_RATE == "20/min"


def _settings_in_child(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    code = (
        "from npuportal import settings as s; "
        "print(s.AXES_FAILURE_LIMIT, int(s.AXES_COOLOFF_TIME.total_seconds()), s.API_BAD_TOKEN_RATE, "
        "s.TRUSTED_PROXY_COUNT, s.REST_FRAMEWORK['NUM_PROXIES'])"
    )
    child_env = {**os.environ, "NPUPORTAL_VAR_DIR": str(tmp_path), **env}
    return subprocess.run(
        [sys.executable, "-c", code], env=child_env, cwd=ROOT, capture_output=True, text=True, timeout=ceiling(120)
    )


def test_the_limits_come_from_the_environment_and_bad_values_stop_start_up(tmp_path) -> None:
    ok = _settings_in_child(
        tmp_path,
        NPUPORTAL_LOGIN_FAILURE_LIMIT="5",
        NPUPORTAL_LOGIN_COOLOFF="60",
        NPUPORTAL_THROTTLE_BAD_TOKEN="50/hour",
        NPUPORTAL_TRUSTED_PROXIES="2",
    )
    assert ok.stdout.split() == ["5", "60", "50/hour", "2", "2"], ok.stderr
    for name, value, message in [
        ("NPUPORTAL_LOGIN_FAILURE_LIMIT", "ten", "NPUPORTAL_LOGIN_FAILURE_LIMIT='ten': expected a whole number"),
        ("NPUPORTAL_LOGIN_FAILURE_LIMIT", "0", "NPUPORTAL_LOGIN_FAILURE_LIMIT='0': expected a number of at least 1"),
        ("NPUPORTAL_LOGIN_COOLOFF", "0", "NPUPORTAL_LOGIN_COOLOFF='0': expected a number of at least 1"),
        ("NPUPORTAL_THROTTLE_BAD_TOKEN", "0/min", "NPUPORTAL_THROTTLE_BAD_TOKEN='0/min': expected at least 1"),
        ("NPUPORTAL_THROTTLE_BAD_TOKEN", "many", "NPUPORTAL_THROTTLE_BAD_TOKEN='many': expected requests per"),
    ]:
        failed = _settings_in_child(tmp_path, **{name: value})
        assert failed.returncode != 0 and message in failed.stderr, (name, value, failed.stderr[-500:])


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_300_wrong_passwords_then_the_right_one_is_refused(alice, path) -> None:
    alice.is_staff = True  # the admin's login only lets staff in; the lock must not depend on it
    alice.save()
    client = Client()
    with time_machine.travel(T0, tick=False):
        codes = hammer(client, path, "alice", 300)
        assert codes[: LIMIT - 1] == [200] * (LIMIT - 1)  # the form again, "wrong username or password"
        assert set(codes[LIMIT - 1 :]) == {429}  # the 10th failure sets the lock; the rest are refused
        right = client.post(path, {"username": "alice", "password": "right-horse-battery"})
        assert right.status_code == 429
        # Checked on the pinned clock: weeks of real time later any session has expired anyway.
        assert not signed_in(client)
        assert client.get("/").status_code == 302  # still sent to sign in

    # The page is the console's, and says when to come back: 15 minutes after the last counted failure.
    html = right.content.decode()
    assert "<title>Sign-in locked · npuportal</title>" in html and "css/console.css" in html
    assert 'class="brand"' in html
    assert '<time datetime="2026-11-18T09:15:00+00:00">09:15</time>' in html
    assert "in about 15 minutes" in html
    assert right["Retry-After"] == "900"

    # Audit: the counted failures (not the 290 refused ones, so a row stops growing), one lock event.
    attempt = AccessAttempt.objects.get(username="alice")
    assert (attempt.failures_since_start, attempt.path_info, attempt.ip_address) == (LIMIT, path, "127.0.0.1")
    assert "right-horse-battery" not in attempt.post_data and "guess-" not in attempt.post_data
    failures = AccessFailureLog.objects.filter(username="alice").order_by("attempt_time", "id")
    assert failures.count() == LIMIT
    assert [f.locked_out for f in failures] == [False] * (LIMIT - 1) + [True]
    locked = AuditEvent.objects.get(action="signin.locked")
    assert locked.target == "alice from 127.0.0.1"
    assert "10 failed sign-ins" in locked.detail and "2026-11-18 09:15:00" in locked.detail


@pytest.mark.django_db
def test_the_lock_is_per_account_and_per_address(alice) -> None:
    get_user_model().objects.create_user("bob", password="bobs-own-password")
    hammer(Client(REMOTE_ADDR="10.0.0.66"), "/login/", "alice", LIMIT)

    # Another account from another address signs in.
    bob = Client(REMOTE_ADDR="10.0.0.2")
    assert bob.post("/login/", {"username": "bob", "password": "bobs-own-password"}).status_code == 302
    assert signed_in(bob)
    # The account is locked from any address ...
    elsewhere = Client(REMOTE_ADDR="10.0.0.3")
    assert elsewhere.post("/login/", {"username": "alice", "password": "right-horse-battery"}).status_code == 429
    assert not signed_in(elsewhere)
    # ... and the address for any account.
    same_address = Client(REMOTE_ADDR="10.0.0.66")
    assert same_address.post("/login/", {"username": "bob", "password": "bobs-own-password"}).status_code == 429
    assert not signed_in(same_address)

    # Guessing many accounts from one address: one failure each still locks the address.
    spray = Client(REMOTE_ADDR="10.0.0.77")
    assert hammer(spray, "/login/", "nobody", 1) == [200]
    codes = [spray.post("/login/", {"username": f"user{i}", "password": "x"}).status_code for i in range(LIMIT)]
    assert codes == [200] * (LIMIT - 2) + [429, 429]


@pytest.mark.django_db
def test_the_page_warns_before_the_lock_and_the_lock_lapses(alice) -> None:
    client = Client()
    with time_machine.travel(T0, tick=False) as clock:
        first = client.post("/login/", {"username": "alice", "password": "nope"}).content.decode()
        assert "Wrong username or password." in first
        assert "After 10 failed sign-ins, the account and the address are locked for 15 minutes." in first
        hammer(client, "/login/", "alice", LIMIT - 1)
        clock.shift(timedelta(minutes=14, seconds=59))
        assert client.post("/login/", {"username": "alice", "password": "right-horse-battery"}).status_code == 429
        clock.shift(timedelta(seconds=2))
        assert client.post("/login/", {"username": "alice", "password": "right-horse-battery"}).status_code == 302
        # Read while the clock is still pinned: the session was made at T0 + 15 min, and a session
        # read two weeks of real time later has expired, whatever day the test runs.
        assert signed_in(client)
    assert AccessLog.objects.filter(username="alice").count() == 1  # successful sign-ins are logged too


@pytest.mark.django_db
def test_an_admin_unlocks_the_account_from_the_admin(alice, boss) -> None:
    hammer(Client(REMOTE_ADDR="10.0.0.66"), "/login/", "alice", LIMIT)  # the attacker
    hammer(Client(), "/login/", "alice", 2)  # alice herself, refused
    staff = Client(REMOTE_ADDR="10.0.0.1")
    staff.force_login(boss)
    listing = staff.get("/admin/axes/accessattempt/")
    assert listing.status_code == 200
    html = listing.content.decode()
    assert "Unlock the accounts of the selected attempts" in html and "Locked Out" in html

    ids = list(AccessAttempt.objects.filter(username="alice").values_list("pk", flat=True))
    done = staff.post("/admin/axes/accessattempt/", {"action": "unlock_accounts", "_selected_action": ids}, follow=True)
    assert "Unlocked alice: cleared 1 record(s)." in done.content.decode()
    assert not AccessAttempt.objects.filter(username="alice").exists()
    unlock = AuditEvent.objects.get(action="signin.unlock_account")
    assert (unlock.actor, unlock.target) == (boss, "alice")
    assert "signin.unlock_account" in staff.get("/audit/").content.decode()

    client = Client()
    assert client.post("/login/", {"username": "alice", "password": "right-horse-battery"}).status_code == 302
    assert signed_in(client)


@pytest.mark.django_db
def test_unlocking_an_address_leaves_locked_accounts_locked(alice, boss) -> None:
    get_user_model().objects.create_user("bob", password="bobs-own-password")
    attacker = "10.0.0.66"
    hammer(Client(REMOTE_ADDR=attacker), "/login/", "alice", LIMIT)
    staff = Client()
    staff.force_login(boss)
    ids = list(AccessAttempt.objects.values_list("pk", flat=True))
    staff.post("/admin/axes/accessattempt/", {"action": "unlock_addresses", "_selected_action": ids})
    assert AuditEvent.objects.get(action="signin.unlock_address").target == attacker
    assert not AccessAttempt.objects.exists()  # alice's only failures were from that address
    again = Client(REMOTE_ADDR=attacker)
    assert again.post("/login/", {"username": "bob", "password": "bobs-own-password"}).status_code == 302


@pytest.mark.django_db
def test_unlock_by_command_is_axes_own(alice) -> None:
    from django.core.management import call_command

    hammer(Client(), "/login/", "alice", LIMIT)
    call_command("axes_reset_username", "alice")
    assert Client().post("/login/", {"username": "alice", "password": "right-horse-battery"}).status_code == 302


@pytest.mark.django_db
def test_forwarded_for_is_ignored_unless_proxies_are_configured(alice) -> None:
    def via(forwarded: str) -> Client:
        return Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)

    # No proxies configured: a forged header does not give a guesser a fresh address per request.
    codes = [via(f"192.0.2.{i}").post("/login/", {"username": f"u{i}", "password": "x"}).status_code for i in range(10)]
    assert codes[-1] == 429
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"10.0.0.1"}


@pytest.mark.django_db
def test_behind_a_proxy_the_client_is_the_address_it_saw(alice, settings) -> None:
    settings.TRUSTED_PROXY_COUNT = 1
    get_user_model().objects.create_user("bob", password="bobs-own-password")

    def via(forwarded: str) -> Client:
        return Client(REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR=forwarded)

    # The guesser prepends forged hops; the proxy appends the address it saw, which is what counts.
    for i in range(LIMIT):
        via(f"198.51.100.{i}, 203.0.113.5").post("/login/", {"username": f"u{i}", "password": "x"})
    assert set(AccessAttempt.objects.values_list("ip_address", flat=True)) == {"203.0.113.5"}
    assert via("203.0.113.5").post("/login/", {"username": "bob", "password": "bobs-own-password"}).status_code == 429
    # Everybody else behind the same proxy still signs in.
    other = via("203.0.113.77")
    assert other.post("/login/", {"username": "bob", "password": "bobs-own-password"}).status_code == 302
    # A hop that is not an address (a proxy too few) falls back to the connection's.
    via("not-an-address").post("/login/", {"username": "carol", "password": "x"})
    assert AccessAttempt.objects.filter(username="carol").get().ip_address == "10.0.0.1"


# -- API tokens -----------------------------------------------------------------------------------


def _bad(client: APIClient, times: int, key: str = "npu_not-a-real-key") -> list[int]:
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return [client.get("/api/v1/jobs/").status_code for _ in range(times)]


@pytest.mark.django_db
def test_bad_tokens_are_throttled_per_address(alice) -> None:
    _, good_key = issue_token(alice, "laptop")
    legacy = Token.objects.create(user=alice).key
    with time_machine.travel(T0 + timedelta(seconds=5), tick=False) as clock:
        good = APIClient()
        good.credentials(HTTP_AUTHORIZATION=f"Token {good_key}")
        assert {good.get("/api/v1/jobs/").status_code for _ in range(30)} == {200}  # good ones never count

        guesser = APIClient()
        codes = _bad(guesser, 12) + _bad(guesser, 8, key="deadbeef" * 5) + _bad(guesser, 1, key="npu_x")
        assert codes == [401] * 20 + [429]  # both kinds of key count; the 21st is refused unchecked
        refused = guesser.get("/api/v1/jobs/")
        assert refused.json() == {
            "error": "Too many requests with a token that does not authenticate from this address."
            " Expected available in 55 seconds.",
            "field": None,
        }
        assert refused["Retry-After"] == "55"
        # From that address even the right token is refused until the minute ends: no oracle.
        assert good.get("/api/v1/jobs/").status_code == 429
        legacy_client = APIClient()
        legacy_client.credentials(HTTP_AUTHORIZATION=f"Token {legacy}")
        assert legacy_client.get("/api/v1/jobs/").status_code == 429
        # Other addresses are untouched, good or bad.
        elsewhere = APIClient(REMOTE_ADDR="10.0.0.9")
        assert _bad(elsewhere, 1) == [401]
        elsewhere.credentials(HTTP_AUTHORIZATION=f"Token {good_key}")
        assert elsewhere.get("/api/v1/jobs/").status_code == 200
        # Requests without a token are not this throttle's business (DRF's anonymous throttle has them).
        assert APIClient().get("/api/v1/jobs/").status_code == 401

        clock.shift(timedelta(seconds=55))
        assert good.get("/api/v1/jobs/").status_code == 200
        assert _bad(guesser, 1) == [401]


@pytest.mark.django_db
def test_the_bad_token_limit_comes_from_settings(alice, settings) -> None:
    settings.API_BAD_TOKEN_RATE = "3/hour"
    with time_machine.travel(T0, tick=False) as clock:
        guesser = APIClient()
        assert _bad(guesser, 5) == [401, 401, 401, 429, 429]
        clock.shift(timedelta(minutes=59, seconds=59))
        assert _bad(guesser, 1) == [429]
        clock.shift(timedelta(seconds=1))
        assert _bad(guesser, 1) == [401]


@pytest.mark.django_db
def test_a_cache_that_is_down_lets_requests_through(alice, monkeypatch, caplog) -> None:
    with socket.socket() as s:  # a port nobody listens on: a real Redis client that cannot connect
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr(token_throttle, "cache", RedisCache(f"redis://127.0.0.1:{port}/0", {}))
    _, good_key = issue_token(alice, "laptop")
    assert _bad(APIClient(), 25) == [401] * 25  # not counted, never 429
    good = APIClient()
    good.credentials(HTTP_AUTHORIZATION=f"Token {good_key}")
    assert good.get("/api/v1/jobs/").status_code == 200
    assert "bad-token throttle: cache unavailable" in caplog.text


@requires_redis
@pytest.mark.django_db
def test_bad_tokens_are_counted_in_redis(alice) -> None:
    from django.core.cache import cache

    with time_machine.travel(T0, tick=False):
        assert _bad(APIClient(), 21) == [401] * 20 + [429]
        key = token_throttle.KEY_FORMAT % {"ident": "127.0.0.1", "window": int(T0.timestamp()) // 60}
        assert cache.get(key) == 20


# -- the page in a browser ----------------------------------------------------------------------------


@requires_chromium
@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_a_locked_out_person_sees_the_console_page(alice, page, settings) -> None:  # noqa: F811
    settings.AXES_FAILURE_LIMIT = 3
    for attempt in range(3):
        page.goto("/login/")
        page.get_by_label("Username").fill("alice")
        page.get_by_label("Password").fill(f"wrong-{attempt}")
        page.get_by_role("button", name="Log in").click()
    assert page.get_by_role("heading", name="Sign-in locked").is_visible()
    assert "refused for now, even with the right password" in page.get_by_role("alert").inner_text()
    assert re.search(r"Try again after \d\d:\d\d \(UTC\), in about 15 minutes", page.locator("main").inner_text())
    assert page.locator("header .brand").inner_text() == "npuportal"
    page.get_by_role("link", name="Back to sign-in").click()
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("right-horse-battery")
    page.get_by_role("button", name="Log in").click()
    assert page.get_by_role("heading", name="Sign-in locked").is_visible()
