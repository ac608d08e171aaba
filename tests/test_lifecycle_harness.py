"""Real node agents for the lifecycle and health tests: no tests here, only the harness.

Each agent is ``python -m devices.agent --backend sim`` on 127.0.0.1 with its own token and state
dir. The portal side runs in-process (``poll_all()``, ``run_tick()``, ``launch()``) so the tests are
deterministic; Celery runs eagerly, so the agent calls the tick queues after its commit happen at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port, training_lead_submitter
from tests.waiting import ceiling, wait_for

ROOT = Path(__file__).resolve().parent.parent
NODE_A, NODE_B = "ascend-b4-01", "ascend-b4-02"


class Agent:
    """One simulated 8x 910B4 agent process, restartable on the same state dir."""

    def __init__(self, base: Path, name: str, devices: int = 8, extra: tuple[str, ...] = ()) -> None:
        self.name = name
        self.extra = extra  # more agent flags
        self.devices = devices
        self.port = free_port()
        self.dir = base / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.state_dir = self.dir / "state"
        self.token = secrets.token_urlsafe(24)
        self.token_file = self.dir / "token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "agent.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Agent:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "devices.agent",
                    "--backend",
                    "sim",
                    "--listen",
                    f"127.0.0.1:{self.port}",
                    "--token-file",
                    str(self.token_file),
                    "--state-dir",
                    str(self.state_dir),
                    "--sim-chip",
                    "910B4",
                    "--sim-devices",
                    str(self.devices),
                    "--node-name",
                    self.name,
                    "--kill-grace",
                    "2",
                    # The portal's test users have no POSIX accounts here: jobs run as the test's own.
                    "--jobs-as-agent",
                    "--allow-root-jobs",
                    *self.extra,
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-2000:]
            return self.call("GET", "/v1/health").status_code == 200

        wait_for(up, ignore=(requests.ConnectionError,), message=f"agent {self.name} to answer /v1/health")
        return self

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=ceiling(60))
        self.proc = None

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        return requests.request(method, self.url + path, json=body, headers=headers, timeout=ceiling(60))

    def fault(self, device: int, kind: str) -> dict[str, Any]:
        resp = self.call("POST", "/v1/sim/faults", {"device": device, "kind": kind})
        assert resp.status_code == 200, resp.text
        return resp.json()

    def jobs(self) -> dict[str, dict[str, Any]]:
        resp = self.call("GET", "/v1/jobs")
        assert resp.status_code == 200, resp.text
        return {str(j["job_id"]): j for j in resp.json()["jobs"]}

    def wait_job(self, run_id: str, states: set[str]) -> dict[str, Any]:
        return wait_for(
            lambda: self.jobs().get(run_id),
            until=lambda record: record is not None and record["state"] in states,
            message=f"run {run_id} on {self.name} to be {'/'.join(sorted(states))}",
        )

    def kill_leftover_jobs(self) -> None:
        """Jobs outlive their agent by design; the test must not leave any behind."""
        for path in (self.state_dir / "jobs").glob("*.json"):
            with contextlib.suppress(OSError, ValueError):
                record = json.loads(path.read_text())
                if record.get("state") in {"running", "stopping"} and record.get("pid"):
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(int(record["pid"]), signal.SIGKILL)


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Agent calls queued by the tick or a cancel run in-process right after the commit."""
    from npuportal.celery import app

    saved = (app.conf.task_always_eager, app.conf.task_eager_propagates)
    app.conf.task_always_eager = app.conf.task_eager_propagates = True
    try:
        yield
    finally:
        app.conf.task_always_eager, app.conf.task_eager_propagates = saved


@pytest.fixture
def cluster(demo, eager_celery, tmp_path: Path) -> Iterator[dict[str, Agent]]:
    """The demo site with real agents behind its two 910B4 nodes (the other nodes have none)."""
    from devices.models import Node

    agents = {name: Agent(tmp_path, name).start() for name in (NODE_A, NODE_B)}
    for name, agent in agents.items():
        Node.objects.filter(name=name).update(agent_url=agent.url, agent_token=agent.token)
    try:
        yield agents
    finally:
        for agent in agents.values():
            agent.kill(signal.SIGTERM)
            agent.kill_leftover_jobs()


@pytest.fixture
def submit(demo) -> Callable[..., Any]:
    """Submit a 910B4 job as the training lead (the demo policy lets training use up to 24 cards)."""
    return training_lead_submitter()


def node_of(job: Any) -> str:
    """Name of the node a running job holds its devices on."""
    names = {a.device.node.name for a in job.allocations.filter(end__isnull=True).select_related("device__node")}
    assert len(names) == 1, names
    return names.pop()


def open_devices(job: Any) -> list[Any]:
    return [a.device for a in job.allocations.filter(end__isnull=True).select_related("device__node")]


def poll() -> Any:
    from devices.executors.agents import poll_all

    return poll_all()


def without_reservation() -> None:
    """A policy without the demo's reservation: it holds 4 of the 910B4 cards for critical jobs, and a 16-card job
    needs two servers whole (the agents' and Slurm's multi-node tests)."""
    from quotas.models import Policy
    from quotas.policies.versions import active_policy, create_version

    text = Policy.objects.get(version=active_policy().version).yaml_text
    kept = [line for line in text.splitlines() if "online-inference" not in line]
    create_version("\n".join(kept).replace("reservations:\n", "reservations: []\n"), author=None, comment="test")


def tick() -> Any:
    from scheduling.services.tick import run_tick

    return run_tick()
