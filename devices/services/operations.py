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

A removed node (``manage.py nodes remove``) is read-only: its rows stay for their history, and
each of these refuses it with :class:`NodeRemoved`, which says when it was removed.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

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


def _running_jobs(node: Node) -> int:
    return (
        Job.objects.filter(state=Job.State.RUNNING, allocations__device__node=node, allocations__end__isnull=True)
        .distinct()
        .count()
    )


def _set_state(name: str, target: str, action: str, *, actor: AbstractBaseUser | None, reason: str) -> NodeOperation:
    """Move node ``name`` to ``target`` and audit it. Raises ``Node.DoesNotExist``, or :class:`NodeRemoved`."""
    node = Node.objects.select_for_update().get(name=name)
    if node.removed_at is not None:
        raise NodeRemoved(node)
    previous = node.state
    if previous == target or (target == Node.State.DRAINING and previous == Node.State.DRAINED):
        return NodeOperation(node=node, changed=False, previous=previous)
    node.state = target
    node.save(update_fields=["state"])
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
    inventory.record(devices, cause=f"{verb}: {reason}" if reason else verb)
    return NodeOperation(node=node, changed=True, previous=previous)


@transaction.atomic
def cordon_node(name: str, *, actor: AbstractBaseUser | None, reason: str = "") -> NodeOperation:
    """No new work on the node; running work stays."""
    return _set_state(name, Node.State.CORDONED, "node.cordon", actor=actor, reason=reason)


@transaction.atomic
def drain_node(name: str, *, actor: AbstractBaseUser | None, reason: str = "") -> NodeOperation:
    """No new work on the node; running work finishes there, then the node is ``drained``."""
    result = _set_state(name, Node.State.DRAINING, "node.drain", actor=actor, reason=reason)
    if result.changed and mark_drained():
        result.node.refresh_from_db(fields=["state"])
    return result


@transaction.atomic
def uncordon_node(name: str, *, actor: AbstractBaseUser | None, reason: str = "") -> NodeOperation:
    """The node takes new work again (from cordoned, draining or down)."""
    return _set_state(name, Node.State.READY, "node.uncordon", actor=actor, reason=reason)
