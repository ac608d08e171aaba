"""The portal's half of a multi-node launch, without agents: the rendezvous it sends and the part it blames."""

from __future__ import annotations

from typing import Any

import pytest

from devices.executors.agents import first_failed_part
from devices.services import rendezvous
from devices.services.agent_client import AgentAddress, AgentClient, AgentError

A = AgentAddress(1, "ascend-b4-01", "http://10.0.0.11:8471", "t" * 16)
B = AgentAddress(2, "ascend-b4-02", "http://10.0.0.12:8471", "t" * 16)


def _offer(self: AgentClient, run_id: str, devices: list[int], port: bool) -> dict[str, Any]:
    first = self.base.endswith("11:8471")
    return {
        "job_id": run_id,
        "address": "192.0.2.1" if first else None,  # the second advertises nothing: its URL's host is used
        "port": 29777 if port else None,
        "devices": [{"device_id": d, "device_ip": f"192.168.{100 + d}.{11 if first else 12}"} for d in devices],
    }


def test_every_part_gets_the_same_rendezvous_and_its_own_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AgentClient, "rendezvous", _offer)
    targets, errors = rendezvous.meet("5.1", [(A, {"job_id": "5.1", "devices": [0, 1]}), (B, {"devices": [0, 1]})])
    assert errors == []
    (_, first), (_, second) = targets
    assert first["rendezvous"]["node_rank"] == 0 and second["rendezvous"]["node_rank"] == 1
    assert {k: v for k, v in first["rendezvous"].items() if k != "node_rank"} == {
        k: v for k, v in second["rendezvous"].items() if k != "node_rank"
    }
    assert first["rendezvous"]["master_addr"] == "192.0.2.1"
    assert first["rendezvous"]["master_port"] == 29777
    assert [s["server_id"] for s in first["rendezvous"]["servers"]] == ["192.0.2.1", "10.0.0.12"]
    assert first["rendezvous"]["servers"][1]["device"][1] == {"device_id": 1, "device_ip": "192.168.101.12"}


def test_a_job_on_one_server_needs_no_rendezvous_and_a_refusal_is_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    one = [(A, {"devices": [0]})]
    assert rendezvous.meet("6.1", one) == (one, [])

    def refuse(self: AgentClient, run_id: str, devices: list[int], port: bool) -> dict[str, Any]:
        if port:
            raise AgentError("POST /v1/rendezvous: HTTP 503 no free port", status=503)
        return _offer(self, run_id, devices, port)

    monkeypatch.setattr(AgentClient, "rendezvous", refuse)
    targets = [(A, {"devices": [0]}), (B, {"devices": [0]})]
    sent, errors = rendezvous.meet("6.1", targets)
    assert sent == targets and [a.name for a, _ in errors] == ["ascend-b4-01"]


def test_the_part_that_failed_first_is_blamed_not_the_one_read_first() -> None:
    seen = {
        "7.1": {
            1: {"state": "failed", "exit_code": 1, "ended_at": "2026-12-01T10:00:05+00:00"},
            2: {"state": "failed", "exit_code": 1, "ended_at": "2026-12-01T10:00:01+00:00"},
        }
    }
    node, record = first_failed_part("7.1", seen, 1, seen["7.1"][1])
    assert node == 2 and record["ended_at"].endswith("01+00:00")
    alone = {"state": "killed", "reason": "walltime", "ended_at": None}
    assert first_failed_part("8.1", {}, 1, alone) == (1, alone)
