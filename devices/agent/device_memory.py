"""Is a job's accelerator memory free? Read from the vendor tool's process table once its processes are gone.

A process that has exited may hold its card's memory a moment longer, until the driver releases it, and a
process the agent does not know (started by hand, or in another container) may hold it for good; the
next job on the card would then fail for want of memory. So, where the tool prints a process table
(``npu-smi info`` on recent releases, ``nvidia-smi --query-compute-apps``), the agent reports a job
ended only once the table lists no process on the job's cards but those of another running job sharing
one, or after a bound, saying in words who still holds it (docs/agent.md, "Stopping a job").
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

from devices.agent.backends import ProcessTable

#: Default of ``--memory-release-wait``: how long a job's end waits for its cards' memory to be released.
DEFAULT_RELEASE_WAIT_S = 10.0
#: Seconds between two readings of the table while waiting (each reading is one tool call).
CHECK_INTERVAL_S = 0.5
#: At most this many holders are named in the words; the rest are counted.
NAMED_HOLDERS = 4


@dataclass(frozen=True)
class Holder:
    """A process the table lists on one of the job's cards."""

    device: int
    pid: int | None
    name: str | None = None
    memory_mb: int | float | None = None


def holders(devices: Iterable[int], table: ProcessTable, others: Collection[int]) -> tuple[list[Holder], list[int]]:
    """The processes on ``devices`` that are not in ``others`` (pids of other running jobs), and the
    devices the table does not cover (their memory is unknown, not free).
    """
    found: list[Holder] = []
    unread: list[int] = []
    for device in devices:
        rows = table.processes.get(device)
        if rows is None:
            unread.append(device)
            continue
        for row in rows:
            pid = row.get("pid")
            pid = pid if isinstance(pid, int) and not isinstance(pid, bool) else None
            if pid is not None and pid in others:
                continue
            found.append(Holder(device, pid, row.get("name"), row.get("memory_mb")))
    return found, unread


def held_words(found: list[Holder], waited_s: float) -> str:
    """``accelerator memory still held by pid 4242 on card 3 after 10 s`` (several: comma-separated)."""
    named = [f"{'pid ' + str(h.pid) if h.pid is not None else 'a process'} on card {h.device}" for h in found]
    listed = ", ".join(named[:NAMED_HOLDERS])
    if len(named) > NAMED_HOLDERS:
        listed += f" and {len(named) - NAMED_HOLDERS} more"
    return f"accelerator memory still held by {listed} after {waited_s:g} s"


def free_words(waited_s: float | None) -> str:
    """``accelerator memory free`` at the first look, ``... free after 1.5 s`` when the table had to clear."""
    if waited_s is None:
        return "accelerator memory free"
    return f"accelerator memory free after {waited_s:.1f} s"


def unconfirmed_words(error: str | None) -> str:
    """The table could not be read for every card of the job before the bound."""
    return f"accelerator memory not confirmed free: {error or 'the process table does not cover its cards'}"
