"""The database side of "can this job ever run": the inventory as the engine reads it, and the check at submission."""

from __future__ import annotations

from devices.models import Device, VnpuTemplate
from scheduling.engine.feasibility import Impossible, Request, never_runnable
from scheduling.engine.policy import Policy
from scheduling.engine.snapshot import DeviceState, NodeState
from scheduling.engine.snapshot import VnpuTemplate as TemplateState


def inventory() -> tuple[list[NodeState], dict[tuple[str, str], TemplateState]]:
    """Every device in the inventory (removed nodes left out) by node (one query), and the vNPU templates.

    Templates by (chip, name), one more query.
    """
    nodes: dict[int, NodeState] = {}
    for pk, node_id, node_name, index, chip, group, hbm, cores, cpus in (
        Device.objects.filter(node__removed_at__isnull=True)
        .order_by("node__name", "index")
        .values_list(
            "id", "node_id", "node__name", "index", "chip_model", "topology_group", "hbm_mb", "ai_cores", "ai_cpus"
        )
    ):
        node = nodes.get(node_id)
        if node is None:
            node = nodes[node_id] = NodeState(node_name, [])
        node.devices.append(DeviceState(pk, node.name, index, chip, group or "", hbm, cores, cpus))
    templates = {
        (chip, name): TemplateState(chip, name, mem, cores, cpus)
        for chip, name, mem, cores, cpus in VnpuTemplate.objects.values_list(
            "chip_model", "name", "memory_mb", "ai_cores", "ai_cpus"
        )
    }
    return list(nodes.values()), templates


def check(policy: Policy, request: Request) -> Impossible | None:
    """Why the job can never run here, or ``None``."""
    nodes, templates = inventory()
    return never_runnable(policy, request, nodes, templates)
