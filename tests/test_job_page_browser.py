"""The job page in a real chromium: a batch script submitted on the form, its output as a terminal shows it.

Real agents run the jobs (tests/test_lifecycle_harness.py); each step leaves a screenshot (``snap``).
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from scheduling.models import Job
from tests.browser import login, page, requires_chromium, snap  # noqa: F401 - page is a fixture
from tests.test_lifecycle_harness import cluster, eager_celery, poll, tick

pytestmark = [requires_chromium, pytest.mark.browser, pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery"]  # fixtures, imported for pytest


def _run_to_the_end(job: Job) -> Job:
    deadline = time.monotonic() + 60
    while not job.is_final and time.monotonic() < deadline:
        if job.state == Job.State.PENDING:
            tick()
        else:
            poll()
            time.sleep(0.3)
        job.refresh_from_db()
    assert job.state == Job.State.COMPLETED, job.state
    return job


SCRIPT = """#!/bin/bash
#SBATCH --job-name=sweep-from-form
#SBATCH --gres=npu:2 --time=00:10:00
#SBATCH --output={out}/%x-%j.out --chdir={out}
#SBATCH --export=NONE,GREETING=hello
#SBATCH --partition=debug
#NPU --chip 910B4

for i in 1 2; do echo "step $i of $1"; done
echo "$GREETING from $(pwd)"
"""


def test_a_batch_script_submitted_on_the_form_runs_with_its_directives(cluster, user_factory, page, tmp_path) -> None:  # noqa: F811
    """Issue 26, 3: the console's form takes a script the way npuctl batch does."""
    user_factory("lena", team="training", role="lead")
    login(page, "lena", "pw-lena")
    page.goto("/jobs/new/")
    page.get_by_label("Batch script").fill(SCRIPT.format(out=tmp_path))
    page.get_by_label("Script arguments").fill("'the sweep'")
    snap(page, "script typed")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="sweep-from-form")
    assert (job.num_devices, job.chip_model, job.max_duration_s, job.env) == (2, "910B4", 600, {"GREETING": "hello"})
    warning = page.get_by_role("status").filter(has_text="directives not honoured")
    expect(warning).to_contain_text("--partition=debug (line 6: no partitions here")
    expect(page.locator("#job-spec")).to_contain_text("2 910B4")
    expect(page.locator("#job-time")).to_contain_text("time limit 10m, stopped when reached")
    expect(page.locator("#job-command")).to_contain_text("#SBATCH --gres=npu:2 --time=00:10:00")
    snap(page, "submitted, one warning line")

    _run_to_the_end(job)
    output = page.locator("#job-output")
    expect(output).to_have_text(f"step 1 of the sweep\nstep 2 of the sweep\nhello from {tmp_path}\n", timeout=15_000)
    assert (tmp_path / f"sweep-from-form-{job.pk}.out").exists()
    snap(page, "ran with its directives")


#: 50,000 plain lines, then colours, a progress bar redrawn with "\r", and markup that must stay text.
NOISY = (
    'seq -f "line %g" 1 50000; '
    r"printf '\033[31mred alert\033[0m and \033[1;32mbold green\033[0m \033[38;5;4mblue\033[m\n'; "
    r"printf 'progress  10%%|#         |\rprogress  50%%|#####     |\rprogress 100%%|##########|\n'; "
    r"printf 'erased tail\033[K\rkept\033[K\n'; "
    r"printf '\033]0;a title\007<script>window.__pwned = 1</script><b>not bold</b>\n'"
)


def test_the_output_panel_says_how_much_it_shows_and_renders_a_terminal(cluster, user_factory, page) -> None:  # noqa: F811
    """Issue 26, 6: "last 500 of 50,004 lines", a download of the whole, colours and progress bars as a terminal."""
    from django.contrib.auth import get_user_model

    from quotas.models import Team
    from scheduling.services.jobs import JobSpec, submit_job

    user_factory("tess", team="training", role="lead")
    job = submit_job(
        team=Team.objects.get(name="training"),
        user=get_user_model().objects.get(username="tess"),
        spec=JobSpec(name="noisy", command=NOISY, chip_model="910B4", estimated_duration_s=60),
    )
    _run_to_the_end(job)
    login(page, "tess", "pw-tess")
    page.goto(f"/jobs/{job.pk}/")
    expect(page.locator("#job-output-status")).to_have_text("complete", timeout=15_000)
    expect(page.locator("#job-output-lines")).to_have_text("last 500 of 50,004 lines")
    output = page.locator("#job-output")
    text = output.inner_text()
    assert text.startswith("line 49505\n") and "[31m" not in text and "\x1b" not in text and "a title" not in text
    expect(output.locator("span.ansi-fg-1")).to_have_text("red alert")
    expect(output.locator("span.ansi-fg-2.ansi-bold")).to_have_text("bold green")
    expect(output.locator("span.ansi-fg-4")).to_have_text("blue")
    assert "progress 100%|##########|\n" in text and "progress  10%" not in text and "progress  50%" not in text
    assert "\nkept\n" in text and "erased" not in text
    # Hostile output stays text: shown as written, never run or rendered.
    assert "<script>window.__pwned = 1</script><b>not bold</b>" in text
    assert page.evaluate("window.__pwned") is None and output.locator("b, script").count() == 0
    output.evaluate("el => el.scrollTop = el.scrollHeight")
    snap(page, "last 500 of 50,004 lines, in colour")

    link = page.locator("#job-output-download")
    expect(link).to_be_visible()
    with page.expect_download() as caught:
        link.click()
    whole = caught.value.path().read_bytes().decode()  # as sent: read_text turns each \r into a \n
    assert whole.startswith("line 1\nline 2\n") and whole.count("\n") == 50004 and "\x1b[31mred alert" in whole
    assert caught.value.suggested_filename.startswith(f"job-{job.pk}-run-1-")
