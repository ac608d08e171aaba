"""The node agent as users run it: ``python -m devices.agent`` in a subprocess, spoken to over HTTP.

Every test starts real agents (sim backend) on 127.0.0.1 with a temporary state dir and token file, and
real jobs (``/bin/sh -c``). Waits poll for a condition (``tests/waiting.py``: generous ceilings, never
budgets), never fixed sleeps, so the file stays fast; jobs that wait for something use a file handshake
so timing cannot make a test flaky.
"""

from __future__ import annotations

import ast
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.waiting import ceiling, stop_process, wait_for

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "agent-test-token-5f1b9c0e7d2a"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Agent:
    """One agent process plus a tiny HTTP client for it."""

    #: Jobs run as the test's own account (root in CI); tests/agent/test_job_accounts.py runs them as others.
    account_flags: tuple[str, ...] = ("--jobs-as-agent", "--allow-root-jobs")

    def __init__(self, tmp: Path, *extra: str, state_dir: Path | None = None) -> None:
        self.tmp = tmp
        self.state_dir = state_dir or tmp / "state"
        self.token_file = tmp / "token"
        if not self.token_file.exists():
            self.token_file.write_text(TOKEN + "\n")
            self.token_file.chmod(0o600)
        self.extra = extra
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> Agent:
        self.port = free_port()
        argv = [
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
            "--node-name",
            "test-node",
            *self.account_flags,
            *self.extra,
        ]
        log = (self.tmp / "agent.log").open("ab")
        env = {k: v for k, v in os.environ.items() if not k.endswith("_VISIBLE_DEVICES")}
        env["PYTHONPATH"] = str(ROOT)
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=log, stderr=log, env=env)
        log.close()

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log()
            try:
                return self.call("GET", "/v1/health")[0] == 200
            except OSError:
                return False

        wait_for(up, message=f"the agent on port {self.port} to answer /v1/health")
        return self

    def log(self) -> str:
        path = self.tmp / "agent.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        raw: bytes | None = None,
        auth: str | None = f"Bearer {TOKEN}",
    ) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=ceiling(120))
        headers = {"Content-Type": "application/json"}
        if auth is not None:
            headers["Authorization"] = auth
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        try:
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            payload = resp.read()
        finally:
            conn.close()
        assert resp.getheader("Content-Type") == "application/json", payload
        return resp.status, json.loads(payload)

    def job(self, job_id: Any) -> dict[str, Any]:
        status, body = self.call("GET", f"/v1/jobs/{job_id}")
        assert status == 200, body
        return body

    def launch(self, job_id: Any, command: str, devices: list[int], **fields: Any) -> dict[str, Any]:
        status, body = self.call(
            "POST", "/v1/jobs", {"job_id": job_id, "command": command, "devices": devices, **fields}
        )
        assert status == 201, body
        return body

    def wait_state(self, job_id: Any, *states: str) -> dict[str, Any]:
        return wait_for(
            lambda: self.job(job_id),
            until=lambda job: job["state"] in states,
            message=f"job {job_id!r} to be {'/'.join(states)}",
        )

    def device(self, index: int) -> dict[str, Any]:
        status, body = self.call("GET", "/v1/devices")
        assert status == 200
        return next(d for d in body["devices"] if d["index"] == index)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            stop_process(self.proc)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    """Factory for agents; on teardown stops them and kills every job process they left behind."""
    started: list[Agent] = []

    def make(*extra: str, state_dir: Path | None = None) -> Agent:
        agent = Agent(tmp_path, *extra, state_dir=state_dir).start()
        started.append(agent)
        return agent

    yield make
    for agent in started:
        agent.stop()
    for record in (tmp_path / "state" / "jobs").glob("*.json"):
        pid = json.loads(record.read_text()).get("pid")
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


@pytest.fixture
def agent(agents: Callable[..., Agent]) -> Agent:
    return agents()


@pytest.fixture(scope="module")
def idle_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    """One agent shared by the tests that must leave no trace (refused requests): they check each other."""
    shared = Agent(tmp_path_factory.mktemp("idle-agent")).start()
    yield shared
    shared.stop()


def job_pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] not in "ZX"


# --------------------------------------------------------------------------------------------------
# authentication


def test_requests_without_the_right_token_get_401_and_change_nothing(idle_agent: Agent, tmp_path: Path) -> None:
    agent = idle_agent
    launch = {"job_id": "sneaky", "command": f"touch {tmp_path / 'pwned'}", "devices": [0]}
    for auth in (None, "Bearer wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN, "Bearer "):
        for method, path, body in (
            ("GET", "/v1/health", None),
            ("GET", "/v1/devices", None),
            ("POST", "/v1/jobs", launch),
            ("POST", "/v1/sim/faults", {"device": 0, "kind": "lost"}),
            ("DELETE", "/v1/jobs/sneaky", None),
        ):
            status, reply = agent.call(method, path, body, auth=auth)
            assert status == 401, (auth, method, path, reply)
            assert "token" in reply["error"]
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    assert not list((agent.state_dir / "jobs").glob("*.json"))
    assert agent.device(0)["health"] == "OK"
    time.sleep(0.2)
    assert not (tmp_path / "pwned").exists()
    # both schemes, any capitalisation of the scheme, are accepted
    assert agent.call("GET", "/v1/health", auth=f"Token {TOKEN}")[0] == 200
    assert agent.call("GET", "/v1/health", auth=f"bearer {TOKEN}")[0] == 200


def test_health(idle_agent: Agent) -> None:
    status, body = idle_agent.call("GET", "/v1/health")
    assert status == 200
    assert body == {"ok": True, "node": "test-node", "backend": "sim", "jobs_running": 0, "agent_version": "1"}


# --------------------------------------------------------------------------------------------------
# running jobs


def test_job_runs_to_success_with_output(agent: Agent) -> None:
    created = agent.launch("ok-1", "echo hi; sleep 0.2", [0])
    assert created["state"] == "running" and created["exit_code"] is None
    done = agent.wait_state("ok-1", "succeeded")
    assert done["exit_code"] == 0
    assert done["reason"] is None
    assert done["output_tail"] == ["hi"]
    assert done["devices"] == [0]
    assert done["ended_at"] >= done["started_at"]
    assert done["started_at"].endswith("+00:00")


def test_failed_exit_code_is_propagated(agent: Agent) -> None:
    agent.launch(42, "echo oops >&2; exit 3", [1])
    done = agent.wait_state(42, "failed")
    assert done["job_id"] == 42  # the id comes back in the type it was sent
    assert done["exit_code"] == 3
    assert "3" in done["reason"]
    assert done["output_tail"] == ["oops"]  # stderr goes to the same log


def test_job_sees_only_its_devices_and_its_env(agent: Agent) -> None:
    cmd = 'echo "$ASCEND_RT_VISIBLE_DEVICES|$NPUPORTAL_JOB_ID|$FOO|${CUDA_VISIBLE_DEVICES-unset}"'
    agent.launch("env-1", cmd, [3, 1, 6], env={"FOO": "bar baz"})
    done = agent.wait_state("env-1", "succeeded")
    assert done["output_tail"] == ["3,1,6|env-1|bar baz|unset"]


def test_output_tail_is_the_last_50_lines(agent: Agent) -> None:
    agent.launch("many", "i=0; while [ $i -lt 120 ]; do echo line$i; i=$((i+1)); done", [0])
    tail = agent.wait_state("many", "succeeded")["output_tail"]
    assert tail == [f"line{i}" for i in range(70, 120)]


def test_repost_is_idempotent_and_never_starts_twice(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "runs.txt"
    gate = tmp_path / "go"
    body = {
        "job_id": "idem",
        "command": f"echo ran >> {marker}; while [ ! -e {gate} ]; do sleep 0.02; done",
        "devices": [2],
    }
    results: list[tuple[int, Any]] = []
    threads = [threading.Thread(target=lambda: results.append(agent.call("POST", "/v1/jobs", body))) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    statuses = sorted(status for status, _ in results)
    assert statuses == [200, 200, 200, 200, 200, 201]
    assert len({reply["pid"] for _, reply in results}) == 1
    again = agent.call("POST", "/v1/jobs", {**body, "command": "echo different"})
    assert again[0] == 200 and again[1]["command"] == body["command"]
    gate.touch()
    agent.wait_state("idem", "succeeded")
    assert agent.call("POST", "/v1/jobs", body)[0] == 200  # also after it finished
    time.sleep(0.2)
    assert marker.read_text().splitlines() == ["ran"]


def test_delete_stops_a_job_within_grace_and_is_idempotent(agent: Agent) -> None:
    started = agent.launch("long", "sleep 60", [4])
    t0 = time.monotonic()
    status, reply = agent.call("DELETE", "/v1/jobs/long?grace=600")
    assert status == 200
    assert time.monotonic() - t0 < ceiling(30)  # the HTTP call does not wait out the grace period
    assert reply["state"] in ("stopping", "killed")
    done = agent.wait_state("long", "killed")
    assert time.monotonic() - t0 < ceiling(60)  # SIGTERM ended it, long before the grace period
    assert done["exit_code"] == -signal.SIGTERM
    assert done["reason"] == "cancelled"
    assert not job_pid_alive(started["pid"])
    again = agent.call("DELETE", "/v1/jobs/long")
    assert again[0] == 200 and again[1]["state"] == "killed" and again[1]["ended_at"] == done["ended_at"]
    agent.launch("after", "true", [4])  # the device is free again
    assert agent.call("DELETE", "/v1/jobs/nope")[0] == 404


def test_delete_records_the_reason_it_is_given(agent: Agent) -> None:
    agent.launch("evicted", "sleep 60", [3])
    status, reply = agent.call("DELETE", "/v1/jobs/evicted?grace=5&reason=Preempted%20for%20job%2042")
    assert status == 200 and reply["state"] in ("stopping", "killed")
    done = agent.wait_state("evicted", "killed")
    assert done["reason"] == "Preempted for job 42"
    # A second request may shorten the grace but not rewrite why the job was stopped.
    agent.call("DELETE", "/v1/jobs/evicted?reason=other")
    assert agent.job("evicted")["reason"] == "Preempted for job 42"


def test_delete_with_a_bad_reason_is_refused_and_stops_nothing(agent: Agent) -> None:
    agent.launch("kept", "sleep 30", [2])
    for query, words in (
        ("reason=%20%20", "empty"),
        ("reason=" + "x" * 201, "at most 200"),
        ("reason=two%0Alines", "one line"),
    ):
        status, reply = agent.call("DELETE", f"/v1/jobs/kept?{query}")
        assert (status, reply.get("field")) == (400, "reason"), (query, reply)
        assert words in reply["error"]
        assert agent.job("kept")["state"] == "running"


def test_delete_escalates_to_sigkill_after_grace(agents: Callable[..., Agent]) -> None:
    agent = agents("--kill-grace", "600")  # the default grace, far beyond the ceiling below: not the one used
    agent.launch("stubborn", "trap '' TERM; echo ready; sleep 600", [5])
    wait_for(lambda: agent.job("stubborn")["output_tail"] == ["ready"])
    t0 = time.monotonic()
    assert agent.call("DELETE", "/v1/jobs/stubborn?grace=0.5")[1]["state"] == "stopping"
    done = agent.wait_state("stubborn", "killed")
    assert 0.4 <= time.monotonic() - t0 < ceiling(60)
    assert done["exit_code"] == -signal.SIGKILL


def test_delete_with_wait_answers_once_the_job_is_gone_and_its_device_is_free(agent: Agent) -> None:
    """What the portal asks before it sends another job to the device: the stop, confirmed."""
    agent.launch("leaving", "trap 'sleep 0.8; exit 0' TERM; echo ready; sleep 60 & wait", [1])
    wait_for(lambda: agent.job("leaving")["output_tail"] == ["ready"])
    t0 = time.monotonic()
    status, reply = agent.call("DELETE", "/v1/jobs/leaving?grace=600&wait=60&reason=Preempted")
    assert status == 200 and reply["state"] == "killed" and reply["exit_code"] == 0
    assert 0.7 <= time.monotonic() - t0 < 60, "it waited for the job to leave, not for the grace period"
    assert agent.launch("next", "true", [1])["state"] in ("running", "succeeded")  # no 409: the device is free
    # Bounded by ``wait``: a job that outlives it is answered as still stopping.
    agent.launch("stubborn", "trap '' TERM; echo ready; sleep 600", [2])
    wait_for(lambda: agent.job("stubborn")["output_tail"] == ["ready"])
    t0 = time.monotonic()
    assert agent.call("DELETE", "/v1/jobs/stubborn?grace=600&wait=0.3")[1]["state"] == "stopping"
    assert time.monotonic() - t0 < ceiling(30)
    for bad in ("soon", "-1", "121", "nan"):
        status, reply = agent.call("DELETE", f"/v1/jobs/stubborn?wait={bad}")
        assert (status, reply["field"]) == (400, "wait"), bad
    agent.call("DELETE", "/v1/jobs/stubborn?grace=0&wait=60")
    assert agent.job("stubborn")["state"] == "killed"


def test_walltime_is_enforced(agent: Agent) -> None:
    agent.launch("wall", "sleep 30", [6], max_duration_s=0.5)
    done = agent.wait_state("wall", "killed")
    assert done["reason"] == "walltime"
    assert done["max_duration_s"] == 0.5
    assert done["exit_code"] == -signal.SIGTERM


def test_busy_device_is_refused_and_list_shows_jobs(agent: Agent) -> None:
    agent.launch("holder", "sleep 30", [7])
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "intruder", "command": "true", "devices": [7, 0]})
    assert status == 409 and reply["field"] == "devices" and "holder" in reply["error"]
    listed = agent.call("GET", "/v1/jobs")[1]
    assert listed["node"] == "test-node"
    assert [j["job_id"] for j in listed["jobs"]] == ["holder"]
    assert agent.call("GET", "/v1/health")[1]["jobs_running"] == 1
    agent.call("DELETE", "/v1/jobs/holder?grace=0")
    agent.wait_state("holder", "killed")


# --------------------------------------------------------------------------------------------------
# validation


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        (b"{not json", "body", "not valid JSON"),
        (b"", "body", "must be JSON"),
        (b"[1, 2]", "body", "object"),
        ({"command": "true", "devices": [0]}, "job_id", "required"),
        ({"job_id": "../../etc/x", "command": "true", "devices": [0]}, "job_id", "letters"),
        ({"job_id": True, "command": "true", "devices": [0]}, "job_id", "string or an integer"),
        ({"job_id": "v", "devices": [0]}, "command", "required"),
        ({"job_id": "v", "command": 7, "devices": [0]}, "command", "string"),
        ({"job_id": "v", "command": "  ", "devices": [0]}, "command", "non-empty"),
        ({"job_id": "v", "command": "true"}, "devices", "required"),
        ({"job_id": "v", "command": "true", "devices": "0"}, "devices", "list"),
        ({"job_id": "v", "command": "true", "devices": [0, True]}, "devices", "list"),
        ({"job_id": "v", "command": "true", "devices": []}, "devices", "at least one"),
        ({"job_id": "v", "command": "true", "devices": [1, 1]}, "devices", "twice"),
        ({"job_id": "v", "command": "true", "devices": [99]}, "devices", "unknown device index 99"),
        ({"job_id": "v", "command": "true", "devices": [0], "env": []}, "env", "object"),
        ({"job_id": "v", "command": "true", "devices": [0], "env": {"A": 1}}, "env", "string"),
        ({"job_id": "v", "command": "true", "devices": [0], "env": {"1A": "x"}}, "env", "valid variable"),
        (
            {"job_id": "v", "command": "true", "devices": [0], "env": {"ASCEND_RT_VISIBLE_DEVICES": "0"}},
            "env",
            "set by",
        ),
        ({"job_id": "v", "command": "true", "devices": [0], "max_duration_s": -1}, "max_duration_s", "> 0"),
        ({"job_id": "v", "command": "true", "devices": [0], "max_duration_s": "10"}, "max_duration_s", "number"),
        ({"job_id": "v", "command": "true", "devices": [0], "vnpu": "vir01"}, "vnpu", "object"),
        ({"job_id": "v", "command": "true", "vnpu": {"template": "vir05_1c_8g"}}, "vnpu.device", "integer"),
        ({"job_id": "v", "command": "true", "vnpu": {"template": "x y", "device": 0}}, "vnpu.template", "template"),
        (
            {"job_id": "v", "command": "true", "vnpu": {"template": "vir05_1c_8g", "device": 0}, "devices": [1]},
            "devices",
            "vnpu.device",
        ),
        ({"job_id": "v", "command": "true", "devices": [0], "cwd": "relative/dir"}, "cwd", "absolute"),
    ],
)
def test_bad_requests_name_the_field_and_change_nothing(idle_agent: Agent, body: Any, field: str, words: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    status, reply = idle_agent.call("POST", "/v1/jobs", raw=raw)
    assert status == 400, reply
    assert reply["field"] == field
    assert words in reply["error"]
    assert idle_agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    assert not list((idle_agent.state_dir / "jobs").iterdir())


def test_other_bad_requests(agent: Agent) -> None:
    assert agent.call("GET", "/v1/jobs/unknown")[0] == 404
    assert agent.call("GET", "/v1/nothing")[0] == 404
    status, reply = agent.call("PUT", "/v1/jobs", {})
    assert status == 405 and "PUT" in reply["error"]
    status, reply = agent.call("OPTIONS", "/v1/health")  # refused by the HTTP layer itself: still JSON
    assert status == 501 and "OPTIONS" in reply["error"]
    agent.launch("g", "sleep 600", [0])
    status, reply = agent.call("DELETE", "/v1/jobs/g?grace=soon")
    assert (status, reply["field"]) == (400, "grace")
    assert agent.job("g")["state"] == "running"  # the bad DELETE did not stop it
    status, reply = agent.call("POST", "/v1/jobs", raw=b"x" * (1024 * 1024 + 1))
    assert (status, reply["field"]) == (413, "body")


def test_a_command_longer_than_one_program_argument_is_413_and_the_longest_one_runs(agents) -> None:
    """What the kernel cannot pass to ``sh -c`` is refused as too large (final for the portal), not started."""
    from devices.agent.jobs import MAX_COMMAND_BYTES

    agent = agents()
    longest = "echo ok #" + "x" * (MAX_COMMAND_BYTES - 9)
    assert len(longest.encode()) == MAX_COMMAND_BYTES >= 131071
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "long", "command": longest + "x", "devices": [0]})
    assert (status, reply["field"]) == (413, "command"), reply
    assert (
        reply["error"]
        == f"command is {MAX_COMMAND_BYTES + 1} bytes; a program takes at most {MAX_COMMAND_BYTES} in one argument"
    )
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    agent.launch("long", longest, [0])
    done = agent.wait_state("long", "succeeded", "failed")
    assert (done["state"], done["exit_code"]) == ("succeeded", 0), done


# --------------------------------------------------------------------------------------------------
# simulated devices


def test_sim_devices_shape_and_live_figures(agent: Agent) -> None:
    status, body = agent.call("GET", "/v1/devices")
    assert status == 200
    assert (body["node"], body["backend"], body["error"]) == ("test-node", "sim", None)
    assert body["collected_at"].endswith("+00:00")
    assert [d["index"] for d in body["devices"]] == list(range(8))
    idle = body["devices"][5]
    for key in ("chip_model", "health", "temp_c", "power_w", "aicore_pct", "hbm_used_mb", "hbm_total_mb", "ecc_errors"):
        assert key in idle
    assert (idle["chip_model"], idle["health"], idle["aicore_pct"], idle["ecc_errors"]) == ("910B4", "OK", 0, 0)
    assert idle["hbm_total_mb"] == 32768 and idle["processes"] == []
    job = agent.launch("busy", "sleep 30", [5])
    busy = agent.device(5)
    assert busy["aicore_pct"] > 50
    assert busy["power_w"] > idle["power_w"] + 100
    assert busy["temp_c"] > idle["temp_c"]
    assert busy["hbm_used_mb"] > idle["hbm_used_mb"]
    assert busy["processes"][0]["pid"] == job["pid"] and busy["job_ids"] == ["busy"]
    assert agent.device(5) == busy  # deterministic: same load, same figures
    agent.call("DELETE", "/v1/jobs/busy?grace=0")
    agent.wait_state("busy", "killed")
    assert agent.device(5) == idle


def test_sim_faults(agent: Agent) -> None:
    normal_temp = agent.device(3)["temp_c"]
    assert agent.call("POST", "/v1/sim/faults", {"device": 2, "kind": "ecc"})[0] == 200
    agent.call("POST", "/v1/sim/faults", {"device": 2, "kind": "ecc"})
    assert (agent.device(2)["health"], agent.device(2)["ecc_errors"]) == ("Critical", 2)
    agent.call("POST", "/v1/sim/faults", {"device": 3, "kind": "overheat"})
    assert (agent.device(3)["health"], agent.device(3)["temp_c"]) == ("Alarm", 98)
    status, reply = agent.call("POST", "/v1/sim/faults", {"device": 4, "kind": "lost"})
    assert status == 200 and reply["health"] == "lost"
    lost = agent.device(4)
    assert lost["health"] == "lost" and lost["temp_c"] is None and lost["power_w"] is None
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "on-lost", "command": "true", "devices": [4]})
    assert (status, reply["field"]) == (409, "devices")
    for device in (2, 3, 4):
        agent.call("POST", "/v1/sim/faults", {"device": device, "kind": "recover"})
        assert agent.device(device)["health"] == "OK"
    assert agent.device(3)["temp_c"] == normal_temp
    assert agent.device(2)["ecc_errors"] == 2  # cumulative: recovery does not erase history
    for body, field in (
        ({"device": 2, "kind": "fire"}, "kind"),
        ({"device": 99, "kind": "ecc"}, "device"),
        ({"device": "2", "kind": "ecc"}, "device"),
        ({"kind": "ecc"}, "device"),
    ):
        status, reply = agent.call("POST", "/v1/sim/faults", body)
        assert (status, reply["field"]) == (400, field)
    assert agent.device(2)["ecc_errors"] == 2


def test_sim_vnpu_jobs_share_a_device(agent: Agent) -> None:
    vnpu = {"template": "vir05_1c_8g", "device": 1}
    first = agent.launch("v1", "echo $NPUPORTAL_VNPU_ID $ASCEND_RT_VISIBLE_DEVICES; sleep 30", [1], vnpu=vnpu)
    assert first["vnpu"] == {"template": "vir05_1c_8g", "device": 1, "vnpu_id": 116, "aicores": 5, "memory_mb": 8192}
    second = agent.call("POST", "/v1/jobs", {"job_id": "v2", "command": "sleep 30", "vnpu": vnpu})
    assert second[0] == 201 and second[1]["vnpu"]["vnpu_id"] == 117 and second[1]["devices"] == [1]
    dev = agent.device(1)
    assert sorted(v["vnpu_id"] for v in dev["vnpus"]) == [116, 117]
    assert dev["hbm_used_mb"] == 32768 * 3 // 100 + 8192 * 2
    assert dev["aicore_pct"] == round(10 / 20 * 92)  # half the AI cores are handed out
    big = {"template": "vir10_3c_16g", "device": 1}
    assert agent.call("POST", "/v1/jobs", {"job_id": "v3", "command": "sleep 30", "vnpu": big})[0] == 201
    full = agent.call("POST", "/v1/jobs", {"job_id": "v4", "command": "true", "vnpu": vnpu})
    assert full[0] == 409 and "0 free" in full[1]["error"]  # 5 + 5 + 10 of 20 AI cores
    whole = agent.call("POST", "/v1/jobs", {"job_id": "w", "command": "true", "devices": [1]})
    assert whole[0] == 409
    assert wait_for(lambda: agent.job("v1")["output_tail"]) == ["116 1"]


# --------------------------------------------------------------------------------------------------
# restarts


def test_restart_readopts_a_running_job_and_reports_its_real_exit_code(
    agents: Callable[..., Agent], tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    first = agents()
    started = first.launch(
        "survivor", f"echo started; while [ ! -e {gate} ]; do sleep 0.02; done; echo done; exit 7", [0]
    )
    first.call("POST", "/v1/sim/faults", {"device": 6, "kind": "ecc"})
    first.kill9()
    assert job_pid_alive(started["pid"])  # the job does not die with the agent
    second = agents()
    adopted = second.job("survivor")
    assert adopted["state"] == "running" and adopted["pid"] == started["pid"]
    assert second.call("GET", "/v1/health")[1]["jobs_running"] == 1
    assert (second.device(6)["health"], second.device(6)["ecc_errors"]) == ("Critical", 1)  # faults persist
    assert second.device(0)["job_ids"] == ["survivor"]
    gate.touch()
    done = second.wait_state("survivor", "failed")
    assert done["exit_code"] == 7
    assert done["output_tail"] == ["started", "done"]


def test_job_that_ends_while_the_agent_is_down_keeps_its_exit_code(
    agents: Callable[..., Agent], tmp_path: Path
) -> None:
    gate = tmp_path / "go"
    first = agents()
    first.launch("offline-end", f"while [ ! -e {gate} ]; do sleep 0.02; done; exit 5", [1])
    first.launch("offline-ok", f"while [ ! -e {gate} ]; do sleep 0.02; done", [2])
    first.kill9()
    gate.touch()
    jobs_dir = first.state_dir / "jobs"
    wait_for(lambda: (jobs_dir / "offline-end.exit").exists() and (jobs_dir / "offline-ok.exit").exists())
    second = agents()
    ended = second.job("offline-end")
    assert (ended["state"], ended["exit_code"]) == ("failed", 5)
    assert ended["ended_at"] is not None
    assert (second.job("offline-ok")["state"], second.job("offline-ok")["exit_code"]) == ("succeeded", 0)


def test_job_killed_while_the_agent_is_down_is_lost_not_ok(agents: Callable[..., Agent]) -> None:
    first = agents()
    started = first.launch("victim", "sleep 60", [3])
    first.kill9()
    os.killpg(started["pid"], signal.SIGKILL)  # SIGKILL: the wrapper cannot record an exit status
    wait_for(lambda: not job_pid_alive(started["pid"]))
    second = agents()
    record = second.job("victim")
    assert record["state"] == "lost"
    assert record["exit_code"] is None
    assert "no exit status" in record["reason"]
    second.launch("next", "true", [3])  # a lost job no longer holds its device


def test_graceful_stop_leaves_jobs_running_for_the_next_agent(agents: Callable[..., Agent], tmp_path: Path) -> None:
    gate = tmp_path / "go"
    first = agents()
    first.launch("across", f"while [ ! -e {gate} ]; do sleep 0.02; done", [0])
    first.stop()
    assert first.proc is not None and first.proc.returncode == 0
    second = agents()
    assert second.job("across")["state"] == "running"
    second.call("DELETE", "/v1/jobs/across?grace=2")  # adopted jobs can still be stopped
    assert second.wait_state("across", "killed")["exit_code"] == -signal.SIGTERM


def test_second_agent_on_the_same_state_dir_refuses_to_start(agent: Agent, tmp_path: Path) -> None:
    other = subprocess.run(
        [
            sys.executable,
            "-m",
            "devices.agent",
            "--backend",
            "sim",
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--token-file",
            str(agent.token_file),
            "--state-dir",
            str(agent.state_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ceiling(60),
        check=False,
    )
    assert other.returncode == 1
    assert "another agent" in other.stderr


# --------------------------------------------------------------------------------------------------
# command line and packaging


def run_agent_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "devices.agent", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ceiling(60),
        check=False,
    )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--backend": "rocm-smi"}, "invalid choice"),
        ({"--listen": None}, "--listen"),
        ({"--listen": "localhost"}, "HOST:PORT"),
        ({"--listen": "127.0.0.1:99999"}, "out of range"),
        ({"--token-file": "/nonexistent/token"}, "--token-file"),
        ({"--token-file": "EMPTY"}, "empty"),
        ({"--token-file": "SHORT"}, "shorter than 16"),
        ({"--sim-chip": "999X"}, "--sim-chip"),
        ({"--sim-devices": "0"}, "--sim-devices"),
        ({"--sim-devices": "many"}, "invalid int"),
        ({"--sim-topology": "ring:3"}, "do not divide"),
        ({"--sim-topology": "torus"}, "unknown topology"),
        ({"--backend": "npu-smi", "--sim-chip": "910B4"}, "only apply to --backend sim"),
        ({"--kill-grace": "-1"}, "--kill-grace"),
        ({"--memory-release-wait": "61"}, "--memory-release-wait must be between 0 and 60"),
        ({"--bogus-flag": "1"}, "unrecognized arguments"),
    ],
)
def test_bad_flags_exit_2_with_a_clear_message(tmp_path: Path, change: dict[str, str | None], message: str) -> None:
    (tmp_path / "token").write_text(TOKEN)
    (tmp_path / "EMPTY").write_text("\n")
    (tmp_path / "SHORT").write_text("abc\n")
    flags: dict[str, str | None] = {
        "--backend": "sim",
        "--listen": f"127.0.0.1:{free_port()}",
        "--token-file": str(tmp_path / "token"),
        "--state-dir": str(tmp_path / "state"),
    }
    for key, value in change.items():
        flags[key] = str(tmp_path / value) if value in ("EMPTY", "SHORT") else value
    argv = [part for key, value in flags.items() if value is not None for part in (key, value)]
    done = run_agent_cli(*argv)
    assert done.returncode == 2, done.stderr
    assert message in done.stderr
    assert "Traceback" not in done.stderr


def test_agent_package_imports_only_the_standard_library() -> None:
    package = ROOT / "devices" / "agent"
    for path in package.glob("*.py"):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or name.startswith("devices.agent") or name == "devices", (
                    f"{path.name} imports {name}"
                )
    probe = (
        "import sys, devices.agent.cli, devices.agent.npusmi, devices.agent.nvsmi, devices.agent.runner;"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'requests', 'yaml', 'rest_framework'});"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=ceiling(60), check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_log_serves_byte_ranges_while_the_job_runs_and_after(agent: Agent, tmp_path: Path) -> None:
    """A follower asks from ``next_offset`` and sees each line once, stdout and stderr in order."""
    gate = tmp_path / "go"  # the job goes on only after the first read: that read sees it running
    agent.launch("follow-1", f"echo one; echo two >&2; while [ ! -e {gate} ]; do sleep 0.02; done; echo 'trois é'", [0])
    status, first = agent.call("GET", "/v1/jobs/follow-1/log")
    assert status == 200 and first["offset"] == 0
    gate.touch()
    seen = first["data"]
    offset = first["next_offset"]

    def read_on() -> dict[str, Any] | None:
        nonlocal seen, offset
        status, more = agent.call("GET", f"/v1/jobs/follow-1/log?offset={offset}")
        assert status == 200 and more["offset"] == offset
        seen += more["data"]
        offset = more["next_offset"]
        return more if more["complete"] else None

    more = wait_for(read_on, interval=0.1, message="the log of follow-1 to be complete")
    assert seen == "one\ntwo\ntrois é\n"
    assert offset == len(seen.encode())
    assert not first["complete"] and more["state"] == "succeeded"
    status, tail = agent.call("GET", "/v1/jobs/follow-1/log?tail=2")
    assert tail["data"] == "two\ntrois é\n" and tail["next_offset"] == offset
    assert tail["offset"] == len(b"one\n")
    assert tail["lines"] == 3  # of the whole log: "the last 2 of 3 lines"


def test_log_refuses_bad_parameters_and_unknown_jobs(idle_agent: Agent) -> None:
    for query, field in (("offset=-1", "offset"), ("offset=x", "offset"), ("tail=99999999", "tail")):
        status, body = idle_agent.call("GET", f"/v1/jobs/nope/log?{query}")
        assert status == 400 and body["field"] == field, body
    status, body = idle_agent.call("GET", "/v1/jobs/nope/log")
    assert status == 404


def test_output_beyond_the_cap_is_dropped_with_a_line_saying_so(agents: Callable[..., Agent]) -> None:
    agent = agents("--max-log-bytes", "2048")
    agent.launch("loud", "i=0; while [ $i -lt 500 ]; do echo line-$i; i=$((i+1)); done; echo done", [0])
    agent.wait_state("loud", "succeeded")
    _, log = agent.call("GET", "/v1/jobs/loud/log")
    assert log["data"].startswith("line-0\nline-1\n")
    assert log["data"].endswith("[npuportal: output beyond 2048 bytes was dropped]\n")
    assert log["size"] < 2048 + 100
    assert log["complete"]


def test_a_tail_counts_the_lines_of_the_whole_log(tmp_path: Path) -> None:
    """Past the part a tail reads (256 KiB), every line still counts; a last line without its newline too."""
    from devices.agent.jobs import read_log

    log = tmp_path / "j.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(50_000)) + b"no newline")
    answer = read_log(log, tail=500)
    assert answer["lines"] == 50_001 and answer["data"].count("\n") == 499
    assert answer["data"].endswith("line 49999\nno newline")
    assert read_log(tmp_path / "none.log", tail=5)["lines"] == 0
    assert "lines" not in read_log(log, offset=0)  # a byte range does not read the whole file


def test_a_progress_bar_redrawn_with_carriage_returns_is_one_line(tmp_path: Path) -> None:
    from devices.agent.jobs import read_log

    log = tmp_path / "j.log"
    log.write_bytes(b"start\nprogress 10%\rprogress 50%\rprogress 100%\ndone\n")
    answer = read_log(log, tail=2)
    assert answer["data"] == "progress 10%\rprogress 50%\rprogress 100%\ndone\n" and answer["lines"] == 3
