"""Shared fixtures: the demo site, users of each role, API clients; test outcomes for the browser fixture."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Callable, Generator, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests import clock
from tests.browser import PHASE_REPORTS

requires_postgres = pytest.mark.skipif(
    not settings.DATABASES["default"]["ENGINE"].endswith("postgresql"),
    reason="needs PostgreSQL: set DATABASE_URL=postgres://... (CI does)",
)
requires_redis = pytest.mark.skipif(not settings.REDIS_URL, reason="needs Redis: set REDIS_URL (CI does)")


def pytest_configure(config: pytest.Config) -> None:
    """Start the clock at ``NPUPORTAL_TEST_CLOCK`` when it is set (see tests/clock.py)."""
    found = clock.pinned()
    if found is not None:
        import time_machine

        traveller = time_machine.travel(found[0], tick=True)
        traveller.start()
        config.add_cleanup(traveller.stop)


@pytest.fixture(autouse=True)
def _pinned_clock() -> Iterator[None]:
    """With ``NPUPORTAL_TEST_CLOCK``, every test starts at that instant (the clock ticks on within it)."""
    found = clock.pinned()
    if found is None:
        yield
        return
    import time_machine

    with time_machine.travel(found[0], tick=True):
        yield


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules holding a test marked ``slow`` first, each module's tests kept together and in order.

    The workers take tests in this order, so the minutes-long ones (the API fuzzing, the supervisor's
    restarts, the Slurm faults) start early instead of leaving one worker busy after the other is done.
    pytest-django sorts by database use after this (stably), so this holds within each of its groups.
    """
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)


def pytest_report_header(config: pytest.Config) -> str | None:
    found = clock.pinned()
    return f"clock pinned at {found[0].isoformat()} ({found[1]})" if found else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Keep each phase's report on the test, so the browser ``page`` fixture knows on teardown if it failed."""
    report = yield
    item.stash.setdefault(PHASE_REPORTS, {})[report.when] = report
    return report


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(n: int, tries: int = 50) -> int:
    """A port ``p`` such that ``p`` .. ``p + n - 1`` are all free now (the demo's agents take consecutive ports)."""
    for _ in range(tries):
        base = free_port()
        held: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports found")


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):  # type: ignore[no-untyped-def]
    """pytest-django's test database; on PostgreSQL, sessions left on it are ended before it is dropped.

    One idle connection outlives the run (its last query is one a browser test makes after the
    live server has answered), and with it open the database could not be dropped: pytest only
    warned, and a later run had to drop it first. Ending such sessions here keeps runs independent.
    """
    yield
    if connection.vendor != "postgresql":
        return
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def demo(db):
    """The demo site without agents: nodes, devices, templates, teams, users, policy, history."""
    from scheduling.demo import DEMO_POLICY, seed

    seed(with_agents=False, policy_text=clock.demo_policy_text(DEMO_POLICY.read_text()))
    return True


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[Any]:
    """The session's real single-host Slurm cluster (``tests.slurm.conftest.session_cluster``); skipped without Slurm.

    Here rather than in tests/slurm/conftest.py so that every test using it shares one per session
    (per xdist worker): the Slurm tests and the executor journey.
    """
    from tests.slurm.conftest import session_cluster

    yield from session_cluster()


@pytest.fixture
def user_factory(db) -> Callable[..., object]:
    from django.contrib.auth import get_user_model

    from quotas.models import Membership, Team

    def make(username: str, team: str | None = None, role: str = "member", staff: bool = False) -> object:
        user = get_user_model().objects.create_user(username, password="pw-" + username, is_staff=staff)
        if team:
            Membership.objects.create(user=user, team=Team.objects.get(name=team), role=role)
        return user

    return make


@pytest.fixture
def isolated_api_state(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Throttle counters of this test only, and no parsed policy cached from another test's v1.

    API tests make many requests with the same users; shared counters would throttle one
    test because of another, and a policy parsed for another test's database would leak.
    """
    from rest_framework.throttling import SimpleRateThrottle

    from npuportal.api import token_throttle
    from quotas.policies import versions

    monkeypatch.setattr(SimpleRateThrottle, "cache_format", f"throttle-{uuid.uuid4().hex}-%(scope)s-%(ident)s")
    monkeypatch.setattr(token_throttle, "KEY_FORMAT", f"bad-token-{uuid.uuid4().hex}-%(ident)s-%(window)d")
    versions._cache.clear()
    yield
    versions._cache.clear()


@pytest.fixture
def api() -> Callable[[object], APIClient]:
    def client_for(user: object) -> APIClient:
        client = APIClient()
        token, _ = Token.objects.get_or_create(user=user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
        return client

    return client_for


def db_url_for_subprocess() -> str:
    """A DATABASE_URL pointing child processes at the test database."""
    cfg = connection.settings_dict
    if cfg["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{cfg['NAME']}"
    user = cfg.get("USER") or ""
    auth = f"{user}@" if user else ""
    return f"postgres://{auth}{cfg.get('HOST') or '127.0.0.1'}:{cfg.get('PORT') or 5432}/{cfg['NAME']}"


def training_lead_submitter() -> Callable[..., Any]:
    """A function that submits a 910B4 job as the demo's training lead (the lifecycle and Slurm journeys)."""
    from django.contrib.auth import get_user_model

    from quotas.models import Team
    from scheduling.services.jobs import JobSpec, submit_job

    lead = get_user_model().objects.get(username="lead-training")
    team = Team.objects.get(name="training")

    def make(command: str, devices: int = 1, max_duration_s: int | None = None, name: str = "job") -> Any:
        spec = JobSpec(
            name=name,
            command=command,
            num_devices=devices,
            chip_model="910B4",
            estimated_duration_s=1 if max_duration_s else 60,
            max_duration_s=max_duration_s,
        )
        return submit_job(team=team, user=lead, spec=spec)

    return make
