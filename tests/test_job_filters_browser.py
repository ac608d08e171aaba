"""A lead narrows the job list in chromium: two states and a name, kept in the address, kept live."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from quotas.models import Team
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

#: How long a change may take to show: the region polls every 3 s; a busy machine gets room.
WITHIN_MS = 20_000


def _submit(user: object, name: str, devices: int, chip: str) -> Job:
    spec = job_service.JobSpec(name=name, command="sleep 600", num_devices=devices, chip_model=chip)
    return job_service.submit_job(team=Team.objects.get(name="training"), user=user, spec=spec)


def test_two_states_and_a_name_filter_the_list_and_it_stays_filtered_live(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("rosa", team="training", role="lead")
    first = _submit(lead, "bert-first", 8, "910A")
    second = _submit(lead, "bert-second", 8, "910A")  # the 910A cards are taken: it waits
    resnet = _submit(lead, "resnet-runs", 1, "910B4")
    done = _submit(lead, "bert-done", 1, "910B4")
    run_tick()
    job_service.finish_job(done.pk, exit_code=0)
    states = dict(Job.objects.filter(pk__in=[first.pk, second.pk]).values_list("pk", "state"))
    running = next(pk for pk, state in states.items() if state == Job.State.RUNNING)
    waiting = next(pk for pk, state in states.items() if state == Job.State.PENDING)
    assert Job.objects.get(pk=resnet.pk).state == Job.State.RUNNING

    login(page, "rosa", "pw-rosa")
    page.goto("/jobs/")
    form = page.locator("#job-filters")
    form.get_by_label("Pending").check()
    form.get_by_label("Running").check()
    form.get_by_label("Name contains").fill("bert")
    snap(page, "form-filled")
    form.get_by_role("button", name="Filter").click()

    page.wait_for_url("**/jobs/?*")
    query = parse_qs(urlsplit(page.url).query)
    assert query == {"name": ["bert"], "state": ["pending", "running"]}, page.url  # no empty fields
    rows = page.locator("#live-jobs tbody tr")
    expect(rows).to_have_count(2)
    for pk in (running, waiting):
        expect(page.locator(f'#live-jobs a[href="/jobs/{pk}/"]')).to_be_visible()
    for pk in (resnet.pk, done.pk):
        expect(page.locator(f'#live-jobs a[href="/jobs/{pk}/"]')).to_have_count(0)
    expect(form.get_by_label("Pending")).to_be_checked()
    expect(form.get_by_label("Running")).to_be_checked()
    expect(form.get_by_label("Completed")).not_to_be_checked()
    expect(form.get_by_label("Name contains")).to_have_value("bert")
    page.evaluate("window.__stillHere = 'yes'")
    polled: list[str] = []
    page.on("request", lambda r: polled.append(r.url) if "/live/jobs/" in r.url else None)
    snap(page, "filtered")

    # The running one ends: completed is not asked for, so it leaves the list; the waiting one starts.
    job_service.finish_job(running, exit_code=0)
    run_tick()
    expect(page.locator(f'#live-jobs a[href="/jobs/{running}/"]')).to_have_count(0, timeout=WITHIN_MS)
    started = page.locator("#live-jobs tbody tr", has=page.locator(f'a[href="/jobs/{waiting}/"]'))
    expect(started.locator(".state")).to_have_text("Running", timeout=WITHIN_MS)
    expect(rows).to_have_count(1)
    snap(page, "one-ended-one-started")

    # New jobs: only the one the filters match appears.
    late = _submit(lead, "BERT-late", 1, "910B4")
    other = _submit(lead, "resnet-late", 1, "910B4")
    expect(page.locator(f'#live-jobs a[href="/jobs/{late.pk}/"]')).to_be_visible(timeout=WITHIN_MS)
    expect(page.locator(f'#live-jobs a[href="/jobs/{other.pk}/"]')).to_have_count(0)
    expect(rows).to_have_count(2)
    snap(page, "new-match-appears")

    assert page.evaluate("window.__stillHere") == "yes", "the page was not reloaded"
    assert polled and all(parse_qs(urlsplit(url).query) == query for url in polled), polled
    assert parse_qs(urlsplit(page.url).query) == query
