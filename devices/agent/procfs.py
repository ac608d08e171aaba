"""Process identity and crash-safe state files.

The agent must recognise its jobs again after it restarts. A bare pid is not enough (pids are reused),
so a job is identified by pid *and* the start time the kernel records in ``/proc/<pid>/stat``, plus the
boot id so a reboot never makes an unrelated process look like our job. State files are replaced
atomically so a crash mid-write leaves the previous version, never a half-written one.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")


@dataclass(frozen=True)
class ProcStat:
    """The fields of ``/proc/<pid>/stat`` the agent relies on."""

    state: str
    pgrp: int
    session: int
    start_ticks: int


def read_stat(pid: int) -> ProcStat | None:
    """Read ``/proc/<pid>/stat``; ``None`` when there is no such process (or no procfs)."""
    try:
        raw = (PROC / str(pid) / "stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses; everything after the last ')' is fixed.
    tail = raw[raw.rfind(")") + 2 :].split()
    try:
        return ProcStat(state=tail[0], pgrp=int(tail[2]), session=int(tail[3]), start_ticks=int(tail[19]))
    except (IndexError, ValueError):
        return None


def boot_id() -> str | None:
    """This boot's random id; start times are only comparable within one boot."""
    try:
        return (PROC / "sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        return None


def same_process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether ``pid`` still names the very process we launched and it has not exited.

    Zombies count as exited: after the agent dies, our job's wrapper is reparented and may sit unreaped.
    """
    stat = read_stat(pid)
    if stat is None:
        if PROC.is_dir():
            return False
        try:  # no procfs (not Linux): the best we can do is "some process has this pid"
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    if stat.state in ("Z", "X"):
        return False
    return start_ticks is None or stat.start_ticks == start_ticks


def find_pid_by_argument(needle: str) -> int | None:
    """Find a live process whose command line contains ``needle`` (used to re-find an unrecorded launch)."""
    encoded = needle.encode()
    try:
        entries = list(PROC.iterdir())
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if encoded in cmdline.split(b"\0"):
            stat = read_stat(int(entry.name))
            if stat is not None and stat.state not in ("Z", "X"):
                return int(entry.name)
    return None


MARK_VARIABLE = "NPUPORTAL_JOB_MARK"


def processes_of_job(mark: str | None, session: int | None, since_ticks: int | None) -> dict[int, int]:
    """Every live process of one job: ``{pid: kernel start time}``.

    A process belongs to the job when its environment carries ``NPUPORTAL_JOB_MARK=<mark>`` (set by the
    job's wrapper; a child that calls ``setsid`` or daemonises keeps it) or it is in the job's session
    or process group ``session`` and started no earlier than the job (``since_ticks``). The mark is
    unique per launch, so two agents on one machine with the same job id never take each other's.
    """
    needle = f"{MARK_VARIABLE}={mark}".encode() if mark else None
    found: dict[int, int] = {}
    try:
        entries = [e.name for e in PROC.iterdir() if e.name.isdigit()]
    except OSError:
        return found
    own = os.getpid()
    for name in entries:
        pid = int(name)
        if pid == own:
            continue
        stat = read_stat(pid)
        if stat is None or stat.state in ("Z", "X"):
            continue
        member = session is not None and session in (stat.session, stat.pgrp)
        if member and since_ticks is not None and stat.start_ticks < since_ticks:
            member = False
        if not member and needle is not None:
            try:
                member = needle in (PROC / name / "environ").read_bytes().split(b"\0")
            except OSError:
                member = False
        if member:
            found[pid] = stat.start_ticks
    return found


def signal_verified(pid: int, start_ticks: int, sig: int) -> bool:
    """Signal ``pid`` only if it is still the process that started at ``start_ticks`` (a reused pid is spared).

    A pidfd pins the process between the check and the signal, so there is no window for reuse.
    """
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        stat = read_stat(pid)
        if stat is None or stat.start_ticks != start_ticks:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(pid, sig)
        return True
    except (ProcessLookupError, PermissionError, OSError):
        return False
    finally:
        if fd is not None:
            os.close(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so readers (and a restarted agent) see the old or the new file, never a torn one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    """Read a JSON state file; raises ``OSError``/``ValueError`` for the caller to report."""
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)
