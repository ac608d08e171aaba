"""The inventory's history: which cards existed when, and whether they could be used.

Chargeback prices capacity from this history (``quotas.accounting``), the way a cloud bill counts
a machine for the hours it was provisioned: a card added on the 20th counts from the 20th, one
removed on the 10th stops on the 10th, and a card that was cordoned, draining, down or unhealthy
is paid for but unavailable (its own line, with the cause); so is a card a job submitted to Slurm
directly holds (``outside``: the portal could not use it, and a site may want it charged apart).

One function decides a card's status from what the database says now (:func:`derive_status`), and
one appends an event when that status changed (:func:`record`). Every path that changes a node's
state, a card's health or schedulability, or adds or removes a node calls :func:`record` inside its
transaction; :func:`sweep` catches up on any path that did not (the tick calls it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import OuterRef, Subquery
from django.utils import timezone

from devices.models import Device, InventoryEvent, Node

Status = InventoryEvent.Status

#: Node states that take a card out of service, and the status they give it.
_NODE_STATUS = {
    Node.State.CORDONED: Status.CORDONED,
    Node.State.DRAINING: Status.DRAINING,
    Node.State.DRAINED: Status.DRAINED,
    Node.State.DOWN: Status.DOWN,
}


def derive_status(node: Any, device: Any) -> tuple[str, str]:
    """``(status, cause)`` of ``device`` on ``node`` now; the first reason that applies wins.

    Works on model instances and on migration-time historical models alike (it reads fields only).
    """
    return _status(
        getattr(node, "removed_at", None),
        node.state,
        node.reachable,
        device.health,
        device.health_detail,
        device.schedulable,
        getattr(device, "outside_use", ""),  # not on the models of migrations before 0006
    )


_USABLE_HEALTH = frozenset(str(h) for h in Device.USABLE_HEALTH)


def _status(
    removed_at: datetime | None,
    state: str,
    reachable: bool,
    health: str,
    health_detail: str,
    schedulable: bool,
    outside_use: str = "",
) -> tuple[str, str]:
    """:func:`derive_status` on plain values, so the sweep needs no model instances."""
    if removed_at is not None:
        return Status.REMOVED, "node removed"
    if state in _NODE_STATUS:
        return _NODE_STATUS[state], f"node {state}"
    if not reachable:
        return Status.DOWN, "node unreachable"
    if health not in _USABLE_HEALTH:
        detail = f": {health_detail}" if health_detail else ""
        return Status.UNHEALTHY, f"{health}{detail}"[:300]
    if not schedulable:
        return Status.DISABLED, "card marked unschedulable"
    if outside_use:
        return Status.OUTSIDE, f"in use outside npuportal: {outside_use}"[:300]
    return Status.USABLE, ""


def _last_status(device_ids: Iterable[int]) -> dict[int, str | None]:
    last = InventoryEvent.objects.filter(device_id=OuterRef("pk")).order_by("-at", "-id")
    return dict(
        Device.objects.filter(pk__in=list(device_ids))
        .annotate(last=Subquery(last.values("status")[:1]))
        .values_list("pk", "last")
    )


def _events(devices: Iterable[Any], last: dict[int, str | None], at: datetime, cause: str) -> list[InventoryEvent]:
    """The events that bring ``devices`` (with ``node`` loaded) from their ``last`` status to the derived one."""
    events = []
    for device in devices:
        status, derived = derive_status(device.node, device)
        if last.get(device.pk) == status:
            continue
        why = "; ".join(part for part in (derived, cause) if part)[:300]
        events.append(
            InventoryEvent(
                device=device, node_name=device.node.name, chip_model=device.chip_model, at=at, status=status, cause=why
            )
        )
    return events


def record(devices: Iterable[Device], *, at: datetime | None = None, cause: str = "") -> int:
    """Append an event for each of ``devices`` whose status differs from its last one; how many were added.

    ``devices`` need their ``node`` loaded (``select_related("node")``, or set by the caller).
    ``cause`` (an operator's reason, the tool that reported a fault) is added to the derived one.
    Call it inside the transaction that made the change, after the change.
    """
    devices = list(devices)
    if not devices:
        return 0
    events = _events(devices, _last_status(d.pk for d in devices), at or timezone.now(), cause)
    InventoryEvent.objects.bulk_create(events)
    return len(events)


def record_nodes(node_names: Iterable[str], *, at: datetime | None = None, cause: str = "") -> int:
    """:func:`record` for every card of the named nodes (read fresh from the database)."""
    devices = Device.objects.filter(node__name__in=list(node_names)).select_related("node")
    return record(devices, at=at, cause=cause)


def sweep(*, at: datetime | None = None) -> int:
    """:func:`record` for the whole inventory: a path that changed a status without recording it is caught here.

    One query when nothing changed (the tick calls it every few seconds): the cards, their nodes and
    each card's last status come back together as plain rows (no model instances: a few thousand
    cards cost milliseconds), and nothing is written.
    """
    last = InventoryEvent.objects.filter(device_id=OuterRef("pk")).order_by("-at", "-id")
    rows = Device.objects.annotate(last_status=Subquery(last.values("status")[:1])).values_list(
        "pk",
        "chip_model",
        "health",
        "health_detail",
        "schedulable",
        "outside_use",
        "node__name",
        "node__state",
        "node__reachable",
        "node__removed_at",
        "last_status",
    )
    at = at or timezone.now()
    events = []
    for pk, chip, health, detail, schedulable, outside, node, state, reachable, removed_at, last_status in rows:
        status, cause = _status(removed_at, state, reachable, health, detail, schedulable, outside)
        if status != last_status:
            events.append(
                InventoryEvent(device_id=pk, node_name=node, chip_model=chip, at=at, status=status, cause=cause)
            )
    if events:
        InventoryEvent.objects.bulk_create(events)
    return len(events)


@dataclass(frozen=True)
class Stretch:
    """``[start, end)`` during which one card had one status."""

    device_id: int
    node_name: str
    chip_model: str
    start: datetime
    end: datetime
    status: str
    cause: str

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds()


def stretches(start: datetime, end: datetime) -> list[Stretch]:
    """Each card's statuses within ``[start, end)``, from its history; ``removed`` stretches left out.

    A card counts from its first event (it did not exist before) to its ``removed`` event.
    Bounds on a zone's clock (a month of the policy) are taken to UTC first: Python subtracts two
    times of one zone on the wall clock, which makes a month with a DST change an hour off.
    """
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    if end <= start:
        return []
    found: list[Stretch] = []
    before = InventoryEvent.objects.filter(at__lte=start).order_by("device_id", "-at", "-id")
    current: dict[int, InventoryEvent] = {}
    for event in before.only("device_id", "node_name", "chip_model", "at", "status", "cause").iterator():
        current.setdefault(event.device_id, event)  # the newest at or before start, per card
    during = InventoryEvent.objects.filter(at__gt=start, at__lt=end).order_by("device_id", "at", "id")
    changes: dict[int, list[InventoryEvent]] = {}
    for event in during.iterator():
        changes.setdefault(event.device_id, []).append(event)
    for device_id in sorted(set(current) | set(changes)):
        events = ([current[device_id]] if device_id in current else []) + changes.get(device_id, [])
        for this, following in zip(events, [*events[1:], None], strict=True):
            a = max(this.at, start)
            b = following.at if following is not None else end
            if b > a and this.status != Status.REMOVED:
                found.append(Stretch(device_id, this.node_name, this.chip_model, a, b, this.status, this.cause))
    return found
