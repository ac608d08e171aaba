"""The main console journeys in a real chromium: submit, watch, cancel; cordon a node; team isolation."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from devices.models import Node
from quotas.models import AuditEvent
from scheduling.engine.durations import format_duration
from scheduling.models import Job
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium  # noqa: F401 - page is a fixture
from tests.waiting import ceiling

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_lead_submits_sees_why_it_waits_then_runs_and_cancels(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("rosa", team="research", role="lead")
    login(page, "rosa", "pw-rosa")
    assert page.locator("#team-research").count() == 1
    assert page.locator("#team-training").count() == 0  # other teams' quota is not shown
    page.get_by_role("link", name="Submit a job").click()
    page.get_by_label("Name").fill("ablation-7")
    page.get_by_label("Command").fill("python ablate.py")
    page.get_by_label("Priority class").select_option("critical")
    page.get_by_label("Whole devices").fill("4")
    page.get_by_label("Chip model").select_option("910A")
    page.get_by_role("button", name="Submit").click()
    # research may not use the critical class: the form says so next to the field, nothing is queued.
    assert "may not use 'critical'" in page.locator("#priority_class-error").inner_text()
    assert not Job.objects.filter(name="ablation-7").exists()

    page.get_by_label("Priority class").select_option("normal")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="ablation-7")
    assert page.locator("#job-state").inner_text() == "Pending"
    assert page.locator("#priority").count() == 1  # the engine's own priority breakdown
    # What the order reads of its length (the duration factor), as the user gave it.
    assert "duration" in page.locator("#priority").inner_text()
    assert f"estimated {format_duration(job.estimated_duration_s)}" in page.locator("#job-time").inner_text()

    run_tick()
    page.reload()
    assert page.locator("#job-state").inner_text() == "Running"
    assert "ascend-a-01" in page.content()

    page.once("dialog", lambda dialog: dialog.accept())  # "Cancel job #N (ablation-7)?"
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-state")).to_have_text("Cancelled")
    job.refresh_from_db()
    assert job.state == "cancelled" and not job.allocations.filter(end__isnull=True).exists()


def test_admin_cordons_a_node_and_the_tick_places_nothing_there(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("ops", staff=True)
    lead = user_factory("tom", team="training", role="lead")
    login(page, "ops", "pw-ops")
    page.get_by_role("link", name="Cluster").click()
    page.get_by_role("link", name="ascend-a-01").click()
    page.get_by_label("Reason").fill("replace fan")
    page.once("dialog", lambda dialog: dialog.accept())  # "Cordon ascend-a-01? ..."
    page.get_by_role("button", name="Cordon", exact=True).click()
    expect(page.locator("#node-state")).to_have_text("Cordoned")
    assert Node.objects.get(name="ascend-a-01").state == "cordoned"
    event = AuditEvent.objects.get(action="node.cordon")
    assert event.actor.username == "ops" and "replace fan" in event.detail

    from scheduling.services.jobs import JobSpec, submit_job

    job = submit_job(
        team=lead.memberships.get().team,
        user=lead,
        spec=JobSpec(name="needs-910A", command="true", num_devices=2, chip_model="910A"),
    )
    run_tick()
    job.refresh_from_db()
    assert job.state == "pending" and job.pending_reason == "NodeUnhealthy"

    page.get_by_role("button", name="Uncordon").click()
    expect(page.locator("#node-state")).to_have_text("Ready")
    run_tick()
    job.refresh_from_db()
    assert job.state == "running"


def test_a_member_cannot_open_another_teams_job(demo, user_factory, page) -> None:  # noqa: F811
    from scheduling.services.jobs import JobSpec, submit_job

    owner = user_factory("olga", team="inference")
    user_factory("ivan", team="research")
    job = submit_job(team=owner.memberships.get().team, user=owner, spec=JobSpec(name="secret", command="true"))
    login(page, "ivan", "pw-ivan")
    resp = page.goto(f"/jobs/{job.pk}/")
    assert resp is not None and resp.status == 404
    page.goto("/jobs/")
    assert "secret" not in page.content()
    resp = page.request.post(f"/jobs/{job.pk}/cancel/")
    assert resp.status in (403, 404)
    job.refresh_from_db()
    assert job.state == "pending"


def test_user_creates_uses_and_revokes_an_api_token(demo, user_factory, page) -> None:  # noqa: F811
    import requests

    user_factory("tina", team="training")
    login(page, "tina", "pw-tina")
    page.get_by_role("link", name="Tokens").click()
    page.get_by_label("Name").fill("laptop")
    page.get_by_role("button", name="Create token").click()
    key = page.locator("#new-key").inner_text()
    base = page.url.split("/tokens/")[0]
    ok = requests.get(f"{base}/api/v1/jobs/", headers={"Authorization": f"Token {key}"}, timeout=ceiling(60))
    assert ok.status_code == 200
    page.once("dialog", lambda dialog: dialog.accept())  # "Revoke the token 'laptop'? ..."
    page.get_by_role("button", name="Revoke laptop").click()
    expect(page.locator("#tokens")).not_to_contain_text("laptop")
    refused = requests.get(f"{base}/api/v1/jobs/", headers={"Authorization": f"Token {key}"}, timeout=ceiling(60))
    assert refused.status_code == 401
