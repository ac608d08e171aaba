"""What the agent's record says of a run it stopped at its own shutdown (``--stop-jobs-on-exit``).

The portal requeues such a run instead of failing it (devices/executors/agents.py, ``stopped_by_system``),
so the record must tell it apart from a run the job ended itself and from one the portal asked to stop.
Real jobs (``/bin/sh -c``) under a job manager in this process.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from devices.agent.accounts import AccountPolicy
from devices.agent.environment import JobSetup
from devices.agent.jobs import RUNNING_STATES, JobManager
from devices.agent.sim import SimBackend


def _manager(tmp_path: Path) -> JobManager:
    """A job manager as an agent starts one: its state dir read, then its monitor started."""
    # Jobs as the agent's own account (the demo's way), so the test runs the same as root or not.
    setup = JobSetup(AccountPolicy.for_agent("node-a", jobs_as_agent=True, allow_root=True))
    manager = JobManager(tmp_path, SimBackend("910B4", 4, tmp_path), setup=setup, memory_release_wait_s=0)
    manager.load()
    manager.start()
    return manager


def _ended(manager: JobManager, job_id: str, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    record = manager.describe(job_id)
    while time.monotonic() < deadline and record["state"] in RUNNING_STATES:
        time.sleep(0.05)
        record = manager.describe(job_id)
    assert record["state"] not in RUNNING_STATES, record
    return record


def _running(manager: JobManager, job_id: str, timeout: float = 30) -> None:
    """Until the job's command runs (it writes a file): a signal before that would hit the wrapper alone."""
    started = manager.state_dir / f"{job_id}.started"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not started.exists():
        time.sleep(0.05)
    assert started.exists(), manager.describe(job_id)


def test_runs_stopped_at_shutdown_say_cause_system_and_others_do_not(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    try:
        ready = f"touch {tmp_path}/%s.started; "
        manager.submit({"job_id": "own-signal", "command": ready % "own-signal" + "kill -TERM $$", "devices": [0]})
        manager.submit({"job_id": "work", "command": ready % "work" + "sleep 60", "devices": [1]})
        # Asked to stop by the portal before the shutdown, and slow to go: it keeps the portal's reason.
        slow = ready % "cancelled" + "trap '' TERM; sleep 60"
        manager.submit({"job_id": "cancelled", "command": slow, "devices": [2]})
        own = _ended(manager, "own-signal")
        _running(manager, "work")
        _running(manager, "cancelled")
        assert manager.stop("cancelled", grace_s=60, reason="Cancelled")["state"] == "stopping"

        assert manager.stop_all(grace_s=1) == 2

        work, cancelled = manager.describe("work"), manager.describe("cancelled")
    finally:
        manager.close()
    assert (work["state"], work["reason"], work["cause"]) == ("killed", "agent stopped", "system")
    assert (cancelled["state"], cancelled["reason"], cancelled["cause"]) == ("killed", "Cancelled", None)
    assert cancelled["exit_reason"] == "cancelled"
    assert (own["state"], own["exit_code"], own["cause"]) == ("failed", -15, None)
    assert own["exit_reason"] == "killed by signal SIGTERM"


def test_the_cause_survives_the_agent(tmp_path: Path) -> None:
    """A later agent on the same state dir reports the run as the one that stopped it wrote it."""
    manager = _manager(tmp_path)
    try:
        manager.submit({"job_id": "work", "command": f"touch {tmp_path}/work.started; sleep 60", "devices": [0]})
        _running(manager, "work")
        manager.stop_all(grace_s=1)
    finally:
        manager.close()
    later = _manager(tmp_path)
    try:
        record = later.describe("work")
    finally:
        later.close()
    assert (record["state"], record["cause"]) == ("killed", "system")
