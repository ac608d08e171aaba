"""The HCCL rank table of a multi-node job, and where a node's device IPs come from.

HCCL (the collective library of CANN) finds the other cards of a job through a *rank table*: a JSON
file naming every server and, on each, every card with the IP address of its RoCE port and its rank.
MindCluster writes it for Kubernetes jobs; our agent writes it for each part of a multi-node job
(:mod:`devices.agent.rendezvous`), from the servers the portal lists in the launch. Ranks run
0..WORLD_SIZE-1 in server order, then in card order on each server, so every part computes the same
table.

A card's IP lives in ``/etc/hccn.conf`` (``address_<device>=<ip>``, written by ``hccn_tool`` when an
admin configured it) and is read live with ``hccn_tool -i <device> -ip -g`` (``ipaddr:<ip>``).
Nothing here runs a tool or opens a file: the parsers take the text, so they are tested on fixtures.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

RANK_TABLE_VERSION = "1.0"

_HCCN_ADDRESS = re.compile(r"^\s*address_(?P<device>\d{1,4})\s*=\s*(?P<ip>\S+)\s*$")
_HCCN_TOOL_IP = re.compile(r"^\s*ipaddr\s*:\s*(?P<ip>\S+)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class ServerCards:
    """One server of a job: its id (the address its agent advertises) and its cards as ``(device_id, device_ip)``."""

    server_id: str
    devices: tuple[tuple[int, str], ...]


def _ipv4(text: str) -> str | None:
    try:
        return str(ipaddress.IPv4Address(text))
    except ValueError:
        return None


def parse_hccn_conf(text: str) -> dict[int, str]:
    """``{device: ip}`` from ``/etc/hccn.conf``; other keys (netmask_N, netdetect_N, gateway_N) are ignored.

    A line whose value is not an IPv4 address is skipped rather than trusted: HCCL would fail on it
    much later, on every server of the job, with a far less clear message.
    """
    found: dict[int, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        match = _HCCN_ADDRESS.match(line)
        if match is None:
            continue
        ip = _ipv4(match.group("ip"))
        if ip is not None:
            found[int(match.group("device"))] = ip
    return found


def parse_hccn_tool_ip(text: str) -> str | None:
    """The IP of ``hccn_tool -i N -ip -g`` (``ipaddr:192.168.100.101`` then ``netmask:...``), or ``None``."""
    for line in text.splitlines():
        match = _HCCN_TOOL_IP.match(line)
        if match is not None:
            return _ipv4(match.group("ip"))
    return None


def build_rank_table(servers: Sequence[ServerCards]) -> dict[str, Any]:
    """The rank table of ``servers`` in this order: ranks 0..N-1 over servers, then cards (each sorted by id)."""
    server_list: list[dict[str, Any]] = []
    rank = 0
    for server in servers:
        devices = []
        for device_id, device_ip in sorted(server.devices):
            devices.append({"device_id": str(device_id), "device_ip": device_ip, "rank_id": str(rank)})
            rank += 1
        server_list.append({"server_id": server.server_id, "device": devices})
    return {
        "version": RANK_TABLE_VERSION,
        "server_count": str(len(servers)),
        "server_list": server_list,
        "status": "completed",
    }


def sim_device_ips(node: str, indices: Sequence[int]) -> dict[int, str]:
    """Made-up but stable device IPs for a simulated node, in the usual layout (one /24 per card slot).

    Real sites number card ``d`` of server ``s`` as ``192.168.(100+d).(s)``; the server part here is
    a fixed function of the node name, so two simulated nodes get different addresses and a test can
    predict them.
    """
    host = 1 + sum((i + 1) * ord(c) for i, c in enumerate(node)) % 254
    return {index: f"192.168.{100 + index % 100}.{host}" for index in indices}


def rank_table_ranks(table: Mapping[str, Any]) -> list[int]:
    """Every ``rank_id`` of a rank table in file order (what a check of a written table compares)."""
    return [int(d["rank_id"]) for s in table.get("server_list", []) for d in s.get("device", [])]
