"""A cgroup v2 per job, where the agent may create one: the one way to find *every* process of a job.

A session or process group is left by any child that calls ``setsid`` or daemonises; a cgroup is not
(only root can move a process out, and the job's children inherit it). So when the agent finds a
writable cgroup v2 hierarchy it puts each job in ``<root>/job-<id>-<mark>``; the job's wrapper joins it
before starting the command, stop uses ``cgroup.kill`` (Linux 5.14+) or signals every pid in
``cgroup.procs``, and the group is removed once empty. ``memory.events`` tells an out-of-memory kill.

Without one (no cgroup v2 mounted, read-only inside a container, not delegated), :func:`detect`
answers ``None`` with the reason and the agent falls back to tracking processes (see ``procfs``).
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = Path("/proc/self/mountinfo")
_SIZE_RE = re.compile(r"(\d+)([KMGT]?)(i?B?)?", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """``64G``, ``512M``, ``1073741824`` → bytes (powers of 1024, as cgroup and Slurm sizes); ``ValueError`` else."""
    match = _SIZE_RE.fullmatch(text.strip())
    if not match:
        raise ValueError(f"{text!r} is not a size such as 64G, 512M or a number of bytes")
    value = int(match.group(1)) * 1024 ** "_KMGT".index(match.group(2).upper() or "_")
    if value <= 0:
        raise ValueError("a size must be positive")
    return value


def cgroup2_mount() -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified`` on hybrid hosts)."""
    try:
        lines = MOUNTINFO.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        left, _, right = line.partition(" - ")
        if right.split(" ", 1)[0] == "cgroup2":
            return Path(left.split()[4])
    return None


def own_cgroup() -> str | None:
    """This process's cgroup v2 path (``0::/path`` in ``/proc/self/cgroup``)."""
    try:
        for line in Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines():
            if line.startswith("0::"):
                return line[3:]
    except OSError:
        pass
    return None


@dataclass
class CgroupRoot:
    """The directory job cgroups are made in, and which limits it can apply."""

    path: Path
    controllers: frozenset[str]
    has_kill: bool

    def job_path(self, name: str) -> Path:
        return self.path / name

    def create(self, name: str, memory_max: int | None, cpu_max: float | None) -> tuple[Path, list[str]]:
        """Make the job's cgroup with its limits; returns it and warnings for limits that could not be set."""
        path = self.job_path(name)
        path.mkdir(exist_ok=True)
        warnings = []
        if memory_max is not None:
            warnings += _write_limit(path / "memory.max", str(memory_max), "memory", self.controllers)
        if cpu_max is not None:
            period = 100000
            warnings += _write_limit(path / "cpu.max", f"{int(cpu_max * period)} {period}", "cpu", self.controllers)
        return path, warnings


def _write_limit(file: Path, value: str, controller: str, controllers: frozenset[str]) -> list[str]:
    if controller not in controllers:
        return [f"the {controller} controller is not enabled for job cgroups; {file.name} not set"]
    try:
        file.write_text(value, encoding="ascii")
    except OSError as exc:
        return [f"cannot set {file.name}: {exc.strerror or exc}"]
    return []


def detect(configured: Path | None = None) -> tuple[CgroupRoot | None, str]:
    """Find (and make) the root of job cgroups; ``(None, why not)`` when there is none to use.

    ``configured`` is ``--cgroup-root``: a directory in the cgroup v2 hierarchy delegated to the agent.
    Otherwise ``npuportal-jobs`` next to the agent's own cgroup (under it when the agent is in the root
    cgroup). The memory and cpu controllers are enabled for it where the parent allows (a parent holding
    processes cannot pass controllers on: then limits are no-ops, with a warning).
    """
    mount = cgroup2_mount()
    if mount is None:
        return None, "no cgroup v2 hierarchy is mounted"
    if configured is not None:
        root = configured
        if mount not in root.parents and root != mount:
            return None, f"--cgroup-root {root} is not inside the cgroup v2 hierarchy at {mount}"
    else:
        own = own_cgroup()
        if own is None:
            return None, "this process has no cgroup v2 path"
        root = mount / own.lstrip("/") / "npuportal-jobs"
    try:
        root.mkdir(exist_ok=True)
        probe = root / "probe"
        probe.mkdir(exist_ok=True)
        probe.rmdir()
    except OSError as exc:
        return None, f"cannot create cgroups in {root}: {exc.strerror or exc}"
    try:
        available = set((root.parent / "cgroup.controllers").read_text(encoding="ascii").split())
        enabled = set((root.parent / "cgroup.subtree_control").read_text(encoding="ascii").split())
        for controller in ("memory", "cpu"):
            if controller in available and controller not in enabled:
                try:
                    (root.parent / "cgroup.subtree_control").write_text(f"+{controller}", encoding="ascii")
                except OSError:
                    continue
        (root / "cgroup.subtree_control").write_text(
            " ".join(f"+{c}" for c in ("memory", "cpu") if c in _controllers(root)), encoding="ascii"
        )
    except OSError:
        pass
    has_kill = _has_kill(root)
    sweep_empty(root)
    return CgroupRoot(root, frozenset(_subtree(root)), has_kill), f"cgroup v2 at {root}"


def _controllers(path: Path) -> set[str]:
    try:
        return set((path / "cgroup.controllers").read_text(encoding="ascii").split())
    except OSError:
        return set()


def _subtree(path: Path) -> set[str]:
    try:
        return set((path / "cgroup.subtree_control").read_text(encoding="ascii").split())
    except OSError:
        return set()


def _has_kill(root: Path) -> bool:
    probe = root / "probe"
    try:
        probe.mkdir(exist_ok=True)
        return (probe / "cgroup.kill").exists()
    except OSError:
        return False
    finally:
        try:
            probe.rmdir()
        except OSError:
            pass


#: An empty job cgroup this old is left over (its agent was killed before it removed it) and is removed.
STALE_EMPTY_S = 600.0


def sweep_empty(root: Path, older_than_s: float = STALE_EMPTY_S) -> int:
    """Remove empty ``job-*`` cgroups older than ``older_than_s`` (other agents may share the root: a
    group just made for a launch is younger, and one holding processes cannot be removed); returns how many.
    """
    removed = 0
    now = time.time()
    try:
        entries = list(root.glob("job-*"))
    except OSError:
        return 0
    for entry in entries:
        try:
            if now - entry.stat().st_mtime < older_than_s or procs(entry):
                continue
        except OSError:
            continue
        removed += remove(entry)
    return removed


def procs(path: Path) -> list[int]:
    """Pids in the cgroup (none when it is gone)."""
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text(encoding="ascii").split()]
    except (OSError, ValueError):
        return []


def kill(path: Path) -> bool:
    """SIGKILL every process of the cgroup at once (``cgroup.kill``); ``False`` when the kernel lacks it."""
    try:
        (path / "cgroup.kill").write_text("1", encoding="ascii")
    except OSError:
        return False
    return True


def oom_kills(path: Path) -> int:
    """How many processes of the cgroup the kernel killed for memory (``memory.events`` ``oom_kill``)."""
    try:
        for line in (path / "memory.events").read_text(encoding="ascii").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def remove(path: Path) -> bool:
    """Remove an empty job cgroup; ``False`` while processes are left (or it cannot be removed)."""
    try:
        os.rmdir(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True
