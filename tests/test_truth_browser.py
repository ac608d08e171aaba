"""What a person sees is so (issue 26): in a real chromium, each step asserting the page and leaving a
screenshot (``snap``).

- a lead's job: the "queued" message goes once it runs, the account its agent ran it as, events in words;
- a preempted job's events in words, with the code kept beside them;
- an admin: a cordoned node whose cards are all busy counts them as both; a removed node is read-only;
  a node's readings with units and its health history;
- finance: the Statements menu opens the last closed month, headed as closed, with total rows and the
  top jobs not linked (finance cannot open them).
"""

from __future__ import annotations

import os
import pwd
import re
from datetime import timedelta

import pytest
from django.contrib.auth.models import Group
from django.utils import timezone
from playwright.sync_api import expect

from devices.models import Device, HealthEvent, Node
from devices.services import operations, registration
from quotas.models import Team
from quotas.policies.versions import create_version
from scheduling.engine import reasons
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.test_lifecycle_harness import cluster, eager_celery, node_of, poll, tick

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
__all__ = ["cluster", "eager_celery"]  # fixtures, imported for pytest

#: A live region polls every 3 s: a change must show within this many milliseconds.
LIVE_MS = 8000

#: Research is guaranteed the 910A server's 8 cards; training may borrow them (tests/test_event_disclosure.py).
RECLAIM_POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: reclaim}
spec:
  timezone: UTC
  priorityClasses:
    - {name: high, preempts: [low]}
    - {name: normal, default: true}
    - {name: low}
  preemption: {gracePeriod: 60s, onPreempt: requeue}
  teams:
    - {name: research, shares: 1, quota: {guaranteed: {devices: 8}, max: {devices: 8}}}
    - {name: training, shares: 1, quota: {max: {devices: 28}}}
"""


def _submit(user: object, team: str, name: str, devices: int, chip: str, pclass: str | None = None) -> Job:
    spec = job_service.JobSpec(
        name=name, command="sleep 600", num_devices=devices, chip_model=chip, priority_class=pclass
    )
    return job_service.submit_job(team=Team.objects.get(name=team), user=user, spec=spec)


def test_a_leads_job_says_who_it_ran_as_and_drops_the_queued_message_once_it_runs(
    cluster,
    user_factory,
    page,  # noqa: F811
) -> None:
    user_factory("lena", team="training", role="lead")
    login(page, "lena", "pw-lena")
    page.goto("/jobs/new/")
    page.get_by_label("Name").fill("who-am-i")
    page.get_by_label("Command").fill("id; sleep 60")
    page.get_by_label("Whole devices").fill("1")
    page.get_by_label("Chip model").select_option("910B4")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    expect(page.locator("#job-queued")).to_contain_text("is queued")
    expect(page.locator("#job-runs-as")).to_contain_text("the cluster reports the account once the job runs")
    expect(page.locator("#job-posix-user")).to_have_text("lena")
    snap(page, "queued")

    tick()
    job = Job.objects.get(name="who-am-i")
    cluster[node_of(job)].wait_job(job.agent_job_id, {"running"})
    for _ in range(60):
        poll()
        job.refresh_from_db()
        if job.ran_as:
            break
        page.wait_for_timeout(500)
    me = pwd.getpwuid(os.geteuid()).pw_name
    assert job.ran_as == me
    expect(page.locator("#job-state")).to_have_text("Running", timeout=LIVE_MS)
    expect(page.locator("#job-queued")).to_be_empty(timeout=LIVE_MS)  # the job has moved on
    expect(page.locator("#job-ran-as")).to_have_text(f"{me} as the cluster reported", timeout=LIVE_MS)
    expect(page.locator("#job-runs-as")).to_contain_text("asked for lena")
    expect(page.locator("#job-output")).to_contain_text(f"uid={os.geteuid()}({me})", timeout=15_000)
    started = page.locator("#events td.event-name", has_text="Started")
    expect(started).to_have_count(1)
    expect(started.locator("code")).to_have_text("Scheduled")  # the code, kept for whoever greps for it
    snap(page, "running as the agent reported")


def test_a_preempted_job_reads_its_events_in_words(demo, user_factory, page) -> None:  # noqa: F811
    """Training borrows research's guaranteed 910A cards with a low job; research wants them back."""
    create_version(RECLAIM_POLICY, author=None, comment="test")
    lena = user_factory("lena", team="training", role="lead")
    rita = user_factory("rita", team="research", role="lead")
    t0 = timezone.now().replace(microsecond=0) - timedelta(seconds=30)
    victim = _submit(lena, "training", "borrowed", 8, "910A", pclass="low")
    assert victim.pk in run_tick(t0).started
    _submit(rita, "research", "reclaim", 8, "910A")
    assert run_tick(t0 + timedelta(seconds=5)).preempted == [victim.pk]

    login(page, "lena", "pw-lena")
    page.goto(f"/jobs/{victim.pk}/")
    row = page.locator("#events tr", has=page.locator("td.event-name", has_text="Preemption scheduled"))
    expect(row).to_have_count(1)
    expect(row.locator("code")).to_have_text("PreemptionScheduled")
    cause = reasons.TEXT[reasons.GUARANTEE_RECLAIM].rstrip(".")
    expect(row).to_contain_text(f"{cause} — for a job of another team")
    expect(page.locator("#events")).not_to_contain_text("GuaranteeReclaim")
    expect(page.locator("#job-preemption")).to_contain_text("a waiting job (a job of another team) needs its devices")
    snap(page, "preemption scheduled in words")


def test_an_admin_sees_busy_cordoned_cards_counted_and_a_removed_node_read_only(
    demo,
    user_factory,
    page,  # noqa: F811
) -> None:
    user_factory("ops", staff=True)
    lena = user_factory("lena", team="training", role="lead")
    job = _submit(lena, "training", "fills-the-910a", 8, "910A")
    run_tick()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, job.pending_reason
    operations.cordon_node("ascend-a-01", actor=None, reason="fan noise")
    registration.remove_node("ascend-310p-01", actor=None, reason="sent back")
    device = Device.objects.get(node__name="ascend-b4-01", index=2)
    Device.objects.filter(pk=device.pk).update(temp_c=71.6, power_w=182.0, aicore_pct=64.0, hbm_used_mb=20480)
    HealthEvent.objects.create(
        node=device.node, device=device, at=timezone.now() - timedelta(minutes=3), from_health="healthy",
        to_health="warning", reason="temperature 86 °C above 85 °C",
    )  # fmt: skip

    login(page, "ops", "pw-ops")
    page.goto("/cluster/")
    expect(page.locator("#cards-busy strong")).to_have_text("8")
    expect(page.locator("#cards-cordoned strong")).to_have_text("8")  # said "0 cordoned" before
    expect(page.locator("#cards-counted-twice")).to_contain_text("8 busy cards are also counted as cordoned")
    total = Device.objects.filter(node__removed_at__isnull=True).count()
    expect(page.locator("#utilisation-of")).to_have_text(f"(8 of {total} cards busy)")
    expect(page.locator("#node-ascend-a-01 .card-word").first).to_have_text("busy · cordoned")
    expect(page.locator("#node-ascend-310p-01")).to_have_count(0)  # removed: in no count
    snap(page, "cordoned busy node counted twice")

    page.goto("/nodes/ascend-b4-01/")
    row = page.locator("#devices tbody tr").nth(2)
    for text in ("72 °C", "182 W", "64 %", "20.0 / 32.0 GB"):
        expect(row).to_contain_text(text)
    history = page.locator("#health-history")
    expect(history).to_contain_text("device 2")
    expect(history).to_contain_text("healthy → warning")
    snap(page, "node readings with units and health history")

    page.goto("/nodes/ascend-310p-01/")
    expect(page.locator("#node-removed")).to_contain_text("Removed from the inventory on")
    expect(page.locator("#node-state")).to_have_text("Removed")
    expect(page.get_by_role("button", name="Uncordon")).to_have_count(0)
    expect(page.get_by_role("button", name="Cordon")).to_have_count(0)
    expect(page.get_by_role("button", name="Drain")).to_have_count(0)
    expect(page.locator(".card-word").first).to_have_text("removed")
    snap(page, "removed node read-only")
    assert Node.objects.get(name="ascend-310p-01").state == Node.State.READY


def test_finance_opens_the_last_closed_month_from_the_menu(demo, user_factory, page) -> None:  # noqa: F811
    fiona = user_factory("fiona")
    fiona.groups.add(Group.objects.get(name="finance"))  # type: ignore[attr-defined]
    login(page, "fiona", "pw-fiona")
    page.get_by_role("navigation", name="main").get_by_role("link", name="Statements").click()
    page.wait_for_url(re.compile(r"/reports/\?month=\d{4}-\d{2}#statements$"))
    month = re.search(r"month=(\d{4}-\d{2})", page.url).group(1)
    expect(page.locator("#statements")).to_be_visible()
    expect(page.locator("#month-heading")).to_have_text(f"{month}, closed")
    snap(page, "statements of the last closed month")

    expect(page.locator("#team-total th").first).to_have_text("Total")
    expect(page.locator("#user-total th").first).to_have_text("Total")
    top = page.locator("#top-jobs tbody tr")
    assert top.count() > 0
    expect(page.locator("#top-jobs a")).to_have_count(0)  # finance cannot open a job: no links
    page.locator("#team-table").scroll_into_view_if_needed()
    snap(page, "tables with totals and unlinked top jobs")


def test_a_constant_quota_reads_as_one_value_on_the_week_heatmap(demo, user_factory, page) -> None:  # noqa: F811
    user_factory("lena", team="training", role="lead")  # training: max 24 at every hour
    login(page, "lena", "pw-lena")
    page.goto("/quota/")
    expect(page.locator("#heatmap-note-training")).to_have_text("The same maximum all week: 24 devices at every hour.")
    expect(page.locator("#heatmap-training .main-svg").first).to_be_visible()
    ticks = page.locator("#heatmap-training .colorbar .cbaxis text, #heatmap-training .cbaxis text")
    assert "0" in ticks.all_text_contents(), ticks.all_text_contents()  # the scale starts at nothing
    page.locator("#heatmap-training").scroll_into_view_if_needed()
    snap(page, "constant quota heatmap")
