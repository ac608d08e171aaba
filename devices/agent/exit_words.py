"""How a process ended, in words: the one wording of exit codes and signals, for the agent and the portal.

``exit code 3``, ``killed by signal SIGKILL``, ``no exit status``: the agent's run records
(``exit_reason``, ``reason``), the portal's events (``devices.executors.agents.outcome``), the API's
``exit_reason`` and the console (``scheduling.reason_text.exit_reason``) all say it so. Standard
library only: the agent runs on nodes without the portal's Django.
"""

from __future__ import annotations

import signal


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def exit_words(code: int | None) -> str:
    """An exit status in words: ``exit code 3`` (0 too), ``killed by signal SIGKILL`` (negative), ``no exit status``."""
    if code is None:
        return "no exit status"
    if code < 0:
        return f"killed by signal {signal_name(-code)}"
    return f"exit code {code}"
