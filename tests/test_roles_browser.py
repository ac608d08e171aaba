"""Roles in a real chromium: the confirmation before a cancel, finance's menu, an admin page for a lead."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from scheduling.models import Job
from scheduling.services.jobs import JobSpec, submit_job
from tests import browser
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_cancel_asks_first_dismiss_changes_nothing_accept_cancels(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("rosa", team="research", role="lead")
    job = submit_job(team=lead.memberships.get().team, user=lead, spec=JobSpec(name="sweep", command="true"))
    login(page, "rosa", "pw-rosa")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("Pending")
    assert re.search(r"Times are \S+, the policy's clock\.", page.locator("#clock-note").inner_text())
    snap(page, "pending job")

    asked: list[str] = []

    def dismiss(dialog) -> None:  # type: ignore[no-untyped-def]
        asked.append(dialog.message)
        dialog.dismiss()

    page.once("dialog", dismiss)
    page.get_by_role("button", name="Cancel job").click()
    assert asked == [f"Cancel job #{job.pk} (sweep)?"]
    expect(page.locator("#job-state")).to_have_text("Pending")  # no request was sent
    assert page.url.endswith(f"/jobs/{job.pk}/")
    job.refresh_from_db()
    assert job.state == "pending"
    snap(page, "dismissed: still pending")

    def accept(dialog) -> None:  # type: ignore[no-untyped-def]
        asked.append(dialog.message)
        dialog.accept()

    page.once("dialog", accept)
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-state")).to_have_text("Cancelled")
    assert len(asked) == 2
    job.refresh_from_db()
    assert job.state == "cancelled"
    snap(page, "accepted: cancelled")


def test_a_never_runnable_job_offers_its_cancel(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("rosa", team="research", role="lead")
    job = submit_job(team=lead.memberships.get().team, user=lead, spec=JobSpec(name="huge", command="true"))
    Job.objects.filter(pk=job.pk).update(
        pending_reason="NeverRunnable",
        pending_detail="cannot run under the current policy: asks for 25 devices; the largest pool holds 16",
    )
    login(page, "rosa", "pw-rosa")
    page.goto("/jobs/")
    expect(page.get_by_text("The job can never run under the current policy and cluster")).to_be_visible()
    page.get_by_role("link", name=f"#{job.pk} huge").click()
    box = page.locator("#never-runnable")
    expect(box).to_contain_text("This job will never start: cannot run under the current policy")
    expect(page.locator("#job-reason-detail")).to_contain_text("the largest pool holds 16")
    snap(page, "never runnable")
    page.once("dialog", lambda dialog: dialog.accept())
    box.get_by_role("button", name="Cancel this job").click()
    expect(page.locator("#job-state")).to_have_text("Cancelled")
    snap(page, "cancelled")


def test_finance_sees_reports_and_statements_and_no_job_submission(demo, page) -> None:  # noqa: F811
    user = get_user_model().objects.create_user("fiona", password="pw-fiona")
    user.groups.add(Group.objects.get(name="finance"))
    login(page, "fiona", "pw-fiona")
    page.wait_for_url("**/reports/")  # finance starts on the reports
    nav = page.get_by_role("navigation", name="main")
    for present in ("Reports", "Statements", "Rate cards", "Tokens"):
        expect(nav.get_by_role("link", name=present, exact=True)).to_be_visible()
    for absent in ("Submit", "Jobs", "Dashboard", "Policy", "Teams"):
        expect(nav.get_by_role("link", name=absent, exact=True)).to_have_count(0)
    snap(page, "finance menu")
    response = page.goto("/jobs/new/")
    assert response is not None and response.status == 403
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(nav.get_by_role("link", name="Reports", exact=True)).to_be_visible()  # the console's page, its menu
    snap(page, "finance on the job form: 403")


def test_a_lead_opening_the_policy_gets_the_console_403(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("lena", team="inference", role="lead")
    login(page, "lena", "pw-lena")
    response = page.goto("/policy/")
    assert response is not None and response.status == 403
    assert "/admin/login/" not in page.url
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.get_by_role("navigation", name="main").get_by_role("link", name="Submit", exact=True)).to_be_visible()
    snap(page, "lead on the policy: 403")
    page.goto("/no/such/page/")
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    snap(page, "unknown page: 404")


def test_without_javascript_a_cancel_asks_on_a_page_first(demo, user_factory, page, live_server) -> None:  # noqa: F811
    lead = user_factory("rosa", team="research", role="lead")
    job = submit_job(team=lead.memberships.get().team, user=lead, spec=JobSpec(name="sweep", command="true"))
    context = page.context.browser.new_context(base_url=live_server.url, java_script_enabled=False)
    try:
        plain = browser.patient(context.new_page())
        browser._pages[plain] = [browser._pages[page][0] + "-noscript", 0]  # its screenshots named for this test
        login(plain, "rosa", "pw-rosa")
        plain.goto(f"/jobs/{job.pk}/")
        plain.get_by_role("button", name="Cancel job").click()
        expect(plain.locator("#confirm-question")).to_have_text(f"Cancel job #{job.pk} (sweep)?")
        job.refresh_from_db()
        assert job.state == "pending"  # asked, not done
        snap(plain, "no script: the question on a page")
        plain.get_by_role("link", name="No, go back").click()
        expect(plain.locator("#job-state")).to_have_text("Pending")
        plain.get_by_role("button", name="Cancel job").click()
        plain.get_by_role("button", name="Yes, cancel it").click()
        expect(plain.locator("#job-state")).to_have_text("Cancelled")
        snap(plain, "no script: cancelled after yes")
    finally:
        context.close()
