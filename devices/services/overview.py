"""The cluster at a glance: every card's state, who holds it, and the counts at the top of /cluster/.

One card has one state, the first that applies: ``removed`` (its node left the inventory: only
its own page shows it), ``busy`` (an open allocation), ``unhealthy`` (its health takes no work, or
its node is down or unreachable), ``cordoned``/``draining``/``drained`` (its node's admin state; a
card the admins took out by hand counts as cordoned), ``outside`` (in use outside npuportal: a job
submitted to Slurm directly holds it, ``Device.outside_use``), else ``free``.

A busy card on a node that takes no new work is also counted as what it would be without its job
(a cordoned node whose cards are all busy still counts its cards as cordoned), so the counts may
add up to more than the cards. Utilisation is busy cards over the cards in service: every card of
the inventory but the drained ones (removed nodes are not in it).

A busy card names its team; it names and links its job only for a viewer who may see that job (an
admin, or a member of the job's team); for anyone else it says "in use". Three queries for the
whole cluster, whatever its size.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devices.models import Device, Node
from scheduling.models import Allocation

#: Card states, in the order the summary shows them.
CARD_STATES = ("busy", "free", "cordoned", "draining", "drained", "unhealthy", "outside")
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
    #: A busy card's other state: ``cordoned``, ``draining`` or ``unhealthy`` when its job runs on
    #: where no new work goes ('' when it would be free).
    also: str = ""


@dataclass
class NodeCards:
    node: Node
    cards: list[Card]


@dataclass
class Overview:
    nodes: list[NodeCards]
    #: Cards per state; a busy card on a cordoned (draining, unhealthy) node counts in both.
    by_state: dict[str, int]
    total: int
    #: Busy cards of the cards that could be busy: every card but the drained ones.
    busy_pct: float
    by_team: list[tuple[str, int]]
    #: Busy cards that also count as cordoned, draining or unhealthy.
    busy_also: int = 0
    #: Cards utilisation is counted over (``total`` less the drained).
    in_service: int = 0


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
    """The card's one state to show: ``busy`` before any other, except ``removed``."""
    if node.removed_at is not None:
        return "removed"
    return "busy" if busy else service_state(device, node)


def service_state(device: Device, node: Node) -> str:
    """Whether the card takes new work, whatever runs on it: ``free``, or why not."""
    if device.health not in Device.USABLE_HEALTH or not node.reachable or node.state == Node.State.DOWN:
        return "unhealthy"
    if node.state in _NODE_STATE_CARD:
        return _NODE_STATE_CARD[node.state]
    if not device.schedulable:
        return "cordoned"
    return "outside" if device.outside_use else "free"


def _card(device: Device, node: Node, holders: list[Holder]) -> Card:
    state = card_state(device, node, bool(holders))
    also = ""
    if state == "busy":
        service = service_state(device, node)
        also = "" if service == "free" else service
    return Card(device=device, state=state, holders=holders, also=also)


def cluster_overview(visible_team_ids: set[int] | None) -> Overview:
    """Every node's cards with their states and holders, and the summary counts."""
    held = holders_by_device({}, visible_team_ids)
    nodes = []
    by_state = dict.fromkeys(CARD_STATES, 0)
    teams: dict[str, int] = {}
    total = busy_also = 0
    for node in Node.objects.filter(removed_at__isnull=True).prefetch_related("devices"):
        cards = []
        for device in node.devices.all():
            card = _card(device, node, held.get(device.pk, []))
            total += 1
            by_state[card.state] += 1
            if card.also:  # busy, and on a node that takes no new work: counted in both
                by_state[card.also] += 1
                busy_also += 1
            for team in {h.team for h in card.holders}:
                teams[team] = teams.get(team, 0) + 1
            cards.append(card)
        nodes.append(NodeCards(node=node, cards=cards))
    in_service = total - by_state["drained"]
    return Overview(
        nodes=nodes,
        by_state=by_state,
        total=total,
        busy_pct=100.0 * by_state["busy"] / in_service if in_service else 0.0,
        by_team=sorted(teams.items()),
        busy_also=busy_also,
        in_service=in_service,
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
        card = _card(device, node, holders)
        rows.append(
            {
                "device": device,
                "state": card.state,
                "also": card.also,
                "held": holders,
                "cores_used": cores.get(device.pk, 0),
                **readings(device),
            }
        )
    return rows


def readings(device: Device) -> dict[str, str]:
    """A card's last readings with their units, as the node page shows them ('' when not read).

    HBM in GB of 1024 MB, as the vendors' tools and data sheets count it (a 910B4's 32768 MB is 32 GB).
    """

    def gb(mb: float) -> str:
        return f"{mb / 1024:.1f}"

    hbm = ""
    if device.hbm_mb:
        used = gb(device.hbm_used_mb) if device.hbm_used_mb is not None else "—"
        hbm = f"{used} / {gb(device.hbm_mb)} GB"
    return {
        "temp": f"{device.temp_c:.0f} °C" if device.temp_c is not None else "",
        "power": f"{device.power_w:.0f} W" if device.power_w is not None else "",
        "aicore": f"{device.aicore_pct:.0f} %" if device.aicore_pct is not None else "",
        "hbm": hbm,
    }
