"""Job wrapper: runs the user's command and leaves its exit status in a file.

The agent may die or be restarted while a job runs; the job keeps going in its own session, but a
restarted agent is no longer its parent and cannot ``wait()`` for it. This tiny wrapper *is* the job's
parent, so it always learns the real exit status and writes it to ``<state>/jobs/<id>.exit`` (atomically)
for whichever agent is around to read it.

It joins the job's cgroup (``--cgroup``) and marks the command's environment (``--mark``) before the
command starts, so every process of the job can be found again, also one that left the session.

It ignores SIGTERM/SIGINT/SIGHUP only in the sense of not dying from them: the agent signals every
process of the job, so the command gets the signal directly and the wrapper stays to record the outcome.
A signal that comes before the command exists is passed on to it once it runs.
SIGKILL still takes the wrapper down, and then no exit file exists, which the agent reports honestly.

An agent running as root starts the wrapper as root and tells it the job's account (``--uid``,
``--gid``, ``--groups``): the wrapper runs the command as that account, with ``--umask``, and stays
root itself, so the exit status it records is out of the job's reach. An ``--output`` file is opened
as the job's account (the job may write only where its account may), and the command's output goes
to it as well as to the agent's log. ``--wrapper PROGRAM`` runs ``PROGRAM /bin/sh -c COMMAND``
instead, for a site's toolkit set-up (CANN's ``set_env.sh``).

Standard library only, and importing nothing from the project, so the agent can start it by file path
with ``python -I -S runner.py`` (``python -m devices.agent.runner`` works too).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from types import FrameType
from typing import IO

SHELL = "/bin/sh"
#: How long the wrapper still copies output after the command ended: a daemon it left behind may hold
#: the pipe open for ever, and the exit status must not wait for it.
DRAIN_AFTER_EXIT_S = 2.0
#: How often, while the command writes, the wrapper looks whether the agent stopped its output (the
#: node's output budget, ``devices/agent/output_budget.py``): one ``open`` at most this often, not per write.
STOP_LOOK_INTERVAL_S = 0.25


def _write_all(fds: Sequence[int], data: bytes) -> None:
    """Write to the agent's log (the first), then to the job's own output file, whose errors are its own."""
    os.write(fds[0], data)
    for fd in fds[1:]:
        try:
            os.write(fd, data)
        except OSError:
            pass  # a full disk under the user's output file must not stop the agent's own log


def stop_reason(path: str) -> str | None:
    """Why the agent stopped this job's output (the file it wrote), or ``None`` while it has not."""
    try:
        with open(path, encoding="utf-8") as fh:
            reason = json.load(fh).get("reason")
    except (OSError, ValueError, AttributeError):
        return None
    return str(reason) if reason else "the node's output budget"


def copy_capped(
    source: IO[bytes], out_fd: int, limit: int, also: Sequence[int] = (), stop_file: str | None = None
) -> None:
    """Copy ``source`` to ``out_fd`` and ``also`` until EOF; past ``limit`` bytes, say so once and drop the rest.

    The command writes into a pipe, not the log itself, so a job printing without end fills a
    bounded file instead of the node's disk, and it never blocks on a full pipe. Once ``stop_file``
    exists (the agent keeps the node's output budget) the output is dropped the same way, after
    one line saying why; the command goes on running.
    """
    fds = (out_fd, *also)
    written = 0
    dropped = False
    next_look = 0.0
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
        if not chunk:
            return
        if stop_file is not None and not dropped and time.monotonic() >= next_look:
            next_look = time.monotonic() + STOP_LOOK_INTERVAL_S
            why = stop_reason(stop_file)
            if why is not None:
                dropped = True
                _write_all(fds, f"\n[npuportal: output stopped here: {why}; the job keeps running]\n".encode())
                continue
        if dropped:
            continue
        if written < limit:
            part = chunk[: limit - written]
            _write_all(fds, part)
            written += len(part)
            chunk = chunk[len(part) :]
        if chunk and not dropped:
            dropped = True
            _write_all(fds, f"\n[npuportal: output beyond {limit} bytes was dropped]\n".encode())


def open_as(path: str, uid: int | None, gid: int | None, groups: Sequence[int]) -> int:
    """Open ``path`` for appending with the rights of ``uid`` (when given), not the wrapper's root.

    The wrapper is single-threaded here, so switching its effective ids for one ``open`` is safe;
    a path the account may not write (or a symlink to ``/etc/shadow``) fails as it would for the job.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC
    if uid is None or os.geteuid() != 0:
        return os.open(path, flags, 0o600)
    saved_groups = os.getgroups()
    os.setgroups(list(groups))
    os.setegid(gid if gid is not None else os.getgid())
    os.seteuid(uid)
    try:
        return os.open(path, flags, 0o600)
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved_groups)


def write_exit_status(path: str, status: int) -> None:
    """Atomically write ``status`` (negative: killed by that signal, as Python reports it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{status}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


#: Stop signals that came while the command did not run yet: :func:`main` passes them on once it runs.
_early_signals: list[int] = []
_command_started = threading.Event()


def _stay_alive(signum: int, frame: FrameType | None) -> None:
    """Outlive group-wide signals long enough to record the command's status (the command got them too).

    One that comes before the command exists (a job stopped just after its launch, on a busy node) reached
    no command: it is kept, to be passed on as soon as the command runs. Lost, it would leave the job
    running until SIGKILL at the end of its grace period.
    """
    if not _command_started.is_set():
        _early_signals.append(signum)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``/bin/sh -c COMMAND``, record its status, and exit with a shell-style status."""
    parser = argparse.ArgumentParser(prog="python -m devices.agent.runner")
    parser.add_argument("--exit-file", required=True, help="where to write the command's exit status")
    parser.add_argument(
        "--max-output-bytes", type=int, default=0, help="cap of what the command's output may add (0: none)"
    )
    parser.add_argument("--uid", type=int, help="run the command as this user id (the wrapper stays who it is)")
    parser.add_argument("--gid", type=int, help="... with this primary group id")
    parser.add_argument("--groups", default="", help="... and these supplementary group ids, comma-separated")
    parser.add_argument("--umask", type=lambda text: int(text, 8), help="umask of the command, octal (e.g. 077)")
    parser.add_argument("--output", help="also append the command's output to this file (opened as --uid)")
    parser.add_argument("--stop-output-file", help="once this file exists, drop the output, saying why (its reason)")
    parser.add_argument("--wrapper", help="run WRAPPER /bin/sh -c COMMAND (a site's toolkit set-up)")
    parser.add_argument("--env-file", help="JSON object: the command's whole environment (read, then removed)")
    parser.add_argument("--mark", help="value of NPUPORTAL_JOB_MARK for the command: how the agent finds its processes")
    parser.add_argument("--cgroup", help="cgroup v2 directory to join before starting the command")
    parser.add_argument("command", help="shell command, run with /bin/sh -c")
    args = parser.parse_args(argv)
    os.umask(0o077)  # the exit file and anything else of the wrapper's: not for other accounts
    if args.mark:
        os.environ["NPUPORTAL_JOB_MARK"] = args.mark  # inherited by every child, setsid or not
    if args.cgroup:
        try:  # before any child exists, so all of them are born inside it
            with open(os.path.join(args.cgroup, "cgroup.procs"), "w", encoding="ascii") as fh:
                fh.write(str(os.getpid()))
        except OSError as exc:
            print(f"npuportal runner: cannot join cgroup {args.cgroup}: {exc}", file=sys.stderr, flush=True)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _stay_alive)  # a Python handler, unlike SIG_IGN, is reset for the child on exec
    groups = [int(g) for g in args.groups.split(",") if g]
    env = None
    if args.env_file:
        try:
            with open(args.env_file, encoding="utf-8") as fh:
                env = {str(k): str(v) for k, v in json.load(fh).items()}
            os.unlink(args.env_file)
            if args.mark:  # the job's own environment carries the mark too: its processes are found by it
                env["NPUPORTAL_JOB_MARK"] = args.mark
        except (OSError, ValueError, AttributeError) as exc:
            print(f"npuportal runner: cannot read the job's environment: {exc}", file=sys.stderr, flush=True)
            write_exit_status(args.exit_file, 126)
            return 126
    also: list[int] = []
    if args.output:
        try:
            also.append(open_as(args.output, args.uid, args.gid, groups))
        except OSError as exc:
            print(f"npuportal runner: cannot open the output file {args.output}: {exc}", file=sys.stderr, flush=True)
            write_exit_status(args.exit_file, 126)
            return 126
    capped = args.max_output_bytes > 0 or bool(also) or args.stop_output_file is not None
    limit = args.max_output_bytes if args.max_output_bytes > 0 else sys.maxsize
    switch = args.uid is not None and os.geteuid() == 0  # only root can; otherwise the job is the wrapper's own
    argv_child = [SHELL, "-c", args.command]
    if args.wrapper:
        argv_child = [args.wrapper, *argv_child]
    try:
        child = subprocess.Popen(  # same process group: group signals reach it
            argv_child,
            stdout=subprocess.PIPE if capped else None,
            stderr=subprocess.STDOUT if capped else None,
            env=env,
            user=args.uid if switch else None,
            group=args.gid if switch else None,
            extra_groups=groups if switch else None,
            umask=-1 if args.umask is None else args.umask,
        )
    except OSError as exc:
        print(f"npuportal runner: cannot start {argv_child[0]}: {exc}", file=sys.stderr, flush=True)
        write_exit_status(args.exit_file, 127)
        return 127
    _command_started.set()
    for signum in dict.fromkeys(_early_signals):
        child.send_signal(signum)
    copier = None
    if capped and child.stdout is not None:
        copier = threading.Thread(
            target=copy_capped,
            args=(child.stdout, sys.stdout.fileno(), limit, also, args.stop_output_file),
            daemon=True,
        )
        copier.start()
    status = child.wait()
    if copier is not None:
        copier.join(DRAIN_AFTER_EXIT_S)
    write_exit_status(args.exit_file, status)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
