"""Faults on a real Slurm cluster: the controller away, a node's slurmd killed, a worker dying mid-submission.

Each test breaks a cluster of its own (``own_slurm_site``), stops daemons by pid and starts them
again with the cluster's helpers (``kill_daemon``, ``restart_daemon``). What each must show, in
counts: no job lost, none submitted (or started) twice, system faults requeued and not failed.
Slow on purpose: Slurm notices a dead node after ``SlurmdTimeout`` (30 s), and an outage is ~30 s.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import pytest

from devices.executors import get_executor
from devices.executors import slurm as slurm_executor
from devices.executors.slurm import run, squeue
from scheduling.models import Job
from scheduling.services.jobs import cancel_job
from tests.test_lifecycle_harness import node_of, tick
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _slurm_runs() -> Counter[int]:
    """How many Slurm jobs each portal job has had, by the comments Slurm remembers (``squeue -t all``)."""
    return Counter(q.portal_run[0] for q in squeue(every_state=True).values() if q.portal_run is not None)


def _observe_until(jobs: list[Job], done: Any, timeout: float = 240) -> list[Job]:
    def observed() -> list[Job]:
        get_executor().observe()
        return [_reload(j) for j in jobs]

    return wait_for(observed, until=done, interval=1.0, timeout=timeout, message="the jobs to reach their state")


def _running_in_slurm(job: Job) -> Job:
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING and job.agent_job_id.isdigit(), (job.state, job.pending_reason)
    wait_for(lambda: squeue().get(job.agent_job_id), until=lambda q: q is not None and q.state == "RUNNING")
    return job


def test_the_controller_away_for_30_s_loses_nothing_and_starts_nothing_twice(own_slurm_site, submit_slurm) -> None:
    cluster = own_slurm_site
    before = _running_in_slurm(submit_slurm("sleep 90", name="before"))
    cluster.kill_daemon("slurmctld")
    stopped = time.monotonic()
    during = [submit_slurm("sleep 3", name=f"during-{i}") for i in range(3)]
    tick()  # the portal starts them; their sbatch cannot reach the controller
    for job in during:
        job = _reload(job)
        assert (job.state, job.agent_job_id) == (Job.State.RUNNING, ""), "started in the portal, not yet in Slurm"
        assert job.events.filter(reason="LaunchFailed").count() == 1
    # The worker's poll goes on while the controller is away: it changes nothing.
    observed = wait_for(
        lambda: (get_executor().observe(), time.monotonic() - stopped)[0],
        until=lambda _: time.monotonic() - stopped >= 30,
        interval=1.0,
        timeout=120,
    )
    assert observed.failed == 1 and "slurm" in observed.errors
    assert _reload(before).state == Job.State.RUNNING
    cluster.restart_daemon("slurmctld")
    print(f"\ncontroller away {time.monotonic() - stopped:.0f} s")

    # It catches up by itself: the next observations submit the three runs, once each.
    ended = _observe_until(during, lambda jobs: all(j.state == Job.State.COMPLETED for j in jobs))
    runs = _slurm_runs()
    lost = [j.pk for j in ended if j.state != Job.State.COMPLETED]
    twice = [pk for pk, n in runs.items() if n > 1]
    print(f"lost {len(lost)}, submitted twice {len(twice)}, runs {dict(runs)}")
    assert (lost, twice) == ([], [])
    assert [runs[j.pk] for j in during] == [1, 1, 1]
    before = _reload(before)
    assert before.state == Job.State.RUNNING and squeue()[before.agent_job_id].state == "RUNNING", "kept running"
    assert runs[before.pk] == 1
    cancel_job(before.pk, actor=None)


def test_a_killed_slurmd_ends_its_jobs_node_fail_and_they_are_requeued(own_slurm_site, submit_slurm) -> None:
    cluster = own_slurm_site
    jobs = [_running_in_slurm(submit_slurm("sleep 300", devices=2, name=f"on-node-{i}")) for i in range(2)]
    victim = node_of(jobs[0])
    on_victim = [j for j in jobs if node_of(j) == victim]
    cluster.kill_daemon(f"slurmd-{victim}", signal.SIGKILL)
    # Slurm notices after SlurmdTimeout (30 s): it has the node down and ends the node's jobs NODE_FAIL (they
    # are not requeued by Slurm: the portal submits with --no-requeue and requeues them itself). Whichever the
    # portal reads first requeues them: the jobs' end (``NodeFail``) or the node down (``NodeUnreachable``,
    # as for an agent's node gone); on a loaded machine either comes first. The retry is not counted.
    after = _observe_until(on_victim, lambda js: all(j.state != Job.State.RUNNING for j in js))
    requeued = [
        j
        for j in after
        if j.state == Job.State.PENDING and j.pending_reason in ("NodeFail", "NodeUnreachable") and j.retries == 0
    ]
    failed = [j for j in after if j.is_final]
    print(f"\nslurmd of {victim} killed: {len(on_victim)} job(s) there, requeued {len(requeued)}, failed {len(failed)}")
    assert (len(requeued), failed) == (len(on_victim), []), [(j.state, j.pending_reason, j.retries) for j in after]
    for job, slurm_id in zip(after, [j.agent_job_id for j in on_victim], strict=True):
        detail = job.events.last().detail
        assert "NODE_FAIL" in detail or f"Slurm has node {victim} down" in detail, detail
        wait_for(
            lambda slurm_id=slurm_id: run(["sacct", "-X", "-n", "-P", "-o", "State", "-j", slurm_id]).strip(),
            until=lambda state: state == "NODE_FAIL",
            interval=1.0,
            timeout=120,
            message="Slurm's accounting to say NODE_FAIL",
        )
    for job in jobs:
        if job not in on_victim:
            assert _reload(job).state == Job.State.RUNNING, "a job on another node runs on"


class WorkerDied(BaseException):
    """The worker process dying between Slurm's answer and the database's commit."""


def test_a_worker_dying_between_sbatch_and_its_commit_submits_nothing_twice(
    slurm_site, submit_slurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = submit_slurm("sleep 30", name="once")
    monkeypatch.setattr("scheduling.executor_tasks.queue_launches", lambda ids: None)  # the tick's launch: by hand
    tick()
    assert _reload(job).state == Job.State.RUNNING

    real_submit = slurm_executor._submit

    def submit_then_die(sub: slurm_executor.Submission) -> str:
        real_submit(sub)
        raise WorkerDied

    monkeypatch.setattr(slurm_executor, "_submit", submit_then_die)
    with pytest.raises(WorkerDied):
        get_executor().launch([job.pk])
    assert _reload(job).agent_job_id == "", "the commit never happened"
    assert _slurm_runs()[job.pk] == 1, "but Slurm has the run"
    monkeypatch.setattr(slurm_executor, "_submit", real_submit)

    # The retry (another worker's launch, then the poll's relaunch) finds the run by its comment.
    assert get_executor().launch([job.pk]) == {job.pk: True}
    assert get_executor().launch([job.pk]) == {job.pk: True}, "the start path twice for the same attempt"
    summary = get_executor().observe()
    job = _reload(job)
    runs = _slurm_runs()
    print(f"\nworker died mid-submission: Slurm jobs for job {job.pk}: {runs[job.pk]}, relaunched {summary.relaunched}")
    assert runs[job.pk] == 1 and job.agent_job_id.isdigit()
    assert summary.relaunched == [] and summary.stale_stopped == []
    assert [q.slurm_id for q in squeue().values() if q.portal_run == (job.pk, 1)] == [job.agent_job_id]
    cancel_job(job.pk, actor=None)
