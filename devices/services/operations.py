"""Admin operations on nodes: cordon, drain, uncordon. Each one transaction with its audit event.

- cordon: no new work lands on the node; what runs there keeps running.
- drain: the same for the scheduler, and says the node is being emptied — running work
  finishes, then the node is ``drained`` (:mod:`devices.services.draining`) and can be serviced.
  Draining a node with nothing running drains it at once; draining a drained node changes nothing.
- uncordon: the node takes new work again (also from ``drained``).

Each one writes the inventory history (:mod:`devices.services.inventory`) in its transaction, with
the operator's reason as the cause (``cordon: replace fan``).

The tick reads ``Node.state`` (only ``ready`` nodes get new work), so a change
takes effect at the next tick. Asking for the state a node is already in
changes nothing and writes no audit event, so scripts may repeat themselves.

What runs the jobs is told after the commit (``Executor.set_node_service``): with Slurm a cordon
or drain is ``scontrol update State=DRAIN``, an uncordon ``State=RESUME``; the agents need nothing.
An operation the executor itself asked for (Slurm drained the node: ``by_executor``) is not sent
back to it, and marks the node's state as the executor's (``Node.state_from_executor``), so that
the executor's return to service brings the node back, while an operator's cordon stays.

A removed node (``manage.py nodes remove``) is read-only: its rows stay for their history, and
each of these refuses it with :class:`NodeRemoved`, which says when it was removed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from devices.executors import get_executor
from devices.models import Node
from devices.services import inventory
from devices.services.draining import mark_drained
from quotas.models import AuditEvent
from scheduling.models import Job

#: Longest reason kept with an operation.
MAX_REASON = 300


class NodeRemoved(Exception):
    """The node left the inventory: nothing about it changes any more."""

    def __init__(self, node: Node) -> None:
        assert node.removed_at is not None
        self.node = node
        when = timezone.localtime(node.removed_at).strftime("%Y-%m-%d %H:%M %Z")
        super().__init__(
            f"node {node.name} was removed from the inventory on {when}: a removed node cannot be cordoned, "
            "drained or uncordoned (add it again with `manage.py nodes add` to use it)"
        )


@dataclass(frozen=True)
class NodeOperation:
    node: Node
    changed: bool
    previous: str
    #: What the executor could not do after the commit, in its words (Slurm refused the drain, say);
    #: filled when the operation's transaction commits. The portal's change stands either way.
    executor_failures: list[str] = field(default_factory=list)


def _running_jobs(node: Node) -> int:
    return (
        Job.objects.filter(state=Job.State.RUNNING, allocations__device__node=node, allocations__end__isnull=True)
        .distinct()
        .count()
    )


def _set_state(
    name: str, target: str, action: str, *, actor: AbstractBaseUser | None, reason: str, by_executor: bool = False
) -> NodeOperation:
    """Move node ``name`` to ``target``, audit it, and tell the executor after the commit (unless it asked).

    Raises ``Node.DoesNotExist``, or :class:`NodeRemoved`.
    """
    node = Node.objects.select_for_update().get(name=name)
    if node.removed_at is not None:
        raise NodeRemoved(node)
    previous = node.state
    if previous == target or (target == Node.State.DRAINING and previous == Node.State.DRAINED):
        return NodeOperation(node=node, changed=False, previous=previous)
    node.state = target
    node.state_from_executor = by_executor and target != Node.State.READY
    node.save(update_fields=["state", "state_from_executor"])
    running = _running_jobs(node)
    detail = f"{previous} → {target}; {running} running job(s) on it"
    if target == Node.State.DRAINING and running:
        detail += " will finish there"
    reason = reason.strip()[:MAX_REASON]
    if reason:
        detail += f": {reason}"
    AuditEvent.objects.create(actor=actor, action=action, target=node.name, detail=detail)
    verb = action.removeprefix("node.")
    devices = list(node.devices.all())
    for device in devices:
        device.node = node
    cause = f"{verb}: {reason}" if reason else verb
    inventory.record(devices, cause=cause)
    done = NodeOperation(node=node, changed=True, previous=previous)
    if not by_executor:
        in_service = target == Node.State.READY

        def tell_executor() -> None:
            failure = get_executor().set_node_service(name, in_service=in_service, reason=cause)
            if failure:
                done.executor_failures.append(failure)

        # robust: the operation stands whatever the executor says; it logs its own failure.
        transaction.on_commit(tell_executor, robust=True)
    return done


@transaction.atomic
def cordon_node(
    name: str, *, actor: AbstractBaseUser | None, reason: str = "", by_executor: bool = False
) -> NodeOperation:
    """No new work on the node; running work stays."""
    return _set_state(name, Node.State.CORDONED, "node.cordon", actor=actor, reason=reason, by_executor=by_executor)


@transaction.atomic
def drain_node(
    name: str, *, actor: AbstractBaseUser | None, reason: str = "", by_executor: bool = False
) -> NodeOperation:
    """No new work on the node; running work finishes there, then the node is ``drained``."""
    result = _set_state(name, Node.State.DRAINING, "node.drain", actor=actor, reason=reason, by_executor=by_executor)
    if result.changed and mark_drained():
        result.node.refresh_from_db(fields=["state"])
    return result


@transaction.atomic
def uncordon_node(
    name: str, *, actor: AbstractBaseUser | None, reason: str = "", by_executor: bool = False
) -> NodeOperation:
    """The node takes new work again (from cordoned, draining or down)."""
    return _set_state(name, Node.State.READY, "node.uncordon", actor=actor, reason=reason, by_executor=by_executor)
