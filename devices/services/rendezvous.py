"""The portal's half of a multi-node launch: one rendezvous for every part of a job.

A job whose cards are on several servers is launched by each server's agent. Before the launches are
sent, every agent is asked for its part (``POST /v1/rendezvous``, concurrently): the address it is
reached at, its cards' IPs, and on the first server (by node name, node rank 0) a port reserved for
the job. Each launch then carries the same ``rendezvous`` — master address and port, every server with
its cards — and its own node rank; the agents turn it into ``MASTER_ADDR``, ``MASTER_PORT``,
``WORLD_SIZE``, ``NNODES``, ``NODE_RANK``, ``NPROC_PER_NODE`` and an HCCL rank table
(``devices/agent/rendezvous.py``; docs/agent.md, "Multi-node jobs").

Asking again is harmless: an agent offers a run the port it already reserved for it, so a launch
retried by the poll (one part refused, the others running) gets the rendezvous the running parts have.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

from devices.services.agent_client import AgentAddress, AgentClient, AgentError

Target = tuple[AgentAddress, dict[str, Any]]


def server_address(answer: dict[str, Any], address: AgentAddress) -> str:
    """Where the other servers reach this one: the agent's ``--advertise-address``, else its URL's host."""
    advertised = answer.get("address")
    if isinstance(advertised, str) and advertised:
        return advertised
    return urlsplit(address.url).hostname or address.name


def meet(run_id: str, targets: list[Target]) -> tuple[list[Target], list[tuple[AgentAddress, AgentError]]]:
    """The launches of ``targets`` (first server first) with their rendezvous, or the agents that failed to offer one.

    A job on one server is returned as it is: it needs no rendezvous.
    """
    if len(targets) < 2:
        return targets, []

    def ask(item: tuple[int, Target]) -> dict[str, Any] | AgentError:
        rank, (address, payload) = item
        try:
            return AgentClient(address).rendezvous(run_id, list(payload.get("devices", [])), port=rank == 0)
        except AgentError as exc:
            return exc

    with ThreadPoolExecutor(max_workers=min(16, len(targets))) as pool:
        answers = list(pool.map(ask, enumerate(targets)))
    errors = [(address, a) for (address, _), a in zip(targets, answers, strict=True) if isinstance(a, AgentError)]
    if errors:
        return targets, errors
    offers = [a for a in answers if isinstance(a, dict)]
    servers = [
        {
            "server_id": server_address(offer, address),
            "device": [
                {"device_id": d.get("device_id"), "device_ip": d.get("device_ip") or ""}
                for d in offer["devices"]
                if isinstance(d, dict)
            ],
        }
        for offer, (address, _) in zip(offers, targets, strict=True)
    ]
    master = {"master_addr": servers[0]["server_id"], "master_port": offers[0]["port"], "servers": servers}
    return [
        (address, {**payload, "rendezvous": {**master, "node_rank": rank}})
        for rank, (address, payload) in enumerate(targets)
    ], []
