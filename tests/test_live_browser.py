"""A person watches live pages in chromium: nothing is reloaded, yet each change shows at the next poll (every 3 s)."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from devices.models import Node
from quotas.models import Team
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.waiting import ceiling_ms

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]

#: A change shows at the regions' next poll (every 3 s), long before this ceiling; a page that stopped
#: following never shows it. Generous, so that a busy machine cannot fail a page that is right.
WITHIN_MS = ceiling_ms(30)


def _submit(user: object, name: str, devices: int = 2, chip: str = "910A") -> Job:
    spec = job_service.JobSpec(name=name, command="sleep 60", num_devices=devices, chip_model=chip)
    return job_service.submit_job(team=Team.objects.get(name="training"), user=user, spec=spec)


def _mark(page) -> None:  # noqa: F811
    """A value that only survives while the document is not reloaded."""
    page.evaluate("window.__stillHere = 'yes'")


def _not_reloaded(page) -> bool:  # noqa: F811
    return page.evaluate("window.__stillHere") == "yes"


def _watch_requests(page) -> tuple[list[str], list[str]]:  # noqa: F811
    """The paths the page requests from now on, and any script error it raises."""
    from urllib.parse import urlsplit

    paths: list[str] = []
    errors: list[str] = []
    page.on(
        "request",
        lambda r: paths.append(urlsplit(r.url).path + ("?" + urlsplit(r.url).query if urlsplit(r.url).query else "")),
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    return paths, errors


def test_the_job_page_goes_pending_running_completed_without_a_reload(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("rosa", team="training", role="lead")
    job = _submit(lead, "watch-me")
    login(page, "rosa", "pw-rosa")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-state")).to_have_text("Pending")
    expect(page.locator("#job-output-status")).to_contain_text("has not started")
    _mark(page)
    paths, errors = _watch_requests(page)
    snap(page, "pending")

    run_tick()
    expect(page.locator("#job-state")).to_have_text("Running", timeout=WITHIN_MS)
    node = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    expect(page.locator("#job-devices")).to_contain_text(node)
    snap(page, "running")

    job_service.finish_job(job.pk, exit_code=0)
    expect(page.locator("#job-state")).to_have_text("Completed", timeout=WITHIN_MS)
    expect(page.locator("#events")).to_contain_text("Completed")
    snap(page, "completed")
    assert _not_reloaded(page)
    assert f"/jobs/{job.pk}/" not in paths and f"/live/jobs/{job.pk}/" in paths and not errors


def test_the_job_list_shows_a_new_state_and_keeps_its_filter_and_scroll(demo, user_factory, page) -> None:  # noqa: F811
    lead = user_factory("tom", team="training", role="lead")
    for i in range(4):
        _submit(lead, f"early-{i}", devices=1, chip="910B4")
    run_tick()
    login(page, "tom", "pw-tom")
    page.goto("/jobs/?state=running")
    page.set_viewport_size({"width": 1366, "height": 320})
    late = _submit(lead, "late-starter", devices=1, chip="910B4")
    rows = page.locator("#live-jobs tbody tr")
    expect(rows).to_have_count(4)
    expect(page.locator("#live-jobs")).not_to_contain_text("late-starter")
    page.mouse.wheel(0, 150)
    page.wait_for_function("window.scrollY > 0")
    scrolled = page.evaluate("window.scrollY")
    _mark(page)
    paths, errors = _watch_requests(page)
    snap(page, "four-running")

    run_tick()
    expect(page.locator(f'#live-jobs a[href="/jobs/{late.pk}/"]')).to_be_visible(timeout=WITHIN_MS)
    expect(rows).to_have_count(5)
    expect(page.locator("#live-jobs")).to_contain_text("Running")
    snap(page, "late-starter-running")
    assert page.url.endswith("/jobs/?state=running"), "the filter stays in the address"
    assert page.locator('#job-filters input[name="state"][value="running"]').is_checked()
    assert page.evaluate("window.scrollY") == scrolled, "the reader's scroll position is kept"
    assert _not_reloaded(page)
    assert paths and set(paths) == {"/live/jobs/?state=running"}, "only the region is polled, with the filter"
    assert not errors


def test_the_cluster_page_shows_a_node_turn_from_draining_to_drained(demo, user_factory, page) -> None:  # noqa: F811
    from devices.services.operations import drain_node

    user_factory("ops", staff=True)
    lead = user_factory("lena", team="training", role="lead")
    job = _submit(lead, "last-on-node", devices=4, chip="910A")
    run_tick()
    job.refresh_from_db()
    node = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    login(page, "ops", "pw-ops")
    page.goto("/cluster/")
    badge = page.locator(f"#node-{node} .node-badge")
    expect(badge).to_have_text("Ready")
    expect(page.locator("#cluster-summary")).to_contain_text("training 4")
    expect(page.locator(f'#node-{node} a[href="/jobs/{job.pk}/"]').first).to_be_visible()
    _mark(page)
    snap(page, "busy")

    drain_node(node, actor=None, reason="firmware")
    expect(badge).to_have_text("Draining", timeout=WITHIN_MS)
    expect(page.locator(f'#node-{node} .dev[data-state="draining"]')).to_have_count(4)  # its idle cards
    expect(page.locator(f'#node-{node} .dev[data-state="busy"]')).to_have_count(4)
    snap(page, "draining")

    job_service.finish_job(job.pk, exit_code=0)
    expect(badge).to_have_text("Drained", timeout=WITHIN_MS)
    expect(page.locator(f'#node-{node} .dev[data-state="drained"]')).to_have_count(8)
    expect(page.locator("#cards-drained")).to_contain_text("8")
    snap(page, "drained")
    assert _not_reloaded(page)


def test_a_hidden_tab_stops_polling_and_catches_up_when_shown(demo, user_factory, page) -> None:  # noqa: F811
    """The page's timers run on a clock the test moves: 7 s pass for them in an instant, and none pass unasked."""
    user_factory("vic", team="research", role="lead")
    login(page, "vic", "pw-vic")
    page.clock.install()
    page.goto("/cluster/")
    page.evaluate("Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'hidden'})")
    paths, errors = _watch_requests(page)
    page.clock.pause_at(page.evaluate("Date.now()") + 1000)
    page.clock.run_for(7000)  # two polls fall due while hidden
    assert [p for p in paths if p.startswith("/live/")] == [], "a hidden tab costs the server nothing"
    with page.expect_request(lambda r: r.url.endswith("/live/cluster/")):  # the clock stands still: no poll is due
        page.evaluate(
            "Object.defineProperty(document, 'visibilityState', {configurable: true, get: () => 'visible'});"
            "document.dispatchEvent(new Event('visibilitychange'))"
        )
    assert "/live/cluster/" in paths, "shown again, the page asks at once"
    snap(page, "shown-again")
    assert not errors
