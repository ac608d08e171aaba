"""Plain words for the reason codes people see: why a job waits, and what each event of its life was.

Codes are for scripts (the API and ``npuctl --json`` keep them); words are for people. A waiting
reason the engine gives has its sentence in the engine's own table (``scheduling.engine.reasons.TEXT``,
which ``explain`` and ``sprio`` read too); the codes only the portal gives a waiting job (a requeue's
cause, a fresh submission) have theirs here. No code is in both, so each has one sentence.
"""

from __future__ import annotations

import re

from devices.agent.exit_words import exit_words
from devices.agent.exit_words import signal_name as signal_name  # where it lived before
from scheduling.engine import reasons

#: Waiting reasons the portal gives (not the engine): a job just submitted, or queued again after a fault.
PORTAL_TEXT = {
    "Submitted": "Just submitted; the scheduler looks at it within seconds.",
    "Preempted": "It was preempted and is queued again, keeping its place by submit time.",
    "DeviceFailed": "Its device failed; it was requeued to run elsewhere.",
    "NodeUnreachable": "Its node stopped answering; it was requeued.",
    "LostOnAgent": "Its node lost the process; it was requeued.",
    "NodeFail": "Its node stopped it (the agent or the whole system was shut down); it was requeued in its place.",
    "LaunchFailed": "Its node refused or missed the launch; it is tried again, then requeued.",
    "HeldInSlurm": "Slurm kept it waiting after it was started (a job outside npuportal took its cards); "
    "it was queued again in its place.",
    "Walltime": "It ran past its maximum duration and was stopped.",
    "Killed": "Its process was killed by a signal.",
    "OutOfMemory": "The kernel killed it for using more memory than its limit.",
}

#: Each event reason's name in words, the events table's first column ("Preemption scheduled");
#: the code stays beside it, and in the API, for scripts.
EVENT_NAMES = {
    "Submitted": "Submitted",
    "Scheduled": "Started",
    "PreemptionScheduled": "Preemption scheduled",
    "PreemptionCalledOff": "Preemption called off",
    "Preempted": "Preempted",
    "Cancelled": "Cancelled",
    "Completed": "Completed",
    "NonZeroExit": "Failed",
    "OutOfMemory": "Out of memory",
    "Walltime": "Run time limit reached",
    "Killed": "Killed",
    "LaunchFailed": "Launch failed",
    "HeldInSlurm": "Withdrawn from Slurm",
    "LostOnAgent": "Lost on its node",
    "NodeUnreachable": "Node stopped answering",
    "DeviceFailed": "Device failed",
    "NodeFail": "Stopped by its node",
    reasons.DEPENDENCY_NEVER_SATISFIED: "Dependency never satisfied",
    reasons.NEVER_RUNNABLE: "Can never run",
}


#: Event reasons that say more about how a job ended than its exit code does.
_END_REASONS = {
    "Walltime": "time limit reached",
    "Preempted": "preempted",
    "OutOfMemory": "out of memory",
    "LostOnAgent": "node lost",
    "NodeUnreachable": "node lost",
    "NodeFail": "stopped by its node's shutdown",
    "DeviceFailed": "device failed",
    "LaunchFailed": "launch failed",
    "HeldInSlurm": "withdrawn from Slurm before it ran",
    "Cancelled": "cancelled",
}

#: The words of a final state that says how the job ended by itself, whatever its exit code.
_STATE_WORDS = {
    "cancelled": "cancelled",
    "preempted": "preempted",
    "timeout": "time limit reached",
    "out_of_memory": "out of memory",
}


def exit_reason(state: str, exit_code: int | None, end_reason: str | None = None) -> str | None:
    """How a job ended, in words: ``exit code 3``, ``killed by signal SIGKILL``, ``walltime exceeded``...

    ``None`` while it has not ended. ``end_reason`` is the reason of the event that ended it, when the
    caller has it (the job page does; the API's job rows, kept query-free, go by state and exit code).
    A run that was requeued is worded the same way by its own outcome (``node_fail``, ``preempted``).
    """
    if state == "cancelled" and end_reason == reasons.DEPENDENCY_NEVER_SATISFIED:
        return "cancelled: dependency never satisfied"
    if state in _STATE_WORDS:
        return _STATE_WORDS[state]
    if state == "node_fail":
        return _END_REASONS.get(end_reason or "", "node failure")
    if state not in ("completed", "failed"):
        return None
    if end_reason in _END_REASONS:
        return _END_REASONS[end_reason]
    return exit_words(exit_code)


def reason_text(code: str) -> str:
    """The sentence for waiting reason ``code`` (the code itself when it has none)."""
    return reasons.TEXT.get(code) or PORTAL_TEXT.get(code) or code


def event_name(code: str) -> str:
    """An event reason in words: ``Preemption scheduled`` for ``PreemptionScheduled``.

    A code with no name here (a future one) is split at its capitals, so it still reads as words.
    """
    if not code:
        return ""
    found = EVENT_NAMES.get(code)
    if found:
        return found
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", code).split()
    return " ".join([words[0], *(w.lower() for w in words[1:])]) if words else code


def preemption_cause(code: str) -> str:
    """Why a running job is asked to leave, from its ``PreemptionScheduled`` event's detail (a code)."""
    return reasons.TEXT.get(code, code).rstrip(".")
