"""A job held by its own team's maximum says so on its page (issue 30), in a real chromium."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from quotas.models import Team
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_job_at_its_teams_maximum_reads_so_on_its_page(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("rita", team="research", role="lead")
    research = Team.objects.get(name="research")  # may hold 12 devices (the demo policy)
    spec = job_service.JobSpec(name="first", command="sleep 600", num_devices=8, chip_model="910A")
    job_service.submit_job(team=research, user=lead, spec=spec)
    run_tick()
    spec = job_service.JobSpec(name="second", command="sleep 600", num_devices=8, chip_model="910A")
    waiting = job_service.submit_job(team=research, user=lead, spec=spec)
    run_tick()

    login(page, "rita", "pw-rita")
    page.goto(f"/jobs/{waiting.pk}/")
    expect(page.get_by_text("your team is at its maximum of 12 devices: it holds 8 in 1 running job")).to_be_visible()
    expect(page.locator("body")).to_contain_text("this job needs 8 more")
    snap(page, "waiting at its team's maximum")
