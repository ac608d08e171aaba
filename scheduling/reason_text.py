"""Plain words for the reason codes users see next to a waiting job."""

from __future__ import annotations

import signal

TEXT = {
    "Submitted": "Just submitted; the scheduler looks at it within seconds.",
    "Priority": "Jobs with higher priority are ahead of it in the queue.",
    "Resources": "Not enough free devices of the kind it needs right now.",
    "QuotaMaxDevices": "Your team is at its device limit (max quota) for now.",
    "QuotaMaxJobs": "Your team is at its limit of concurrent jobs.",
    "QuotaMaxDuration": "The job asks for longer than your team's maximum job duration.",
    "QuotaClassNotAllowed": "Your team may not use this priority class.",
    "MonthlyBudgetExhausted": "Your team has used its device-hours for this month.",
    "ReservedCapacity": "The free devices are reserved for another priority class.",
    "Topology": "No placement fits its shape (devices per node, rings or whole nodes).",
    "ChipModelUnavailable": "The cluster has no devices of the chip model it asks for.",
    "NodeUnhealthy": "The devices it could use are unhealthy, cordoned or down.",
    "NeverRunnable": "It can never run under the current policy and cluster: cancel it, or ask an admin.",
    "PreemptionGrace": "Devices are being reclaimed for it; lower-priority jobs get a grace period to finish.",
    "Preempted": "It was preempted and is queued again, keeping its place by submit time.",
    "DeviceFailed": "Its device failed; it was requeued to run elsewhere.",
    "NodeUnreachable": "Its node stopped answering; it was requeued.",
    "LostOnAgent": "Its node lost the process; it was requeued.",
    "NodeFail": "Its node stopped it (the agent or the whole system was shut down); it was requeued in its place.",
    "LaunchFailed": "Its node refused or missed the launch; it is tried again, then requeued.",
    "Walltime": "It ran past its maximum duration and was stopped.",
    "Killed": "Its process was killed by a signal.",
    "OutOfMemory": "The kernel killed it for using more memory than its limit.",
}

#: Event reasons that say more about how a job ended than its exit code does.
_END_REASONS = {
    "Walltime": "walltime exceeded",
    "Preempted": "preempted",
    "OutOfMemory": "out of memory",
    "LostOnAgent": "node lost",
    "NodeUnreachable": "node lost",
    "Cancelled": "cancelled",
}


def exit_reason(state: str, exit_code: int | None, end_reason: str | None = None) -> str | None:
    """How a job ended, in words: ``exit code 3``, ``killed by signal SIGKILL``, ``walltime exceeded``...

    ``None`` while it has not ended. ``end_reason`` is the reason of the event that ended it, when the
    caller has it (the job page does; the API's job rows, kept query-free, go by state and exit code).
    """
    if state == "cancelled":
        return "cancelled"
    if state == "preempted":
        return "preempted"
    if state not in ("completed", "failed"):
        return None
    if end_reason in _END_REASONS:
        return _END_REASONS[end_reason]
    if exit_code is None:
        return "no exit status"
    if exit_code < 0:
        return f"killed by signal {signal_name(-exit_code)}"
    return f"exit code {exit_code}"


def signal_name(number: int) -> str:
    """``SIGKILL`` for 9; ``signal 99`` for a number with no name (the one rule of every exit text)."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def reason_text(code: str) -> str:
    try:
        from scheduling.engine import reasons

        text = getattr(reasons, "REASON_TEXT", {}).get(code)
        if text:
            return text
    except ImportError:
        pass
    return TEXT.get(code, code)
