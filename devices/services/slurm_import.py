"""The portal's nodes and cards made those of a Slurm cluster: ``manage.py slurm import``.

Slurm is asked first (:mod:`devices.slurm.survey`), the plan is made without writing anything, and
each node is then written by the inventory's own services, so an import leaves the same history
as ``manage.py nodes``: :func:`devices.services.registration.sync_node` adds a node (``joined``
events, a ``node.add`` audit event) or updates its cards (``node.update``), and, with ``replace``,
:func:`devices.services.registration.remove_node` removes a node Slurm does not have (draining it
first when jobs still run there, as ``nodes remove --drain`` does). A second import of an unchanged
cluster writes nothing.

A node's chip model is ``chip`` when given, else its GRES type (``Gres=npu:910B4:8``), else a
feature (``Features=910B4``): an Ascend chip model (:data:`devices.slurm.survey.ASCEND_CHIP`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.contrib.auth.models import AbstractBaseUser

from devices.models import Node
from devices.services.registration import (
    CHIP_FIGURES,
    RegistrationError,
    describe_jobs,
    remove_node,
    reported_cards,
    sync_node,
)
from devices.slurm import survey
from devices.slurm.commands import SlurmError
from devices.slurm.survey import ASCEND_CHIP, NodeReport


class ImportRefused(Exception):
    """Nothing was imported; ``usage`` when the command's own arguments are wrong (``--chip``)."""

    def __init__(self, message: str, *, usage: bool = False) -> None:
        super().__init__(message)
        self.usage = usage


@dataclass
class ImportResult:
    """What an import did, node by node, in the words the command prints."""

    source: str
    lines: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    #: Nodes left as they are, with why: no chip model, jobs still running where a node is to go.
    skipped: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Every node of Slurm's that the portal can use is in the inventory, and nothing is left to remove."""
        return not self.skipped


def known_chip(chip: str) -> bool:
    """A chip model the portal can take: one it has figures for, or an Ascend 910/310 model name."""
    return chip in CHIP_FIGURES or bool(ASCEND_CHIP.fullmatch(chip))


def _cards(indexes: tuple[int, ...]) -> str:
    if not indexes:
        return "none"
    if list(indexes) == list(range(indexes[0], indexes[-1] + 1)):
        return f"{indexes[0]}-{indexes[-1]}" if len(indexes) > 1 else str(indexes[0])
    return ",".join(map(str, indexes))


def import_nodes(
    *, replace: bool = False, chip: str = "", partition: str = "", actor: AbstractBaseUser | None = None
) -> ImportResult:
    """Make the portal's nodes those of Slurm (of ``partition``); see the module docstring."""
    chip = chip.strip()
    if chip and not known_chip(chip):
        known = ", ".join(sorted(CHIP_FIGURES))
        raise ImportRefused(
            f"--chip {chip!r} is not an Ascend chip model (one of {known}, or another 910 or 310 model)", usage=True
        )
    up, words = survey.ping()
    if not up:
        raise ImportRefused(f"Slurm's controller does not answer: {words}")
    try:
        listed = survey.nodes()
        parts = survey.partitions()
    except SlurmError as exc:
        raise ImportRefused(f"could not read Slurm's nodes: {exc}") from exc
    if partition and partition not in {p.name for p in parts}:
        raise ImportRefused(
            f"no partition {partition!r} in Slurm (its partitions: {', '.join(p.name for p in parts) or 'none'})"
        )
    source = "Slurm" + (f" partition {partition}" if partition else "")
    result = ImportResult(source=source)
    chosen = [n for n in listed if not partition or partition in n.partitions]
    plan: list[tuple[NodeReport, str]] = []
    for node in sorted(chosen, key=lambda n: n.name):
        if not node.cards:
            result.lines.append(f"skipped node {node.name}: it declares no npu GRES (Gres={node.gres or '(none)'})")
            continue
        model = chip or survey.chip_of(node)
        if not model:
            said = ", ".join((*node.gres_types, *node.features)) or "nothing"
            why = f"no chip model: its GRES type and features ({said}) name none; give --chip"
            result.skipped.append(node.name)
            result.lines.append(f"skipped node {node.name}: {why}")
            continue
        plan.append((node, model))
    for node, model in plan:
        try:
            done = sync_node(node.name, reported_cards(node.cards, model), source=source, actor=actor)
        except RegistrationError as exc:
            result.skipped.append(node.name)
            result.lines.append(f"skipped node {node.name}: {exc}")
            continue
        what = f"{len(node.cards)} card(s) {_cards(node.cards)} ({model}), {node.placement.split(' (')[0]}"
        if done.outcome in ("added", "re-added"):
            result.added.append(node.name)
            result.lines.append(f"{done.outcome} node {node.name}: {what}")
        elif done.outcome == "changed":
            result.changed.append(node.name)
            result.lines.append(f"changed node {node.name}: {'; '.join(done.changes)}")
        else:
            result.unchanged.append(node.name)
    if replace:
        in_slurm = {n.name for n in chosen}
        for name in Node.objects.filter(removed_at__isnull=True).order_by("name").values_list("name", flat=True):
            if name in in_slurm:
                continue
            removal = remove_node(name, actor=actor, drain=True, reason=f"not in {source} (slurm import --replace)")
            if removal.removed:
                result.removed.append(name)
                result.lines.append(f"removed node {name}: not in {source}")
            else:
                result.skipped.append(name)
                result.lines.append(
                    f"draining node {name}: not in {source}, but {len(removal.running)} job(s) still run there "
                    f"({describe_jobs(removal.running)}); the next import removes it once they end"
                )
    return result
