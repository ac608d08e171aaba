"""`make run`'s system heals: a child that dies is restarted, and no job fails for it.

The real supervisor with the demo's agents, web, worker and beat, on loopback in a scratch var/
folder (SQLite, folder broker) as tests/test_foundation_e2e.py runs it, without the load generator:
the jobs are the test's own. ``kill -9`` of an agent and of the worker's main process, and Ctrl-C
followed by a new start, must each leave every job completed, none failed, and every job the
system interrupted requeued with an event saying why (docs/health.md, "What happens to jobs").
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port, free_port_block
from tests.test_foundation_e2e import _env, _manage

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow
#: Requeues for reasons of the system, never the job's (none of them counts as a retry).
SYSTEM_REASONS = {"NodeFail", "NodeUnreachable"}


def _wait(what: str, check: Callable[[], Any], timeout: float = 180, interval: float = 0.5) -> Any:
    """Poll ``check`` until it is truthy (its value is returned); fail naming ``what`` and its last value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except requests.RequestException as exc:  # the web server restarting, or busy
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise AssertionError(f"{what}: not within {timeout} s; last seen: {last!r}")


class System:
    """One ``python -m npuportal.supervisor`` and what it printed so far."""

    def __init__(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "npuportal.supervisor", "--port", str(self.port), "--no-loadgen"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def output(self) -> str:
        return "\n".join(self.lines)

    def line(self, pattern: str, timeout: float = 120) -> str:
        """The first line of the output matching ``pattern`` (waited for)."""
        regex = re.compile(pattern)

        def found() -> str | None:
            return next((line for line in list(self.lines) if regex.search(line)), None)

        return str(_wait(f"a line matching {pattern!r}", found, timeout))

    def up(self) -> None:
        def healthy() -> bool:
            assert self.proc.poll() is None, self.output()[-3000:]
            return requests.get(f"{self.base}/healthz", timeout=10).status_code == 200

        _wait("the web server answering /healthz", healthy)

    def children(self, *words: str) -> list[int]:
        """Pids of the supervisor's own children whose command line holds every one of ``words``."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == self.proc.pid and all(w.encode() in argv for w in words):
                found.append(int(entry.name))
        return found

    def stop(self, timeout: float = 60) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(timeout=10)
        return code


class Api:
    def __init__(self, system: System, token: str) -> None:
        self.system = system
        self.headers = {"Authorization": f"Token {token}"}

    def submit(self, command: str, name: str) -> dict[str, Any]:
        body = {"name": name, "command": command, "num_devices": 1, "chip_model": "910B4", "estimated_duration_s": 60}
        resp = requests.post(f"{self.system.base}/api/v1/jobs/", json=body, headers=self.headers, timeout=30)
        assert resp.status_code == 201, resp.text
        return dict(resp.json())

    def job(self, job_id: int) -> dict[str, Any]:
        resp = requests.get(f"{self.system.base}/api/v1/jobs/{job_id}/", headers=self.headers, timeout=30)
        assert resp.status_code == 200, resp.text
        return dict(resp.json())

    def log(self, job_id: int) -> str:
        resp = requests.get(f"{self.system.base}/api/v1/jobs/{job_id}/log/", headers=self.headers, timeout=30)
        return str(resp.json().get("data", "")) if resp.status_code == 200 else ""

    def all_running(self, ids: list[int]) -> bool:
        """Every job runs, its command started (it has printed)."""
        return all(self.job(j)["state"] == "running" and "started" in self.log(j) for j in ids)

    def all_completed(self, ids: list[int]) -> list[dict[str, Any]] | None:
        """The jobs once every one has completed (``None`` before); a job that failed fails the test at once."""
        jobs = [self.job(j) for j in ids]
        ended_otherwise = [(j["id"], j["state"], j["events"]) for j in jobs if j["state"] in {"failed", "cancelled"}]
        assert not ended_otherwise, ended_otherwise
        return jobs if all(j["state"] == "completed" for j in jobs) else None


def _setup(tmp_path: Path) -> tuple[dict[str, str], str]:
    """A scratch var/ with the demo seeded (its agents on free ports); the environment and lead-training's token."""
    env = _env(tmp_path, free_port_block(8))
    # An agent's restart must not be taken for a node gone away: 30 polls missed before it is unreachable.
    env["NPUPORTAL_AGENT_MISSED_POLLS"] = "30"
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "seed_demo")
    return env, _manage(env, "drf_create_token", "lead-training").split()[2]


def _agent(env: dict[str, str], name: str) -> dict[str, Any]:
    agents = json.loads((Path(env["NPUPORTAL_VAR_DIR"]) / "demo_agents.json").read_text())
    return next(a for a in agents if a["name"] == name)


def _agent_answers(env: dict[str, str], name: str) -> bool:
    agent = _agent(env, name)
    token = Path(agent["token_file"]).read_text().strip()
    url = f"http://127.0.0.1:{agent['port']}/v1/health"
    return requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=5).status_code == 200


def _check_healed(jobs: list[dict[str, Any]], submitted: dict[int, str], *, requeued: bool) -> None:
    """Every job completed; each requeue was the system's, cost no retry, and the job kept its place.

    ``requeued``: every job was running when the system stopped, so each must have been requeued.
    """
    for job in jobs:
        assert job["state"] == "completed" and job["exit_code"] == 0, job
        assert job["retries"] == 0, job
        assert job["submitted_at"] == submitted[job["id"]], "it kept its place in the queue"
        requeues = [e for e in job["events"] if (e["from_state"], e["to_state"]) == ("running", "pending")]
        assert all(e["reason"] in SYSTEM_REASONS for e in requeues), requeues
        if requeued:
            assert requeues, f"job {job['id']} was running at the stop: {job['events']}"


def test_kill_9_of_an_agent_and_of_the_worker_heals_and_fails_no_job(tmp_path: Path) -> None:
    env, token = _setup(tmp_path)
    system = System(env)
    api = Api(system, token)
    try:
        system.up()
        submitted = {
            j["id"]: j["submitted_at"] for j in (api.submit("echo started; sleep 30", f"heal-{n}") for n in range(4))
        }
        ids = list(submitted)
        _wait("the jobs running", lambda: api.all_running(ids))
        node = api.job(ids[0])["allocations"][0]["node"]

        # An agent killed: restarted, it answers again and re-adopts the jobs that ran on without it.
        (agent_pid,) = system.children("devices.agent", node)
        os.kill(agent_pid, signal.SIGKILL)
        said = system.line(rf"^supervisor \| agent:{node} was killed by SIGKILL at [0-9:]+; restarting it in 1 s$")
        _wait(f"agent {node} started again", lambda: system.children("devices.agent", node) not in ([], [agent_pid]))
        _wait(f"agent {node} answering", lambda: _agent_answers(env, node))
        starts = [line for line in system.lines if f"node {node}, backend sim" in line]
        assert len(starts) == 2 and not starts[1].endswith(" 0 job(s) running"), (said, starts)

        # The worker's main process killed: restarted, the ticks go on.
        (worker_pid,) = system.children("celery", "worker")
        killed_at = time.monotonic()
        os.kill(worker_pid, signal.SIGKILL)
        system.line(r"^supervisor \| worker was killed by SIGKILL at [0-9:]+; restarting it in 1 s$")
        _wait("the worker started again", lambda: system.children("celery", "worker") not in ([], [worker_pid]))

        def ticking() -> bool:
            tick = requests.get(f"{system.base}/healthz", timeout=10).json()["tick"]
            return tick["age_s"] is not None and tick["age_s"] < time.monotonic() - killed_at

        _wait("a tick by the new worker", ticking)

        jobs = _wait("the jobs completed", lambda: api.all_completed(ids), timeout=300)
        _check_healed(jobs, submitted, requeued=False)
        assert "keeps dying" not in system.output()
    finally:
        code = system.stop()
        print(system.output()[-10000:])  # shown by pytest when the test fails
    assert code == 0


def test_ctrl_c_and_a_new_start_requeue_the_running_jobs_and_they_complete(tmp_path: Path) -> None:
    env, token = _setup(tmp_path)
    first = System(env)
    try:
        first.up()
        api = Api(first, token)
        submitted = {
            j["id"]: j["submitted_at"] for j in (api.submit("echo started; sleep 15", f"resume-{n}") for n in range(4))
        }
        ids = list(submitted)
        _wait("the jobs running", lambda: api.all_running(ids))
    finally:
        code = first.stop()
        print(first.output()[-6000:])
    assert code == 0 and "stopping all processes" in first.output()
    assert re.search(r"stopped, and stopped its [1-9]\d* running job\(s\)", first.output())

    second = System(env)
    try:
        second.up()
        api = Api(second, token)
        jobs = _wait("the jobs completed after the new start", lambda: api.all_completed(ids), timeout=300)
        _check_healed(jobs, submitted, requeued=True)
        for job in jobs:
            (event,) = [e for e in job["events"] if e["reason"] == "NodeFail"]
            assert "agent stopped" in event["detail"], event
    finally:
        code = second.stop()
        print(second.output()[-6000:])
    assert code == 0
