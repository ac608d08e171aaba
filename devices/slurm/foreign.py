"""Cards held by Slurm jobs npuportal did not submit: read at the executor's poll, never given by the tick.

A Slurm cluster the portal runs on may also take jobs submitted to it directly (``sbatch`` by hand,
another portal). Such a job carries no ``npuportal:<job id>:<attempt>`` comment. While it holds
cards, the portal must not decide to start its own jobs there: Slurm would keep them pending.

At each observation the Slurm executor lists those jobs (``squeue``) and, when one holds cards,
reads which (``scontrol show job -d``: ``Nodes=npu1 … GRES=npu:c2:1(IDX:2),npu:c5:1(IDX:5)``).
:func:`record_outside_use` writes what holds each card on ``Device.outside_use`` (``Slurm job 42 of
alice``) and clears it on the cards no longer held. From there it takes the path a cordoned or
unhealthy card takes: the tick's snapshot gives the engine the card as unusable
(``scheduling.services.snapshot``), the node page and the API say "in use outside npuportal", and
the inventory's history records the stretch (status ``outside``), so chargeback counts it apart
from the portal's idle capacity.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q

from devices.models import Device
from devices.services import inventory
from devices.slurm.commands import expand_hostlist, expand_indexes
from npuportal.cluster_lock import lock_cluster

#: Slurm's states of a job that holds its cards (a pending one holds none; a suspended one keeps its GRES).
HOLDING_STATES = frozenset({"RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "STOPPED", "SIGNALING", "RESIZING"})


@dataclass(frozen=True)
class HeldCards:
    """One Slurm job's cards, by node: whose job it is, in the words the node page shows."""

    slurm_id: str
    user: str
    cards: dict[str, tuple[int, ...]]

    @property
    def words(self) -> str:
        return f"Slurm job {self.slurm_id} of {self.user}" if self.user else f"Slurm job {self.slurm_id}"


def parse_job_details(text: str) -> dict[str, HeldCards]:
    """The cards of each job in ``scontrol show job -d`` (every job: blocks starting ``JobId=``), by Slurm id.

    A job with no ``IDX`` (pending, or over) holds no cards and is left out.
    """
    found: dict[str, HeldCards] = {}
    for block in re.split(r"(?m)^(?=JobId=)", text):
        job = re.match(r"JobId=(\S+)", block)
        if job is None:
            continue
        user = re.search(r"\bUserId=([^(\s]+)", block)
        cards: dict[str, tuple[int, ...]] = {}
        for node, gres in re.findall(r"(?m)^\s+Nodes=(\S+)\s.*\bGRES=(\S*)", block):
            indexes = sorted({i for idx in re.findall(r"IDX:([0-9,-]+)", gres) for i in expand_indexes(idx)})
            if indexes:
                cards.update(
                    dict.fromkeys(expand_hostlist(node), tuple(indexes))
                )  # ``npu[1-2]``: the same cards on each
        if cards:
            found[job.group(1)] = HeldCards(job.group(1), user.group(1) if user else "", cards)
    return found


def record_outside_use(held: Iterable[HeldCards]) -> list[int]:
    """Mark the cards ``held`` names as in use outside npuportal and clear the rest; the ids of cards changed.

    Under the cluster's lock, so a tick reads the cards before or after, never half-way; the
    inventory's history gets an event for each card whose status changed.
    """
    words: dict[tuple[str, int], str] = {}
    for job in held:
        for node, indexes in job.cards.items():
            for index in indexes:
                words[(node, index)] = job.words[:200]
    with transaction.atomic():
        lock_cluster()
        nodes = {node for node, _ in words}
        devices = (
            Device.objects.filter(node__removed_at__isnull=True)
            .filter(Q(node__name__in=nodes) | ~Q(outside_use=""))
            .select_related("node")
        )
        changed = []
        for device in devices:
            now = words.get((device.node.name, device.index), "")
            if device.outside_use != now:
                device.outside_use = now
                changed.append(device)
        if changed:
            Device.objects.bulk_update(changed, ["outside_use"])
            inventory.record(changed, cause="seen at the Slurm executor's poll")
    return [d.pk for d in changed]
