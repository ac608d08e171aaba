"""What a run of the agent's tests found about this machine, listed at its end (CI logs are quiet otherwise)."""

from __future__ import annotations

import pytest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Which way the agent stopped jobs here (own cgroup or process tracking): the tests pass either way."""
    lines = [
        f"{report.nodeid}: {value}"
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", ())
        if name == "stop_path"
    ]
    if lines:
        terminalreporter.write_sep("-", "how the agent stopped jobs on this machine")
        for line in lines:
            terminalreporter.write_line(line)
