"""One wording of how a process ended, whoever says it: the agent, the portal's events, the API and the console.

``devices.agent.exit_words`` is the one copy; each caller below is asked about the same exit codes and
signals and must give its words.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from devices.agent import jobs as agent_jobs
from devices.agent.exit_words import exit_words, signal_name
from devices.executors.agents import describe_exit, outcome
from scheduling.reason_text import exit_reason

CODES = [1, 2, 3, 127, 255, -1, -2, -6, -9, -11, -15, -99]


@pytest.mark.parametrize("code", CODES)
def test_every_caller_words_an_exit_the_same(code: int) -> None:
    words = exit_words(code)
    assert exit_reason("failed", code) == words  # the API's exit_reason, the console
    assert describe_exit(code) == words
    assert outcome({"state": "failed", "exit_code": code})[2] == words  # the portal's event detail
    ended = SimpleNamespace(exit_code=code, oom_kills=0, stop_reason=None)
    assert agent_jobs.exit_reason(ended) == words  # the agent's run record
    record = SimpleNamespace(stop_reason=None, sigkill_sent=False, state="", reason="", exit_code=code)
    agent_jobs.JobManager._finalize_state(None, record, code)  # type: ignore[arg-type]
    assert (record.state, record.reason) == ("failed", words)


def test_the_words() -> None:
    assert exit_words(0) == "exit code 0"
    assert exit_words(3) == "exit code 3"
    assert exit_words(-9) == "killed by signal SIGKILL"
    assert exit_words(-99) == "killed by signal signal 99"
    assert exit_words(None) == "no exit status"
    assert signal_name(15) == "SIGTERM"
    assert exit_reason("failed", None) == exit_words(None)
    assert agent_jobs.exit_reason(SimpleNamespace(exit_code=None, oom_kills=0, stop_reason=None)) == (
        f"node lost ({exit_words(None)})"
    )


def test_the_wording_needs_only_the_standard_library() -> None:
    """The agent runs on nodes without Django: the module it shares with the portal imports nothing else."""
    path = Path(__file__).resolve().parent.parent / "devices" / "agent" / "exit_words.py"
    imported = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_no_other_copy_of_the_wording() -> None:
    """The phrases are written once, in ``devices/agent/exit_words.py``."""
    root = Path(__file__).resolve().parent.parent
    copies = sorted(
        str(p.relative_to(root))
        for package in ("devices", "scheduling", "npuportal", "npuctl", "quotas")
        for p in (root / package).rglob("*.py")
        if "migrations" not in p.parts
        and p.name != "exit_words.py"
        and ('f"killed by signal {' in p.read_text() or "exited with status {code}" in p.read_text())
    )
    assert not copies
