"""Multi-node jobs and job arrays on a real Slurm cluster through the portal's tick (``NPUPORTAL_EXECUTOR=slurm``).

A job the engine places on two whole servers is one Slurm job with one task on each: an ``sbatch
--nodes=2`` where both nodes take the same ``--gres``, a heterogeneous job where they do not (a
node with exact cards beside one with a count). Each node's process gets the rendezvous the agents
give (``NODE_RANK``, ``RANK_TABLE_FILE``…) and its own cards; each node's output is read through the
API as the agents keep it, per node. An array's copies each get their index.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from devices.executors import get_executor
from devices.executors.slurm import (
    _submission,
    _submit,
    cards_given,
    ended_jobs,
    failed_part,
    node_layouts,
    run,
    run_output,
    squeue,
)
from devices.models import Device, Node
from devices.slurm.commands import expand_hostlist
from quotas.models import Team
from scheduling.models import Allocation, Job
from scheduling.services.jobs import JobSpec, cancel_job, submit_array
from tests.slurm.conftest import COUNT_NODE
from tests.test_lifecycle_harness import open_devices, tick, without_reservation
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: What each node's process prints: who it is in the job, and the rank table it was given.
REPORT = (
    'echo "node=$SLURMD_NODENAME rank=$NODE_RANK/$NNODES world=$WORLD_SIZE per_node=$NPROC_PER_NODE '
    'cards=$ASCEND_RT_VISIBLE_DEVICES master=$MASTER_ADDR:$MASTER_PORT run=$NPUPORTAL_JOB_ID"; '
    "python3 -c \"import json, os; t = json.load(open(os.environ['RANK_TABLE_FILE'])); "
    "print('table', t['server_count'], [[d['device_id'] for d in s['device']] for s in t['server_list']])\""
)
ALL_CARDS = ",".join(str(c) for c in range(8))
TABLE = f"table 2 {[[str(c) for c in range(8)]] * 2}"


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _on_two_nodes(submit_slurm: Any, command: str, *, left_out: str) -> Job:
    """A 16-card job (two whole 8-card servers) started by the tick on the two nodes other than ``left_out``."""
    without_reservation()
    Node.objects.filter(name=left_out).update(state=Node.State.CORDONED)
    job = submit_slurm(command, devices=16, name="two-nodes")
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING, (job.state, job.pending_reason, job.pending_detail)
    assert job.agent_job_id.isdigit(), job.agent_job_id
    return job


def _nodes(job: Job) -> list[str]:
    return sorted({d.node.name for d in open_devices(job)})


def _log(api: Any, job: Job, node: str | None = None) -> str:
    lead = get_user_model().objects.get(username="lead-training")
    resp = api(lead).get(f"/api/v1/jobs/{job.pk}/log/" + (f"?node={node}" if node else ""))
    assert resp.status_code == 200, resp.content
    return str(resp.json()["data"])


def _processes_of(run_id: str) -> list[int]:
    """The processes of a run on this host (every test node is this host): those with its ``NPUPORTAL_JOB_ID``."""
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"\0NPUPORTAL_JOB_ID={run_id}\0".encode() in b"\0" + environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def _observe_until(job: Job, states: set[str]) -> Job:
    def observed() -> Job:
        get_executor().observe()
        return _reload(job)

    return wait_for(observed, until=lambda j: j.state in states, interval=0.5, timeout=120, message=f"job {job.pk}")


def test_a_two_node_job_runs_one_task_on_each_decided_node_with_its_rank(slurm_site, submit_slurm, api) -> None:
    job = _on_two_nodes(submit_slurm, REPORT, left_out=COUNT_NODE)
    first, second = nodes = _nodes(job)
    queued = wait_for(
        lambda: squeue().get(job.agent_job_id),
        until=lambda q: q is not None and q.state in {"RUNNING", "COMPLETING"},
        message=f"Slurm job {job.agent_job_id} to run",
    )
    assert sorted(expand_hostlist(queued.nodes)) == nodes, "one Slurm job on both decided nodes"
    assert cards_given(job.agent_job_id) == {first: list(range(8)), second: list(range(8))}
    assert "NumNodes=2 NumCPUs=2 NumTasks=2" in run(["scontrol", "show", "job", job.agent_job_id])

    job = _observe_until(job, {Job.State.COMPLETED, Job.State.FAILED})
    assert job.state == Job.State.COMPLETED, job.events.last().detail
    run_id = f"{job.pk}.1"
    for rank, node in enumerate(nodes):
        lines = _log(api, job, node).splitlines()
        assert lines[0].startswith(f"node={node} rank={rank}/2 world=16 per_node=8 cards={ALL_CARDS} master=")
        assert lines[0].endswith(f" run={run_id}")
        assert lines[1] == TABLE, "every node reads the rank table listing both nodes"
    assert _log(api, job) == _log(api, job, first), "the first node's output by default, as the agents'"


def test_a_part_that_fails_fails_the_job_naming_its_node(slurm_site, submit_slurm, api) -> None:
    # Node rank 1 fails once node rank 0 has said who it is (else it might be ended before it has).
    waits = f'until grep -q table "{slurm_site.root}/out/$NPUPORTAL_JOB_ID.out"; do sleep 0.2; done; exit 3'
    job = _on_two_nodes(
        submit_slurm, REPORT + f'; if [ "$NODE_RANK" = 1 ]; then {waits}; fi; sleep 300', left_out=COUNT_NODE
    )
    job = _observe_until(job, {Job.State.COMPLETED, Job.State.FAILED})
    event = job.events.last()
    assert (job.state, job.exit_code, event.reason) == (Job.State.FAILED, 3, "NonZeroExit")
    assert event.detail == "on ascend-b4-02: exit code 3", "as the agents name the part that failed"
    assert _log(api, job).endswith("npuportal: the part on ascend-b4-02 failed (exit code 3)\n")
    assert job.allocations.filter(end__isnull=True).count() == 0


def test_a_heterogeneous_two_node_job_is_cancelled_on_both_nodes(slurm_site, submit_slurm, api) -> None:
    """Exact cards on one node, a count on the other: two ``--gres``, so one component per node (``hetjob``)."""
    job = _on_two_nodes(submit_slurm, REPORT + "; sleep 300", left_out="ascend-b4-02")
    nodes = _nodes(job)
    assert nodes == ["ascend-b4-01", COUNT_NODE]
    for rank, node in enumerate(nodes):  # both started, each on its own cards (the count node's read back)
        wait_for(
            lambda node=node: _log(api, job, node),
            until=lambda text: "table" in text,
            interval=0.5,
            timeout=120,
            message=f"the part on {node} to start",
        )
        assert _log(api, job, node).startswith(f"node={node} rank={rank}/2 world=16 per_node=8 cards={ALL_CARDS} ")
    details = run(["scontrol", "show", "job", "-d", job.agent_job_id])
    assert "HetJobOffset=1" in details, "a heterogeneous job: one component per node"
    assert cards_given(job.agent_job_id) == {node: list(range(8)) for node in nodes}
    assert sorted(expand_hostlist(squeue()[job.agent_job_id].nodes)) == nodes

    assert len(_processes_of(f"{job.pk}.1")) >= 2, "a process on each node"
    cancel_job(job.pk, actor=None)
    assert _reload(job).state == Job.State.CANCELLED
    wait_for(
        lambda: run(["squeue", "-h", "-o", "%i", "-j", job.agent_job_id]).split(),
        until=lambda ids: not ids,
        interval=0.5,
        message=f"every component of Slurm job {job.agent_job_id} to be gone",
    )
    wait_for(
        lambda: _processes_of(f"{job.pk}.1"),
        until=lambda pids: not pids,
        interval=0.5,
        message=f"every process of run {job.pk}.1, on both nodes, to be gone",
    )
    assert job.allocations.filter(end__isnull=True).count() == 0, "its cards on both nodes are free"
    assert get_executor().observe().stale_stopped == []


def test_different_cards_on_each_node_and_a_failing_part_ends_every_part(slurm_site, submit_slurm) -> None:
    """Cards 1 and 2 of one node, card 5 of another: a heterogeneous job, each node on exactly its cards.

    The run is submitted as the launch would submit it for such a placement (the engine gives a
    multi-node job whole servers); the part on node rank 1 exits 3, and the part still sleeping on
    node rank 0 is ended with it (``srun --kill-on-bad-exit``): the run fails with exit code 3.
    """
    chosen = {"ascend-b4-01": [1, 2], "ascend-b4-02": [5]}
    # Node rank 1 fails once node rank 0 has said who it is (else it might be ended before it has).
    waits = f'until grep -q table "{slurm_site.root}/out/$NPUPORTAL_JOB_ID.out"; do sleep 0.2; done; exit 3'
    job = submit_slurm(REPORT + f'; if [ "$NODE_RANK" = 1 ]; then {waits}; fi; sleep 300', devices=3, name="uneven")
    outputs = [run_output(job, 1, node, first=rank == 0) for rank, node in enumerate(chosen)]
    allocs = [
        Allocation(job=job, device=Device.objects.select_related("node").get(node__name=node, index=index))
        for node, indexes in chosen.items()
        for index in indexes
    ]
    sub = _submission(job, 1, allocs, node_layouts())
    assert sub.script.count("#SBATCH hetjob") == 1
    slurm_id = _submit(sub)
    wait_for(
        lambda: [path.read_text() if path.exists() else "" for path in outputs],
        until=lambda texts: all("table" in text for text in texts),
        interval=0.5,
        timeout=120,
        message="both parts to start",
    )
    first, second = (path.read_text().splitlines() for path in outputs)
    assert first[0].startswith("node=ascend-b4-01 rank=0/2 world=3 per_node=2 cards=1,2 ")
    assert second[0].startswith("node=ascend-b4-02 rank=1/2 world=3 per_node=1 cards=5 ")
    assert first[1] == second[1] == "table 2 [['1', '2'], ['5']]"
    ended = wait_for(
        lambda: ended_jobs([slurm_id]).get(slurm_id),
        # slurmdbd records a heterogeneous job's second component a moment after its first.
        until=lambda e: e is not None and sorted(expand_hostlist(e.nodes)) == sorted(chosen),
        interval=0.5,
        timeout=120,
        message=f"Slurm job {slurm_id} to end with its failing part",
    )
    assert (ended.base_state, ended.code) == ("FAILED", 3)
    assert outputs[0].read_text().endswith("npuportal: the part on ascend-b4-02 failed (exit code 3)\n")
    assert failed_part(job.pk, 1) == "ascend-b4-02", "the job's end names it: on ascend-b4-02: exit code 3"


def test_each_copy_of_an_array_sees_its_index(slurm_site, api) -> None:
    lead = get_user_model().objects.get(username="lead-training")
    spec = JobSpec(
        name="sweep",
        command='echo "index=$SLURM_ARRAY_TASK_ID of $SLURM_ARRAY_TASK_COUNT npuportal=$NPUPORTAL_ARRAY_INDEX"',
        num_devices=1,
        chip_model="910B4",
        estimated_duration_s=60,
    )
    copies = submit_array(team=Team.objects.get(name="training"), user=lead, spec=spec, count=3)
    tick()
    for copy in copies:
        copy = _observe_until(copy, {Job.State.COMPLETED, Job.State.FAILED})
        assert copy.state == Job.State.COMPLETED, copy.events.last().detail
        index = copy.array_index
        assert _log(api, copy) == f"index={index} of 3 npuportal={index}\n"
