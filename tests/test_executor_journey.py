"""One job journey, run on each executor: real node agents, and a real Slurm cluster.

The journey (each step one test below, the same code on both executors):

1. a submitted job runs on the cards the portal decided, as the executor itself reports them
   (agents: the agent's record of the run; Slurm: ``scontrol show job -d``, ``IDX``), is told
   them (``ASCEND_RT_VISIBLE_DEVICES``), its output reads through ``GET /api/v1/jobs/{id}/log/``,
   and its exit code 3 fails it with ``exit code 3``;
2. a cancel ends a running job ``cancelled`` and its run leaves the executor;
3. a higher priority class job on a full cluster preempts a running one: the victim runs on through
   the policy's grace, then gets SIGTERM and is queued again keeping its place, and runs again
   once the cards are free;
4. a job past its time limit ends ``timeout`` and leaves the executor;
5. each element of an array sees its own index;
6. a multi-node job runs a part on each node, each on its node's cards;
7. cards held by a job the portal did not submit are never given, and that job is left alone.

What differs is in a small adapter per executor (:class:`AgentSite`, :class:`SlurmSite`): how the
site starts, how it is observed (the worker's poll), how a run's cards are read and whether the
run is still there. One site per executor per module: the agent processes are started once and the
Slurm cluster is the session's (``slurm_cluster``); the database is the demo's, afresh for each step.
A step an executor does not do yet is listed in :data:`NOT_YET` (deleting its line switches it on).
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from devices.models import Node
from scheduling.models import Job
from scheduling.services.jobs import cancel_job
from scheduling.services.walltime import enforce_walltime
from tests.test_lifecycle_harness import NODE_A, NODE_B, Agent, eager_celery, open_devices, tick
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["eager_celery"]  # a fixture, imported for pytest

EXECUTORS = ("agents", "slurm")

#: ``(executor, step)`` → why that executor skips the step. Delete a line to switch its step on.
NOT_YET: dict[tuple[str, str], str] = {
    ("agents", "foreign"): "the agents run only the portal's jobs: a node agent has no notion of a job it did not "
    "start, so there are no foreign cards to leave alone",
}

#: The preemption grace of the journey's policy: long enough to see the victim run on through it.
GRACE_S = 3


def not_yet(site: Site, step: str) -> None:
    """Skip ``step`` on an executor that does not do it yet (:data:`NOT_YET`)."""
    reason = NOT_YET.get((site.name, step))
    if reason:
        pytest.skip(f"{site.name}: {reason}")


# --------------------------------------------------------------------------------------------------
# the executors


class Site:
    """What the journey needs of one executor; the portal side (tick, cancel, API) is the same for both."""

    name = ""
    #: The 910B4 nodes this executor serves.
    nodes: tuple[str, ...] = ()

    def open(self, settings: Any) -> None:
        """Point the demo site (fresh for each test) at this executor."""

    def clear(self) -> None:
        """Stop every run a test left, so the next starts on an idle executor."""

    def observe(self) -> None:
        """What the worker's poll does: reconcile what runs with the database."""
        from devices.executors import get_executor

        get_executor().observe()

    def running(self, job: Job) -> None:
        """Wait until the executor runs the job's current run."""
        raise NotImplementedError

    def cards(self, job: Job) -> dict[str, list[int]]:
        """The cards the executor itself says the job's current run got, by node."""
        raise NotImplementedError

    def gone(self, job: Job) -> bool:
        """Whether the job's current run no longer runs on the executor."""
        raise NotImplementedError

    def outside_job(self, node: str, cards: list[int]) -> str:
        """Start a job on ``node``'s ``cards`` without the portal, once it runs; its id (see NOT_YET)."""
        raise NotImplementedError

    def outside_runs(self, outside: str) -> bool:
        """Whether that job still runs."""
        raise NotImplementedError


class AgentSite(Site):
    """The demo's two 910B4 nodes, each with a real agent process (``tests.test_lifecycle_harness.Agent``)."""

    name = "agents"
    nodes = (NODE_A, NODE_B)

    def __init__(self, base: Path) -> None:
        self.agents = {name: Agent(base, name) for name in self.nodes}

    def start(self) -> None:
        for agent in self.agents.values():
            agent.start()

    def shut(self) -> None:
        for agent in self.agents.values():
            agent.kill(signal.SIGTERM)
            agent.kill_leftover_jobs()

    def open(self, settings: Any) -> None:
        for name, agent in self.agents.items():
            Node.objects.filter(name=name).update(agent_url=agent.url, agent_token=agent.token)

    def clear(self) -> None:
        for agent in self.agents.values():
            live = [run for run, r in agent.jobs().items() if r["state"] in {"running", "stopping"}]
            for run in live:
                agent.call("DELETE", f"/v1/jobs/{run}?grace=1&reason=test+over")
            for run in live:
                agent.wait_job(run, {"succeeded", "failed", "killed"})

    def observe(self) -> None:
        from devices.executors.agents import poll_all

        poll_all()

    def _records(self, job: Job) -> dict[str, dict[str, Any]]:
        found = {name: agent.jobs().get(job.agent_job_id) for name, agent in self.agents.items()}
        return {name: record for name, record in found.items() if record is not None}

    def running(self, job: Job) -> None:
        for name in sorted({d.node.name for d in open_devices(job)}):
            self.agents[name].wait_job(job.agent_job_id, {"running"})

    def cards(self, job: Job) -> dict[str, list[int]]:
        return {name: sorted(record["devices"]) for name, record in self._records(job).items()}

    def gone(self, job: Job) -> bool:
        return all(r["state"] not in {"running", "stopping"} for r in self._records(job).values())


class SlurmSite(Site):
    """The session's Slurm test cluster (tests/slurm/conftest.py): three 910B4 nodes, exact cards on two."""

    name = "slurm"
    nodes = ("ascend-b4-01", "ascend-b4-02", "ascend-b4-03")

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def open(self, settings: Any) -> None:
        from tests.slurm.conftest import _site

        _site(self.cluster, settings)

    def clear(self) -> None:
        from devices.executors.slurm import run, squeue

        left = list(squeue())
        if left:
            run(["scancel", *left])
            wait_for(lambda: not squeue(), message=f"Slurm jobs {', '.join(left)} to be gone")

    def running(self, job: Job) -> None:
        from devices.executors.slurm import squeue

        assert job.agent_job_id.isdigit(), f"Slurm's job id is kept on the job, not {job.agent_job_id!r}"
        wait_for(
            lambda: squeue().get(job.agent_job_id),
            until=lambda q: q is not None and q.state == "RUNNING",
            message=f"Slurm job {job.agent_job_id} to run",
        )

    def cards(self, job: Job) -> dict[str, list[int]]:
        from devices.executors.slurm import cards_given

        return cards_given(job.agent_job_id)

    def gone(self, job: Job) -> bool:
        from devices.executors.slurm import squeue

        return job.agent_job_id not in squeue()

    def outside_job(self, node: str, cards: list[int]) -> str:
        from tests.slurm.conftest import outside_job

        return outside_job(node, cards)  # sbatch'ed directly, without the portal's comment

    def outside_runs(self, outside: str) -> bool:
        from devices.executors.slurm import squeue

        found = squeue().get(outside)
        return found is not None and found.state == "RUNNING"


@pytest.fixture(scope="module", params=EXECUTORS)
def executor_site(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    """One site per executor for the whole module: the agents started once, or the session's Slurm cluster."""
    if request.param == "agents":
        agents = AgentSite(tmp_path_factory.mktemp("agents"))
        try:
            agents.start()
            yield agents
        finally:
            agents.shut()
    else:
        yield SlurmSite(request.getfixturevalue("slurm_cluster"))


@pytest.fixture
def site(executor_site: Site, demo, eager_celery, settings: Any) -> Iterator[Site]:
    """The demo site on the module's executor, with the journey's policy; every run stopped afterwards."""
    executor_site.open(settings)
    _journey_policy()
    try:
        yield executor_site
    finally:
        executor_site.clear()


def _journey_policy() -> None:
    """The demo policy without its reservation (every 910B4 card usable) and with a short preemption grace."""
    from quotas.models import Policy
    from quotas.policies.versions import active_policy, create_version

    text = Policy.objects.get(version=active_policy().version).yaml_text
    kept = [line for line in text.splitlines() if "online-inference" not in line]
    text = "\n".join(kept).replace("reservations:\n", "reservations: []\n")
    assert "gracePeriod: 30s" in text
    text = text.replace("gracePeriod: 30s", f"gracePeriod: {GRACE_S}s")
    create_version(text, author=None, comment="the executor journey")


@pytest.fixture
def submit(demo) -> Callable[..., Job]:
    """Submit a 910B4 job as the demo's training lead, in the priority class given (the policy's default else)."""
    from quotas.models import Team
    from scheduling.services.jobs import JobSpec, submit_job

    team = Team.objects.get(name="training")

    def make(command: str, devices: int = 1, max_duration_s: int | None = None, **fields: Any) -> Job:
        spec = JobSpec(
            name=fields.pop("name", "job"),
            command=command,
            num_devices=devices,
            chip_model="910B4",
            estimated_duration_s=1 if max_duration_s else 60,
            max_duration_s=max_duration_s,
            **fields,
        )
        return submit_job(team=team, user=_lead(), spec=spec)

    return make


# --------------------------------------------------------------------------------------------------
# the portal side, the same on every executor


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def _lead() -> Any:
    return get_user_model().objects.get(username="lead-training")


def _started(site: Site, job: Job) -> Job:
    """Tick; the job runs in the database and on the executor."""
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING, (job.state, job.pending_reason, job.pending_detail)
    site.running(job)
    return job


def _observe_until(site: Site, job: Job, states: set[str], *, each: Callable[[], Any] | None = None) -> Job:
    def observed() -> Job:
        site.observe()
        if each is not None:
            each()
        return _reload(job)

    return wait_for(
        observed, until=lambda j: j.state in states, interval=0.3, timeout=90, message=f"job {job.pk} in {states}"
    )


def _decided(job: Job) -> dict[str, list[int]]:
    """The cards the portal decided, by node (the job's open allocations)."""
    found: dict[str, list[int]] = {}
    for device in open_devices(job):
        found.setdefault(device.node.name, []).append(device.index)
    return {node: sorted(cards) for node, cards in found.items()}


def _log(api: Any, job_id: int, **query: Any) -> dict[str, Any]:
    resp = api(_lead()).get(f"/api/v1/jobs/{job_id}/log/", query)
    assert resp.status_code == 200, resp.content
    body: dict[str, Any] = resp.json()
    return body


def _own_lines(text: str) -> list[str]:
    """The job's own output lines: without the line Slurm's step daemon adds when a run is signalled or cancelled
    (``slurmstepd: error: *** JOB 7 ON ascend-b4-01 CANCELLED AT …``)."""
    return [line for line in text.splitlines() if not line.startswith("slurmstepd")]


def _only(node: str) -> None:
    """Only ``node`` takes work (the other nodes cordoned in the portal): a full node is a full cluster."""
    Node.objects.exclude(name=node).update(state=Node.State.CORDONED)


# --------------------------------------------------------------------------------------------------
# the journey


def test_runs_on_the_decided_cards_its_output_reads_back_and_exit_code_3_fails_it(site, submit, api) -> None:
    job = submit('echo "cards=$ASCEND_RT_VISIBLE_DEVICES run=$NPUPORTAL_JOB_ID"; sleep 3; exit 3', devices=2)
    job = _started(site, job)
    decided = _decided(job)
    assert len(decided) == 1 and len(next(iter(decided.values()))) == 2, decided
    assert site.cards(job) == decided, "the executor runs it on exactly the cards the portal chose"

    job = _observe_until(site, job, {Job.State.FAILED, Job.State.COMPLETED})
    assert (job.state, job.exit_code) == (Job.State.FAILED, 3)
    event = job.events.last()
    assert (event.reason, event.detail) == ("NonZeroExit", "exit code 3")
    assert job.allocations.filter(end__isnull=True).count() == 0

    output = _log(api, job.pk)
    cards = ",".join(map(str, next(iter(decided.values()))))
    assert output["data"] == f"cards={cards} run={job.pk}.1\n"
    assert output["complete"] is True


def test_a_cancel_ends_it_cancelled_and_its_run_leaves_the_executor(site, submit, api) -> None:
    job = _started(site, submit("echo begun; sleep 300"))
    wait_for(lambda: "begun" in _log(api, job.pk)["data"], message=f"job {job.pk} to begin")
    cancel_job(job.pk, actor=None, reason="not needed")
    assert _reload(job).state == Job.State.CANCELLED
    wait_for(lambda: site.gone(job), message=f"the run of job {job.pk} to leave {site.name}")
    site.observe()
    job = _reload(job)
    assert job.state == Job.State.CANCELLED
    assert job.events.last().reason == "Cancelled"
    assert job.allocations.filter(end__isnull=True).count() == 0
    output = _log(api, job.pk)
    assert _own_lines(output["data"]) == ["begun"]
    assert output["complete"] is True


def test_a_higher_class_preempts_after_its_grace_with_sigterm_and_the_victim_keeps_its_place(site, submit, api) -> None:
    node = site.nodes[0]
    _only(node)
    trap = "trap 'echo got SIGTERM; exit 143' TERM; echo started; sleep 300 & wait"
    victim = _started(site, submit(trap, devices=8, name="victim", priority_class="low"))
    first_run = victim.agent_job_id
    wait_for(lambda: "started" in _log(api, victim.pk)["data"], message="the victim to set its trap")
    submitted_at = victim.submitted_at
    later = submit("echo later", devices=8, name="later", priority_class="low")

    urgent = submit("echo urgent", devices=2, name="urgent", priority_class="high")
    assert victim.pk in tick().preempted
    victim = _reload(victim)
    assert victim.state == Job.State.RUNNING and victim.preempt_deadline is not None, "it runs on through its grace"
    assert not site.gone(victim)

    wait_for(lambda: victim.pk in tick().evicted, interval=0.5, message=f"the grace of job {victim.pk} to end")
    victim = _reload(victim)
    assert (victim.state, victim.pending_reason) == (Job.State.PENDING, "Preempted")
    assert victim.submitted_at == submitted_at, "queued again keeping its place (its submit time)"
    first = _log(api, victim.pk, attempt=1)
    assert _own_lines(first["data"]) == ["started", "got SIGTERM"], "the victim was sent SIGTERM"
    assert first["complete"] is True

    urgent = _reload(urgent)
    assert urgent.state in {Job.State.RUNNING, Job.State.COMPLETED}, (urgent.state, urgent.pending_reason)
    _observe_until(site, urgent, {Job.State.COMPLETED})

    victim = _observe_until(site, victim, {Job.State.RUNNING}, each=tick)
    assert _reload(later).state == Job.State.PENDING, "the victim went first: it kept its place ahead of a later job"
    site.running(victim)
    assert victim.agent_job_id != first_run
    wait_for(lambda: _log(api, victim.pk), until=lambda o: o["data"] == "started\n", message="the second run")


def test_a_job_past_its_time_limit_ends_timeout_and_leaves_the_executor(site, submit) -> None:
    job = _started(site, submit("sleep 300", max_duration_s=2))
    job = _observe_until(site, job, {Job.State.TIMEOUT, Job.State.FAILED, Job.State.COMPLETED}, each=enforce_walltime)
    assert job.state == Job.State.TIMEOUT
    assert job.events.last().reason == "Walltime"
    assert job.allocations.filter(end__isnull=True).count() == 0
    wait_for(lambda: site.gone(job), message=f"the run of job {job.pk} to leave {site.name}")


def test_each_element_of_an_array_sees_its_index(site, api) -> None:
    body = {
        "name": "shard",
        "command": 'echo "task=$SLURM_ARRAY_TASK_ID index=$NPUPORTAL_ARRAY_INDEX of $NPUPORTAL_ARRAY_COUNT"',
        "team": "training",
        "num_devices": 1,
        "chip_model": "910B4",
        "estimated_duration_s": 60,
        "array": "1-3",
    }
    resp = api(_lead()).post("/api/v1/jobs/", body, format="json")
    assert resp.status_code == 201, resp.content
    ids = [c["id"] for c in resp.json()]

    def states() -> set[str]:
        site.observe()
        tick()
        return set(Job.objects.filter(pk__in=ids).values_list("state", flat=True))

    assert wait_for(states, until=lambda s: s <= {Job.State.COMPLETED, Job.State.FAILED}, interval=0.3) == {
        Job.State.COMPLETED
    }
    for index, job_id in enumerate(ids, start=1):
        assert _log(api, job_id)["data"] == f"task={index} index={index} of 3\n"


def test_a_multi_node_job_runs_a_part_on_each_node_on_its_cards(site, submit, api) -> None:
    not_yet(site, "multi_node")
    Node.objects.exclude(name__in=site.nodes[:2]).update(state=Node.State.CORDONED)
    job = _started(site, submit('echo "rank=$NODE_RANK cards=$ASCEND_RT_VISIBLE_DEVICES"; sleep 2', devices=16))
    decided = _decided(job)
    assert decided == {name: list(range(8)) for name in site.nodes[:2]}
    assert site.cards(job) == decided
    job = _observe_until(site, job, {Job.State.COMPLETED, Job.State.FAILED})
    assert job.state == Job.State.COMPLETED
    for rank, name in enumerate(site.nodes[:2]):
        assert _log(api, job.pk, node=name)["data"] == f"rank={rank} cards=0,1,2,3,4,5,6,7\n"


def test_cards_a_foreign_job_holds_are_never_given_and_that_job_is_left_alone(site, submit) -> None:
    not_yet(site, "foreign")
    node = site.nodes[0]
    _only(node)
    outside = site.outside_job(node, [0, 1])
    site.observe()
    job = _started(site, submit("sleep 300", devices=6))
    assert _decided(job) == {node: [2, 3, 4, 5, 6, 7]}
    assert site.cards(job) == {node: [2, 3, 4, 5, 6, 7]}
    site.observe()
    assert site.outside_runs(outside), "the portal leaves a job it did not submit alone"
    assert _reload(job).state == Job.State.RUNNING
