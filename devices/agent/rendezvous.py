"""How the parts of a multi-node job find each other: one master address and port, ranks, a rank table.

A job on N servers is launched by each of its N agents. Before the launch the portal asks every agent
for its part of the rendezvous (``POST /v1/rendezvous``): the address it advertises, its cards' IPs,
and on the first server (node rank 0) a free port it reserves for the job. The portal then sends each
agent the same rendezvous in the launch (``"rendezvous"`` of ``POST /v1/jobs``): the master address and
port, every server with its cards, and this part's node rank. Each agent checks that its own cards are
the ones listed, writes the HCCL rank table (:mod:`devices.agent.ranktable`) and adds the variables of
:func:`Rendezvous.env` to the job's environment (docs/agent.md, "Multi-node jobs").

The port is reserved per run id, so asking again (a launch retried after a lost answer) gets the same
port; it stays reserved while the agent knows the run as running, or for :data:`RESERVE_TTL_S` after
it was offered if no launch came. Reserved ports are picked at random from ``--rendezvous-ports``
among those nothing on the node listens on, so two agents on one host rarely collide; give agents
sharing a host disjoint ranges to rule it out.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.agent.backends import Backend
from devices.agent.environment import RENDEZVOUS_NAMES
from devices.agent.errors import ApiError
from devices.agent.procfs import write_json_atomic
from devices.agent.ranktable import ServerCards, build_rank_table

#: Variables a multi-node launch sets; a job's own ``env`` may not set them too (one list, the environment's).
RENDEZVOUS_ENV = RENDEZVOUS_NAMES
DEFAULT_PORTS = (29500, 29999)
#: How long an offered port stays reserved for a run that has not been launched.
RESERVE_TTL_S = 600.0
MAX_SERVERS = 1024
MAX_DEVICES_PER_SERVER = 64
_HOST_RE = re.compile(r"[A-Za-z0-9._:-]{1,255}")
_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def parse_port_range(text: str) -> tuple[int, int]:
    """``LOW-HIGH`` (``29500-29999``) → ``(29500, 29999)``; ``ValueError`` says what is wrong."""
    match = re.fullmatch(r"\s*(\d{1,5})\s*-\s*(\d{1,5})\s*", text)
    if not match:
        raise ValueError(f"--rendezvous-ports must be LOW-HIGH, such as 29500-29999, not {text!r}")
    low, high = int(match.group(1)), int(match.group(2))
    if not 1024 <= low <= high <= 65535:
        raise ValueError(f"--rendezvous-ports {text}: need 1024 <= LOW <= HIGH <= 65535")
    return low, high


def valid_host(text: str) -> bool:
    """An address or host name fit for ``MASTER_ADDR`` (no spaces, no URL parts)."""
    if not _HOST_RE.fullmatch(text):
        return False
    if ":" in text:
        try:
            ipaddress.IPv6Address(text)
        except ValueError:
            return False
    return True


# --------------------------------------------------------------------------------------------------
# the rendezvous of one part, as the launch carries it


@dataclass(frozen=True)
class Rendezvous:
    """One part's view of the job's rendezvous (validated ``"rendezvous"`` of a launch)."""

    master_addr: str
    master_port: int
    node_rank: int
    servers: tuple[ServerCards, ...]

    @property
    def world_size(self) -> int:
        return sum(len(s.devices) for s in self.servers)

    def env(self, rank_table_file: Path) -> dict[str, str]:
        """The variables every process of this part gets (docs/agent.md, "Multi-node jobs")."""
        values = (  # in the order of RENDEZVOUS_NAMES
            self.master_addr,  # MASTER_ADDR
            self.master_port,  # MASTER_PORT
            self.world_size,  # WORLD_SIZE
            len(self.servers),  # NNODES
            self.node_rank,  # NODE_RANK
            len(self.servers[self.node_rank].devices),  # NPROC_PER_NODE
            rank_table_file,  # RANK_TABLE_FILE
        )
        return dict(zip(RENDEZVOUS_NAMES, map(str, values), strict=True))


def _int(value: Any, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ApiError(400, f"{name} must be an integer from {low} to {high}", name)
    return value


def parse_rendezvous(value: Any, devices: Sequence[int], env: Mapping[str, str]) -> Rendezvous:
    """Check a launch's ``rendezvous``: its shape, and that this part's server lists exactly ``devices``."""
    if not isinstance(value, dict):
        raise ApiError(400, "rendezvous must be an object {master_addr, master_port, node_rank, servers}", "rendezvous")
    addr = value.get("master_addr")
    if not isinstance(addr, str) or not valid_host(addr):
        raise ApiError(400, "rendezvous.master_addr must be an address or host name", "rendezvous.master_addr")
    port = _int(value.get("master_port"), "rendezvous.master_port", 1, 65535)
    raw_servers = value.get("servers")
    if not isinstance(raw_servers, list) or not 1 <= len(raw_servers) <= MAX_SERVERS:
        raise ApiError(400, f"rendezvous.servers must list 1 to {MAX_SERVERS} servers", "rendezvous.servers")
    servers: list[ServerCards] = []
    for n, raw in enumerate(raw_servers):
        where = f"rendezvous.servers[{n}]"
        if not isinstance(raw, dict):
            raise ApiError(400, f"{where} must be an object {{server_id, device}}", "rendezvous.servers")
        server_id = raw.get("server_id")
        if not isinstance(server_id, str) or not valid_host(server_id):
            raise ApiError(400, f"{where}.server_id must be an address or host name", "rendezvous.servers")
        cards = raw.get("device")
        if not isinstance(cards, list) or not 1 <= len(cards) <= MAX_DEVICES_PER_SERVER:
            raise ApiError(400, f"{where}.device must list 1 to {MAX_DEVICES_PER_SERVER} cards", "rendezvous.servers")
        pairs: list[tuple[int, str]] = []
        for card in cards:
            if not isinstance(card, dict):
                raise ApiError(400, f"{where}.device entries must be {{device_id, device_ip}}", "rendezvous.servers")
            device_id = _int(card.get("device_id"), "rendezvous.servers.device_id", 0, 65535)
            ip = card.get("device_ip", "")
            if not isinstance(ip, str) or (ip and not valid_host(ip)):
                raise ApiError(400, f"{where}: device_ip of card {device_id} is not an address", "rendezvous.servers")
            pairs.append((device_id, ip))
        if len({d for d, _ in pairs}) != len(pairs):
            raise ApiError(400, f"{where} lists a card twice", "rendezvous.servers")
        servers.append(ServerCards(server_id, tuple(sorted(pairs))))
    rank = _int(value.get("node_rank"), "rendezvous.node_rank", 0, len(servers) - 1)
    mine = sorted(d for d, _ in servers[rank].devices)
    if mine != sorted(devices):
        raise ApiError(
            400,
            f"rendezvous.servers[{rank}] lists cards {mine}, but this part runs on {sorted(devices)}",
            "rendezvous.servers",
        )
    clash = sorted(set(env) & set(RENDEZVOUS_ENV))
    if clash:
        raise ApiError(400, f"env {clash[0]} is set by the agent for a multi-node job", "env")
    return Rendezvous(addr, port, rank, tuple(servers))


# --------------------------------------------------------------------------------------------------
# the agent's side: offers and rank tables


@dataclass
class _Reservation:
    port: int
    offered_ts: float


class RendezvousService:
    """Offers ports and card IPs (``POST /v1/rendezvous``) and prepares each multi-node part's launch.

    ``running`` says which run ids the agent has running now (a reserved port stays taken while its run
    runs). Files live in ``<state>/rendezvous/``: ``<run>.port`` (the reservation, so a restarted agent
    offers the same port again) and ``<run>.ranktable.json``.
    """

    def __init__(self, state_dir: Path, backend: Backend, running: Callable[[], set[str]]) -> None:
        self.dir = state_dir / "rendezvous"
        self.backend = backend
        self.running = running
        self.node = ""
        self.advertise: str | None = None
        self.ports = DEFAULT_PORTS
        self._lock = threading.Lock()
        self._reserved: dict[str, _Reservation] = {}
        self._loaded = False

    def configure(self, *, node: str, advertise: str | None, ports: tuple[int, int]) -> None:
        self.node, self.advertise, self.ports = node, advertise, ports

    def rank_table_path(self, run_id: str) -> Path:
        return self.dir / f"{run_id}.ranktable.json"

    # -- POST /v1/rendezvous ------------------------------------------------------------------------
    def offer(self, payload: Any, known: set[int] | None) -> dict[str, Any]:
        """This node's part of a rendezvous: ``{job_id, node, address, port, devices: [{device_id, device_ip}]}``.

        ``port`` is a reserved free port when the body asks for one (``"port": true``, the first server).
        """
        if not isinstance(payload, dict):
            raise ApiError(400, "body must be a JSON object {job_id, devices, port}", "body")
        run_id = payload.get("job_id")
        if isinstance(run_id, int) and not isinstance(run_id, bool):
            run_id = str(run_id)
        if not isinstance(run_id, str) or not _ID_RE.fullmatch(run_id):
            raise ApiError(400, "job_id must be a job id such as 12.1", "job_id")
        devices = payload.get("devices")
        if (
            not isinstance(devices, list)
            or not devices
            or not all(isinstance(d, int) and not isinstance(d, bool) for d in devices)
        ):
            raise ApiError(400, "devices must be a non-empty list of integer device indices", "devices")
        if known is None:
            raise ApiError(409, "the agent cannot list this node's devices right now; see GET /v1/devices", "devices")
        unknown = [d for d in devices if d not in known]
        if unknown:
            raise ApiError(400, f"unknown device index {unknown[0]}", "devices")
        want_port = payload.get("port", False)
        if not isinstance(want_port, bool):
            raise ApiError(400, "port must be true (reserve one for the job) or false", "port")
        ips = self.backend.device_ips(sorted(devices), self.node)
        missing = [d for d in sorted(devices) if d not in ips]
        if missing and self.backend.needs_device_ips:
            raise ApiError(
                409,
                f"no IP known for device {missing[0]} (neither /etc/hccn.conf nor `hccn_tool -i {missing[0]} -ip -g` "
                "gave one): HCCL cannot reach it",
                "devices",
            )
        return {
            "job_id": run_id,
            "node": self.node,
            "address": self.advertise,
            "port": self.reserve(run_id) if want_port else None,
            "devices": [{"device_id": d, "device_ip": ips.get(d, "")} for d in sorted(devices)],
        }

    def reserve(self, run_id: str) -> int:
        """The port reserved for ``run_id``: the one it already has, or a free one from the range."""
        running = self.running()  # before our lock: the job manager takes its own lock, then ours
        with self._lock:
            self._load()
            now = time.time()
            for rid, old in list(self._reserved.items()):  # release what no run needs any more
                if rid != run_id and rid not in running and now - old.offered_ts > RESERVE_TTL_S:
                    del self._reserved[rid]
                    for path in (self.dir / f"{rid}.port", self.rank_table_path(rid)):
                        path.unlink(missing_ok=True)
            held = self._reserved.get(run_id)
            if held is not None:
                return held.port
            taken = {r.port for r in self._reserved.values()}
            low, high = self.ports
            candidates = [p for p in range(low, high + 1) if p not in taken]
            random.shuffle(candidates)
            for port in candidates[:256]:
                if _bindable(port):
                    self._reserved[run_id] = _Reservation(port, now)
                    self.dir.mkdir(mode=0o700, exist_ok=True)
                    write_json_atomic(self.dir / f"{run_id}.port", {"port": port, "offered_ts": now})
                    return port
        raise ApiError(503, f"no free port left in --rendezvous-ports {low}-{high}", "port")

    def _load(self) -> None:
        """Reservations of an earlier agent process (its runs may still run): read once."""
        if self._loaded:
            return
        self._loaded = True
        for path in self.dir.glob("*.port") if self.dir.is_dir() else ():
            try:
                data = json.loads(path.read_text())
                self._reserved[path.name[: -len(".port")]] = _Reservation(int(data["port"]), float(data["offered_ts"]))
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)

    # -- the launch ---------------------------------------------------------------------------------
    def prepare(self, run_id: str, rendezvous: Rendezvous, owner: Any = None) -> dict[str, str]:
        """Write the part's rank table and return the variables its launch adds (see :class:`Rendezvous`).

        ``owner`` is the account the job runs as (``devices.agent.accounts.Account``; None when jobs run
        as the agent): the table is then that account's, mode 0600, in a folder others may only pass
        through, so the job reads its own table and no other account's job reads it.
        """
        path = self.rank_table_path(run_id)
        self.dir.mkdir(mode=0o700, exist_ok=True)
        write_json_atomic(path, build_rank_table(rendezvous.servers))
        path.chmod(0o600)
        if owner is not None and os.geteuid() == 0:
            self.dir.chmod(0o711)
            os.chown(path, owner.uid, owner.gid)
        if rendezvous.node_rank == 0:
            with self._lock:  # the launch holds the port from now on, even if it was not offered here
                self._load()
                self._reserved.setdefault(run_id, _Reservation(rendezvous.master_port, time.time()))
        return rendezvous.env(path)


def _bindable(port: int) -> bool:
    """Whether nothing listens on ``port`` of any address now (the job's rank 0 binds it later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True
