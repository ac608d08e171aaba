"""A two-server job through the portal and two real agents: its parts meet through the rendezvous
variables and exchange data; a failing part stops the other and the job names it (docs/agent.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from scheduling.models import Job
from tests.test_lifecycle_harness import NODE_A, NODE_B, cluster, eager_celery, poll, submit, tick, without_reservation
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest

#: Rank 0 listens on MASTER_PORT at MASTER_ADDR, rank 1 connects; they swap their NODE_RANK and a payload.
#: Each waits for the other up to a ceiling a busy machine never reaches (the two may start far apart).
BARRIER = r"""
import json, os, socket, sys, time

env = os.environ
rank, world = int(env["NODE_RANK"]), int(env["WORLD_SIZE"])
table = json.load(open(env["RANK_TABLE_FILE"]))
ranks = [int(d["rank_id"]) for s in table["server_list"] for d in s["device"]]
mine = [int(d["device_id"]) for d in table["server_list"][rank]["device"]]
visible = [int(d) for d in env["ASCEND_RT_VISIBLE_DEVICES"].split(",")]
assert ranks == list(range(world)), ranks
assert mine == visible and len(mine) == int(env["NPROC_PER_NODE"]), (mine, visible)
print(f"rank table ok: {len(ranks)} ranks on {table['server_count']} servers, mine {mine}", flush=True)
if rank == 1 and env.get("FAIL_RANK_1"):
    print("rank 1 fails on purpose", flush=True)
    sys.exit(1)
payload = f"rank {rank} says hello with {len(mine)} cards".encode()
addr, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
if rank == 0:
    server = socket.create_server((addr, port))
    server.settimeout(180)
    conn, _ = server.accept()
else:
    deadline = time.monotonic() + 180
    while True:
        try:
            conn = socket.create_connection((addr, port), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
with conn:
    conn.sendall(payload + b"\n")
    received = conn.makefile("rb").readline().decode().strip()
print(f"NODE_RANK {rank} received: {received}", flush=True)
"""


def _job(cluster, submit, tmp_path: Path, *, fail: bool = False) -> Job:  # type: ignore[no-untyped-def]
    without_reservation()
    script = tmp_path / "barrier.py"
    script.write_text(BARRIER)
    prefix = "FAIL_RANK_1=1 " if fail else ""
    job = submit(f"{prefix}{sys.executable} {script}", devices=16, name="two-servers")
    result = tick()
    job.refresh_from_db()
    assert job.pk in result.started, (job.pending_reason, job.pending_detail)
    return Job.objects.get(pk=job.pk)


def _poll_until(job: Job, states: set[str]) -> Job:
    def polled() -> tuple[Job, list[tuple[str, str]]]:
        poll()
        current = Job.objects.get(pk=job.pk)
        return current, list(current.events.values_list("reason", "detail"))

    found, _ = wait_for(
        polled, until=lambda seen: seen[0].state in states, interval=0.2, message=f"job {job.pk} to be {states}"
    )
    return found


def _log(job: Job, node: str) -> str:
    client = APIClient()
    client.force_login(job.submitter)
    resp = client.get(f"/api/v1/jobs/{job.pk}/log/", {"node": node})
    assert resp.status_code == 200, resp.content
    body = resp.json()
    assert body["node"] == node and body["nodes"] == [NODE_A, NODE_B]
    return str(body["data"])


def test_two_servers_meet_through_the_rendezvous_and_exchange_data(cluster, submit, tmp_path: Path) -> None:
    job = _job(cluster, submit, tmp_path)
    assert job.launched, "both parts were accepted"
    run = job.agent_job_id
    first = cluster[NODE_A].jobs()[run]
    second = cluster[NODE_B].jobs()[run]
    assert first["devices"] == second["devices"] == list(range(8))

    job = _poll_until(job, {Job.State.COMPLETED, Job.State.FAILED})
    out_a, out_b = _log(job, NODE_A), _log(job, NODE_B)
    assert job.state == Job.State.COMPLETED, (out_a, out_b)
    assert "rank table ok: 16 ranks on 2 servers, mine [0, 1, 2, 3, 4, 5, 6, 7]" in out_a
    assert "rank table ok: 16 ranks on 2 servers" in out_b
    assert "NODE_RANK 0 received: rank 1 says hello with 8 cards" in out_a
    assert "NODE_RANK 1 received: rank 0 says hello with 8 cards" in out_b
    assert job.outputs.count() == 2, "each part's output is kept, per node"


def test_a_failing_part_stops_the_other_and_the_job_names_its_server(cluster, submit, tmp_path: Path) -> None:
    job = _job(cluster, submit, tmp_path, fail=True)
    run = job.agent_job_id
    cluster[NODE_B].wait_job(run, {"failed"})
    job = _poll_until(job, {Job.State.FAILED, Job.State.COMPLETED})
    assert job.state == Job.State.FAILED
    event = job.events.last()
    assert event.reason == "NonZeroExit"
    assert event.detail == f"on {NODE_B}: exit code 1"
    stopped = cluster[NODE_A].wait_job(run, {"killed"})
    assert stopped["reason"] == f"the part on {NODE_B} failed (exit code 1)"
    assert "rank 1 fails on purpose" in _log(job, NODE_B)
    assert "rank table ok" in _log(job, NODE_A)
