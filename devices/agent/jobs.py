"""Jobs on this node: launch, watch, stop, and survive the agent's own restarts.

The portal may lose the agent at any moment (upgrade, OOM, node hiccup) while jobs hold accelerators for
days, so the agent is built to be disposable:

* every job runs in its own session under a small wrapper (``runner.py``) that records the exit status
  in ``<state>/jobs/<id>.exit``, so the status survives the agent;
* every state change is written to ``<state>/jobs/<id>.json`` atomically before it is acted on;
* a restarted agent re-adopts running jobs (same pid *and* same kernel start time), reports jobs that
  ended while it was away with their real exit status, and calls ``lost`` only what it truly cannot know.

One monitor thread does all waiting, time-limit and kill-escalation work, so HTTP calls never block on a
process.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, BinaryIO

from devices.agent import cgroups, device_memory, procfs
from devices.agent.accounts import ACCOUNT_NAME_RE, JOB_UMASK, NO_HOME_CWD, Account, check_paths
from devices.agent.backends import Backend, DeviceUse, ProcessTable
from devices.agent.environment import JobSetup, build_job_env, check_submitted_env, identity_env
from devices.agent.errors import ApiError
from devices.agent.exit_words import exit_words
from devices.agent.output_budget import CHECK_INTERVAL_S as OUTPUT_CHECK_INTERVAL_S
from devices.agent.output_budget import OutputLedger, RunningOutput
from devices.agent.rendezvous import RendezvousService, parse_rendezvous

RUNNING_STATES = frozenset({"running", "stopping"})
FINAL_STATES = frozenset({"succeeded", "failed", "killed", "lost"})
OUTPUT_TAIL_LINES = 50
MAX_DURATION_LIMIT_S = 366 * 24 * 3600.0
MAX_GRACE_S = 3600.0
RUNNER_PATH = Path(__file__).with_name("runner.py")
#: The wrapper's own environment (it may run as root): fixed, nothing of the job's or the agent's.
RUNNER_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _longest_argument() -> int:
    """Bytes of the longest single argument this kernel passes to a program (Linux: 32 pages, less the NUL).

    A command is one argument of the job's wrapper and of ``sh -c``: a longer one can never start.
    """
    try:
        return 32 * os.sysconf("SC_PAGESIZE") - 1
    except (AttributeError, OSError, ValueError):
        return 32 * 4096 - 1


#: Longest command the agent takes (131,071 bytes with 4 KiB pages); longer is refused with 413, for good.
MAX_COMMAND_BYTES = _longest_argument()
_JOB_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
#: Longest ``cwd``/``output`` path the agent takes (the portal's limit is the same).
MAX_PATH_CHARS = 1024
_TAIL_BYTES = 64 * 1024
#: Default cap of one job attempt's log file (``--max-log-bytes``); output beyond it is dropped, with a line saying so.
DEFAULT_MAX_LOG_BYTES = 64 * 1024 * 1024
#: At most this much log text in one answer of ``GET /v1/jobs/<id>/log`` (the caller asks again from ``next_offset``).
LOG_CHUNK_BYTES = 256 * 1024
#: ``?tail=N`` answers at most this many lines.
MAX_TAIL_LINES = 10000
_MONITOR_INTERVAL_S = 0.1
#: Processes still there this long after SIGKILL (stuck in the kernel, "D" state) no longer hold the job:
#: it is reported ended, with the count in its reason, as Slurm's UnkillableStepTimeout does.
UNKILLABLE_AFTER_S = 60.0


def utc_iso(ts: float | None) -> str | None:
    """Timestamps go out as ISO 8601 in UTC: the portal compares them across nodes and timezones."""
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds")


# --------------------------------------------------------------------------------------------------
# request validation


@dataclass(frozen=True)
class JobRequest:
    """A validated ``POST /v1/jobs`` body."""

    job_id: str
    job_id_raw: str | int
    command: str
    env: dict[str, str]
    devices: list[int]
    vnpu: dict[str, Any] | None
    max_duration_s: float | None
    cwd: str | None
    user: str | None = None
    team: str | None = None
    output: str | None = None
    #: Which job of the portal, and which copy of an array, it is, as variables (``identity_env``).
    identity: dict[str, str] = field(default_factory=dict)


def _optional_text(payload: Mapping[str, Any], name: str, limit: int) -> str | None:
    value = payload.get(name)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isprintable() or len(value) > limit:
        raise ApiError(400, f"{name} must be printable text of at most {limit} characters", name)
    return value


def _absolute_path(payload: Mapping[str, Any], name: str) -> str | None:
    value = _optional_text(payload, name, MAX_PATH_CHARS)
    if value is not None and not os.path.isabs(value):
        raise ApiError(400, f"{name} must be an absolute path", name)
    return value


def parse_job_id(value: Any) -> tuple[str, str | int]:
    """Job ids name files in the state dir, so they are held to a safe alphabet."""
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ApiError(400, "job_id must be a string or an integer", "job_id")
    text = str(value)
    if not _JOB_ID_RE.fullmatch(text):
        raise ApiError(
            400, "job_id must be 1-128 characters of letters, digits, '.', '_' or '-', starting alphanumeric", "job_id"
        )
    return text, value


def _index_list(value: Any, field_name: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        raise ApiError(400, f"{field_name} must be a list of integer device indices", field_name)
    if len(set(value)) != len(value):
        raise ApiError(400, f"{field_name} lists a device twice", field_name)
    return list(value)


def parse_job_request(payload: Any, known: set[int] | None) -> JobRequest:
    """Check every field of a job request; the first problem found is raised naming its field.

    ``known`` is the set of device indices on this node (``None``: the backend cannot list them now,
    which is itself reason to refuse a launch).
    """
    if not isinstance(payload, dict):
        raise ApiError(400, "body must be a JSON object", "body")
    if "job_id" not in payload:
        raise ApiError(400, "job_id is required", "job_id")
    job_id, raw_id = parse_job_id(payload["job_id"])
    command = payload.get("command")
    if command is None:
        raise ApiError(400, "command is required", "command")
    if not isinstance(command, str) or not command.strip():
        raise ApiError(400, "command must be a non-empty string", "command")
    if "\0" in command:
        raise ApiError(400, "command must not contain NUL bytes", "command")
    try:
        size = len(command.encode("utf-8", "surrogateescape"))  # what the kernel is given
    except UnicodeEncodeError:
        raise ApiError(400, "command must be valid text", "command") from None
    if size > MAX_COMMAND_BYTES:
        raise ApiError(
            413, f"command is {size} bytes; a program takes at most {MAX_COMMAND_BYTES} in one argument", "command"
        )
    try:
        env = check_submitted_env(payload.get("env"))
    except ValueError as exc:
        raise ApiError(400, f"env {exc}", "env") from None
    vnpu = payload.get("vnpu")
    if vnpu is not None:
        if not isinstance(vnpu, dict):
            raise ApiError(400, "vnpu must be an object {template, device}", "vnpu")
        template = vnpu.get("template")
        if not isinstance(template, str) or not re.fullmatch(r"[A-Za-z0-9_]{1,64}", template):
            raise ApiError(400, "vnpu.template must be a template name such as vir05_1c_8g", "vnpu.template")
        vdev = vnpu.get("device")
        if isinstance(vdev, bool) or not isinstance(vdev, int):
            raise ApiError(400, "vnpu.device must be an integer device index", "vnpu.device")
        vnpu = {"template": template, "device": vdev}
    if "devices" in payload:
        devices = _index_list(payload["devices"], "devices")
    elif vnpu is not None:
        devices = [vnpu["device"]]
    else:
        raise ApiError(400, "devices is required (a list of device indices)", "devices")
    if vnpu is not None and devices != [vnpu["device"]]:
        raise ApiError(400, "a vNPU job runs on exactly its vnpu.device; devices must be [vnpu.device]", "devices")
    if not devices:
        raise ApiError(400, "devices must name at least one device", "devices")
    if known is None:
        raise ApiError(400, "the agent cannot list this node's devices right now; see GET /v1/devices", "devices")
    unknown = [d for d in devices if d not in known]
    if unknown:
        listing = ", ".join(str(k) for k in sorted(known)) or "none"
        raise ApiError(400, f"unknown device index {unknown[0]} (this node has: {listing})", "devices")
    limit = payload.get("max_duration_s")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int | float) or not math.isfinite(limit):
            raise ApiError(400, "max_duration_s must be a number of seconds", "max_duration_s")
        if not 0 < limit <= MAX_DURATION_LIMIT_S:
            raise ApiError(400, f"max_duration_s must be > 0 and <= {MAX_DURATION_LIMIT_S:g}", "max_duration_s")
        limit = float(limit)
    cwd = _absolute_path(payload, "cwd")  # whether it exists is checked as the job's account (check_paths)
    user = _optional_text(payload, "user", 64)
    if user is not None and not ACCOUNT_NAME_RE.fullmatch(user):
        raise ApiError(400, f"user {user!r} is not a POSIX account name", "user")
    team = _optional_text(payload, "team", 200)
    output = _absolute_path(payload, "output")
    try:
        identity = identity_env(payload.get("portal_job"))
    except ValueError as exc:
        raise ApiError(400, f"portal_job {exc}", "portal_job") from None
    return JobRequest(job_id, raw_id, command, env, devices, vnpu, limit, cwd, user, team, output, identity)


def parse_grace(value: str | None, default: float) -> float:
    """``?grace=`` on DELETE: seconds between SIGTERM and SIGKILL."""
    if value is None:
        return default
    try:
        grace = float(value)
    except ValueError:
        raise ApiError(400, "grace must be a number of seconds", "grace") from None
    if not math.isfinite(grace) or not 0 <= grace <= MAX_GRACE_S:
        raise ApiError(400, f"grace must be between 0 and {MAX_GRACE_S:g} seconds", "grace")
    return grace


#: Longest ``?wait=`` a DELETE may give: the answer waits at most this long for the job to end.
MAX_STOP_WAIT_S = 120.0


def parse_wait(value: str | None) -> float:
    """``?wait=`` on DELETE: seconds to hold the answer until the job has ended (default 0: answer now).

    A caller about to start another job on the same devices asks for the stop to be confirmed:
    the devices are free once the answer's state is no longer ``running`` or ``stopping``.
    """
    if value is None:
        return 0.0
    try:
        wait = float(value)
    except ValueError:
        raise ApiError(400, "wait must be a number of seconds", "wait") from None
    if not math.isfinite(wait) or not 0 <= wait <= MAX_STOP_WAIT_S:
        raise ApiError(400, f"wait must be between 0 and {MAX_STOP_WAIT_S:g} seconds", "wait")
    return wait


#: Longest ``?reason=`` a DELETE may give (it is kept in the job record and shown as is).
MAX_STOP_REASON = 200


def parse_stop_reason(value: str | None) -> str:
    """``?reason=`` on DELETE: why the job is stopped, in the caller's words (default ``cancelled``).

    The portal says why (``Preempted``, ``walltime``, ``the part on <server> failed (...)`` ...), so the agent's own
    record of a killed job tells an operator on the node what happened, not always "cancelled".
    """
    if value is None:
        return "cancelled"
    text = value.strip()
    if not text:
        raise ApiError(400, "reason must not be empty", "reason")
    if len(text) > MAX_STOP_REASON:
        raise ApiError(400, f"reason must be at most {MAX_STOP_REASON} characters", "reason")
    if not text.isprintable():
        raise ApiError(400, "reason must be printable text on one line", "reason")
    return text


# --------------------------------------------------------------------------------------------------
# job records


@dataclass
class Job:
    """Everything persisted about one job (``<state>/jobs/<id>.json``)."""

    job_id: str
    job_id_raw: str | int
    command: str
    devices: list[int]
    state: str
    started_ts: float
    vnpu: dict[str, Any] | None = None
    max_duration_s: float | None = None
    cwd: str | None = None
    env_keys: list[str] = field(default_factory=list)  # values are not stored: they may hold secrets
    user: str | None = None  # the POSIX account it runs as
    team: str | None = None
    output: str | None = None
    exit_code: int | None = None
    reason: str | None = None
    ended_ts: float | None = None
    pid: int | None = None
    proc_start: int | None = None
    boot_id: str | None = None
    stop_reason: str | None = None
    stop_requested_ts: float | None = None
    stop_deadline_ts: float | None = None
    sigkill_sent: bool = False
    mark: str | None = None  # NPUPORTAL_JOB_MARK of this launch (unique: job id plus a random part)
    cgroup: str | None = None  # the job's cgroup v2 directory, when the agent made one
    runner_status: int | None = None  # the wrapper has ended with this status; leftovers are being killed
    runner_ended_ts: float | None = None
    leftovers_since_ts: float | None = None
    oom_kills: int = 0
    exit_reason: str | None = None
    memory_check_since_ts: float | None = None  # its processes are gone; its cards' memory is awaited since
    accelerator_memory: str | None = None  # what the process table said when it was reported ended
    #: ``"system"``: the agent stopped it for a reason of its own, not the job's nor the portal's (its
    #: shutdown with ``--stop-jobs-on-exit``); the portal requeues such a run instead of failing it.
    cause: str | None = None
    output_bytes: int | None = None  # size of its log when it ended
    output_stopped: str | None = None  # why its output stopped being kept while it ran (the output budget)
    output_removed: str | None = None  # when and why its log was removed (the output budget)
    output_removed_ts: float | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def view(self) -> dict[str, Any]:
        """The API shape of this job (without ``output_tail``, which costs a file read)."""
        return {
            "job_id": self.job_id_raw,
            "state": self.state,
            "exit_code": self.exit_code,
            "started_at": utc_iso(self.started_ts),
            "ended_at": utc_iso(self.ended_ts),
            "devices": self.devices,
            "reason": self.reason,
            "command": self.command,
            "vnpu": self.vnpu,
            "max_duration_s": self.max_duration_s,
            "pid": self.pid,
            "user": self.user,
            "cwd": self.cwd,
            "output": self.output,
            "exit_reason": self.exit_reason,
            "cgroup": self.cgroup is not None,
            "accelerator_memory": self.accelerator_memory,
            "cause": self.cause,
            "output_stopped": self.output_stopped,
            "output_removed": self.output_removed,
        }


def read_tail(path: Path, lines: int = OUTPUT_TAIL_LINES) -> list[str]:
    """Last ``lines`` lines of a job log, reading only its end (logs of long jobs get large)."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            data = fh.read()
    except OSError:
        return []
    text = data.decode("utf-8", errors="replace")
    out = text.splitlines()
    if size > _TAIL_BYTES and out:
        out = out[1:]  # first line is probably cut
    return out[-lines:]


def _utf8_boundary(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    end = len(data)
    for back in range(1, min(4, end) + 1):
        byte = data[end - back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for the lead byte
        if byte & 0x80 == 0:
            return end  # ASCII: nothing is cut
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
        return end if back >= need else end - back
    return end


def log_lines(data: bytes) -> list[bytes]:
    """``data`` cut after each ``\n``, each piece keeping it: lines as a terminal counts them.

    Not ``bytes.splitlines``, which also cuts at a ``\r``: a progress bar redrawn a hundred times
    with ``\r`` is one line of a log, not a hundred.
    """
    pieces = data.split(b"\n")
    lines = [piece + b"\n" for piece in pieces[:-1]]
    return [*lines, pieces[-1]] if pieces[-1] else lines


def count_lines(fh: BinaryIO, end: int) -> int:
    """Newlines in the first ``end`` bytes of ``fh``, read in blocks (a 64 MiB log takes a few tens of ms)."""
    fh.seek(0)
    count, left = 0, end
    while left > 0:
        block = fh.read(min(1 << 20, left))
        if not block:
            break
        count += block.count(b"\n")
        left -= len(block)
    return count


def read_log(path: Path, *, offset: int | None = None, tail: int | None = None) -> dict[str, Any]:
    """A byte range of a job log: ``offset`` onwards (at most :data:`LOG_CHUNK_BYTES`), or its last ``tail`` lines.

    ``offset``/``next_offset`` are byte offsets in the file, so a follower asks again from
    ``next_offset`` and never sees a line twice; a chunk never ends inside a UTF-8 character.
    A log that does not exist (the command has not written yet) reads as empty. A ``tail`` answer
    also says how many ``lines`` the whole log has (a last line without its newline counts), so a
    reader can say "the last 500 of 50,001 lines".
    """
    extra: dict[str, Any] = {}
    try:
        with path.open("rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if tail is not None:
                start = max(0, size - _TAIL_BYTES * 4)
                fh.seek(start)
                data = fh.read(size - start)
                lines = log_lines(data)
                if start > 0 and lines:
                    lines = lines[1:]  # the first line is probably cut
                kept = lines[-tail:] if tail > 0 else []
                chunk = b"".join(kept)
                begin = size - len(chunk)
                newlines = count_lines(fh, start) + data.count(b"\n")
                extra["lines"] = newlines + (1 if data and not data.endswith(b"\n") else 0)
            else:
                begin = min(offset or 0, size)
                fh.seek(begin)
                chunk = fh.read(min(LOG_CHUNK_BYTES, size - begin))
                if begin + len(chunk) < size:
                    chunk = chunk[: _utf8_boundary(chunk)]
    except FileNotFoundError:
        size, begin, chunk = 0, 0, b""
        if tail is not None:
            extra["lines"] = 0
    return {
        "offset": begin,
        "next_offset": begin + len(chunk),
        "size": size,
        "data": chunk.decode("utf-8", errors="replace"),
        **extra,
    }


def exit_reason(job: Job) -> str:
    """Why the job ended, in words: ``exit code 3``, ``killed by signal SIGKILL``, ``out of memory``,
    ``time limit reached``, ``preempted``, ``cancelled``, ``node lost``.
    """
    code = job.exit_code
    if job.oom_kills:
        return f"out of memory ({job.oom_kills} process(es) killed by the kernel's OOM killer)"
    why = (job.stop_reason or "").lower()
    if job.stop_reason is not None:
        if "walltime" in why:
            return "time limit reached"
        if "preempt" in why:
            return "preempted"
        if "cancel" in why:
            return "cancelled"
        return f"stopped ({job.stop_reason})"
    if code is None:
        return f"node lost ({exit_words(None)})"
    return exit_words(code)


# --------------------------------------------------------------------------------------------------
# the manager


class JobManager:
    """Owns all jobs of this node; thread-safe; one background monitor thread."""

    def __init__(
        self,
        state_dir: Path,
        backend: Backend,
        *,
        default_grace_s: float = 10.0,
        keep_finished_s: float | None = 14 * 24 * 3600.0,
        max_log_bytes: int = DEFAULT_MAX_LOG_BYTES,
        setup: JobSetup | None = None,
        cgroup_root: cgroups.CgroupRoot | None = None,
        job_memory_max: int | None = None,
        job_cpu_max: float | None = None,
        memory_release_wait_s: float = device_memory.DEFAULT_RELEASE_WAIT_S,
        output: OutputLedger | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)  # logs may hold secrets
        self.setup = setup or JobSetup.default()
        if self.setup.accounts.switch:
            # Each log is its owner's alone (0600, chowned to a submitter's account; root's under
            # --jobs-as, whose jobs all share one account); the directories above it only let an
            # account reach a file it knows the name of (its log, its rank table), never list them.
            for directory in (state_dir, self.jobs_dir):
                directory.chmod(0o711)
        self.backend = backend
        self.default_grace_s = default_grace_s
        self.keep_finished_s = keep_finished_s
        self.max_log_bytes = max_log_bytes
        self._jobs: dict[str, Job] = {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._boot_id = procfs.boot_id()
        self._last_prune = 0.0
        self.warnings: list[str] = []
        self.cgroup_root = cgroup_root
        self.job_memory_max = job_memory_max
        self.job_cpu_max = job_cpu_max
        self.memory_release_wait_s = memory_release_wait_s
        self._memory_check: threading.Thread | None = None
        self._next_memory_check = 0.0  # time.monotonic() of the next reading of the process table
        self._memory_waited: set[str] = set()  # jobs whose cards were still held at a reading
        if cgroup_root is None and (job_memory_max is not None or job_cpu_max is not None):
            self.warnings.append("no job cgroups on this node: --job-memory-max and --job-cpu-max have no effect")
        self.rendezvous = RendezvousService(state_dir, backend, self._running_ids)
        self.output = output or OutputLedger()  # the node's output budget (output_budget.py)
        self._next_output_check = 0.0

    def _running_ids(self) -> set[str]:
        with self._lock:
            return {j.job_id for j in self._jobs.values() if j.state in RUNNING_STATES}

    # -- files ------------------------------------------------------------------------------------
    def record_path(self, job_id: str) -> Path:
        return self.jobs_dir / f"{job_id}.json"

    def log_path(self, job_id: str) -> Path:
        return self.jobs_dir / f"{job_id}.log"

    def exit_path(self, job_id: str) -> Path:
        return self.jobs_dir / f"{job_id}.exit"

    def stop_output_path(self, job_id: str) -> Path:
        """Written (with the reason) when the job's output must stop; its wrapper looks for it."""
        return self.jobs_dir / f"{job_id}.stop-output"

    def env_path(self, job_id: str) -> Path:
        """The job's environment, handed to its wrapper, which reads and removes it at once."""
        return self.jobs_dir / f"{job_id}.env"

    def _save(self, job: Job) -> None:
        procfs.write_json_atomic(self.record_path(job.job_id), asdict(job))

    def _read_exit(self, job_id: str) -> tuple[int | None, float | None]:
        """Exit status the wrapper recorded, and when (the file's mtime is the job's end time)."""
        path = self.exit_path(job_id)
        try:
            text = path.read_text(encoding="ascii").strip()
            mtime = path.stat().st_mtime
        except OSError:
            return None, None
        try:
            return int(text), mtime
        except ValueError:
            return None, None

    # -- startup ----------------------------------------------------------------------------------
    def load(self) -> None:
        """Read persisted jobs and reconcile the ones that were running when the last agent stopped."""
        for stale in self.jobs_dir.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        for path in sorted(self.jobs_dir.glob("*.json")):
            try:
                job = Job.from_json(procfs.read_json(path))
            except (OSError, ValueError, TypeError) as exc:
                self.warnings.append(f"ignoring unreadable job record {path.name}: {exc}")
                continue
            self._jobs[job.job_id] = job
            if job.state in RUNNING_STATES:
                self._adopt(job)
        self._count_ended_output()

    def _adopt(self, job: Job) -> None:
        """Decide, for a job left running by an earlier agent, whether it still runs, ended, or is lost."""
        if job.pid is None:
            # The earlier agent died between launching and recording the pid: find the wrapper by its argv.
            job.pid = procfs.find_pid_by_argument(str(self.exit_path(job.job_id)))
            stat = procfs.read_stat(job.pid) if job.pid else None
            job.proc_start = stat.start_ticks if stat else None
            job.boot_id = self._boot_id
        same_boot = job.boot_id is not None and job.boot_id == self._boot_id
        if job.pid is not None and same_boot and procfs.same_process_alive(job.pid, job.proc_start):
            self._save(job)
            return  # the monitor thread keeps watching it through /proc
        code, ended = self._read_exit(job.job_id)
        if same_boot:
            self._wrapper_ended(job, code, ended)
            finished, code, ended = self._leftovers_gone(job)
            if not finished or self._await_memory(job):
                return  # the monitor kills what the job left behind (and awaits its memory), then reports it ended
        self._finalize(job, code, ended)

    # -- public API -------------------------------------------------------------------------------
    def submit(self, payload: Any) -> tuple[int, dict[str, Any]]:
        """Launch a job; ``(201, record)`` when started, ``(200, record)`` when the id already exists."""
        if isinstance(payload, dict) and "job_id" in payload:
            job_id, _ = parse_job_id(payload["job_id"])
            with self._lock:
                if job_id in self._jobs:
                    return 200, self.describe(job_id)
        known = self.backend.known_indices()  # may run the vendor tool: keep it outside the lock
        request = parse_job_request(payload, known)
        account, cwd = self._account_and_cwd(request)  # refused here, before anything is recorded or run
        rendezvous = None
        if payload.get("rendezvous") is not None:  # a part of a multi-node job
            rendezvous = parse_rendezvous(payload["rendezvous"], request.devices, request.env)
        with self._lock:
            if request.job_id in self._jobs:  # a concurrent POST of the same id won the race
                return 200, self.describe(request.job_id)
            usage = self.device_usage()
            for index in request.devices:
                reason = self.backend.unusable_reason(index)
                if reason:
                    raise ApiError(409, reason, "devices")
                holders = usage.get(index, ())
                if holders and (request.vnpu is None or any(u.vnpu is None for u in holders)):
                    raise ApiError(409, f"device {index} is in use by job {holders[0].job_id}", "devices")
            plan = self.backend.plan_launch(request.devices, request.vnpu, usage)
            env = dict(plan.env)
            if rendezvous is not None:
                env.update(self.rendezvous.prepare(request.job_id, rendezvous, owner=account))
            job = self._launch(request, env, plan.vnpu, account, cwd)
            return 201, self.describe(job.job_id)

    def _account_and_cwd(self, request: JobRequest) -> tuple[Account, str]:
        """The job's account and starting directory; ``ApiError`` naming ``user``, ``cwd`` or ``output``."""
        account = self.setup.accounts.account_for(request.user)
        # Without a home: the state dir for an agent running jobs as itself, never for another account.
        fallback = NO_HOME_CWD if self.setup.accounts.switch else str(self.state_dir)
        cwd = check_paths(account, request.cwd, request.output, fallback, self.setup.accounts.node)
        return account, cwd

    def describe(self, job_id: str, *, with_output: bool = True) -> dict[str, Any]:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None:
                raise ApiError(404, f"no job {job_id} on this node")
            view = job.view()
        if with_output:
            view["output_tail"] = read_tail(self.log_path(job_id))
        return view

    def get(self, raw_id: str) -> dict[str, Any]:
        if not _JOB_ID_RE.fullmatch(raw_id):
            raise ApiError(404, f"no job {raw_id!r} on this node")
        return self.describe(raw_id)

    def log(self, raw_id: str, *, offset: int | None = None, tail: int | None = None) -> dict[str, Any]:
        """A range of the job's output (see :func:`read_log`), and whether it is all there is (``complete``)."""
        if not _JOB_ID_RE.fullmatch(raw_id):
            raise ApiError(404, f"no job {raw_id!r} on this node")
        with self._lock:
            job = self._jobs.get(raw_id)
            if job is None:
                raise ApiError(404, f"no job {raw_id} on this node")
            ended = job.state not in RUNNING_STATES
        answer = read_log(self.log_path(raw_id), offset=offset, tail=tail)
        answer["job_id"] = job.job_id_raw
        answer["state"] = job.state
        # Read after the state: a job that had ended before its log was read has nothing more to write.
        answer["complete"] = ended and answer["next_offset"] >= answer["size"]
        if job.output_removed is not None:  # not a bare "nothing": when and why it went
            size = job.output_bytes or 0
            at = size if tail is not None else min(offset or 0, size)
            answer.update(offset=at, next_offset=at, size=size, complete=True, data="")
            answer["removed_at"] = utc_iso(job.output_removed_ts)
            answer["note"] = job.output_removed
        return answer

    def list_jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            ids = sorted(self._jobs, key=lambda j: self._jobs[j].started_ts)
        return [self.describe(j, with_output=False) for j in ids]

    def running_count(self) -> int:
        with self._lock:
            return sum(1 for j in self._jobs.values() if j.state in RUNNING_STATES)

    def device_usage(self) -> dict[int, list[DeviceUse]]:
        """Which running job holds which device (stopping jobs still hold theirs)."""
        usage: dict[int, list[DeviceUse]] = {}
        with self._lock:
            for job in self._jobs.values():
                if job.state in RUNNING_STATES:
                    for index in job.devices:
                        usage.setdefault(index, []).append(DeviceUse(job.job_id, job.pid, job.command, job.vnpu))
        return usage

    def stop(
        self, raw_id: str, grace_s: float | None = None, reason: str = "cancelled", wait_s: float = 0.0
    ) -> dict[str, Any]:
        """SIGTERM the job's process group now, SIGKILL after ``grace_s``; idempotent.

        ``reason`` is recorded with the first stop request (a later one may only shorten the grace).
        ``wait_s`` > 0 answers only once the job has ended (every process of it is gone and, where the
        tool lists them, no process holds its cards' memory) or ``wait_s`` has passed, so a caller can
        confirm the stop before it sends another job to those devices.
        """
        if not _JOB_ID_RE.fullmatch(raw_id):
            raise ApiError(404, f"no job {raw_id!r} on this node")
        grace = self.default_grace_s if grace_s is None else grace_s
        with self._lock:
            job = self._jobs.get(raw_id)
            if job is None:
                raise ApiError(404, f"no job {raw_id} on this node")
            if job.state in RUNNING_STATES:
                self._request_stop(job, grace, reason)
        self._wake.set()
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            with self._lock:
                if job.state not in RUNNING_STATES:
                    break
            self._wake.set()  # the monitor reaps it (and sends SIGKILL at the grace deadline)
            time.sleep(min(_MONITOR_INTERVAL_S / 2, max(0.0, deadline - time.monotonic())))
        return self.describe(raw_id)

    # -- launching --------------------------------------------------------------------------------
    def _launch(
        self,
        request: JobRequest,
        plan_env: Mapping[str, str],
        vnpu: dict[str, Any] | None,
        account: Account,
        cwd: str,
    ) -> Job:
        job_id = request.job_id
        exit_file = self.exit_path(job_id)
        exit_file.unlink(missing_ok=True)  # from a pruned job of the same id; must not be read as ours
        self.stop_output_path(job_id).unlink(missing_ok=True)
        now = time.time()
        job = Job(
            job_id=job_id,
            job_id_raw=request.job_id_raw,
            command=request.command,
            devices=request.devices,
            state="running",
            started_ts=now,
            vnpu=vnpu,
            max_duration_s=request.max_duration_s,
            cwd=cwd,
            env_keys=sorted(request.env),
            user=account.name,
            team=request.team,
            output=request.output,
            boot_id=self._boot_id,
            mark=f"{job_id}.{uuid.uuid4().hex[:16]}",
        )
        self._make_cgroup(job)
        self._jobs[job_id] = job
        self._save(job)  # on disk before the process exists: a crash now leaves a record to reconcile
        env = build_job_env(  # built from nothing: not one variable of the agent's own reaches the job
            job_id=job_id,
            team=request.team,
            home=account.home,
            user=account.name,
            shell=account.shell,
            submitted=request.env,
            plan_env=plan_env,
            site_env=self.setup.site_env,
            job_path=self.setup.job_path,
            identity=request.identity,
        )
        argv = [sys.executable, "-I", "-S", str(RUNNER_PATH), "--exit-file", str(exit_file)]
        argv += ["--max-output-bytes", str(self.max_log_bytes), "--umask", f"{JOB_UMASK:03o}"]
        argv += ["--stop-output-file", str(self.stop_output_path(job_id))]
        switch = account.uid != os.geteuid()
        if switch:  # the wrapper stays root (its exit file is out of the job's reach); the command does not
            argv += ["--uid", str(account.uid), "--gid", str(account.gid)]
            argv += ["--groups", ",".join(str(g) for g in account.groups)]
        if request.output is not None:
            argv += ["--output", request.output]
        if self.setup.wrapper:
            argv += ["--wrapper", self.setup.wrapper]
        # The job's environment goes to the wrapper in a file only root (or the agent) reads, not in
        # its own environment: a submitter's LD_LIBRARY_PATH must not reach a process running as root,
        # and argv is readable by every account on the node.
        env_file = self.env_path(job_id)
        procfs.write_json_atomic(env_file, env)
        argv += ["--env-file", str(env_file), "--mark", job.mark or job_id]
        argv += ["--cgroup", job.cgroup] if job.cgroup else []
        argv.append(request.command)
        try:
            log_fd = os.open(self.log_path(job_id), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            with os.fdopen(log_fd, "ab") as log:  # job output may hold secrets: its account's only
                if switch and self.setup.accounts.per_submitter:  # one account for all (--jobs-as): root's
                    os.fchown(log_fd, account.uid, account.gid)
                child = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=RUNNER_ENV,
                    cwd=cwd,
                    start_new_session=True,  # own session: survives the agent; also one way to find its processes
                )
        except OSError as exc:
            if job.cgroup:
                cgroups.remove(Path(job.cgroup))
            job.state, job.reason, job.ended_ts = "failed", f"could not start: {exc}", time.time()
            self._save(job)
            return job
        job.pid = child.pid
        stat = procfs.read_stat(child.pid)
        job.proc_start = stat.start_ticks if stat else None
        self._children[job_id] = child
        self._save(job)
        self._wake.set()
        return job

    # -- stopping ---------------------------------------------------------------------------------
    def _request_stop(self, job: Job, grace: float, reason: str, cause: str | None = None) -> None:
        if job.memory_check_since_ts is not None:
            return  # nothing of it is left to stop: it ended, and only its cards' memory is awaited
        now = time.time()
        if job.stop_requested_ts is None:
            job.stop_requested_ts = now
            job.stop_reason = reason
            job.cause = cause  # the first request says why it ends: a later one only hurries it
            job.stop_deadline_ts = now + grace
            job.state = "stopping"
            self._save(job)
            self._signal(job, signal.SIGTERM)
        elif job.stop_deadline_ts is None or now + grace < job.stop_deadline_ts:
            job.stop_deadline_ts = now + grace  # a second, more impatient request may shorten the grace
            self._save(job)

    def _make_cgroup(self, job: Job) -> None:
        """Give the job its own cgroup (with the node's limits) when the agent has a root to make it in."""
        if self.cgroup_root is None:
            return
        try:
            path, warnings = self.cgroup_root.create(
                f"job-{job.mark or job.job_id}", self.job_memory_max, self.job_cpu_max
            )
        except OSError as exc:
            print(f"npuportal-agent: job {job.job_id}: no cgroup ({exc}); tracking its processes", file=sys.stderr)
            return
        job.cgroup = str(path)
        for warning in warnings:
            print(f"npuportal-agent: job {job.job_id}: {warning}", file=sys.stderr, flush=True)

    def processes(self, job: Job) -> dict[int, int]:
        """Every live process of the job, ``{pid: start time}``: its cgroup's, its marked ones, its session's."""
        leader_ours = job.pid is not None and (
            job.job_id in self._children or procfs.same_process_alive(job.pid, job.proc_start)
        )
        # The session id stays allocated while any member lives, so members started after the job are ours.
        session = job.pid if job.pid is not None and (leader_ours or job.proc_start is not None) else None
        found = procfs.processes_of_job(job.mark, session, job.proc_start)  # no mark: a record of an older agent
        if job.cgroup:
            for pid in cgroups.procs(Path(job.cgroup)):
                stat = procfs.read_stat(pid)
                if stat is not None and stat.state not in ("Z", "X"):
                    found[pid] = stat.start_ticks
        return found

    def _signal(self, job: Job, sig: signal.Signals) -> int:
        """Signal every process of the job, each verified by its start time; returns how many were signalled.

        SIGKILL of a job in a cgroup is one write to ``cgroup.kill`` (nothing can fork away meanwhile).
        """
        if sig == signal.SIGKILL and job.cgroup and cgroups.kill(Path(job.cgroup)):
            pass
        count = 0
        for pid, start in self.processes(job).items():
            if procfs.signal_verified(pid, start, sig):
                count += 1
        return count

    # -- monitoring -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._monitor, name="job-monitor", daemon=True)
        self._thread.start()

    def stop_all(self, grace_s: float, reason: str = "agent stopped") -> int:
        """Stop every running job (SIGTERM, SIGKILL after ``grace_s``) and wait until they are gone; returns how many.

        Only for an agent started with ``--stop-jobs-on-exit`` (the demo): a real node's agent
        leaves its jobs running across its own restarts. Each run stopped here is marked
        ``cause: "system"``: it ended because the system stopped, not by anything of its own, so
        the portal queues it again in its place rather than failing it. A run the portal had
        already asked to stop (cancelled, preempted, at its walltime) keeps that reason.
        """
        with self._lock:
            running = [j for j in self._jobs.values() if j.state in RUNNING_STATES]
            for job in running:
                self._request_stop(job, grace_s, reason, cause="system")
        self._wake.set()
        deadline = time.time() + grace_s + 5 + self.memory_release_wait_s
        while time.time() < deadline:
            self.tick()
            with self._lock:
                if not any(j.state in RUNNING_STATES for j in self._jobs.values()):
                    break
            time.sleep(0.1)
        return len(running)

    def close(self) -> None:
        """Stop watching; running jobs keep running and a later agent re-adopts them."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _monitor(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as exc:  # the monitor must outlive any single bad job
                print(f"npuportal-agent: monitor error: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            self._wake.wait(_MONITOR_INTERVAL_S)
            self._wake.clear()

    def tick(self) -> None:
        """One pass: reap finished jobs, enforce time limits, escalate overdue stops, prune old records.

        A job none of whose processes is left ends at once, or, where the backend lists the processes
        holding accelerator memory, once its cards are free (read outside the lock: see :meth:`_check_memory`).
        """
        now = time.time()
        with self._lock:
            awaiting = False
            for job in [j for j in self._jobs.values() if j.state in RUNNING_STATES]:
                if job.memory_check_since_ts is not None:
                    awaiting = True
                    continue
                finished, code, ended = self._poll(job)
                if finished:
                    if self._await_memory(job):
                        awaiting = True
                    else:
                        self._finalize(job, code, ended)
                    continue
                if job.max_duration_s is not None and job.stop_requested_ts is None:
                    if now - job.started_ts >= job.max_duration_s:
                        self._request_stop(job, self.default_grace_s, "walltime")
                if job.stop_deadline_ts is not None and now >= job.stop_deadline_ts and not job.sigkill_sent:
                    job.sigkill_sent = True
                    self._save(job)
                    self._signal(job, signal.SIGKILL)
            if now >= self._next_output_check:
                self._next_output_check = now + OUTPUT_CHECK_INTERVAL_S
                self._keep_output_budget(now)
            if self.keep_finished_s is not None and now - self._last_prune > 3600:
                self._last_prune = now
                self._prune(now)
            if awaiting:
                self._check_memory_soon()

    def _poll(self, job: Job) -> tuple[bool, int | None, float | None]:
        """Has the job ended? Returns ``(finished, exit status or None, end time or None)``."""
        child = self._children.get(job.job_id)
        if child is not None:
            try:
                # WNOWAIT: look without reaping, so the pid (= process group id) cannot be reused yet.
                if os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    return False, None, None
            except ChildProcessError:
                pass  # already reaped (Popen does so when it is collected); wait() below returns the status
            returncode = child.wait()
            del self._children[job.job_id]
            code, ended = self._read_exit(job.job_id)
            if code is None:
                code = returncode  # the wrapper itself was killed (SIGKILL): its own status is all we have
            self._wrapper_ended(job, code, ended or time.time())
        elif job.runner_ended_ts is None:
            if job.pid is not None and procfs.same_process_alive(job.pid, job.proc_start):
                return False, None, None
            code, ended = self._read_exit(job.job_id)
            self._wrapper_ended(job, code, ended)
        return self._leftovers_gone(job)

    def _wrapper_ended(self, job: Job, code: int | None, ended: float | None) -> None:
        job.runner_status, job.runner_ended_ts = code, ended or time.time()
        self._save(job)

    def _leftovers_gone(self, job: Job) -> tuple[bool, int | None, float | None]:
        """The wrapper has ended: the job ends once none of its processes is left (they are SIGKILLed)."""
        now = time.time()
        if self._signal(job, signal.SIGKILL):
            if job.leftovers_since_ts is None:
                job.leftovers_since_ts = now
                self._save(job)
            if now - job.leftovers_since_ts < UNKILLABLE_AFTER_S:
                return False, None, None
            left = len(self.processes(job))
            print(f"npuportal-agent: job {job.job_id}: {left} process(es) survive SIGKILL", file=sys.stderr)
        if job.cgroup:
            job.oom_kills = cgroups.oom_kills(Path(job.cgroup))
            cgroups.remove(Path(job.cgroup))
        return True, job.runner_status, job.runner_ended_ts

    # -- accelerator memory of an ended job ------------------------------------------------------------
    def _await_memory(self, job: Job) -> bool:
        """The job's last process is gone: wait for its cards' memory, where the backend can tell (the caller
        then leaves the job running or stopping); ``False``: report it ended now.
        """
        if self.memory_release_wait_s <= 0 or not self.backend.may_list_processes():
            return False
        if job.memory_check_since_ts is None:
            job.memory_check_since_ts = time.time()
            self._save(job)
        return True

    def _check_memory_soon(self) -> None:
        """Read the process table in a thread of its own (a tool call may take seconds), at most every
        :data:`device_memory.CHECK_INTERVAL_S`; the monitor goes on reaping and killing meanwhile.
        """
        if self._memory_check is not None and self._memory_check.is_alive():
            return
        if time.monotonic() < self._next_memory_check:
            return
        self._next_memory_check = time.monotonic() + device_memory.CHECK_INTERVAL_S
        self._memory_check = threading.Thread(target=self._check_memory, name="memory-check", daemon=True)
        self._memory_check.start()

    def _check_memory(self) -> None:
        """One reading of the process table, then each awaiting job is reported ended or left waiting."""
        try:
            table = self.backend.process_table()
        except Exception as exc:  # a backend bug must not leave jobs stopping forever: the bound still applies
            table = ProcessTable({}, f"reading the process table failed: {type(exc).__name__}: {exc}")
        now = time.time()
        with self._lock:
            for job in [j for j in self._jobs.values() if j.state in RUNNING_STATES]:
                if job.memory_check_since_ts is not None:
                    self._judge_memory(job, table, now)
        self._wake.set()

    def _judge_memory(self, job: Job, table: ProcessTable | None, now: float) -> None:
        """Report the job ended when its cards are free (or the table has none), or when the bound has run out."""
        assert job.memory_check_since_ts is not None
        waited = now - job.memory_check_since_ts
        note: str | None = None
        if table is not None:
            found, unread = device_memory.holders(job.devices, table, self._pids_of_others_on(job))
            if not found and (not unread or table.error is None):
                if len(unread) < len(job.devices):  # else none of its cards is in the table: not checked
                    note = device_memory.free_words(waited if job.job_id in self._memory_waited else None)
            elif waited < self.memory_release_wait_s:
                self._memory_waited.add(job.job_id)
                return
            elif found:
                note = device_memory.held_words(found, self.memory_release_wait_s)
            else:
                note = device_memory.unconfirmed_words(table.error)
            if note is not None and not note.startswith("accelerator memory free"):
                print(f"npuportal-agent: job {job.job_id}: {note}", file=sys.stderr, flush=True)
        self._memory_waited.discard(job.job_id)
        job.accelerator_memory = note
        self._finalize(job, job.runner_status, job.runner_ended_ts)

    def _pids_of_others_on(self, job: Job) -> set[int]:
        """Pids of the other running jobs that share a card with ``job`` (vNPU slices): their memory is theirs."""
        pids: set[int] = set()
        for other in self._jobs.values():
            if other is job or other.state not in RUNNING_STATES or not set(other.devices) & set(job.devices):
                continue
            pids.update(self.processes(other))
            if other.pid is not None:
                pids.add(other.pid)
        return pids

    def _finalize(self, job: Job, code: int | None, ended: float | None) -> None:
        job.ended_ts = ended or time.time()
        job.exit_code = code
        if job.cgroup:
            cgroups.remove(Path(job.cgroup))  # usually gone already; a job adopted after a reboot's is too
        try:
            self._finalize_state(job, code)
        finally:
            job.exit_reason = exit_reason(job)
            self._output_ended(job)
            self._save(job)

    def _finalize_state(self, job: Job, code: int | None) -> None:
        if job.stop_reason is not None:
            job.state = "killed"
            job.reason = job.stop_reason
            if code is None and job.sigkill_sent:
                job.exit_code = -signal.SIGKILL
        elif code is None:
            job.state = "lost"
            job.reason = (
                "the job's process ended while no agent was watching and left no exit status "
                "(killed with SIGKILL, or the node rebooted)"
            )
        else:
            job.state = "succeeded" if code == 0 else "failed"
            job.reason = None if code == 0 else exit_words(code)  # a success needs no reason

    def _prune(self, now: float) -> None:
        """Forget finished jobs older than the retention period, with their logs."""
        assert self.keep_finished_s is not None
        for job in list(self._jobs.values()):
            if job.state in FINAL_STATES and job.ended_ts is not None and now - job.ended_ts > self.keep_finished_s:
                del self._jobs[job.job_id]
                self.output.forget(job.job_id)
                paths = (self.record_path(job.job_id), self.log_path(job.job_id), self.exit_path(job.job_id))
                for path in (*paths, self.env_path(job.job_id), self.stop_output_path(job.job_id)):
                    path.unlink(missing_ok=True)

    # -- the node's output budget (output_budget.py) ------------------------------------------------
    def _output_ended(self, job: Job) -> None:
        """Count the ended job's output once, by the size of its log now (it writes no more)."""
        self.stop_output_path(job.job_id).unlink(missing_ok=True)
        if job.output_removed is not None:
            return
        try:
            job.output_bytes = self.log_path(job.job_id).stat().st_size
        except OSError:
            job.output_bytes = 0
        self.output.ended(job.job_id, job.output_bytes)

    def _count_ended_output(self) -> None:
        """At start: the ledger of ended jobs' output, the one that ended first first."""
        ended = [j for j in self._jobs.values() if j.state in FINAL_STATES and j.output_removed is None]
        ended.sort(key=lambda j: (j.ended_ts or 0.0, j.job_id))
        for job in ended:
            if job.output_bytes is None:  # a record of an older agent: its log's size, once
                try:
                    job.output_bytes = self.log_path(job.job_id).stat().st_size
                except OSError:
                    job.output_bytes = 0
        self.output.reset((j.job_id, j.output_bytes or 0) for j in ended)

    def _keep_output_budget(self, now: float) -> None:
        """Once a second: stop the output of running jobs over their team's share (or the node's budget),
        and remove the output of the jobs that ended first until the node is within its budget.

        Costs one ``stat`` per running job; ended jobs are counted from :class:`OutputLedger`.
        """
        running: list[RunningOutput] = []
        logs = str(self.jobs_dir)
        for job in self._jobs.values():
            if job.state in RUNNING_STATES:
                try:
                    size = os.stat(f"{logs}/{job.job_id}.log").st_size  # log_path(), without a Path per job
                except OSError:
                    size = 0
                running.append(RunningOutput(job.job_id, job.team, size, job.output_stopped is not None))
        plan = self.output.plan(running)
        for job_id in plan.remove:
            self._remove_output(self._jobs[job_id], now)
        for job_id, why in plan.stop.items():
            self._stop_output(self._jobs[job_id], why)

    def _remove_output(self, job: Job, now: float) -> None:
        self.log_path(job.job_id).unlink(missing_ok=True)
        self.output.forget(job.job_id)
        job.output_removed_ts = now
        job.output_removed = self.output.removed_words(utc_iso(now) or "")
        self._save(job)
        print(
            f"npuportal-agent: job {job.job_id}: removed its output ({job.output_bytes or 0} bytes) "
            "to keep the node's output budget",
            file=sys.stderr,
            flush=True,
        )

    def _stop_output(self, job: Job, why: str) -> None:
        """Tell the job's wrapper to keep no more of its output (it writes ``why`` as the last line)."""
        procfs.write_json_atomic(self.stop_output_path(job.job_id), {"reason": why})
        job.output_stopped = why
        self._save(job)
        print(f"npuportal-agent: job {job.job_id}: output stopped: {why}", file=sys.stderr, flush=True)
