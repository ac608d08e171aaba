"""Nodes join and leave the inventory as a site does it: ``manage.py nodes``, ``POST``/``DELETE /api/v1/nodes/``.

* **add** asks the node's agent for its devices (``GET /v1/devices``) *before* anything is written,
  so an agent that does not answer, a token it refuses or an answer without a device list changes
  nothing; then, in one transaction, the node and its cards are created with a ``usable`` inventory
  event each (cause ``joined``). A name held by an active node is refused. The name of a *removed*
  node reactivates it: same rows (its past allocations keep pointing at them), new agent address,
  and a new event per card, so its history shows the gap.
* **remove** is refused while jobs run on the node (it names them). With ``drain`` the node is
  drained instead, and removing it again once it is ``drained`` succeeds; with nothing running it is
  removed at once. A removed node keeps its rows (``Node.removed_at`` is set, each card gets a
  ``removed`` event): it is no longer scheduled, polled, shown on /cluster/ or listed by the API.

Errors are :class:`RegistrationError` with a ``kind`` the command and the API map to an exit code
or an HTTP status, and the request ``field`` at fault when there is one.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.utils import timezone

from devices.models import Device, Node, VnpuTemplate
from devices.services import inventory
from devices.services.agent_client import AgentAddress, AgentClient, AgentError
from devices.services.operations import drain_node
from npuportal.display_time import clock_text
from quotas.models import AuditEvent
from scheduling.models import Job

#: What a node may be called: what the API's ``/nodes/{name}/`` route accepts.
NAME = re.compile(r"[-a-zA-Z0-9_.]{1,100}")
#: The shape of an agent URL, for the API schema; :func:`agent_url_problem` is the whole rule.
AGENT_URL_PATTERN = r"^https?://[!-~]+$"
#: Published AI cores and AI CPUs per chip, for agents that report only the chip model (npu-smi does).
CHIP_FIGURES: dict[str, tuple[int, int]] = {
    "910A": (32, 14),
    "910PremiumA": (32, 14),
    "910B1": (25, 6),
    "910B2": (24, 6),
    "910B3": (20, 7),
    "910B4": (20, 7),
    "Ascend910": (24, 6),
    "310P3": (8, 8),
    "310": (2, 8),
}


class RegistrationError(Exception):
    """A refused add or remove. ``kind``: ``invalid``, ``duplicate``, ``unreachable``, ``refused``
    (the agent refused the token), ``busy`` (jobs run there) or ``missing`` (no such node)."""

    def __init__(self, message: str, *, kind: str, field: str | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.field = field


@dataclass(frozen=True)
class ReportedDevice:
    index: int
    chip_model: str
    hbm_mb: int
    ai_cores: int
    ai_cpus: int
    topology_group: str


@dataclass(frozen=True)
class Registration:
    node: Node
    #: The name belonged to a removed node, which is back.
    reactivated: bool
    devices: int


@dataclass(frozen=True)
class Removal:
    node: Node
    #: False: jobs still run there and the node was drained instead (``drain=True``).
    removed: bool
    running: list[tuple[int, str]] = field(default_factory=list)


#: One label of a host name: what the HTTP client can connect to (``_`` too, which some sites use).
HOST_LABEL = re.compile(r"[A-Za-z0-9_-]{1,63}")


def _is_host(host: str) -> bool:
    """An IP address, or a host name of 1-63 character labels (253 at most): else the HTTP client raises."""
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    return 0 < len(name) <= 253 and all(HOST_LABEL.fullmatch(label) for label in name.split("."))


def agent_url_problem(agent_url: str) -> str | None:
    """Why ``agent_url`` is not an address the portal can call its agent at, or ``None`` when it is.

    ``http``/``https``, a host, an optional port (1-65535) and path; visible ASCII only (an
    internationalised host name in its ``xn--`` form); no user, password, query or fragment:
    the portal appends ``/v1/...`` to it and authenticates with the token.
    """
    if len(agent_url) > 200:
        return "longer than 200 characters"
    if not all("\x21" <= c <= "\x7e" for c in agent_url):
        return f"{agent_url!r}: visible ASCII characters only, no spaces (a host name in its xn-- form)"
    not_a_url = f"{agent_url!r} is not an agent URL (http or https, and a host: http://10.0.0.5:8471)"
    try:
        parts = urlsplit(agent_url)
    except ValueError:  # an unclosed IPv6 bracket: "http://[::1"
        return not_a_url
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return not_a_url
    if not _is_host(parts.hostname):
        return (
            f"{agent_url!r}: {parts.hostname!r} is not a host name (labels of 1-63 letters, digits, '-' or '_', "
            "joined by dots, 253 characters at most) or an IP address"
        )
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        port = 0
    if port is not None and not 1 <= port <= 65535:
        return f"{agent_url!r}: the port must be a number from 1 to 65535"
    if parts.username is not None or parts.password is not None:
        return f"{agent_url!r}: no user or password in it (the agent checks its token)"
    if parts.query or parts.fragment or agent_url.endswith(("?", "#")):
        return f"{agent_url!r}: no query or fragment (?..., #...): the agent's base URL"
    return None


#: What an agent token may be: it travels in an HTTP header (``Authorization: Bearer``), which
#: carries ASCII only, so visible ASCII characters (``!`` to ``~``), no spaces.
TOKEN = re.compile(r"[!-~]{1,200}")
TOKEN_RULE = "must be the agent's token: 1-200 visible ASCII characters, no spaces"


def token_problem(token: str) -> str | None:
    """Why ``token`` cannot be an agent token, or ``None`` (the Django admin's form asks this too)."""
    return None if TOKEN.fullmatch(token or "") else TOKEN_RULE


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a node, or ``None``."""
    return (
        None if NAME.fullmatch(name or "") else f"{name!r} is not a node name (1-100 letters, digits, '-', '_' or '.')"
    )


def validate(name: str, agent_url: str, token: str) -> None:
    """Refuse a bad name, URL or token with the field named, before any agent is asked."""
    problem = name_problem(name)
    if problem:
        raise RegistrationError(problem, kind="invalid", field="name")
    problem = agent_url_problem(agent_url or "")
    if problem:
        raise RegistrationError(problem, kind="invalid", field="agent_url")
    problem = token_problem((token or "").strip())
    if problem:
        raise RegistrationError(problem, kind="invalid", field="token")


def _check_free(name: str) -> Node | None:
    """The removed node of that name, if any; refuses a name an active node holds."""
    node = Node.objects.filter(name=name).first()
    if node is not None and node.removed_at is None:
        raise RegistrationError(f"a node named {name} is already in the inventory", kind="duplicate", field="name")
    return node


def _topology_group(entry: dict[str, Any], kind: str) -> str:
    group = entry.get("topology_group")
    if isinstance(group, str):
        return group[:50]
    if isinstance(group, int) and not isinstance(group, bool):
        return f"ring{group}" if kind == "ring" else f"hccs{group}"
    return ""


def _whole(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def ask_agent(name: str, agent_url: str, token: str) -> tuple[list[ReportedDevice], list[dict[str, Any]]]:
    """The devices (and vNPU templates, when the agent reports any) the agent at ``agent_url`` serves.

    No database access: called before the transaction, so nothing is held during the call.
    """
    client = AgentClient(AgentAddress(0, name, agent_url, token.strip()))
    try:
        body = client.devices()
    except AgentError as exc:
        if exc.status in (401, 403):
            raise RegistrationError(
                f"the agent at {agent_url} refused the token (HTTP {exc.status}); "
                "give the token in the agent's --token-file",
                kind="refused",
                field="token",
            ) from exc
        raise RegistrationError(
            f"cannot read the devices of the agent at {agent_url}: {exc}", kind="unreachable", field="agent_url"
        ) from exc
    if body.get("error"):
        raise RegistrationError(
            f"the agent at {agent_url} could not read its devices: {body['error']}",
            kind="unreachable",
            field="agent_url",
        )
    kind = str((body.get("topology") or {}).get("kind", "")) if isinstance(body.get("topology"), dict) else ""
    found: dict[int, ReportedDevice] = {}
    for entry in body["devices"]:
        index = _whole(entry.get("index")) if isinstance(entry, dict) else None
        chip = entry.get("chip_model") if isinstance(entry, dict) else None
        if index is None or not isinstance(chip, str) or not chip.strip():
            raise RegistrationError(
                f"the agent at {agent_url} reports a device without an index or chip model: {entry!r}"[:300],
                kind="unreachable",
                field="agent_url",
            )
        chip = chip.strip()[:50]
        cores, cpus = CHIP_FIGURES.get(chip, (0, 0))
        found[index] = ReportedDevice(
            index=index,
            chip_model=chip,
            hbm_mb=_whole(entry.get("hbm_total_mb")) or 0,
            ai_cores=_whole(entry.get("ai_cores")) or cores,
            ai_cpus=_whole(entry.get("ai_cpus")) or cpus,
            topology_group=_topology_group(entry, kind),
        )
    if not found:
        raise RegistrationError(f"the agent at {agent_url} reports no devices", kind="unreachable", field="agent_url")
    templates = [t for t in body.get("vnpu_templates") or [] if isinstance(t, dict)]
    return [found[i] for i in sorted(found)], templates


def register_node(
    name: str,
    agent_url: str,
    token: str,
    *,
    actor: AbstractBaseUser | None,
    labels: dict[str, Any] | None = None,
    at: datetime | None = None,
) -> Registration:
    """Ask the agent for its devices, then add the node with them (see the module docstring)."""
    name, agent_url, token = (name or "").strip(), (agent_url or "").strip(), (token or "").strip()
    validate(name, agent_url, token)
    _check_free(name)  # before the agent is asked: a duplicate is refused without a network call
    reported, templates = ask_agent(name, agent_url, token)
    return _store(name, agent_url, token, reported, templates, actor=actor, labels=labels, at=at, source=agent_url)


@transaction.atomic
def _store(
    name: str,
    agent_url: str,
    token: str,
    reported: list[ReportedDevice],
    templates: list[dict[str, Any]],
    *,
    actor: AbstractBaseUser | None,
    labels: dict[str, Any] | None,
    at: datetime | None,
    source: str,
) -> Registration:
    """Write the node and its cards; ``source`` says where they were read (an agent's URL, Slurm)."""
    at = at or timezone.now()
    old = _check_free(name)  # again, inside the transaction: another add may have won meanwhile
    if old is None:
        node = Node.objects.create(name=name, agent_url=agent_url, agent_token=token, labels=labels or {})
        Node.objects.filter(pk=node.pk).update(created=at)
        node.created = at
    else:
        node = Node.objects.select_for_update().get(pk=old.pk)
        node.agent_url, node.agent_token = agent_url, token
        node.removed_at = None
        node.state, node.reachable = Node.State.READY, True
        node.missed_polls = node.answered_polls = 0
        node.last_poll_error = ""
        if labels is not None:
            node.labels = labels
        node.save()
    existing = {d.index: d for d in Device.objects.filter(node=node)}
    for item in reported:
        values = {
            "chip_model": item.chip_model,
            "hbm_mb": item.hbm_mb,
            "ai_cores": item.ai_cores,
            "ai_cpus": item.ai_cpus,
            "topology_group": item.topology_group,
        }
        device = existing.get(item.index)
        if device is None:
            existing[item.index] = Device.objects.create(node=node, index=item.index, **values)
        else:
            for key, value in values.items():
                setattr(device, key, value)
            # Readings start over: the poll judges the card afresh.
            device.health, device.health_detail, device.healthy_streak = Device.Health.HEALTHY, "", 0
            device.schedulable = True
            device.save()
    reported_indices = {item.index for item in reported}
    for index, device in existing.items():
        if index not in reported_indices:  # a card the agent no longer has: kept, never scheduled
            device.schedulable = False
            device.save(update_fields=["schedulable"])
    for t in templates:
        chip, tname = t.get("chip_model") or reported[0].chip_model, t.get("name")
        memory, cores = _whole(t.get("memory_mb")), _whole(t.get("ai_cores"))
        if isinstance(tname, str) and tname and isinstance(chip, str) and memory and cores:
            VnpuTemplate.objects.get_or_create(
                chip_model=chip[:50],
                name=tname[:50],
                defaults={"memory_mb": memory, "ai_cores": cores, "ai_cpus": _whole(t.get("ai_cpus")) or 0},
            )
    devices = list(existing.values())
    for device in devices:
        device.node = node
    verb = "rejoined" if old is not None else "joined"
    inventory.record(devices, at=at, cause=f"{verb}: registered from {source}")
    AuditEvent.objects.create(
        actor=actor,
        action="node.add",
        target=name,
        detail=f"{verb} with {len(reported)} device(s) ({', '.join(sorted({r.chip_model for r in reported}))}) "
        f"from {source}",
    )
    return Registration(node=node, reactivated=old is not None, devices=len(reported))


@dataclass(frozen=True)
class NodeSync:
    """What :func:`sync_node` did to a node: ``added``, ``re-added``, ``changed`` (``changes``: how), ``unchanged``."""

    node: Node
    outcome: str
    changes: list[str] = field(default_factory=list)


def reported_cards(indexes: Iterable[int], chip_model: str) -> list[ReportedDevice]:
    """Cards known by index and chip model only (what Slurm says of a node): the chip's published figures."""
    cores, cpus = CHIP_FIGURES.get(chip_model, (0, 0))
    return [ReportedDevice(i, chip_model[:50], 0, cores, cpus, "") for i in sorted(set(indexes))]


@transaction.atomic
def sync_node(
    name: str,
    reported: list[ReportedDevice],
    *,
    source: str,
    actor: AbstractBaseUser | None,
    at: datetime | None = None,
) -> NodeSync:
    """Make node ``name`` hold exactly the ``reported`` cards, as another inventory (Slurm) lists them.

    A new name (or a removed node's) is added as :func:`register_node` adds one, without an agent.
    A node in the inventory keeps its state, agent and readings; a card it lacks is added, a card
    whose chip model differs takes the new one, a card no longer reported stops being scheduled (its
    rows stay, as when an agent stops reporting one) and one reported again is scheduled again.
    Nothing is written when nothing differs, so a repeated import adds no history.
    """
    problem = name_problem(name)
    if problem:
        raise RegistrationError(problem, kind="invalid", field="name")
    at = at or timezone.now()
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is None or node.removed_at is not None:
        done = _store(name, "", "", reported, [], actor=actor, labels=None, at=at, source=source)
        return NodeSync(done.node, "re-added" if done.reactivated else "added")
    wanted = {item.index: item for item in reported}
    existing = {d.index: d for d in Device.objects.select_for_update().filter(node=node)}
    # What changed, grouped so that eight cards changing alike read as one phrase: (words) → card indexes.
    said: dict[str, list[int]] = {}
    touched: list[Device] = []
    for index, item in sorted(wanted.items()):
        device = existing.get(index)
        if device is None:
            device = Device.objects.create(
                node=node,
                index=index,
                chip_model=item.chip_model,
                hbm_mb=item.hbm_mb,
                ai_cores=item.ai_cores,
                ai_cpus=item.ai_cpus,
                topology_group=item.topology_group,
            )
            said.setdefault(f"added ({item.chip_model})", []).append(index)
        elif device.chip_model != item.chip_model or not device.schedulable:
            if device.chip_model != item.chip_model:
                said.setdefault("{is} " + f"{item.chip_model}, " + "{was} " + device.chip_model, []).append(index)
                device.chip_model, device.ai_cores, device.ai_cpus = item.chip_model, item.ai_cores, item.ai_cpus
            if not device.schedulable:
                said.setdefault("{is} back", []).append(index)
                device.schedulable = True
            device.save(update_fields=["chip_model", "ai_cores", "ai_cpus", "schedulable"])
        else:
            continue
        touched.append(device)
    for index, device in sorted(existing.items()):
        if index not in wanted and device.schedulable:
            device.schedulable = False
            device.save(update_fields=["schedulable"])
            said.setdefault("gone (kept, no longer scheduled)", []).append(index)
            touched.append(device)
    changes = [_card_words(indexes, words) for words, indexes in said.items()]
    if not changes:
        return NodeSync(node, "unchanged")
    for device in touched:
        device.node = node
    inventory.record(touched, at=at, cause=f"changed: read from {source}")
    AuditEvent.objects.create(
        actor=actor, action="node.update", target=name, detail=f"from {source}: {'; '.join(changes)}"
    )
    return NodeSync(node, "changed", changes)


def _card_words(indexes: list[int], words: str) -> str:
    """``card 7 is 910B4, was 910B3`` / ``cards 0-7 are 910B4, were 910B3`` (``{is}``, ``{was}`` agree)."""
    one = len(indexes) == 1
    if one:
        which = f"card {indexes[0]}"
    elif indexes == list(range(indexes[0], indexes[-1] + 1)):
        which = f"cards {indexes[0]}-{indexes[-1]}"
    else:
        which = "cards " + ",".join(map(str, indexes))
    return f"{which} " + words.replace("{is}", "is" if one else "are").replace("{was}", "was" if one else "were")


def running_jobs(node: Node) -> list[tuple[int, str]]:
    """``(id, name)`` of the jobs running on ``node`` now."""
    return list(
        Job.objects.filter(state=Job.State.RUNNING, allocations__device__node=node, allocations__end__isnull=True)
        .values_list("pk", "name")
        .distinct()
        .order_by("pk")
    )


def describe_jobs(jobs: list[tuple[int, str]]) -> str:
    shown = ", ".join(f"{pk} ({name})" for pk, name in jobs[:10])
    return shown + (f" and {len(jobs) - 10} more" if len(jobs) > 10 else "")


@transaction.atomic
def remove_node(name: str, *, actor: AbstractBaseUser | None, drain: bool = False, reason: str = "") -> Removal:
    """Take node ``name`` out of the inventory, or (``drain``, jobs running) drain it for a later remove."""
    node = Node.objects.select_for_update().filter(name=name).first()
    if node is None or node.removed_at is not None:
        when = f" (removed {clock_text(node.removed_at)})" if node is not None and node.removed_at else ""
        raise RegistrationError(f"no node named {name!r} in the inventory{when}", kind="missing")
    jobs = running_jobs(node)
    reason = reason.strip()[:200]
    if jobs:
        if not drain:
            raise RegistrationError(
                f"node {name} runs {len(jobs)} job(s): {describe_jobs(jobs)}; "
                "drain it first (--drain, or ?drain=true in the API) and remove it once it is drained",
                kind="busy",
            )
        drain_node(name, actor=actor, reason=reason or "to be removed")
        node.refresh_from_db()
        return Removal(node=node, removed=False, running=jobs)
    now = timezone.now()
    node.removed_at = now
    node.save(update_fields=["removed_at"])
    devices = list(node.devices.all())
    for device in devices:
        device.node = node
    inventory.record(devices, at=now, cause=f"removed: {reason}" if reason else "removed")
    AuditEvent.objects.create(
        actor=actor,
        action="node.remove",
        target=name,
        detail=f"left the inventory with {len(devices)} device(s)" + (f": {reason}" if reason else ""),
    )
    return Removal(node=node, removed=True)
