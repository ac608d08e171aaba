"""``python -m npuportal.supervisor``: run the whole system in one terminal.

Starts the web server, a Celery worker, Celery beat, one simulated agent per
demo node and the load generator; prefixes and interleaves their output;
Ctrl-C stops them all; a child that dies is reported and takes the rest down
with a non-zero exit, so a broken setup is never mistaken for a running one.
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from npuportal.demo_accounts import demo_job_flags

ROOT = Path(__file__).resolve().parent.parent
COLOURS = ["36", "32", "35", "33", "34", "31", "96", "92", "95"]


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None


def build_children(args: argparse.Namespace) -> list[Child]:
    py = sys.executable
    var = Path(os.environ.get("NPUPORTAL_VAR_DIR", ROOT / "var"))
    children = [
        Child(
            "web",
            [
                py,
                "-m",
                "gunicorn",
                "npuportal.wsgi",
                "-b",
                f"{args.host}:{args.port}",
                "-w",
                "2",
                "--threads",
                "4",
                "--access-logfile",
                "-",
            ],
        ),
        Child(
            "worker",
            [
                py,
                "-m",
                "celery",
                "-A",
                "npuportal",
                "worker",
                "-l",
                "info",
                "-c",
                "2",
                "--without-gossip",
                "--without-mingle",
                "-n",
                f"worker-{os.getpid()}@%h",
            ],
        ),
        Child(
            "beat",
            [py, "-m", "celery", "-A", "npuportal", "beat", "-l", "info", "-s", str(var / "celerybeat-schedule")],
        ),
    ]
    agents_file = var / "demo_agents.json"
    if not args.no_agents and agents_file.exists():
        for n, agent in enumerate(json.loads(agents_file.read_text())):
            # All demo agents share this host: disjoint port ranges keep multi-node jobs' MASTER_PORTs apart.
            ports = f"{29500 + 100 * n}-{29599 + 100 * n}"
            children.append(
                Child(
                    f"agent:{agent['name']}",
                    [
                        py,
                        "-m",
                        "devices.agent",
                        "--backend",
                        "sim",
                        "--listen",
                        f"127.0.0.1:{agent['port']}",
                        "--token-file",
                        agent["token_file"],
                        "--state-dir",
                        agent["state_dir"],
                        "--sim-chip",
                        agent["chip"],
                        "--sim-devices",
                        str(agent["devices"]),
                        "--node-name",
                        agent["name"],
                        # The demo's jobs end with it: nothing `make run` started outlives Ctrl-C.
                        "--stop-jobs-on-exit",
                        "--rendezvous-ports",
                        ports,
                        "--kill-grace",
                        "3",
                        # The demo's users have no POSIX accounts: jobs run as one unprivileged account
                        # (never root; npuportal/demo_accounts.py, docs/agent.md#accounts).
                        *demo_job_flags(var),
                    ],
                )
            )
    if not args.no_loadgen:
        children.append(Child("loadgen", [py, "manage.py", "loadgen"]))
    return children


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("NPUPORTAL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("NPUPORTAL_PORT", "8000")))
    parser.add_argument("--no-loadgen", action="store_true", help="do not submit demo jobs")
    parser.add_argument("--no-agents", action="store_true", help="do not start simulated node agents")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    children = build_children(args)
    width = max(len(c.name) for c in children)
    sel = selectors.DefaultSelector()
    colour = sys.stdout.isatty()
    for i, child in enumerate(children):
        child.proc = subprocess.Popen(
            child.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        prefix = child.name.ljust(width) + " | "
        if colour:
            prefix = f"\033[{COLOURS[i % len(COLOURS)]}m{prefix}\033[0m"
        sel.register(child.proc.stdout, selectors.EVENT_READ, (child, prefix))  # type: ignore[arg-type]

    stopping = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"npuportal is starting: http://{args.host}:{args.port}/  (Ctrl-C stops everything)", flush=True)
    _print_logins()
    code = 0
    buffers: dict[int, bytes] = {}
    while True:
        if stopping["signal"]:
            print("supervisor | stopping all processes", flush=True)
            break
        dead = [c for c in children if c.proc is not None and c.proc.poll() is not None]
        if dead:
            for c in dead:
                print(f"supervisor | {c.name} exited with code {c.proc.returncode}; stopping the rest", flush=True)  # type: ignore[union-attr]
            code = 1
            break
        for key, _ in sel.select(timeout=0.5):
            child, prefix = key.data
            chunk = os.read(key.fd, 65536)
            if not chunk:
                sel.unregister(key.fileobj)
                continue
            data = buffers.pop(key.fd, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                buffers[key.fd] = rest
            for line in lines:
                sys.stdout.write(prefix + line.decode(errors="replace") + "\n")
            sys.stdout.flush()
    _stop_all(children)
    return code


def _stop_all(children: list[Child], grace_s: float = 15.0) -> None:
    """SIGTERM every child's group, SIGKILL what is left after ``grace_s`` (agents stop their jobs within it)."""
    for c in children:
        if c.proc and c.proc.poll() is None:
            try:
                os.killpg(c.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + grace_s
    for c in children:
        if c.proc is None:
            continue
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(c.proc.pid, signal.SIGKILL)
            c.proc.wait()


def _print_logins() -> None:
    path = Path(os.environ.get("NPUPORTAL_VAR_DIR", ROOT / "var")) / "demo_logins.txt"
    if path.exists():
        print(f"Demo logins (from {path}):", flush=True)
        for line in path.read_text().splitlines():
            if line.strip():
                user, _, password = line.partition("\t")
                print(f"  {user:18} {password}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
