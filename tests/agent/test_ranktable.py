"""The rank table builder, the hccn parsers and the agent's rendezvous checks (docs/agent.md, "Multi-node jobs")."""

from __future__ import annotations

import contextlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices.agent.accounts import AccountPolicy
from devices.agent.backends import NpuSmiBackend
from devices.agent.environment import JobSetup
from devices.agent.errors import ApiError
from devices.agent.jobs import JobManager
from devices.agent.ranktable import (
    ServerCards,
    build_rank_table,
    parse_hccn_conf,
    parse_hccn_tool_ip,
    rank_table_ranks,
    sim_device_ips,
)
from devices.agent.rendezvous import RendezvousService, _bindable, parse_port_range, parse_rendezvous
from devices.agent.sim import SimBackend

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "hccn"


def test_hccn_conf_gives_every_cards_address() -> None:
    ips = parse_hccn_conf((FIXTURES / "hccn.conf").read_text())
    assert ips == {d: f"192.168.{100 + d}.101" for d in range(8)}


def test_hccn_conf_skips_what_is_not_an_address() -> None:
    text = "# comment\naddress_0 = 10.0.0.1  \naddress_1=not-an-ip\naddress_x=1.2.3.4\nnetmask_2=255.0.0.0\n"
    assert parse_hccn_conf(text) == {0: "10.0.0.1"}
    assert parse_hccn_conf("") == {}


def test_hccn_tool_output_gives_the_address() -> None:
    assert parse_hccn_tool_ip((FIXTURES / "hccn_tool-i0-ip-g.txt").read_text()) == "192.168.100.101"
    assert parse_hccn_tool_ip("netmask:255.255.255.0\n") is None
    assert parse_hccn_tool_ip("ipaddr:999.1.1.1\n") is None


def test_rank_table_numbers_ranks_in_server_order() -> None:
    table = build_rank_table(
        [
            ServerCards("10.0.0.1", ((1, "192.168.101.1"), (0, "192.168.100.1"))),
            ServerCards("10.0.0.2", ((0, "192.168.100.2"), (1, "192.168.101.2"))),
        ]
    )
    assert table == {
        "version": "1.0",
        "server_count": "2",
        "status": "completed",
        "server_list": [
            {
                "server_id": "10.0.0.1",
                "device": [
                    {"device_id": "0", "device_ip": "192.168.100.1", "rank_id": "0"},
                    {"device_id": "1", "device_ip": "192.168.101.1", "rank_id": "1"},
                ],
            },
            {
                "server_id": "10.0.0.2",
                "device": [
                    {"device_id": "0", "device_ip": "192.168.100.2", "rank_id": "2"},
                    {"device_id": "1", "device_ip": "192.168.101.2", "rank_id": "3"},
                ],
            },
        ],
    }
    assert rank_table_ranks(table) == [0, 1, 2, 3]


def test_sim_ips_are_stable_and_differ_between_nodes() -> None:
    a, b = sim_device_ips("ascend-b4-01", range(8)), sim_device_ips("ascend-b4-02", range(8))
    assert a == sim_device_ips("ascend-b4-01", range(8))
    assert set(a.values()).isdisjoint(b.values())
    assert a[3].startswith("192.168.103.")


def test_npu_smi_backend_reads_hccn_conf_then_hccn_tool(tmp_path: Path) -> None:
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_0=192.168.100.7\n")
    tool = tmp_path / "hccn_tool"
    tool.write_text('#!/bin/sh\n[ "$2" = 1 ] && echo "ipaddr:192.168.101.7" && exit 0\nexit 1\n')
    tool.chmod(0o755)
    backend = NpuSmiBackend("npu-smi", 5)
    backend.hccn_conf, backend.hccn_tool = conf, str(tool)
    assert backend.device_ips([0, 1, 2], "n") == {0: "192.168.100.7", 1: "192.168.101.7"}
    backend.hccn_conf, backend.hccn_tool = tmp_path / "none", str(tmp_path / "missing")
    assert backend.device_ips([0], "n") == {}


def _rendezvous(**over: object) -> dict[str, object]:
    body: dict[str, object] = {
        "master_addr": "10.0.0.1",
        "master_port": 29501,
        "node_rank": 1,
        "servers": [
            {"server_id": "10.0.0.1", "device": [{"device_id": 0, "device_ip": "192.168.100.1"}]},
            {"server_id": "10.0.0.2", "device": [{"device_id": 0, "device_ip": "192.168.100.2"}]},
        ],
    }
    body.update(over)
    return body


def test_a_launch_rendezvous_becomes_the_variables(tmp_path: Path) -> None:
    rdv = parse_rendezvous(_rendezvous(), [0], {})
    env = rdv.env(tmp_path / "t.json")
    assert env == {
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29501",
        "WORLD_SIZE": "2",
        "NNODES": "2",
        "NODE_RANK": "1",
        "NPROC_PER_NODE": "1",
        "RANK_TABLE_FILE": str(tmp_path / "t.json"),
    }


@pytest.mark.parametrize(
    ("over", "devices", "env", "field"),
    [
        ({"master_addr": "a b"}, [0], {}, "rendezvous.master_addr"),
        ({"master_port": 0}, [0], {}, "rendezvous.master_port"),
        ({"node_rank": 2}, [0], {}, "rendezvous.node_rank"),
        ({"servers": []}, [0], {}, "rendezvous.servers"),
        ({}, [0, 1], {}, "rendezvous.servers"),  # this part's cards are not the ones listed
        ({}, [0], {"MASTER_PORT": "1"}, "env"),
    ],
)
def test_a_bad_rendezvous_is_refused_naming_the_field(
    over: dict[str, object], devices: list[int], env: dict[str, str], field: str
) -> None:
    with pytest.raises(ApiError) as err:
        parse_rendezvous(_rendezvous(**over), devices, env)
    assert err.value.status == 400 and err.value.field == field


def test_port_range_flag() -> None:
    assert parse_port_range("29500-29999") == (29500, 29999)
    for bad in ("29500", "100-200", "3000-2000", "1024-70000"):
        with pytest.raises(ValueError):
            parse_port_range(bad)


@contextlib.contextmanager
def _listening_beside_a_free_port() -> Iterator[int]:
    """A port something listens on whose next port is free now.

    The ephemeral port the kernel hands out may have a neighbour another process holds (the suite
    runs in parallel), and then the range of two offers nothing: look for a pair that has room.
    """
    for _ in range(100):
        with socket.socket() as busy:
            busy.bind(("", 0))
            busy.listen()
            port = busy.getsockname()[1]
            if port < 65535 and _bindable(port + 1):
                yield port
                return
    raise RuntimeError("no listening port with a free neighbour found in 100 tries")


def test_an_offer_reserves_one_free_port_per_run_and_the_launch_writes_the_table(tmp_path: Path) -> None:
    backend = SimBackend("910B4", 2, tmp_path)
    service = RendezvousService(tmp_path, backend, set)
    with _listening_beside_a_free_port() as port:
        service.configure(node="n1", advertise="10.0.0.1", ports=(port, port + 1))
        offer = service.offer({"job_id": "7.1", "devices": [0, 1], "port": True}, {0, 1})
        assert offer["port"] == port + 1, "the port something listens on is not offered"
    assert offer["address"] == "10.0.0.1"
    assert [d["device_id"] for d in offer["devices"]] == [0, 1]
    assert service.offer({"job_id": "7.1", "devices": [0, 1], "port": True}, {0, 1})["port"] == port + 1
    assert RendezvousService(tmp_path, backend, set).reserve("7.1") == port + 1, "kept across an agent restart"
    with pytest.raises(ApiError) as err:
        service.offer({"job_id": "7.1", "devices": [5]}, {0, 1})
    assert err.value.field == "devices"

    rdv = parse_rendezvous(_rendezvous(node_rank=0), [0], {})
    env = service.prepare("8.1", rdv)
    table = json.loads(Path(env["RANK_TABLE_FILE"]).read_text())
    assert rank_table_ranks(table) == [0, 1] and table["server_count"] == "2"


def test_the_job_manager_adds_the_rendezvous_to_a_launch(tmp_path: Path) -> None:
    # Jobs as the agent's own account (the demo's way), so the test runs the same as root or not.
    setup = JobSetup(AccountPolicy.for_agent("node-a", jobs_as_agent=True, allow_root=True))
    manager = JobManager(tmp_path, SimBackend("910B4", 2, tmp_path), setup=setup)
    with pytest.raises(ApiError) as err:
        manager.submit({"job_id": "9.1", "command": "true", "devices": [0, 1], "rendezvous": _rendezvous()})
    assert err.value.field == "rendezvous.servers"
    assert manager.list_jobs() == [], "a refused launch starts nothing"
