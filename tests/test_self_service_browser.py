"""The self-service journey in a real chromium: a lead adds a member, sets a member limit, files a
quota request; an admin reads its dry run and approves it; the new policy version is in force on
the request's dates and not outside them; the lead reads the decision on the dashboard.

Dates are built from today on the policy's clock, so the journey holds on any day.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone
from playwright.sync_api import expect

from quotas.models import Membership, QuotaRequest
from quotas.policies.versions import active_policy
from scheduling.engine.policy import as_policy_time, quota_at, zone
from scheduling.services.snapshot import member_limits
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_lead_runs_their_team_and_an_admin_approves_a_quota_request(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("lena", team="training", role="lead")
    user_factory("adam", staff=True)
    get_user_model().objects.create_user("newbie", password="pw-newbie", first_name="Nora", last_name="Ng")
    policy = active_policy().policy
    today = as_policy_time(policy, timezone.now()).date()
    first, last = today + timedelta(days=3), today + timedelta(days=5)

    # The lead adds a member and limits her to 2 cards at once.
    login(page, "lena", "pw-lena")
    page.get_by_role("link", name="Team", exact=True).click()
    expect(page.get_by_role("heading", name="Team training")).to_be_visible()
    page.get_by_label("Username, or e-mail address to invite").fill("newbie")
    page.locator("#add-member").get_by_role("button", name="Add").click()
    expect(page.get_by_role("status")).to_have_text("newbie is now a member of training.")
    row = page.locator("#member-newbie")
    expect(row).to_contain_text("Nora Ng")
    row.get_by_label("cards at once for newbie").fill("2")
    row.get_by_role("button", name="Set limits").click()
    expect(page.locator("#member-newbie .limits")).to_have_text("at most 2 cards at once")
    snap(page, "lead set a member limit")
    assert member_limits()[("training", "newbie")] == (2.0, None)

    # The lead asks for 16 more cards of max for three days.
    page.get_by_role("link", name="Requests", exact=True).click()
    page.get_by_label("Which quota").select_option("max")
    page.get_by_label("Cards of").select_option("devices")
    page.get_by_label("Change (cards").fill("+16")
    page.get_by_label("From (first day)").fill(str(first))
    page.get_by_label("Until (last day, included)").fill(str(last))
    page.get_by_label("Why").fill("paper deadline")
    page.get_by_role("button", name="File the request").click()
    request = QuotaRequest.objects.get()
    expect(page.locator("#request-summary")).to_have_text(f"+16 devices max, {first} to {last}")
    expect(page.locator("#request-state")).to_have_text("Waiting for an admin")
    snap(page, "lead filed a quota request")

    # The admin sees the dry run and approves.
    page.context.clear_cookies()
    login(page, "adam", "pw-adam")
    expect(page.locator(".quota-notice")).to_contain_text("1 quota request(s) wait for your decision.")
    page.goto(f"/quota/requests/{request.pk}/")
    expect(page.get_by_role("heading", name="Dry run: the last 7 days with this change")).to_be_visible()
    expect(page.locator("#dry-run-source")).to_contain_text("recorded jobs of the last 7 day(s)")
    snap(page, "admin reads the dry run")
    page.get_by_role("button", name="Approve: write the new policy version").click()
    expect(page.locator("#request-state")).to_contain_text("Approved — adam")
    expect(page.locator("#request-policy")).to_contain_text(f"schedule request-{request.pk} of team training")
    snap(page, "admin approved")

    active = active_policy()
    assert active.record is not None and f"quota request #{request.pk}" in active.record.comment
    tz = zone(active.policy.timezone)
    noon = lambda day: datetime.combine(day, time(12, 0), tzinfo=tz)  # noqa: E731
    assert quota_at(active.policy, "training", noon(first))[0].max["devices"] == 40
    assert quota_at(active.policy, "training", noon(last))[0].max["devices"] == 40
    assert quota_at(active.policy, "training", noon(first - timedelta(days=1)))[0].max["devices"] == 24
    assert quota_at(active.policy, "training", noon(last + timedelta(days=1)))[0].max["devices"] == 24

    # The lead reads the decision on the dashboard.
    page.context.clear_cookies()
    login(page, "lena", "pw-lena")
    expect(page.locator(".quota-notice")).to_contain_text(
        f"Quota request #{request.pk} for training (+16 devices max, {first} to {last}) was approved: "
        f"policy v{active.record.version}"
    )
    snap(page, "lead reads the approval")
    assert Membership.objects.filter(user__username="newbie", team__name="training").exists()
