"""A real agent stops every process of a job on cancel, also a child that left with ``setsid``.

Both ways the agent finds a job's processes run here: its own cgroup v2 (when this machine lets the
agent make one: as root with cgroup v2 mounted writable it must; the run ends with a line saying which
way ran) and, with ``--no-cgroups``, the environment mark plus the session. Exit reasons are checked in
words on the agent's answer; the per-job limits in the cgroup's files where the controllers allow.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import requests

from devices.agent import cgroups
from tests.waiting import ceiling, wait_for

ROOT = Path(__file__).resolve().parents[2]
DAEMON = (
    "import os,time\nif os.fork()==0:\n os.setsid()\n if os.fork()==0: time.sleep(600)\n os._exit(0)\ntime.sleep(600)"
)
#: A ``setsid`` child, a double-forked daemon in its own session, and the job's own process.
SETSID_JOB = f"setsid sleep 600 & python3 -c '{DAEMON}' & sleep 600"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RealAgent:
    def __init__(self, base: Path, *extra: str, backend: Sequence[str] = ("--backend", "sim")) -> None:
        self.port = _free_port()
        self.token = secrets.token_urlsafe(24)
        token_file = base / "token"
        token_file.write_text(self.token)
        token_file.chmod(0o600)
        self.log = base / "agent.log"
        argv = [sys.executable, "-m", "devices.agent", *backend, "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--token-file", str(token_file), "--state-dir", str(base / "state"), "--kill-grace", "1", *extra]
        argv += ["--jobs-as-agent", "--allow-root-jobs"]  # the jobs carry no account: run them as the agent
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)

        def up() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            return self.call("GET", "/v1/health").status_code == 200

        wait_for(up, ignore=(requests.ConnectionError,), message=f"the agent on port {self.port} to answer")

    def call(self, method: str, path: str, body: Any = None) -> requests.Response:
        headers = {"Authorization": f"Bearer {self.token}"}
        return requests.request(
            method, f"http://127.0.0.1:{self.port}{path}", json=body, headers=headers, timeout=ceiling(120)
        )

    def run(self, job_id: str, command: str, device: int = 0) -> dict[str, Any]:
        resp = self.call("POST", "/v1/jobs", {"job_id": job_id, "command": command, "devices": [device]})
        assert resp.status_code == 201, resp.text
        return resp.json()

    def wait_ended(self, job_id: str) -> dict[str, Any]:
        def ended() -> dict[str, Any] | None:
            record = self.call("GET", f"/v1/jobs/{job_id}").json()
            return record if record["state"] not in ("running", "stopping") else None

        return wait_for(ended, interval=0.1, message=f"job {job_id} to end")

    def close(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=ceiling(60))


def marked(mark: str) -> list[int]:
    """Pids whose environment carries the job's mark (a scan of /proc, independent of the agent)."""
    needle = f"NPUPORTAL_JOB_MARK={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    stat = (entry / "stat").read_text()
                    if stat[stat.rfind(")") + 2] not in "ZX":
                        pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def _sessions(pids: list[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            found.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[3]))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _record(base: Path, job_id: str) -> dict[str, Any]:
    import json

    return json.loads((base / "state" / "jobs" / f"{job_id}.json").read_text())


def _cancel_setsid_job(tmp_path: Path, *extra: str) -> tuple[dict[str, Any], dict[str, Any], str]:
    agent = RealAgent(tmp_path, "--stop-jobs-on-exit", *extra)
    try:
        agent.run("setsid-job", SETSID_JOB)
        mark = _record(tmp_path, "setsid-job")["mark"]
        wait_for(  # the job's, setsid sleep's, the daemon's
            lambda: len(_sessions(marked(mark))) >= 3, interval=0.1, message="the job's children to leave its session"
        )
        before = marked(mark)
        sessions = _sessions(before)
        assert len(sessions) >= 3, f"the job's children did not leave its session: {sessions}"
        stopped = agent.call("DELETE", "/v1/jobs/setsid-job?wait=60").json()
        assert stopped["state"] == "killed", stopped
        assert marked(mark) == [], f"processes of the job survived its cancel: {marked(mark)}"
        for pid in before:
            assert not Path(f"/proc/{pid}").exists() or Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] in "ZX"
        return stopped, _record(tmp_path, "setsid-job"), agent.log.read_text()
    finally:
        agent.close()


def _cgroup_per_job_expected() -> tuple[bool, str]:
    """Whether an agent here may make a cgroup v2 per job: it runs as root and cgroup v2 is mounted writable."""
    if os.geteuid() != 0:
        return False, "not root"
    mount = cgroups.cgroup2_mount()
    if mount is None:
        return False, "no cgroup v2 hierarchy is mounted"
    if not os.access(mount, os.W_OK):
        return False, f"cgroup v2 at {mount} is not writable"
    return True, f"root, with cgroup v2 writable at {mount}"


def _stop_path(record: dict[str, Any], log: str) -> str:
    """Which way the agent found the job's processes, as its record and its start line say."""
    said = next((line for line in log.splitlines() if "jobs are stopped by" in line), "(no start line)")
    if record["cgroup"]:
        return f"own cgroup {record['cgroup']} [{said}]"
    return f"process tracking [{said}]"


def test_cancel_stops_setsid_children_in_the_jobs_cgroup(tmp_path: Path, record_property: Any) -> None:
    stopped, record, log = _cancel_setsid_job(tmp_path)
    assert stopped["exit_reason"] == "cancelled"
    path = _stop_path(record, log)
    print(f"stop path: {path}")
    record_property("stop_path", path)  # listed at the end of the run (tests/agent/conftest.py)
    expected, why = _cgroup_per_job_expected()
    if expected:
        assert record["cgroup"] and stopped["cgroup"] is True, f"{why}, but the agent did not use a cgroup: {log}"
    if record["cgroup"] is None:
        assert "process tracking" in log
        return
    assert stopped["cgroup"] is True
    assert not Path(record["cgroup"]).exists(), "the job's cgroup is removed once empty"


def test_cancel_stops_setsid_children_by_tracking(tmp_path: Path) -> None:
    print("fallback ran: --no-cgroups (environment mark and session)")
    stopped, record, log = _cancel_setsid_job(tmp_path, "--no-cgroups")
    assert record["cgroup"] is None and "process tracking" in log
    assert stopped["exit_reason"] == "cancelled"


def test_exit_reasons_in_words(tmp_path: Path) -> None:
    agent = RealAgent(tmp_path, "--stop-jobs-on-exit")
    try:
        agent.run("three", "exit 3")
        agent.run("nine", "kill -KILL $$", 1)
        agent.run("long", "sleep 60", 2)
        assert agent.wait_ended("three")["exit_reason"] == "exit code 3"
        assert agent.wait_ended("nine")["exit_reason"] == "killed by signal SIGKILL"
        stopped = agent.call("DELETE", "/v1/jobs/long?wait=60&reason=walltime").json()
        assert stopped["exit_reason"] == "time limit reached"
        assert stopped["accelerator_memory"] is None  # the simulator prints no process table: not checked
    finally:
        agent.close()


def test_a_daemon_left_by_a_finished_job_is_stopped_with_it(tmp_path: Path) -> None:
    agent = RealAgent(tmp_path, "--no-cgroups")
    try:
        agent.run("leaves", "setsid sleep 600 > /dev/null 2>&1 < /dev/null & exit 0")
        record = agent.wait_ended("leaves")
        assert record["state"] == "succeeded" and record["exit_reason"] == "exit code 0"
        assert marked(_record(tmp_path, "leaves")["mark"]) == []
    finally:
        agent.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to read other processes' environments")
def test_the_mark_is_unique_per_launch(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    agent = RealAgent(tmp_path / "a", "--stop-jobs-on-exit")
    try:
        agent.run("same", "sleep 60")
        mark = _record(tmp_path / "a", "same")["mark"]
        assert mark.startswith("same.") and len(mark) > len("same.")
    finally:
        agent.close()


def test_memory_sizes_read_as_cgroup_sizes() -> None:
    assert cgroups.parse_bytes("64G") == 64 * 1024**3
    assert cgroups.parse_bytes("512M") == 512 * 1024**2
    assert cgroups.parse_bytes("1048576") == 1048576
    with pytest.raises(ValueError, match="not a size"):
        cgroups.parse_bytes("lots")


def test_limits_are_written_to_a_cgroups_files(tmp_path: Path) -> None:
    root = cgroups.CgroupRoot(tmp_path, frozenset({"memory", "cpu"}), has_kill=False)  # a plain directory
    group, warnings = root.create("job-7.abc", cgroups.parse_bytes("256M"), 1.5)
    assert warnings == []
    assert (group / "memory.max").read_text() == "268435456"
    assert (group / "cpu.max").read_text() == "150000 100000"
    no_cpu = cgroups.CgroupRoot(tmp_path, frozenset({"memory"}), has_kill=False)
    _, warnings = no_cpu.create("job-8.abc", None, 2)
    assert warnings == ["the cpu controller is not enabled for job cgroups; cpu.max not set"]


def test_limits_reach_a_real_jobs_cgroup(tmp_path: Path) -> None:
    agent = RealAgent(tmp_path, "--stop-jobs-on-exit", "--job-memory-max", "256M", "--job-cpu-max", "1.5")
    try:
        agent.run("limited", "sleep 600")
        record, log = _record(tmp_path, "limited"), agent.log.read_text()
        if record["cgroup"] is None:
            pytest.skip(f"no cgroup v2 per job can be made here: {_stop_path(record, log)}")
        group = Path(record["cgroup"])
        enabled = (group.parent / "cgroup.subtree_control").read_text().split()
        written = []
        for name, value, controller in (("memory.max", "268435456", "memory"), ("cpu.max", "150000 100000", "cpu")):
            if controller in enabled:
                assert (group / name).read_text().strip() == value
                written.append(name)
            else:
                assert f"job limited: the {controller} controller is not enabled for job cgroups; {name} not set" in log
        if not written:
            pytest.skip(
                f"job cgroups here ({group.parent}) have neither the memory nor the cpu controller (on a hybrid "
                "host they belong to cgroup v1); the agent said it could not set memory.max and cpu.max"
            )
    finally:
        agent.close()


def test_limits_without_cgroups_are_no_ops_with_a_warning(tmp_path: Path) -> None:
    agent = RealAgent(tmp_path, "--no-cgroups", "--job-memory-max", "64G", "--job-cpu-max", "4")
    try:
        assert "--job-memory-max and --job-cpu-max have no effect" in agent.log.read_text()
    finally:
        agent.close()


def test_a_bad_memory_limit_is_refused_naming_the_flag(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(secrets.token_urlsafe(24))
    argv = [sys.executable, "-m", "devices.agent", "--backend", "sim", "--listen", "127.0.0.1:0"]
    argv += ["--token-file", str(tmp_path / "token"), "--state-dir", str(tmp_path / "s"), "--job-memory-max", "lots"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=ceiling(60))
    assert done.returncode == 2 and "--job-memory-max" in done.stderr
