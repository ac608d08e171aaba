"""A draining node becomes ``drained`` when its last job ends (docs/health.md, "Nodes").

``drained`` is stored, not worked out at each read, so the console, ``GET /api/v1/nodes/``
(its ``state`` field and ``?state=drained``) and ``npuctl nodes`` all read the same field. Every
path that closes allocations calls :func:`mark_drained` in its transaction (a job ending, a job
requeued, the tick's evictions), and the tick calls it once more as a sweep, so a path added later
is caught within one tick. Uncordon takes a drained node back to ``ready``.
"""

from __future__ import annotations

from django.db.models import Exists, OuterRef

from devices.models import Node
from devices.services import inventory
from quotas.models import AuditEvent
from scheduling.models import Allocation


def mark_drained() -> list[str]:
    """Move every draining node that holds no open allocation to ``drained``; the names it moved.

    One query when no node has finished draining (the common case, and what the tick pays).
    """
    open_allocation = Allocation.objects.filter(device__node=OuterRef("pk"), end__isnull=True)
    names = list(
        Node.objects.filter(state=Node.State.DRAINING).exclude(Exists(open_allocation)).values_list("name", flat=True)
    )
    if not names:
        return []
    Node.objects.filter(name__in=names, state=Node.State.DRAINING).update(state=Node.State.DRAINED)
    AuditEvent.objects.bulk_create(
        AuditEvent(
            actor=None,
            action="node.drained",
            target=name,
            detail=f"{Node.State.DRAINING} → {Node.State.DRAINED}; nothing runs on it any more",
        )
        for name in names
    )
    inventory.record_nodes(names, cause="drained: nothing runs on it any more")
    return names
