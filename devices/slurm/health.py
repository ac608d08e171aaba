"""A node's service state kept the same in the portal and in Slurm, both ways, at each observation.

The side that took a node out of service owns it:

- **Slurm drains a node** (an administrator's ``scontrol update State=DRAIN``, or Slurm itself):
  the portal drains it too (``devices.services.operations.drain_node``, marked as the executor's,
  with Slurm's reason), and it becomes ``drained`` when its last job ends. When Slurm resumes it,
  the portal uncordons it. An operator's own cordon or drain in the portal is never lifted by Slurm.
- **Slurm says a node is down**: the portal takes it as an agent that stopped answering, through
  the same services (``devices.services.polling``): ``reachable`` false with its health event and
  inventory history, its running jobs requeued without a retry counted (Slurm's copies are then
  stale and cancelled by the same observation). When Slurm has it up again it is reachable again.
- **An operator cordons, drains or uncordons in the portal**: the executor is told after the commit
  (``SlurmExecutor.set_node_service``: ``State=DRAIN Reason="npuportal: …"``, ``State=RESUME``).
  Each observation repeats what a lost call did not carry: an operator's state whose Slurm node is
  not drained is drained again, and a drain of the portal's (its reason starts ``npuportal:``) on a
  node the portal has ready is resumed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from devices.executors.base import Observation
from devices.models import Node
from devices.services.operations import NodeRemoved, drain_node, uncordon_node
from devices.services.polling import Actions, mark_reachable, mark_unreachable, requeue_jobs_on
from devices.slurm.survey import PORTAL_REASON_PREFIX, NodeReport
from npuportal.cluster_lock import lock_cluster

log = logging.getLogger(__name__)

#: What an observation asks Slurm to do: ``(node, in service, reason)``.
Push = tuple[str, bool, str]


def slurm_reason(reason: str) -> str:
    """The ``Reason=`` the portal gives Slurm: its own prefix, so its drains are known as its own."""
    return f"{PORTAL_REASON_PREFIX} {reason or 'out of service in the portal'}"


def reconcile(reports: Iterable[NodeReport], summary: Observation) -> list[Push]:
    """Bring the portal's nodes to what Slurm says (see the module docstring); the calls Slurm still needs."""
    by_name = {r.name: r for r in reports}
    pushes: list[Push] = []
    nodes = Node.objects.filter(removed_at__isnull=True, name__in=list(by_name)).order_by("name")
    for node in nodes:
        report = by_name[node.name]
        _reachability(node, report, summary)
        said = f"{report.reason} ({report.state})" if report.reason else report.state
        try:
            if report.drained and not report.drained_by_portal and node.state == Node.State.READY:
                log.warning("Slurm drained node %s: %s; draining it in the portal", node.name, said)
                drain_node(node.name, actor=None, reason=f"Slurm: {said}", by_executor=True)
            elif not report.drained and node.state != Node.State.READY and node.state_from_executor:
                log.warning("Slurm resumed node %s (%s); it takes work in the portal again", node.name, report.state)
                uncordon_node(node.name, actor=None, reason=f"Slurm: resumed ({report.state})", by_executor=True)
            elif not report.drained and not report.down and node.state != Node.State.READY:
                pushes.append((node.name, False, f"{node.state} in the portal"))
            elif report.drained_by_portal and node.state == Node.State.READY:
                pushes.append((node.name, True, "ready in the portal"))
        except NodeRemoved:  # removed meanwhile: nothing to follow
            continue
    return pushes


def _reachability(node: Node, report: NodeReport, summary: Observation) -> None:
    """A node Slurm has down is unreachable in the portal (its jobs requeued), and reachable once it is not."""
    if report.down == (not node.reachable):
        return
    now = timezone.now()
    said = f"{report.state}" + (f": {report.reason}" if report.reason else "")
    with transaction.atomic():
        lock_cluster()
        node = Node.objects.select_for_update().get(pk=node.pk)
        if report.down and node.reachable:
            log.warning("Slurm has node %s down (%s): its running jobs are requeued", node.name, said)
            mark_unreachable(node, at=now, reason=f"Slurm has it down ({said})", cause=f"Slurm: down ({said})")
            # Slurm's runs there are stale once requeued: the observation cancels them.
            requeue_jobs_on(node, f"Slurm has node {node.name} down ({said})", now, summary, Actions())
        elif not report.down and not node.reachable:
            log.warning("Slurm has node %s up again (%s)", node.name, report.state)
            mark_reachable(node, at=now, reason=f"Slurm has it up again ({report.state})", cause="Slurm: up again")
