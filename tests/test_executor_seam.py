"""What runs jobs is chosen by ``NPUPORTAL_EXECUTOR`` and reached only through ``get_executor()``."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

from devices import executors
from devices import tasks as device_tasks
from devices.executors import CANCEL_GRACE_S, EVICT_GRACE_S, Executor, Observation, ServedNode, get_executor
from devices.executors.agents import AgentExecutor
from scheduling import executor_tasks


class FakeExecutor:
    """A second executor: it records what the portal asks of it."""

    name = "fake"
    calls: list[tuple[object, ...]] = []

    def launch(self, job_ids: Iterable[int]) -> dict[int, bool]:
        ids = list(job_ids)
        self.calls.append(("launch", ids))
        return dict.fromkeys(ids, True)

    def stop(self, job_id: int, *, grace_s: float, cause: str) -> None:
        self.calls.append(("stop", job_id, grace_s, cause))

    def observe(self) -> Observation:
        self.calls.append(("observe",))
        return Observation(polled=2, finished=[7])

    def inventory(self) -> list[ServedNode]:
        return [ServedNode("f1", (0, 1))]

    #: What ``set_node_service`` answers: ``None`` when done, else what failed (as Slurm refusing it).
    refusal: str | None = None

    def set_node_service(self, node: str, *, in_service: bool, reason: str) -> str | None:
        self.calls.append(("set_node_service", node, in_service, reason))
        return self.refusal


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, settings) -> FakeExecutor:
    monkeypatch.setitem(executors.EXECUTORS, "fake", f"{__name__}.FakeExecutor")
    settings.NPUPORTAL_EXECUTOR = "fake"
    executors._executor.cache_clear()
    FakeExecutor.calls = []
    FakeExecutor.refusal = None
    yield get_executor()  # type: ignore[misc]
    executors._executor.cache_clear()


def test_the_agents_are_the_default_executor(settings) -> None:
    settings.NPUPORTAL_EXECUTOR = "agents"
    executor = get_executor()
    assert isinstance(executor, AgentExecutor) and isinstance(executor, Executor)
    assert executor.name == "agents"


def test_an_unknown_executor_is_named_in_the_error(settings) -> None:
    settings.NPUPORTAL_EXECUTOR = "nope"
    with pytest.raises(ValueError, match=r"nope.*agents"):
        get_executor()


def test_the_portal_reaches_only_the_executor_the_settings_name(fake: FakeExecutor) -> None:
    assert isinstance(fake, Executor)
    assert executor_tasks.launch_job(5) is True
    executor_tasks.stop_job(5, "Cancelled")
    executor_tasks.stop_job(6, "Preempted")
    assert FakeExecutor.calls == [
        ("launch", [5]),
        ("stop", 5, CANCEL_GRACE_S, "Cancelled"),
        ("stop", 6, EVICT_GRACE_S, "Preempted"),
    ]


def test_the_poll_task_observes_through_the_executor(fake: FakeExecutor) -> None:
    result = device_tasks.poll_agents()
    assert FakeExecutor.calls == [("observe",)]
    assert result["polled"] == 2 and result["finished"] == 1


def test_an_unknown_executor_is_reported_by_the_system_checks(settings) -> None:
    from django.core.management import call_command
    from django.core.management.base import SystemCheckError

    from devices.checks import UNKNOWN_EXECUTOR, check_executor

    settings.NPUPORTAL_EXECUTOR = "slrum"
    [error] = check_executor()
    assert error.id == UNKNOWN_EXECUTOR
    assert error.msg == "NPUPORTAL_EXECUTOR='slrum' names no executor"
    assert error.hint == "set NPUPORTAL_EXECUTOR to one of: agents, slurm (default agents)"
    with pytest.raises(SystemCheckError, match=r"devices\.E001.*'slrum' names no executor"):
        call_command("check")
    settings.NPUPORTAL_EXECUTOR = "slurm"
    assert check_executor() == []


@pytest.mark.django_db(transaction=True)
def test_cordon_drain_and_uncordon_are_told_to_the_executor_after_the_commit(fake: FakeExecutor) -> None:
    from devices.models import Node
    from devices.services.operations import cordon_node, drain_node, uncordon_node

    Node.objects.create(name="f1")
    cordon_node("f1", actor=None, reason="replace fan")
    cordon_node("f1", actor=None)  # no change: nothing told
    uncordon_node("f1", actor=None)
    drain_node("f1", actor=None)
    drain_node("f1", actor=None, by_executor=True)  # already drained
    uncordon_node("f1", actor=None, by_executor=True)  # the executor asked: not told back
    assert FakeExecutor.calls == [
        ("set_node_service", "f1", False, "cordon: replace fan"),
        ("set_node_service", "f1", True, "uncordon"),
        ("set_node_service", "f1", False, "drain"),
    ]
    drain_node("f1", actor=None, by_executor=True, reason="Slurm: bad fan")
    assert Node.objects.get(name="f1").state_from_executor, "the executor's drain is marked as the executor's"
    assert len(FakeExecutor.calls) == 3


@pytest.mark.django_db(transaction=True)
def test_a_cordon_the_executor_refuses_is_a_warning_and_still_exit_code_0(fake: FakeExecutor) -> None:
    from io import StringIO

    from django.core.management import call_command

    from devices.models import Node

    Node.objects.create(name="f1")
    FakeExecutor.refusal = "could not drain node f1 in Slurm: scontrol: slurm_update error: Invalid node name"
    out, err = StringIO(), StringIO()
    call_command("nodes", "cordon", "f1", stdout=out, stderr=err)  # returns: exit code 0
    assert out.getvalue() == "node f1: ready → cordoned\n"
    assert err.getvalue() == (
        "warning: could not drain node f1 in Slurm: scontrol: slurm_update error: Invalid node name; "
        "the node is cordoned in the portal all the same\n"
    )
    assert Node.objects.get(name="f1").state == Node.State.CORDONED
