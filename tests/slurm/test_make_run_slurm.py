"""``make run EXECUTOR=slurm`` as a user meets it: the supervisor brings up a local Slurm and takes it down.

The real processes in a scratch ``var/`` on free ports, as ``make run`` starts them after its seed
(``seed_demo --no-agents``): a job submitted through the API runs in Slurm (found by its
``--comment``), never as root, and SIGINT to the supervisor leaves none of Slurm's daemons behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import requests

from devices.slurm.cluster import missing_commands
from npuportal import slurm_demo, supervisor
from tests.conftest import free_port, free_port_block
from tests.test_foundation_e2e import ROOT, _env, _manage
from tests.waiting import ceiling, wait_for

DAEMONS = {"slurmctld", "slurmd", "slurmdbd", "munged"}


def daemons_of(folder: Path) -> list[str]:
    """Slurm's and munge's daemons and job steps of the cluster in ``folder`` (its ``SLURM_CONF`` or path)."""
    conf = f"SLURM_CONF={folder}/etc/slurm.conf\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if name in DAEMONS | {"slurmstepd"} and (conf in environ or str(folder).encode() in cmdline):
            found.append(f"{entry.name} {name}")
    return found


def _environment_has(variable: str) -> list[int]:
    """Pids with ``variable`` (``NAME=value``) in their environment: a job's processes, whatever they run."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"\0{variable}\0".encode() in b"\0" + (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def slurm(conf: str, *argv: str) -> str:
    done = subprocess.run(
        argv, env={**os.environ, "SLURM_CONF": conf}, capture_output=True, text=True, timeout=ceiling(60), check=False
    )
    return done.stdout


@pytest.mark.slow
def test_make_run_on_slurm_runs_a_job_in_its_own_slurm_and_stops_every_daemon(tmp_path: Path) -> None:
    if missing := missing_commands():
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): `make test` installs it as root")
    env = _env(tmp_path, free_port_block(8))
    for name in ("SLURM_CONF", "NPUPORTAL_SLURM_CONF", "NPUPORTAL_SLURM_OUTPUT_DIR", "NPUPORTAL_SLURM_JOBS_AS"):
        env.pop(name, None)
    env["NPUPORTAL_EXECUTOR"] = "slurm"
    _manage(env, "migrate", "--noinput", "-v0")
    _manage(env, "seed_demo", "--no-agents")
    token = _manage(env, "drf_create_token", "lead-training").split()[2]
    port = free_port()
    sup = subprocess.Popen(
        [sys.executable, "-m", "npuportal.supervisor", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    link = tmp_path / "var" / "slurm"
    marker = f"npuportal-slurm-run-{uuid.uuid4().hex}"
    folder = None
    try:

        def healthy() -> requests.Response:
            assert sup.poll() is None, sup.stdout.read()[-3000:]  # type: ignore[union-attr]
            return requests.get(f"{base}/healthz", timeout=ceiling(60))

        wait_for(
            healthy,
            until=lambda resp: resp.status_code == 200,
            ignore=(requests.RequestException,),
            timeout=300,
            interval=1,
            message="the system's /healthz to answer 200",
        )
        folder = link.resolve()
        conf = str(folder / "etc" / "slurm.conf")
        assert {d.split()[1] for d in daemons_of(folder)} >= {"slurmctld", "slurmd", "munged"}
        api = {"Authorization": f"Token {token}"}
        # The portal's nodes are Slurm's: the demo's 310P3 and 910A nodes are gone, ascend-b4-03 came.
        nodes = requests.get(f"{base}/api/v1/nodes/", headers=api, timeout=ceiling(60)).json()
        names = {n["name"] for n in (nodes["results"] if isinstance(nodes, dict) else nodes)}
        assert names == {"ascend-b4-01", "ascend-b4-02", "ascend-b4-03"}, names
        resp = requests.post(
            f"{base}/api/v1/jobs/",
            json={
                "name": "on-slurm",
                "command": "echo hello as $(id -un) on $ASCEND_RT_VISIBLE_DEVICES; sleep 2",
                "num_devices": 2,
                "chip_model": "910B4",
                "estimated_duration_s": 60,
            },
            headers=api,
            timeout=ceiling(60),
        )
        assert resp.status_code == 201, resp.text
        job_id = resp.json()["id"]
        job = wait_for(
            lambda: requests.get(f"{base}/api/v1/jobs/{job_id}/", headers=api, timeout=ceiling(60)).json(),
            until=lambda job: job["state"] in {"completed", "failed", "cancelled"},
            timeout=300,
            interval=1,
            message="the job to end",
        )
        assert job["state"] == "completed" and job["exit_code"] == 0, job
        comment = f"npuportal:{job_id}:1"
        listed = slurm(conf, "squeue", "-h", "-t", "all", "-o", "%i|%T|%u|%k")
        ours = [line.split("|") for line in listed.splitlines() if line.endswith(f"|{comment}")]
        assert ours, f"no Slurm job with comment {comment}: {listed!r}"
        assert ours[0][1] == "COMPLETED" and ours[0][2] != "root", ours
        if "accounting_storage/slurmdbd" in Path(conf).read_text():
            # slurmctld hands the job's end to slurmdbd a moment after squeue shows it.
            wait_for(
                lambda: slurm(conf, "sacct", "-X", "-n", "-P", "-o", "JobID,State,User,Comment", "-S", "now-1hour"),
                until=lambda out: any(f"|COMPLETED|{ours[0][2]}|{comment}" in line for line in out.splitlines()),
                timeout=120,
                interval=1,
                message=f"sacct to account for {comment}",
            )
        log = requests.get(f"{base}/api/v1/jobs/{job_id}/log/", headers=api, timeout=ceiling(60)).json()
        assert re.match(r"hello as (?!root)\S+ on \d,\d\n", log["data"]), log

        # A job still running when the supervisor is stopped ends with Slurm, its processes included.
        resp = requests.post(
            f"{base}/api/v1/jobs/",
            json={"name": "long", "command": "echo start; sleep 600", "num_devices": 1, "env": {"RUN_MARKER": marker}},
            headers=api,
            timeout=ceiling(60),
        )
        assert resp.status_code == 201, resp.text
        long_id = resp.json()["id"]
        wait_for(
            lambda: requests.get(f"{base}/api/v1/jobs/{long_id}/log/", headers=api, timeout=ceiling(60)).json(),
            until=lambda log: log["data"].startswith("start"),
            timeout=300,
            interval=1,
            message="the long job's first line",
        )
        assert _environment_has(f"RUN_MARKER={marker}"), "the long job runs"
    finally:
        sup.send_signal(signal.SIGINT)
        try:
            out, _ = sup.communicate(timeout=ceiling(120))
        except subprocess.TimeoutExpired:
            sup.kill()
            out, _ = sup.communicate()
        print(out[-8000:])  # shown by pytest when the test fails
        left = daemons_of(folder) if folder is not None else []
        stray = _environment_has(f"RUN_MARKER={marker}")
        for pid in stray:  # asserted on below; not left running whatever the test says
            os.kill(pid, signal.SIGKILL)
        if folder is not None and (folder / "cluster.json").exists():  # what the test must not leave running
            from devices.slurm.cluster import LocalCluster

            LocalCluster.load(folder).stop()
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
    assert "Jobs run on a local Slurm, stopped with the rest: SLURM_CONF=" in out
    assert "slurm import: import from Slurm: 1 added, 2 removed, 2 unchanged" in out
    assert "Slurm stopped" in out
    assert not left, f"daemons of {folder} outlived the supervisor: {left}"
    assert not stray, f"a job's process outlived make run: {stray}"
    assert sup.returncode == 0, out[-3000:]


def test_without_slurm_make_run_says_how_to_install_it_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.delenv("SLURM_CONF", raising=False)
    monkeypatch.delenv("NPUPORTAL_SLURM_CONF", raising=False)
    monkeypatch.setenv("NPUPORTAL_EXECUTOR", "slurm")
    monkeypatch.setattr(slurm_demo, "missing_commands", lambda: ["slurmctld", "slurmd"])
    assert slurm_demo.main() == 1
    assert supervisor.main(["--port", str(free_port())]) == 1
    err = capsys.readouterr().err.splitlines()
    expected = (
        "make run EXECUTOR=slurm: Slurm is not installed here (no slurmctld, slurmd): apt-get install "
        "slurm-wlm slurmctld slurmd slurmdbd munge slurm-client, or give SLURM_CONF=<your site's slurm.conf>"
    )
    assert err == [expected, expected]


def test_each_run_of_the_demo_slurm_numbers_its_jobs_after_the_last_runs() -> None:
    """A fresh cluster counting from 1 would give a new job the Slurm id an old running job still holds."""
    start = 1767225600 + 10_000  # 2026-01-01 plus 10,000 s
    assert slurm_demo.first_job_id(start) == 10_001
    assert slurm_demo.first_job_id(start + 60) == 10_061
    assert 1 <= slurm_demo.first_job_id(4_000_000_000) <= 60_000_000  # below Slurm's MaxJobId (67,043,328)
