"""A run's output removed by its node to keep the node's output budget: the portal and npuctl say so, and when.

Real agents with a tiny budget (``--output-budget 48K``); the first job's output goes when a second job
on the same node brings the node over it, before the portal has kept the end of the first.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from scheduling.models import Job, JobOutput
from tests.test_lifecycle_harness import NODE_A, NODE_B, Agent, eager_celery, node_of, poll, submit, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["eager_celery", "submit"]  # fixtures, imported for pytest


@pytest.fixture
def budget_cluster(demo, eager_celery, tmp_path: Path) -> Iterator[dict[str, Agent]]:  # type: ignore[no-untyped-def]
    """The demo's two 910B4 nodes with real agents that keep 48 KiB of output."""
    from devices.models import Node

    flags = ("--output-budget", "48K", "--output-team-share", "1")
    agents = {name: Agent(tmp_path, name, extra=flags).start() for name in (NODE_A, NODE_B)}
    for name, agent in agents.items():
        Node.objects.filter(name=name).update(agent_url=agent.url, agent_token=agent.token)
    try:
        yield agents
    finally:
        for agent in agents.values():
            agent.kill()
            agent.kill_leftover_jobs()


def _ran(budget_cluster: dict[str, Agent], job: Job) -> tuple[Job, str]:
    """Tick, and wait until the job's run has ended on its node's agent (the portal is not told yet)."""
    tick()
    job = Job.objects.get(pk=job.pk)
    node = node_of(job)
    budget_cluster[node].wait_job(job.agent_job_id, {"succeeded"})
    return job, node


def test_a_runs_output_removed_by_its_node_is_said_so_with_the_time(budget_cluster, submit, api, live_server) -> None:  # type: ignore[no-untyped-def]
    from quotas.access.tokens import issue_token

    lead_user = get_user_model().objects.get(username="lead-training")
    lead = api(lead_user)
    first, node = _ran(budget_cluster, submit("head -c 30000 /dev/zero | tr '\\0' f; echo"))
    second, other = _ran(budget_cluster, submit("head -c 30000 /dev/zero | tr '\\0' s; echo"))
    assert other == node  # the demo policy packs a node before it opens the next
    agent = budget_cluster[node]
    deadline = time.monotonic() + 30
    while not agent.jobs()[first.agent_job_id]["output_removed"]:
        assert time.monotonic() < deadline, agent.jobs()[first.agent_job_id]
        time.sleep(0.1)

    resp = lead.get(f"/api/v1/jobs/{first.pk}/log/")
    assert resp.status_code == 200, resp.content
    answer = resp.json()
    note = answer["note"]
    assert note.startswith(f"node {node}: this run's output was removed from the node at 20"), note
    assert "to keep the node's output budget (48 KiB" in note
    assert (answer["data"], answer["complete"], answer["source"]) == ("", True, "none")

    poll()  # both ends reach the portal: the second run's output is kept, nothing of the first is left to keep
    assert not JobOutput.objects.filter(job=first).exists()
    assert JobOutput.objects.get(job=second).data == "s" * 30000 + "\n"
    assert lead.get(f"/api/v1/jobs/{first.pk}/log/").json()["note"] == note

    key = issue_token(lead_user, "logs")[1]
    env = {**os.environ, "NPUPORTAL_URL": live_server.url, "NPUPORTAL_TOKEN": key}
    done = subprocess.run(
        [sys.executable, "-m", "npuctl", "logs", str(first.pk)], env=env, capture_output=True, text=True, timeout=60
    )
    # Output that is gone is output left out: npuctl says what and why, and exits 5 (docs/cli.md).
    assert (done.returncode, done.stdout) == (5, ""), done.stderr
    assert f"job {first.pk}: output from byte 0 on could not be read: {note}" in done.stderr
