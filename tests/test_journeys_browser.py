"""The first hour of a team lead, an admin and a finance user, in a real chromium, step by step.

Each step asserts what the person sees on the page, and leaves a screenshot (``snap``) in the
artifacts folder. Live pages are watched without a reload: a value set on ``window`` when the
page opened must still be there when the change shows.
"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from devices.models import Node
from quotas.models import Team
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.test_lifecycle_harness import cluster, eager_celery, node_of, poll, tick
from tests.waiting import ceiling_ms, wait_for

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["cluster", "eager_celery"]  # fixtures, imported for pytest

#: A live region polls every 3 s: a change shows long before this ceiling, which only a page that stopped
#: following reaches. Generous, so that a busy machine cannot fail a page that is right.
LIVE_MS = ceiling_ms(30)


def _mark(page) -> None:  # noqa: F811
    page.evaluate("window.__sameDocument = true")


def _same_document(page) -> bool:  # noqa: F811
    return page.evaluate("window.__sameDocument === true")


def _fill_job_form(page, name: str, command: str, devices: str, chip: str) -> None:  # noqa: F811
    page.get_by_label("Name").fill(name)
    page.get_by_label("Command").fill(command)
    page.get_by_label("Whole devices").fill(devices)
    page.get_by_label("Chip model").select_option(chip)


def test_lead_is_refused_an_impossible_job_then_watches_one_run_with_its_output(
    cluster,
    user_factory,
    page,  # noqa: F811
) -> None:
    """Submit on the form, see why a job can never run, then watch a real one from queue to end."""
    user_factory("lena", team="training", role="lead")
    login(page, "lena", "pw-lena")
    expect(page.locator("#team-training")).to_be_visible()
    nav = page.get_by_role("navigation", name="main")
    expect(nav.get_by_role("link", name="Submit")).to_be_visible()
    expect(nav.get_by_role("link", name="Policy")).to_have_count(0)  # not an admin
    snap(page, "dashboard")

    page.get_by_role("link", name="Submit a job").click()
    # 25 cards: more than training's max (24) and than any chip pool holds (16).
    _fill_job_form(page, "too-big", "python train.py", "25", "")
    page.get_by_role("button", name="Submit").click()
    error = page.locator("#num_devices-error")
    expect(error).to_be_visible()
    assert "never" in error.inner_text() or "more" in error.inner_text(), error.inner_text()
    snap(page, "25 devices refused")
    # 17 × 910B4: the 910B4 pool has 16 cards.
    _fill_job_form(page, "too-many-b4", "python train.py", "17", "910B4")
    page.get_by_role("button", name="Submit").click()
    expect(page.locator("#num_devices-error")).to_contain_text("910B4")
    snap(page, "17 x 910B4 refused")
    assert not Job.objects.filter(name__in=["too-big", "too-many-b4"]).exists()

    # A real job, its run time typed as the CLI takes it.
    _fill_job_form(page, "first-run", "echo step-one; sleep 3; echo step-two; sleep 3", "1", "910B4")
    page.get_by_label("Estimated run time").fill("30m")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="first-run")
    assert job.estimated_duration_s == 1800
    expect(page.locator("#job-state")).to_have_text("Pending")
    _mark(page)
    snap(page, "pending")

    tick()  # the scheduler starts it on one of the agents
    expect(page.locator("#job-state")).to_have_text("Running", timeout=LIVE_MS)
    expect(page.get_by_role("button", name="Cancel job")).to_be_visible()
    job.refresh_from_db()
    expect(page.locator("#job-live")).to_contain_text(node_of(job), timeout=LIVE_MS)
    output = page.locator("#job-output")
    expect(output).to_contain_text("step-one")
    snap(page, "running with its first line")
    expect(output).to_contain_text("step-two")
    snap(page, "output grows")

    # The agent reports the end at its next poll; the page shows it with no reload.
    def polled_state() -> str:
        poll()
        job.refresh_from_db()
        return job.state

    wait_for(polled_state, until=lambda state: state == Job.State.COMPLETED, interval=0.5, message="the job to end")
    expect(page.locator("#job-state")).to_have_text("Completed", timeout=LIVE_MS)
    expect(output).to_contain_text("step-two")
    expect(page.get_by_role("button", name="Cancel job")).to_have_count(0)  # nothing left to cancel
    expect(page.get_by_role("button", name="Resubmit")).to_be_visible()
    assert _same_document(page), "the page was reloaded"
    snap(page, "completed")


def test_admin_drains_a_node_after_confirming_and_sees_it_drained(demo, user_factory, page) -> None:  # noqa: F811
    """The cluster at a glance, a drain asked first, and the node turning drained when its job ends."""
    user_factory("ops", staff=True)
    lead = user_factory("tom", team="training", role="lead")
    job = job_service.submit_job(
        team=Team.objects.get(name="training"),
        user=lead,
        spec=job_service.JobSpec(name="on-the-node", command="sleep 600", num_devices=1, chip_model="910A"),
    )
    run_tick()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, job.pending_reason
    name = node_of(job)

    login(page, "ops", "pw-ops")
    page.get_by_role("navigation", name="main").get_by_role("link", name="Cluster").click()
    expect(page.locator("#cluster-summary")).to_contain_text("Utilisation now")
    expect(page.locator("#cards-busy")).to_contain_text("busy")
    card = page.locator(f"#node-{name} .dev.card-busy").filter(has_text=f"#{job.pk}")
    expect(card).to_have_count(1)  # the busy card names its job and team
    expect(card).to_contain_text("training")
    snap(page, "cluster at a glance")

    page.locator(f"#node-{name} h2 a").click()
    expect(page.locator("#node-state")).to_have_text("Ready")
    questions: list[str] = []

    def answer(accept: bool):  # type: ignore[no-untyped-def]
        def handle(dialog) -> None:  # type: ignore[no-untyped-def]
            questions.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()

        return handle

    page.get_by_label("Reason").fill("firmware upgrade")
    page.once("dialog", answer(False))
    page.get_by_role("button", name="Drain", exact=True).click()
    assert questions and questions[-1].startswith(f"Drain {name}?"), questions
    expect(page.locator("#node-state")).to_have_text("Ready")
    assert Node.objects.get(name=name).state == Node.State.READY  # "No" changed nothing
    snap(page, "drain dismissed")

    page.once("dialog", answer(True))
    page.get_by_role("button", name="Drain", exact=True).click()
    expect(page.locator("#node-state")).to_have_text("Draining")
    assert Node.objects.get(name=name).state == Node.State.DRAINING  # its job still runs
    snap(page, "draining")

    _mark(page)
    job_service.cancel_job(job.pk, actor=lead)  # the last job on it ends
    expect(page.locator("#node-state")).to_have_text("Drained", timeout=LIVE_MS)
    assert _same_document(page), "the page was reloaded"
    snap(page, "drained")

    page.goto("/cluster/")
    expect(page.locator(f"#node-{name} .node-badge")).to_have_text("Drained")
    expect(page.locator(f"#node-{name} .dev.card-drained").first).to_contain_text("drained")
    snap(page, "drained on the cluster page")


def test_finance_reads_reports_and_statements_and_cannot_submit(demo, user_factory, page) -> None:  # noqa: F811
    """Finance starts on the reports, sees charts and statements, and has no way to submit a job."""
    fin = user_factory("fiona")
    fin.groups.add(Group.objects.get_or_create(name="finance")[0])
    login(page, "fiona", "pw-fiona")
    page.wait_for_url(re.compile(r"/reports/"))
    nav = page.get_by_role("navigation", name="main")
    expect(nav.get_by_role("link", name="Reports")).to_be_visible()
    expect(nav.get_by_role("link", name="Statements")).to_be_visible()
    expect(nav.get_by_role("link", name="Submit")).to_have_count(0)
    expect(nav.get_by_role("link", name="Jobs")).to_have_count(0)
    expect(page.locator("#chart-cost .plot-container")).to_have_count(1)
    expect(page.locator("#report-status")).to_contain_text("Month to date")
    snap(page, "reports, month to date")

    # Last month is closed: its statements are there, one per team, to download.
    from quotas.accounting.statements import previous_month

    page.goto(f"/reports/?month={previous_month()}")
    expect(page.locator("#report-status")).to_contain_text("Closed month")
    rows = page.locator("#statements tbody tr")
    expect(rows.first).to_be_visible()
    teams = {text.split("\t")[0].strip() for text in rows.all_inner_texts()}
    assert {"training", "research", "inference"} <= teams, teams
    expect(page.locator("#statements").get_by_role("link", name="CSV").first).to_be_visible()
    snap(page, "statements of the closed month")

    page.goto("/jobs/new/")
    expect(page.locator("h1")).to_have_text("Not allowed")  # the console's own 403 page, with the menu
    expect(page.get_by_role("navigation", name="main").get_by_role("link", name="Reports")).to_be_visible()
    assert page.locator("form#job-form, input[name=command]").count() == 0
    snap(page, "no job form for finance")
