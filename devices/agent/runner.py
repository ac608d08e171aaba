"""Job wrapper: runs the user's command and leaves its exit status in a file.

The agent may die or be restarted while a job runs; the job keeps going in its own session, but a
restarted agent is no longer its parent and cannot ``wait()`` for it. This tiny wrapper *is* the job's
parent, so it always learns the real exit status and writes it to ``<state>/jobs/<id>.exit`` (atomically)
for whichever agent is around to read it.

It joins the job's cgroup (``--cgroup``) and marks the command's environment (``--mark``) before the
command starts, so every process of the job can be found again, also one that left the session.

It ignores SIGTERM/SIGINT/SIGHUP only in the sense of not dying from them: the agent signals every
process of the job, so the command gets the signal directly and the wrapper stays to record the outcome.
SIGKILL still takes the wrapper down, and then no exit file exists, which the agent reports honestly.

Standard library only, and importing nothing from the project, so the agent can start it by file path
with ``python -I -S runner.py`` (``python -m devices.agent.runner`` works too).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from types import FrameType
from typing import IO

SHELL = "/bin/sh"
#: How long the wrapper still copies output after the command ended: a daemon it left behind may hold
#: the pipe open for ever, and the exit status must not wait for it.
DRAIN_AFTER_EXIT_S = 2.0


def copy_capped(source: IO[bytes], out_fd: int, limit: int) -> None:
    """Copy ``source`` to ``out_fd`` until EOF; past ``limit`` bytes, say so once and drop the rest.

    The command writes into a pipe, not the log itself, so a job printing without end fills a
    bounded file instead of the node's disk, and it never blocks on a full pipe.
    """
    written = 0
    dropped = False
    while True:
        chunk = source.read1(65536) if hasattr(source, "read1") else source.read(65536)
        if not chunk:
            return
        if written < limit:
            part = chunk[: limit - written]
            os.write(out_fd, part)
            written += len(part)
            chunk = chunk[len(part) :]
        if chunk and not dropped:
            dropped = True
            os.write(out_fd, f"\n[npuportal: output beyond {limit} bytes was dropped]\n".encode())


def write_exit_status(path: str, status: int) -> None:
    """Atomically write ``status`` (negative: killed by that signal, as Python reports it)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{status}\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _stay_alive(signum: int, frame: FrameType | None) -> None:
    """Outlive group-wide signals long enough to record the command's status (the command got them too)."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``/bin/sh -c COMMAND``, record its status, and exit with a shell-style status."""
    parser = argparse.ArgumentParser(prog="python -m devices.agent.runner")
    parser.add_argument("--exit-file", required=True, help="where to write the command's exit status")
    parser.add_argument(
        "--max-output-bytes", type=int, default=0, help="cap of what the command's output may add (0: none)"
    )
    parser.add_argument("--mark", help="value of NPUPORTAL_JOB_MARK for the command: how the agent finds its processes")
    parser.add_argument("--cgroup", help="cgroup v2 directory to join before starting the command")
    parser.add_argument("command", help="shell command, run with /bin/sh -c")
    args = parser.parse_args(argv)
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
    capped = args.max_output_bytes > 0
    try:
        child = subprocess.Popen(  # same process group: group signals reach it
            [SHELL, "-c", args.command],
            stdout=subprocess.PIPE if capped else None,
            stderr=subprocess.STDOUT if capped else None,
        )
    except OSError as exc:
        print(f"npuportal runner: cannot start {SHELL}: {exc}", file=sys.stderr, flush=True)
        write_exit_status(args.exit_file, 127)
        return 127
    copier = None
    if capped and child.stdout is not None:
        copier = threading.Thread(
            target=copy_capped, args=(child.stdout, sys.stdout.fileno(), args.max_output_bytes), daemon=True
        )
        copier.start()
    status = child.wait()
    if copier is not None:
        copier.join(DRAIN_AFTER_EXIT_S)
    write_exit_status(args.exit_file, status)
    return status if status >= 0 else 128 - status


if __name__ == "__main__":
    sys.exit(main())
