"""`make run`'s system as a user meets it: supervisor, web, worker, beat, agents.

Runs the real processes on loopback in a scratch var/ folder with the default
embedded setup (SQLite, filesystem broker), exactly as a fresh clone would.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port, free_port_block
from tests.waiting import ceiling, wait_for

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def _env(tmp_path: Path, agent_port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    env.update(
        {
            "NPUPORTAL_VAR_DIR": str(tmp_path / "var"),
            "NPUPORTAL_AGENT_BASE_PORT": str(agent_port),
            "NPUPORTAL_TICK_INTERVAL": "1",
            "NPUPORTAL_AGENT_POLL_INTERVAL": "1",
            "DJANGO_SETTINGS_MODULE": "npuportal.settings",
            "PYTHONUNBUFFERED": "1",
            # What the agents inherit from `make run`; no job may see it (docs/agent.md#environment).
            "NPUPORTAL_E2E_SECRET": "secret-of-the-portal",
        }
    )
    return env


def _manage(env: dict[str, str], *args: str) -> str:
    out = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=ceiling(300)
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def _login(base: str, username: str, password: str) -> requests.Session:
    s = requests.Session()
    page = s.get(f"{base}/login/", timeout=ceiling(60))
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    resp = s.post(
        f"{base}/login/",
        data={"username": username, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{base}/login/"},
        timeout=ceiling(60),
    )
    assert resp.status_code == 200 and "Log out" in resp.text, f"{username} could not log in"
    return s


def _processes_with(text: str) -> list[int]:
    """Pids whose command line contains ``text``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_make_run_system_starts_a_job_through_the_api_within_seconds(tmp_path: Path) -> None:
    agent_port = free_port_block(8)
    env = _env(tmp_path, agent_port)
    _manage(env, "migrate", "--noinput", "-v0")
    seeded = _manage(env, "seed_demo")
    logins = dict(re.findall(r"^\s+(\S+)\s+(\S+)$", seeded, re.M))
    assert {"admin", "lead-training"} <= set(logins)
    token = _manage(env, "drf_create_token", "lead-training").split()[2]
    port = free_port()
    sup = subprocess.Popen(
        [sys.executable, "-m", "npuportal.supervisor", "--port", str(port), "--no-loadgen"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:

        def healthy() -> requests.Response:
            assert sup.poll() is None, sup.stdout.read()[-3000:]
            return requests.get(f"{base}/healthz", timeout=ceiling(60))

        # Not listening yet, or the first request still loading the app: not yet.
        health = wait_for(
            healthy,
            until=lambda resp: resp.status_code == 200,
            ignore=(requests.RequestException,),
            timeout=180,
            interval=1,
            message="the system's /healthz to answer 200",
        )
        assert health.json()["tick"]["age_s"] < 30

        admin = _login(base, "admin", logins["admin"])
        assert admin.get(f"{base}/admin/", timeout=ceiling(60)).status_code == 200
        _login(base, "lead-training", logins["lead-training"])

        api = {"Authorization": f"Token {token}"}
        resp = requests.post(
            f"{base}/api/v1/jobs/",
            json={
                "name": "e2e",
                "command": "echo hi; env | sed 's/^/env: /'; sleep 2",
                "env": {"E2E_VAR": "yes"},
                "num_devices": 2,
                "chip_model": "910B4",
                "estimated_duration_s": 60,
            },
            headers=api,
            timeout=ceiling(60),
        )
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
        states: list[str] = []

        def job_now() -> dict:  # type: ignore[type-arg]
            job = requests.get(f"{base}/api/v1/jobs/{job_id}/", headers=api, timeout=ceiling(60)).json()
            if not states or states[-1] != job["state"]:
                states.append(job["state"])
            return job

        job = wait_for(
            job_now, until=lambda job: job["state"] in {"completed", "failed"}, interval=0.5, message="the job to end"
        )
        assert "running" in states, states
        assert states[-1] == "completed", (states, job)
        assert job["exit_code"] == 0
        assert len(job["allocations"]) == 2
        log = requests.get(f"{base}/api/v1/jobs/{job_id}/log/", headers=api, timeout=ceiling(60)).json()
        assert log["data"].startswith("hi\n") and log["complete"], log
        seen = dict(line[5:].split("=", 1) for line in log["data"].splitlines() if line.startswith("env: "))
        assert not {"NPUPORTAL_E2E_SECRET", "NPUPORTAL_VAR_DIR", "DJANGO_SETTINGS_MODULE"} & set(seen), seen
        assert "secret-of-the-portal" not in log["data"]
        assert seen["NPUPORTAL_JOB_ID"] == f"{job_id}.1" and seen["NPUPORTAL_TEAM"] == "training", seen
        assert seen["E2E_VAR"] == "yes" and seen["ASCEND_RT_VISIBLE_DEVICES"], seen

        # A job still running when make run is stopped goes with it.
        marker = f"npuportal-e2e-{uuid.uuid4().hex}"
        resp = requests.post(
            f"{base}/api/v1/jobs/",
            json={"name": "long", "command": f"echo {marker}; sleep 600 # {marker}", "num_devices": 1},
            headers=api,
            timeout=ceiling(60),
        )
        assert resp.status_code == 201, resp.text
        long_id = resp.json()["id"]
        log = wait_for(
            lambda: requests.get(f"{base}/api/v1/jobs/{long_id}/log/", headers=api, timeout=ceiling(60)).json(),
            until=lambda log: marker in log["data"],
            interval=0.5,
            message="the long job's first line",
        )
        assert _processes_with(marker), "the long job runs"
    finally:
        sup.send_signal(signal.SIGINT)
        try:
            out, _ = sup.communicate(timeout=ceiling(120))
        except subprocess.TimeoutExpired:
            sup.kill()
            out, _ = sup.communicate()
        print(out[-8000:])  # shown by pytest when the test fails
    assert "stopping all processes" in out
    assert not _processes_with(marker), "a job process outlived make run"
    # Every child is gone: the web port no longer answers.
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        pass


def test_supervisor_gives_up_on_a_child_that_keeps_dying_and_exits_non_zero(tmp_path: Path) -> None:
    """The web port is taken: each start of the web server dies; it is restarted with a growing delay, then given up."""
    env = _env(tmp_path, free_port_block(8))
    _manage(env, "migrate", "--noinput", "-v0")
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        sup = subprocess.run(
            [sys.executable, "-m", "npuportal.supervisor", "--port", str(port), "--no-loadgen", "--no-agents"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=ceiling(600),
        )
    assert sup.returncode != 0
    restarts = re.findall(
        r"^supervisor \| web exited with code \d+ at [0-9:]+; restarting it in (\d+) s$", sup.stdout, re.M
    )
    assert restarts == ["1", "2", "4", "8"], sup.stdout[-3000:]
    assert re.search(
        r"^supervisor \| web exited with code \d+ at [0-9:]+: 5 deaths within 120 s, it keeps dying", sup.stdout, re.M
    )
