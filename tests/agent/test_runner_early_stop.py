"""The job wrapper (``devices/agent/runner.py``) and a stop that comes before its command runs.

The agent stops a job by signalling every process of it. Right after a launch the wrapper may
already catch SIGTERM (so that it outlives the signal and records the command's status) while the
command does not exist yet: on a busy node that window lasts long enough for a quick cancel to land
in it. The signal must still reach the command; lost, the job ran on until SIGKILL at the end of its
grace period.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from devices.agent.jobs import RUNNER_PATH
from tests.waiting import ceiling, wait_for


def catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` of ``/proc/PID/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def test_a_stop_before_the_command_starts_reaches_the_command(tmp_path: Path) -> None:
    env_file = tmp_path / "env"
    os.mkfifo(env_file)  # the wrapper blocks reading it: after taking its handlers, before starting the command
    exit_file = tmp_path / "exit"
    argv = [sys.executable, "-I", "-S", str(RUNNER_PATH), "--exit-file", str(exit_file), "--env-file", str(env_file)]
    wrapper = subprocess.Popen([*argv, "sleep 600"], start_new_session=True)
    try:
        wait_for(lambda: catches(wrapper.pid, signal.SIGTERM), message="the wrapper to catch SIGTERM")
        os.killpg(wrapper.pid, signal.SIGTERM)  # what the agent does: the command is not there yet
        env_file.write_text(json.dumps({"PATH": os.environ.get("PATH", "/usr/bin:/bin")}))  # now it starts
        status = wrapper.wait(timeout=ceiling(60))  # without the signal, ``sleep 600`` runs on
    finally:
        try:
            os.killpg(wrapper.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        wrapper.wait()
    assert exit_file.read_text() == f"{-signal.SIGTERM}\n"
    assert status == 128 + signal.SIGTERM
