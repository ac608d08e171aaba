"""The portal's accounting and Slurm's agree: ``manage.py slurm reconcile`` on a real cluster, and its parsing.

The cluster is the test's own (``own_slurm_site``), so its accounting holds this test's jobs alone.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from devices.executors import get_executor
from devices.executors.slurm import run
from devices.slurm.reconcile import npu_count, parse_elapsed, parse_usage, reconcile
from quotas.accounting.statements import parse_month
from quotas.models import UsageRecord
from scheduling.models import Job
from tests.test_lifecycle_harness import tick
from tests.waiting import wait_for


def test_elapsed_and_cards_are_read_as_sacct_prints_them() -> None:
    assert parse_elapsed("00:00:03") == 3
    assert parse_elapsed("1-02:03:04") == 93784
    assert parse_elapsed("05:06") == 306
    assert parse_elapsed("INVALID") == 0
    assert npu_count("billing=1,cpu=1,gres/npu=2,node=1") == 2
    assert npu_count("billing=1,cpu=1,node=1") == 0


def test_a_job_across_the_window_counts_only_its_part_inside() -> None:
    start = datetime(2026, 12, 1, tzinfo=UTC)
    end = datetime(2026, 12, 2, tzinfo=UTC)
    text = (
        "7|npuportal:4:1|COMPLETED|billing=1,cpu=1,gres/npu=2,node=1|02:00:00|2026-11-30T23:00:00+00:00|x\n"
        "8|(null)|RUNNING|billing=1,cpu=1,gres/npu=1,node=1|00:10:00|2026-12-01T10:00:00+00:00|Unknown\n"
        "9|npuportal:5:2|PENDING|billing=1,cpu=1,node=1|00:00:00|Unknown|Unknown\n"
    )
    first, second, third = parse_usage(text, start, end)
    assert (first.portal_job, first.cards, first.seconds, first.device_seconds) == (4, 2, 3600, 7200)
    assert (second.portal_job, second.comment, second.device_seconds) == (None, "", 600)
    assert (third.portal_job, third.device_seconds) == (5, 0)


def test_a_bad_month_is_one_line_and_exit_2(db) -> None:
    err = StringIO()
    with pytest.raises(SystemExit) as done:
        call_command("slurm", "reconcile", "--month", "2026-13", stderr=err)
    assert done.value.code == 2
    assert err.getvalue().strip().splitlines() == ["--month: '2026-13' is not a month between 2000-01 and 9998-12"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_months_jobs_agree_with_sacct_within_one_percent(own_slurm_site, submit_slurm) -> None:
    Job.objects.all().delete()  # the demo's history never ran on Slurm
    UsageRecord.objects.all().delete()
    jobs = [submit_slurm("sleep 60", devices=n, name=f"acct-{n}") for n in (1, 2, 3)]
    # A job submitted to Slurm directly: in sacct, not the portal's to charge, totalled apart.
    outside = ["sbatch", "--parsable", "--gres=npu:1", "--chdir=/tmp", "--output=/dev/null", "--wrap=sleep 5"]
    run([*outside, "--uid=nobody"] if os.geteuid() == 0 else outside)
    tick()
    assert all(j.state == Job.State.RUNNING for j in Job.objects.filter(pk__in=[j.pk for j in jobs]))
    # Mid-run: sacct has no comment for a running job yet, the controller has; each is the portal's.
    # The month on the policy's clock (as reconcile reads it), not the server's: on a month's last
    # evening in UTC, Asia/Shanghai is already in the next one.
    label = parse_month(None, timezone.now())[0].label
    # (Within 45 s, before the 60 s jobs end: slurmdbd may take a moment to record a start.)
    wait_for(
        lambda: sorted(j.job_id for j in reconcile(label).jobs if j.slurm is not None),
        until=lambda matched: matched == sorted(j.pk for j in jobs),
        interval=1.0,
        timeout=45,
    )

    def observed() -> list[str]:
        get_executor().observe()
        return list(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("state", flat=True))

    wait_for(observed, until=lambda states: set(states) == {Job.State.COMPLETED}, interval=1.0, timeout=180)

    result = reconcile(label)
    print("\n".join(result.lines()))
    assert sorted(j.job_id for j in result.jobs) == sorted(j.pk for j in jobs)
    assert all(j.portal is not None and j.slurm is not None for j in result.jobs)
    assert result.agree, result.lines()
    assert result.slurm_total > 0
    assert result.outside_jobs == 1 and result.outside_hours > 0

    out = StringIO()
    call_command("slurm", "reconcile", "--month", result.month, stdout=out)
    assert out.getvalue().strip().splitlines()[-1] == "agree within 1%"
