"""The cluster at a glance: every card's state, who holds it, and the counts at the top of /cluster/.

One card has one state, the first that applies: ``busy`` (an open allocation), ``unhealthy``
(its health takes no work, or its node is down or unreachable), ``cordoned``/``draining``/``drained``
(its node's admin state; a card the admins took out by hand counts as cordoned), else ``free``.
Utilisation is busy cards over all cards. A busy card names its team; it names and links its
job only for a viewer who may see that job (an admin, or a member of the job's team); for
anyone else it says "in use". Three queries for the whole cluster, whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devices.models import Device, Node
from scheduling.models import Allocation

#: Card states, in the order the summary shows them.
CARD_STATES = ("busy", "free", "cordoned", "draining", "drained", "unhealthy")
_NODE_STATE_CARD = {
    Node.State.CORDONED: "cordoned",
    Node.State.DRAINING: "draining",
    Node.State.DRAINED: "drained",
    Node.State.DOWN: "unhealthy",
}


@dataclass
class Holder:
    """One open allocation on a card, as the viewer may know it."""

    team: str
    job_id: int | None  # None: another team's job
    job_name: str
    slice: str  # vNPU template, '' for the whole card


@dataclass
class Card:
    device: Device
    state: str
    holders: list[Holder] = field(default_factory=list)


@dataclass
class NodeCards:
    node: Node
    cards: list[Card]


@dataclass
class Overview:
    nodes: list[NodeCards]
    by_state: dict[str, int]
    total: int
    busy_pct: float
    by_team: list[tuple[str, int]]


def holders_by_device(device_filter: dict[str, Any], visible_team_ids: set[int] | None) -> dict[int, list[Holder]]:
    """Open allocations by device id; ``visible_team_ids`` None: the viewer sees every job."""
    rows = Allocation.objects.filter(end__isnull=True, **device_filter).values_list(
        "device_id", "job_id", "job__name", "job__team_id", "job__team__name", "vnpu_template__name"
    )
    held: dict[int, list[Holder]] = {}
    for device_id, job_id, name, team_id, team, template in rows.order_by("job_id"):
        mine = visible_team_ids is None or team_id in visible_team_ids
        held.setdefault(device_id, []).append(
            Holder(team=team, job_id=job_id if mine else None, job_name=name if mine else "", slice=template or "")
        )
    return held


def card_state(device: Device, node: Node, busy: bool) -> str:
    if busy:
        return "busy"
    if device.health not in Device.USABLE_HEALTH or not node.reachable or node.state == Node.State.DOWN:
        return "unhealthy"
    if node.state in _NODE_STATE_CARD:
        return _NODE_STATE_CARD[node.state]
    return "free" if device.schedulable else "cordoned"


def cluster_overview(visible_team_ids: set[int] | None) -> Overview:
    """Every node's cards with their states and holders, and the summary counts."""
    held = holders_by_device({}, visible_team_ids)
    nodes = []
    by_state = dict.fromkeys(CARD_STATES, 0)
    teams: dict[str, int] = {}
    for node in Node.objects.filter(removed_at__isnull=True).prefetch_related("devices"):
        cards = []
        for device in node.devices.all():
            holders = held.get(device.pk, [])
            card = Card(device=device, state=card_state(device, node, bool(holders)), holders=holders)
            by_state[card.state] += 1
            for team in {h.team for h in holders}:
                teams[team] = teams.get(team, 0) + 1
            cards.append(card)
        nodes.append(NodeCards(node=node, cards=cards))
    total = sum(by_state.values())
    return Overview(
        nodes=nodes,
        by_state=by_state,
        total=total,
        busy_pct=100.0 * by_state["busy"] / total if total else 0.0,
        by_team=sorted(teams.items()),
    )


def node_cards(node: Node, visible_team_ids: set[int] | None) -> list[dict[str, Any]]:
    """One node's devices for its page: state, holders, vNPU cores in use (two queries)."""
    held = holders_by_device({"device__node": node}, visible_team_ids)
    cores: dict[int, int] = {}
    for device_id, ai_cores in Allocation.objects.filter(
        device__node=node, end__isnull=True, vnpu_template__isnull=False
    ).values_list("device_id", "vnpu_template__ai_cores"):
        cores[device_id] = cores.get(device_id, 0) + ai_cores
    rows = []
    for device in node.devices.all():
        holders = held.get(device.pk, [])
        rows.append(
            {
                "device": device,
                "state": card_state(device, node, bool(holders)),
                "held": holders,
                "cores_used": cores.get(device.pk, 0),
            }
        )
    return rows
