"""Usage: device-hours per chip model in a month, split at the month start, running jobs counted to now."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import time_machine

from devices.models import Device, Node
from quotas.models import Team
from quotas.policies.versions import active_policy
from scheduling.models import Allocation, Job
from scheduling.services.usage import UsageError, devices_in_use, month_of, team_usage

pytestmark = [pytest.mark.django_db, pytest.mark.clock]

SHANGHAI = ZoneInfo("Asia/Shanghai")


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Every test of this module with its own throttle counters and policy cache (see conftest)."""


@pytest.fixture
def site(db, user_factory):
    """A tiny cluster and team under a policy on Shanghai's clock (UTC+8)."""
    from quotas.policies.versions import create_version

    node = Node.objects.create(name="n1")
    devices = {
        "910B4": [Device.objects.create(node=node, index=i, chip_model="910B4") for i in range(2)],
        "310P3": [Device.objects.create(node=node, index=10, chip_model="310P3")],
    }
    Team.objects.create(name="t1")
    Team.objects.create(name="t2")
    create_version(
        "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nmetadata: {name: t}\nspec: {timezone: Asia/Shanghai}\n",
        author=None,
    )
    user = user_factory("u1", team="t1")
    return devices, user


def _job(team: str, user, state: str = "completed") -> Job:
    return Job.objects.create(
        team=Team.objects.get(name=team),
        submitter=user,
        name="j",
        command="x",
        priority_class="normal",
        state=state,
        submitted_at=datetime(2026, 10, 1, tzinfo=SHANGHAI),
    )


def test_month_is_split_at_the_local_month_start_and_open_allocations_run_to_now(site) -> None:
    devices, user = site
    now = datetime(2026, 11, 3, 12, 0, tzinfo=SHANGHAI)
    # Oct 31 22:00 → Nov 1 04:00 local: 4 hours fall in November.
    done = _job("t1", user)
    Allocation.objects.create(
        job=done,
        device=devices["910B4"][0],
        start=datetime(2026, 10, 31, 22, tzinfo=SHANGHAI),
        end=datetime(2026, 11, 1, 4, tzinfo=SHANGHAI),
    )
    # 2 hours before Nov 1 00:00 in Shanghai is still October there although it is Oct 31 in UTC too.
    Allocation.objects.create(
        job=done,
        device=devices["910B4"][1],
        start=datetime(2026, 10, 31, 20, tzinfo=SHANGHAI),
        end=datetime(2026, 10, 31, 22, tzinfo=SHANGHAI),
    )
    # A half-card slice still running since Nov 3 10:00: 2 h × 0.5 up to now.
    running = _job("t1", user, state="running")
    Allocation.objects.create(
        job=running, device=devices["310P3"][0], device_share=0.5, start=datetime(2026, 11, 3, 10, tzinfo=SHANGHAI)
    )
    # Another team's allocation is not counted.
    Allocation.objects.create(
        job=_job("t2", user),
        device=devices["910B4"][1],
        start=datetime(2026, 11, 2, tzinfo=SHANGHAI),
        end=datetime(2026, 11, 2, 5, tzinfo=SHANGHAI),
    )
    policy = active_policy().policy
    usage = team_usage(Team.objects.get(name="t1"), policy, now=now)
    assert usage.month == "2026-11"
    assert usage.device_hours == {"310P3": pytest.approx(1.0), "910B4": pytest.approx(4.0)}
    assert usage.total_device_hours == pytest.approx(5.0)
    assert usage.running_jobs == 1 and usage.pending_jobs == 0
    october = team_usage(Team.objects.get(name="t1"), policy, month="2026-10", now=now)
    assert october.device_hours == {"910B4": pytest.approx(4.0)}
    assert devices_in_use(Team.objects.get(name="t1")) == {"devices": 0.5, "devices/310P3": 0.5}


def test_usage_is_two_queries_however_many_allocations(site, django_assert_num_queries) -> None:
    devices, user = site
    for i in range(30):
        job = _job("t1", user)
        start = datetime(2026, 11, 1, tzinfo=SHANGHAI) + timedelta(hours=i)
        Allocation.objects.create(job=job, device=devices["910B4"][i % 2], start=start, end=start + timedelta(hours=1))
    policy = active_policy().policy
    team = Team.objects.get(name="t1")
    with django_assert_num_queries(2):
        usage = team_usage(team, policy, now=datetime(2026, 11, 20, tzinfo=SHANGHAI))
    assert usage.total_device_hours == pytest.approx(30.0)


@pytest.mark.parametrize("label", ["2026-13", "26-11", "november", "2026-1", "1999-12"])
def test_bad_months_are_refused(site, label) -> None:
    with pytest.raises(UsageError) as err:
        month_of(active_policy().policy, datetime(2026, 11, 3, tzinfo=SHANGHAI), label)
    assert err.value.field == "month"


def test_a_future_month_is_empty(site) -> None:
    usage = team_usage(Team.objects.get(name="t1"), active_policy().policy, month="2030-01")
    assert usage.device_hours == {} and usage.total_device_hours == 0.0


# -- cost (GET /api/v1/teams/{name}/usage/) -------------------------------------------


@pytest.fixture
def costly(demo, user_factory):
    """A team of its own on the demo site (its rate card: 910B4 at 12.00 CNY per device-hour)."""
    Team.objects.create(name="costly")
    return user_factory("costly-lead", team="costly", role="lead"), user_factory("costly-member", team="costly")


def test_usage_answers_this_months_cost_so_far_in_the_rate_cards_currency(costly, api) -> None:
    from django.utils import timezone

    lead, _ = costly
    # A quarter of an hour of this month: within the first 15 minutes of a month (on the policy's
    # clock) the clock moves on to 20 minutes in, so the whole quarter is this month's. It stands
    # still from here: a running job is counted to "now", and on a loaded machine seconds pass
    # between the allocation and the answer (3.01 instead of 3.00).
    current = timezone.now()
    now = max(current, month_of(active_policy().policy, current).start + timedelta(minutes=20))
    with time_machine.travel(now, tick=False):
        job = _job("costly", lead, state="running")
        device = Device.objects.filter(chip_model="910B4").first()
        Allocation.objects.create(job=job, device=device, start=now - timedelta(minutes=15))  # still running
        body = api(lead).get("/api/v1/teams/costly/usage/").json()
    assert body["total_device_hours"] == pytest.approx(0.25)
    cost = body["cost"]
    assert cost["currency"] == "CNY" and cost["basis"] == "usage so far"
    assert cost["amount"] == "3.00" and cost["by_chip"] == {"910B4": "3.00"}  # 0.25 h × 12.00 × normal 1.0
    assert cost["month"] == body["month"]


def test_a_closed_month_answers_its_statement(demo, user_factory, api) -> None:
    from quotas.accounting.statements import previous_month
    from quotas.models import Statement

    lead = user_factory("cost-lead", team="training", role="lead")
    label = previous_month()
    statement = Statement.objects.get(team__name="training", month=label)
    cost = api(lead).get(f"/api/v1/teams/training/usage/?month={label}").json()["cost"]
    assert cost["basis"] == "statement" and cost["amount"] == str(statement.total)
    assert cost["currency"] == statement.currency


def test_cost_is_for_leads_and_admins_only_and_months_are_checked(costly, api) -> None:
    _, member = costly
    assert api(member).get("/api/v1/teams/costly/usage/").status_code == 403
    lead, _ = costly
    resp = api(lead).get("/api/v1/teams/costly/usage/?month=2026-13")
    assert resp.status_code == 400 and resp.json()["field"] == "month"
