"""What only Slurm does on a job's journey, through the portal's own tick (``NPUPORTAL_EXECUTOR=slurm``).

The journey both executors share (the decided cards, output, exit code, cancel, preemption, time
limit, arrays, jobs outside the portal) is tests/test_executor_journey.py; here are the Slurm-only
parts: a launch found again by its comment, the account and minutes ``sbatch`` is given, cards
read back from a node that declares a count, runs Slurm forgets or ends for the system, Slurm's
own time limit. The portal decides (``run_tick``), the Slurm executor submits and observes
(``get_executor().observe()``, what the worker's poll calls); Celery runs eagerly, so a tick's
launches and a cancel's stop happen right after the commit. Each check reads Slurm itself
(``squeue``, ``scontrol show job -d``).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from devices.agent.exit_words import exit_words
from devices.executors import Observation, get_executor
from devices.executors.slurm import EndedJob, cards_given, record_cards, run, squeue
from devices.models import Node
from scheduling.models import Job
from scheduling.services.jobs import cancel_job
from tests.slurm.conftest import COUNT_NODE
from tests.test_lifecycle_harness import node_of, open_devices, tick
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _started(job: Job) -> Job:
    """Tick until the job is running and submitted to Slurm, then wait for Slurm to run it."""
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING, (job.state, job.pending_reason, job.pending_detail)
    assert job.agent_job_id.isdigit(), f"Slurm's job id is kept on the job, not {job.agent_job_id!r}"
    wait_for(
        lambda: squeue().get(job.agent_job_id),
        until=lambda q: q is not None and q.state == "RUNNING",
        message=f"Slurm job {job.agent_job_id} to run",
    )
    return job


def _observe_until(job: Job, states: set[str]) -> Job:
    def observed() -> Job:
        get_executor().observe()
        return _reload(job)

    return wait_for(observed, until=lambda j: j.state in states, interval=0.3, message=f"job {job.pk} in {states}")


def _log(api: Any, job: Job) -> dict[str, Any]:
    lead = get_user_model().objects.get(username="lead-training")
    resp = api(lead).get(f"/api/v1/jobs/{job.pk}/log/")
    assert resp.status_code == 200, resp.content
    return resp.json()


def test_a_launch_sent_again_finds_its_run_by_comment_and_sbatch_gets_the_account_and_minutes(
    slurm_site, submit_slurm
) -> None:
    job = _started(submit_slurm("sleep 300", devices=2, max_duration_s=2))
    slurm_id = job.agent_job_id
    # A launch sent again (a retry after a lost answer) finds the run by its comment: never a second sbatch.
    assert get_executor().launch([job.pk]) == {job.pk: True}
    assert _reload(job).agent_job_id == slurm_id
    ours = [q for q in squeue().values() if q.comment == f"npuportal:{job.pk}:1"]
    assert [q.slurm_id for q in ours] == [slurm_id]
    assert ours[0].nodes == node_of(job)
    if os.geteuid() == 0:
        assert ours[0].user == _reload(job).ran_as == "nobody", "run as the submitter's POSIX account"
    assert "TimeLimit=00:01:00" in run(["scontrol", "show", "job", slurm_id]), "Slurm counts minutes: 2 s is one"
    cancel_job(job.pk, actor=None)


def test_a_count_node_gets_its_cards_read_back_and_told_to_the_job(slurm_site, submit_slurm, api) -> None:
    Node.objects.exclude(name=COUNT_NODE).update(state=Node.State.CORDONED)
    first = _started(submit_slurm("sleep 30", devices=2, name="first"))
    assert node_of(first) == COUNT_NODE
    get_executor().observe()  # reads back the cards Slurm gave
    slurm_first = cards_given(first.agent_job_id)[COUNT_NODE]
    assert sorted(d.index for d in open_devices(first)) == slurm_first
    # The portal's record of the first job says 6 and 7 now, so its choice for the next job and
    # Slurm's (the lowest free cards) differ, and the record must follow Slurm's.
    record_cards(first.pk, {COUNT_NODE: [6, 7]})
    assert sorted(d.index for d in open_devices(first)) == [6, 7]
    job = _started(submit_slurm('echo "cards=$ASCEND_RT_VISIBLE_DEVICES"; sleep 2', devices=3, name="second"))
    assert node_of(job) == COUNT_NODE
    get_executor().observe()
    given = cards_given(job.agent_job_id)[COUNT_NODE]
    assert not set(given) & set(slurm_first)
    assert sorted(d.index for d in open_devices(_reload(job))) == given, "the portal records the cards Slurm gave"
    job = _observe_until(job, {Job.State.COMPLETED})
    assert _log(api, job)["data"] == f"cards={','.join(map(str, given))}\n"
    cancel_job(first.pk, actor=None)


def test_a_run_slurm_no_longer_knows_is_requeued_and_a_stale_run_cancelled(slurm_site, submit_slurm) -> None:
    job = _started(submit_slurm("sleep 300"))
    real = job.agent_job_id
    Job.objects.filter(pk=job.pk).update(agent_job_id="987654")  # as if Slurm had forgotten the run
    summary = get_executor().observe()
    job = _reload(job)
    assert job.pk in summary.requeued
    assert (job.state, job.pending_reason) == (Job.State.PENDING, "LostOnAgent")
    assert real in summary.stale_stopped, "the run Slurm still has is no longer the job's: cancelled"
    wait_for(lambda: real not in squeue(), message=f"Slurm job {real} to be gone")


@pytest.mark.skipif(os.geteuid() != 0, reason="only a worker running as root runs jobs as their submitters")
def test_a_submitter_without_a_posix_account_here_fails_with_the_reason(slurm_site, submit_slurm) -> None:
    from quotas.models import UserProfile

    UserProfile.objects.filter(user__username="lead-training").update(posix_user="no-such-account")
    job = submit_slurm("true")
    tick()
    job = _reload(job)
    assert job.state == Job.State.FAILED
    event = job.events.last()
    assert event.reason == "LaunchFailed"
    assert "no POSIX account 'no-such-account'" in event.detail
    assert not [q for q in squeue(every_state=True).values() if q.portal_run == (job.pk, 1)]


def test_a_node_failure_requeues_the_job_in_its_place_without_costing_a_retry(slurm_site, submit_slurm) -> None:
    job = _started(submit_slurm("sleep 300"))
    # What sacct says of a run whose node died (a slurmd killed takes SlurmdTimeout to be noticed).
    failed = EndedJob(job.agent_job_id, "NODE_FAIL", 0, 0, node_of(job), None)
    summary = Observation()
    get_executor()._record_end(job.pk, job.agent_job_id, failed, summary)  # type: ignore[attr-defined]
    job = _reload(job)
    assert summary.requeued == [job.pk]
    assert (job.state, job.pending_reason, job.retries) == (Job.State.PENDING, "NodeFail", 0)
    assert "the system ended it, not the job" in job.events.last().detail
    assert job.agent_job_id in get_executor().observe().stale_stopped


def test_slurms_own_time_limit_ends_the_job_timed_out_in_the_agents_words(slurm_site, submit_slurm) -> None:
    """Slurm's TIMEOUT (``--time=1``, its minimum: one minute) without the portal's walltime sweep.

    Slow on purpose (a minute and Slurm's next time-limit check, 60-100 s): Slurm counts minutes.
    """
    job = _started(submit_slurm("sleep 300", max_duration_s=60))
    assert "TimeLimit=00:01:00" in run(["scontrol", "show", "job", job.agent_job_id])
    job = wait_for(
        lambda: (get_executor().observe(), _reload(job))[1],
        until=lambda j: j.state != Job.State.RUNNING,
        interval=2.0,
        timeout=240,
        message=f"Slurm to end job {job.pk} at its time limit",
    )
    event = job.events.last()
    assert (job.state, event.reason) == (Job.State.TIMEOUT, "Walltime"), (job.state, event.reason, event.detail)
    assert event.detail == f"Slurm stopped it at its time limit: {exit_words(job.exit_code)}"
    assert exit_words(job.exit_code) == "killed by signal SIGTERM", "as an agent's run stopped at its limit"
    assert job.allocations.filter(end__isnull=True).count() == 0
