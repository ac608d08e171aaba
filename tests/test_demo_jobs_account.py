"""`make run` as root: the demo's jobs run as an unprivileged account and reach none of the portal's secrets.

The demo once started its agents with ``--jobs-as-agent --allow-root-jobs``, so under root a member's
job could read an agent's token, another team's output and the database. Here the demo is set up as
``make run`` does it (``manage.py migrate`` and ``seed_demo`` into a ``var/`` made ``0755``, as an
older checkout's is), the supervisor builds the agents' command lines, and one of those agents runs
two teams' jobs: the second tries to read what it must not.
"""

from __future__ import annotations

import argparse
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import free_port_block

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="the demo switches accounts only under root"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="no useradd on this machine"),
]


@pytest.fixture
def demo_var(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A seeded demo ``var/`` under a directory every account may pass (pytest's own are root's alone)."""
    account = f"npt-demo-{secrets.token_hex(3)}"
    top = Path(tempfile.mkdtemp(prefix="npt-demo-"))
    top.chmod(0o755)
    var = top / "var"
    var.mkdir()
    var.chmod(0o755)
    env = {
        **os.environ,
        "NPUPORTAL_VAR_DIR": str(var),
        "DJANGO_SETTINGS_MODULE": "npuportal.settings",
        "NPUPORTAL_AGENT_BASE_PORT": str(free_port_block(4)),
        "NPUPORTAL_DEMO_JOB_ACCOUNT": account,
    }
    env.pop("DATABASE_URL", None)
    for command in (["migrate", "--noinput", "-v0"], ["seed_demo"]):
        done = subprocess.run(
            [sys.executable, "manage.py", *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-2000:]
    for name in ("NPUPORTAL_VAR_DIR", "NPUPORTAL_DEMO_JOB_ACCOUNT"):
        monkeypatch.setenv(name, env[name])
    try:
        yield var
    finally:
        subprocess.run(["userdel", account], check=False, capture_output=True)
        shutil.rmtree(top, ignore_errors=True)


def _wait(check: Any, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"not within {timeout} s: {check()!r}")


def test_the_demos_jobs_run_unprivileged_and_read_none_of_the_portals_secrets(demo_var: Path) -> None:
    from npuportal.supervisor import build_children

    args = argparse.Namespace(host="127.0.0.1", port=8000, no_agents=False, no_loadgen=True)
    agents = [child for child in build_children(args) if child.name.startswith("agent:")]
    argv = agents[0].argv
    account = os.environ["NPUPORTAL_DEMO_JOB_ACCOUNT"]
    assert argv[argv.index("--jobs-as") + 1] == account
    assert "--allow-root-jobs" not in argv and "--jobs-as-agent" not in argv
    entry = pwd.getpwnam(account)  # made by the supervisor, an ordinary account
    assert entry.pw_uid >= 1000
    assert stat.S_IMODE(demo_var.stat().st_mode) == 0o700

    port = int(argv[argv.index("--listen") + 1].rsplit(":", 1)[1])
    token_file = Path(argv[argv.index("--token-file") + 1])
    state = Path(argv[argv.index("--state-dir") + 1])
    url = f"http://127.0.0.1:{port}/v1"
    headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
    log = demo_var.parent / "agent.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:

        def up() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                return requests.get(f"{url}/health", headers=headers, timeout=5).status_code == 200
            except requests.ConnectionError:
                return False

        _wait(up)

        def run(job_id: str, command: str, team: str) -> list[str]:
            body = {"job_id": job_id, "command": command, "devices": [0], "team": team, "user": "lead-" + team}
            resp = requests.post(f"{url}/jobs", json=body, headers=headers, timeout=10)
            assert resp.status_code == 201, resp.text

            def ended() -> dict[str, Any] | None:
                record = requests.get(f"{url}/jobs/{job_id}", headers=headers, timeout=10).json()
                return record if record["state"] not in ("running", "stopping") else None

            record = _wait(ended)
            assert record["state"] == "succeeded", record
            return list(record["output_tail"])

        assert run("1.1", "echo training-secret-output", "training") == ["training-secret-output"]
        secrets_ = [
            token_file,  # any demo agent's token
            demo_var / "secret_key",
            demo_var / "npuportal.sqlite3",
            demo_var / "demo_logins.txt",
            state / "jobs" / "1.1.log",  # another team's output
        ]
        probe = "; ".join(f"if cat {path} >/dev/null 2>&1; then echo READ {path}; fi" for path in secrets_)
        command = f"id -u; id -un; cat /etc/hostname >/dev/null && echo can-read-the-system; {probe}"
        lines = run("2.1", command, "research")
        assert lines == [str(entry.pw_uid), account, "can-read-the-system"], lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
