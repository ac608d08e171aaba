"""What a Slurm cluster says of itself: version, controller, partitions, nodes, accounting.

``manage.py slurm check`` prints it, ``manage.py slurm import`` makes the portal's inventory of its
nodes, and the Slurm executor reads the nodes' states at each observation (a node Slurm drains or
downs is drained or unreachable in the portal). Everything is read from Slurm's own commands' text
output (``scontrol show node -o``, ``scontrol show partition -o``, ``scontrol ping``, ``sacct``) with
the cluster's ``SLURM_CONF``, through :func:`devices.slurm.commands.run`: those are dependable on
Debian's Slurm 22.05, whose ``--json`` is not.

:func:`survey` asks Slurm; :func:`assess` turns what it found into findings in words, and is pure,
so what counts as wrong can be read and tested without a cluster.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

from devices.slurm.commands import COMMAND_TIMEOUT_S, SlurmError, key_values, parse_gres, run, slurm_env

#: ``scontrol ping`` gives up on a controller that refuses the connection at once; other reads retry
#: for seconds. So the controller is asked first, and nothing else is asked of a controller that is down.
PING_TIMEOUT_S = 15.0
#: Base states of a node that runs nothing and will not (``DOWN*``: down and not responding).
DOWN_STATES = frozenset({"DOWN", "FUTURE", "INVAL"})
#: What the portal writes before its reason when it drains a node in Slurm, so that its own drains
#: are told apart from those of Slurm's administrators (:mod:`devices.slurm.health`).
PORTAL_REASON_PREFIX = "npuportal:"
#: An Ascend chip model, as a GRES type or a node feature names it: ``910B4``, ``Ascend910``, ``310P3``.
ASCEND_CHIP = re.compile(r"(Ascend)?(910|310)[A-Za-z0-9]*")


@dataclass(frozen=True)
class NodeReport:
    """One node as ``scontrol show node -o`` lists it."""

    name: str
    #: Slurm's state words: ``IDLE``, ``MIXED+DRAIN``, ``DOWN+NOT_RESPONDING``, ``IDLE*``.
    state: str
    #: Why an administrator (or Slurm) drained or downed it, without the ``[user@time]`` tail.
    reason: str
    gres: str
    features: tuple[str, ...]
    partitions: tuple[str, ...]
    #: Where other nodes reach it (``NodeAddr``; its name when Slurm gives none).
    address: str = ""

    @property
    def base_state(self) -> str:
        return self.state.split("+", 1)[0].rstrip("*~#!%$@^-")

    @property
    def flags(self) -> frozenset[str]:
        return frozenset(self.state.split("+")[1:])

    @property
    def drained(self) -> bool:
        """Slurm takes no new job there (drained, or draining while its jobs finish)."""
        return bool({"DRAIN", "FAIL"} & self.flags) or self.base_state in {"DRAINED", "DRAINING"}

    @property
    def down(self) -> bool:
        """Slurm says the node is down: its jobs end (``NODE_FAIL``), nothing runs there."""
        return self.base_state in DOWN_STATES

    @property
    def drained_by_portal(self) -> bool:
        return self.drained and self.reason.startswith(PORTAL_REASON_PREFIX)

    @property
    def cards(self) -> tuple[int, ...]:
        return parse_gres(self.gres)[0]

    @property
    def per_card(self) -> bool:
        """Each card its own GRES type (``npu:c0:1,…``): the portal can ask Slurm for exact cards."""
        cards, per_card = parse_gres(self.gres)
        return per_card and bool(cards)

    @property
    def gres_types(self) -> tuple[str, ...]:
        """The types of its ``npu`` GRES that are not card names (``npu:910B4:8`` → ``910B4``)."""
        found = []
        for item in self.gres.split(","):
            parts = re.sub(r"\(.*?\)", "", item).split(":")
            if parts[0] == "npu" and len(parts) == 3 and not re.fullmatch(r"c[0-9]+", parts[1]):
                found.append(parts[1])
        return tuple(found)

    @property
    def placement(self) -> str:
        """How the portal places jobs on it, in the words ``slurm check`` uses."""
        if not self.cards:
            return "no npu GRES: the portal cannot place jobs on it"
        if self.per_card:
            return "exact-card placement (each card its own GRES type)"
        return "node-level placement, cards read back (a count of npu; Slurm picks the cards)"


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str
    nodes: str


@dataclass(frozen=True)
class Finding:
    """A thing ``slurm check`` reports as wrong: ``problem`` makes Slurm unusable to the portal, ``warning`` not."""

    level: str
    text: str


@dataclass
class Survey:
    """What :func:`survey` found; ``error`` holds why a part could not be read."""

    conf: str
    version: str = ""
    controller_up: bool = False
    controller: str = ""
    nodes: list[NodeReport] = field(default_factory=list)
    partitions: list[Partition] = field(default_factory=list)
    accounting_type: str = ""
    sacct_ok: bool = False
    sacct: str = ""
    errors: dict[str, str] = field(default_factory=dict)


def parse_nodes(text: str) -> list[NodeReport]:
    """The nodes of ``scontrol show node -o`` (one line each)."""
    found = []
    for line in text.splitlines():
        fields = key_values(line)
        if "NodeName" not in fields:
            continue
        reason = ""
        match = re.search(r"\bReason=(.*?)(?: \[[^\]]*\])?(?= \w+=|$)", line)
        if match:
            reason = match.group(1).strip()
        features = fields.get("AvailableFeatures") or fields.get("Features") or ""
        found.append(
            NodeReport(
                name=fields["NodeName"],
                state=fields.get("State", ""),
                reason="" if reason == "none" else reason,
                gres="" if fields.get("Gres") == "(null)" else fields.get("Gres", ""),
                features=tuple(f for f in features.split(",") if f and f != "(null)"),
                partitions=tuple(p for p in fields.get("Partitions", "").split(",") if p),
                address=fields.get("NodeAddr") or fields["NodeName"],
            )
        )
    return found


def parse_partitions(text: str) -> list[Partition]:
    """The partitions of ``scontrol show partition -o``."""
    found = []
    for line in text.splitlines():
        fields = key_values(line)
        if "PartitionName" in fields:
            found.append(
                Partition(
                    fields["PartitionName"],
                    fields.get("Default") == "YES",
                    fields.get("State", ""),
                    fields.get("Nodes", ""),
                )
            )
    return found


def ping() -> tuple[bool, str]:
    """``(up, Slurm's words)`` of ``scontrol ping``: ``Slurmctld(primary) at vm is UP``."""
    try:
        done = subprocess.run(
            ["scontrol", "ping"],
            capture_output=True,
            text=True,
            timeout=PING_TIMEOUT_S,
            check=False,
            env=slurm_env(),
        )
    except subprocess.TimeoutExpired:
        return False, f"scontrol ping did not answer within {PING_TIMEOUT_S:.0f} s"
    except OSError as exc:
        return False, f"scontrol: {exc.strerror or exc}"
    lines = [line.strip() for line in (done.stdout + "\n" + done.stderr).splitlines() if line.strip()]
    said = [line for line in lines if line.startswith("Slurmctld")] or [
        line for line in lines if not line.startswith("*")
    ]
    words = "; ".join(said) or f"exit status {done.returncode}"
    return done.returncode == 0 and " is UP" in words, words


def nodes() -> list[NodeReport]:
    """Slurm's nodes now (``scontrol show node -o``); :class:`SlurmError` when the controller cannot say."""
    return parse_nodes(run(["scontrol", "show", "node", "-o"]))


def partitions() -> list[Partition]:
    return parse_partitions(run(["scontrol", "show", "partition", "-o"]))


def survey() -> Survey:
    """Ask Slurm what it has: each part that fails is in ``errors``, and the rest is still asked."""
    env = slurm_env()
    found = Survey(conf=env.get("SLURM_CONF", "") or "Slurm's default (/etc/slurm/slurm.conf)")
    try:
        found.version = run(["scontrol", "-V"]).strip().split()[-1]
    except (SlurmError, IndexError) as exc:
        found.errors["version"] = str(exc) or "scontrol -V said nothing"
    found.controller_up, found.controller = ping()
    if found.controller_up:
        for part, read in (("nodes", nodes), ("partitions", partitions)):
            try:
                setattr(found, part, read())
            except SlurmError as exc:
                found.errors[part] = str(exc)
        try:
            config = run(["scontrol", "show", "config"])
            match = re.search(r"^AccountingStorageType\s*=\s*(\S+)", config, re.MULTILINE)
            found.accounting_type = match.group(1) if match else ""
        except SlurmError as exc:
            found.errors["config"] = str(exc)
    try:
        run(["sacct", "-n", "-X", "-P", "-o", "JobID", "-S", "now", "-E", "now"], timeout=COMMAND_TIMEOUT_S)
        found.sacct_ok, found.sacct = True, "sacct answers"
    except SlurmError as exc:
        found.sacct = str(exc)
    return found


def chip_of(node: NodeReport) -> str:
    """The chip model Slurm names for a node: its GRES type, else a feature (``910B4``); empty when none does."""
    for name in (*node.gres_types, *node.features):
        if ASCEND_CHIP.fullmatch(name):
            return name
    return ""


def assess(found: Survey, *, partition: str = "") -> list[Finding]:
    """What is wrong with this cluster for the portal; problems first. ``partition``: the one jobs go to."""
    problems: list[str] = []
    warnings: list[str] = []
    if "version" in found.errors:
        problems.append(f"Slurm's commands do not work here: {found.errors['version']}")
    if not found.controller_up:
        problems.append(f"the controller does not answer ({found.controller}): nothing can be submitted")
    else:
        for part, why in found.errors.items():
            if part in ("nodes", "partitions"):
                problems.append(f"could not read Slurm's {part}: {why}")
        npu_nodes = [n for n in found.nodes if n.cards]
        if found.nodes and not npu_nodes:
            problems.append(
                "no node declares an npu GRES (Gres=npu:c0:1,… or Gres=npu:8): the portal has no card to place"
            )
        for node in found.nodes:
            if not node.cards:
                warnings.append(f"node {node.name} declares no npu GRES (Gres={node.gres or '(none)'}): not used")
            elif node.down:
                warnings.append(f"node {node.name} is {node.state}" + (f": {node.reason}" if node.reason else ""))
            elif node.drained:
                warnings.append(
                    f"node {node.name} is drained ({node.state})" + (f": {node.reason}" if node.reason else "")
                )
        names = [p.name for p in found.partitions]
        if partition and found.partitions and partition not in names:
            problems.append(
                f"NPUPORTAL_SLURM_PARTITION={partition!r} is no partition of this cluster ({', '.join(names)})"
            )
    if not found.sacct_ok:
        if found.accounting_type.endswith("/none"):
            warnings.append(
                "no accounting (AccountingStorageType=accounting_storage/none): how jobs ended is read from "
                "the controller, which forgets a job after MinJobAge"
            )
        else:
            warnings.append(
                f"sacct does not answer ({found.sacct}): how jobs ended is read from the controller meanwhile"
            )
    return [Finding("problem", t) for t in problems] + [Finding("warning", t) for t in warnings]
