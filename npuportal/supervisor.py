"""``python -m npuportal.supervisor``: run the whole system in one terminal.

Starts the web server, a Celery worker, Celery beat, one simulated agent per
demo node and the load generator; prefixes and interleaves their output;
Ctrl-C (or SIGTERM) stops them all.

A child that dies is started again, as systemd's ``Restart=on-failure`` does: one
line says which child died, how (its exit code or signal) and when it restarts;
the delay is 1 s, doubling to 30 s, and starts over at 1 s once the child has
stayed up a minute. Whatever the dead child left in its process group (a pool
worker, say) is sent SIGTERM at once and SIGKILL when the child restarts. Jobs
are not lost meanwhile: an agent's jobs run in sessions of their own and its
next start re-adopts them, and a worker's unfinished work is done again by the
next tick and poll (docs/health.md, "What happens to jobs"). A child that keeps
dying (5 deaths within 2 minutes) is a broken setup, not a hiccup: the supervisor
says so, stops everything and exits non-zero, so it is never mistaken for a
running system.

With ``NPUPORTAL_EXECUTOR=slurm`` (``make run EXECUTOR=slurm``) jobs run on Slurm
(``npuportal/slurm_demo.py``): without ``SLURM_CONF`` a local single-host Slurm is
started first and stopped last, by pid, whatever ends the run; the portal's nodes are
made Slurm's (``manage.py slurm import --replace``); no agents and no load generator run.
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
from dataclasses import dataclass, field
from pathlib import Path

from devices.agent.exit_words import signal_name
from devices.slurm.cluster import ClusterError
from npuportal import slurm_demo
from npuportal.demo_accounts import demo_job_flags, demo_slurm_jobs_as

ROOT = Path(__file__).resolve().parent.parent
COLOURS = ["36", "32", "35", "33", "34", "31", "96", "92", "95"]

#: A dead child is started again after this long, doubling at each death up to ``RESTART_MAX_S``.
RESTART_FIRST_S = 1.0
RESTART_MAX_S = 30.0
#: A child that stayed up this long had recovered: its next death waits ``RESTART_FIRST_S`` again.
STABLE_AFTER_S = 60.0
#: This many deaths of one child within ``GIVE_UP_WINDOW_S`` stop everything (exit code 1).
GIVE_UP_DEATHS = 5
GIVE_UP_WINDOW_S = 120.0


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    prefix: str = ""
    #: ``time.monotonic()`` of its last start, and of its deaths within the give-up window.
    started_at: float = 0.0
    deaths: list[float] = field(default_factory=list)
    #: The delay before its next restart, and when that restart is due (``None``: it runs).
    delay_s: float = RESTART_FIRST_S
    restart_at: float | None = None
    #: The process group a dead child left behind, killed for good when it restarts.
    leftovers: int | None = None


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
    slurm = None
    if env.get("NPUPORTAL_EXECUTOR", "").strip() == "slurm":
        signal.signal(signal.SIGTERM, _interrupt)  # stopped while Slurm comes up: its daemons go too
        try:
            slurm = _start_slurm(env)
        except KeyboardInterrupt:
            return 130
        if slurm is None:
            return 1
        args.no_agents = args.no_loadgen = True
    try:
        return _supervise(args, env, slurm)
    finally:
        if slurm is not None and slurm.cluster is not None:
            slurm.stop()
            print(f"supervisor | Slurm stopped (its daemons in {slurm.cluster.root})", flush=True)


def _start_slurm(env: dict[str, str]) -> slurm_demo.DemoSlurm | None:
    """The run's Slurm (started when no ``SLURM_CONF`` is given), its settings put in ``env``, the nodes imported.

    ``None`` when it cannot be used: one line says why.
    """
    var = Path(env.get("NPUPORTAL_VAR_DIR", ROOT / "var"))
    if line := slurm_demo.missing():
        print(line, file=sys.stderr, flush=True)
        return None
    site = bool(slurm_demo.site_conf())
    print("supervisor | " + ("using the site's Slurm" if site else "starting a local Slurm (3 nodes)"), flush=True)
    try:
        slurm = slurm_demo.start(var)
    except ClusterError as exc:
        print(f"supervisor | the local Slurm did not start: {exc}", file=sys.stderr, flush=True)
        return None
    try:
        _use_slurm(slurm, env, var)
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _use_slurm(slurm: slurm_demo.DemoSlurm, env: dict[str, str], var: Path) -> None:
    env.update(slurm.env())
    if jobs_as := demo_slurm_jobs_as(var):  # never root: one unprivileged account, as the demo agents'
        env["NPUPORTAL_SLURM_JOBS_AS"] = jobs_as
    if slurm.cluster is not None:
        print(f"supervisor | Slurm up in {slurm.cluster.started_in_s:.1f} s, its files in {var / 'slurm'}", flush=True)
    # The demo's nodes become Slurm's: those Slurm lacks go (at once, or once their jobs end).
    done = subprocess.run(
        [sys.executable, "manage.py", "slurm", "import", "--replace"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    for line in (done.stdout + done.stderr).splitlines():
        print(f"supervisor | slurm import: {line}", flush=True)
    if done.returncode != 0:
        print(f"supervisor | slurm import exited with code {done.returncode}; running on", flush=True)


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _supervise(args: argparse.Namespace, env: dict[str, str], slurm: slurm_demo.DemoSlurm | None) -> int:
    children = build_children(args)
    width = max(len(c.name) for c in children)
    sel = selectors.DefaultSelector()
    colour = sys.stdout.isatty()
    for i, child in enumerate(children):
        child.prefix = child.name.ljust(width) + " | "
        if colour:
            child.prefix = f"\033[{COLOURS[i % len(COLOURS)]}m{child.prefix}\033[0m"
        _start(child, env, sel)

    stopping = {"signal": 0}

    def on_signal(signum: int, _frame: object) -> None:
        stopping["signal"] = signum

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    print(f"npuportal is starting: http://{args.host}:{args.port}/  (Ctrl-C stops everything)", flush=True)
    if slurm is not None:
        where = "a local Slurm, stopped with the rest" if slurm.cluster else "the site's Slurm"
        print(f"Jobs run on {where}: SLURM_CONF={slurm.conf} squeue", flush=True)
    _print_logins()
    code = 0
    buffers: dict[int, bytes] = {}
    while not stopping["signal"]:
        now = time.monotonic()
        if not _tend(children, env, sel, now):
            code = 1
            break
        due = [c.restart_at for c in children if c.restart_at is not None]
        _relay(sel, buffers, max(0.0, min([0.5, *(at - now for at in due)])))
    if stopping["signal"]:
        print("supervisor | stopping all processes", flush=True)
    _stop_all(children, sel, buffers)
    return code


def _relay(sel: selectors.BaseSelector, buffers: dict[int, bytes], timeout: float) -> int:
    """Copy what the children wrote, line by line with their prefix, waiting at most ``timeout`` for some.

    Returns how many pipes had something (0: nothing was written meanwhile).
    """
    if not sel.get_map():  # every pipe closed (the children are between a death and a restart)
        time.sleep(timeout)
        return 0
    ready = sel.select(timeout=timeout)
    for key, _ in ready:
        prefix = key.data
        chunk = os.read(key.fd, 65536)
        if not chunk:  # its writers are all gone: what is left of a last line, then the pipe closes
            if rest := buffers.pop(key.fd, b""):
                sys.stdout.write(prefix + rest.decode(errors="replace") + "\n")
            sel.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
            continue
        data = buffers.pop(key.fd, b"") + chunk
        *lines, rest = data.split(b"\n")
        if rest:
            buffers[key.fd] = rest
        for line in lines:
            sys.stdout.write(prefix + line.decode(errors="replace") + "\n")
    sys.stdout.flush()
    return len(ready)


def _start(child: Child, env: dict[str, str], sel: selectors.BaseSelector) -> None:
    """Start ``child`` in a session of its own (a signal for the group reaches it and its helpers only)."""
    child.proc = subprocess.Popen(
        child.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    child.started_at = time.monotonic()
    child.restart_at = None
    sel.register(child.proc.stdout, selectors.EVENT_READ, child.prefix)  # type: ignore[arg-type]


def _tend(children: list[Child], env: dict[str, str], sel: selectors.BaseSelector, now: float) -> bool:
    """Notice children that died and restart those whose delay is over; ``False``: one keeps dying, give up."""
    for child in children:
        if child.restart_at is None and child.proc is not None and child.proc.poll() is not None:
            if not _died(child, now):
                return False
        elif child.restart_at is not None and now >= child.restart_at:
            _kill_group(child.leftovers, signal.SIGKILL)
            child.leftovers = None
            _start(child, env, sel)
    return True


def _died(child: Child, now: float) -> bool:
    """Record a death and plan the restart (one line says so); ``False`` when the child keeps dying."""
    assert child.proc is not None
    code = child.proc.returncode
    how = f"was killed by {signal_name(-code)}" if code < 0 else f"exited with code {code}"
    if now - child.started_at >= STABLE_AFTER_S:
        child.delay_s = RESTART_FIRST_S
    child.deaths = [t for t in child.deaths if now - t < GIVE_UP_WINDOW_S] + [now]
    # What the child left in its group (gunicorn's or Celery's workers) goes now; it gets the delay to end.
    child.leftovers = child.proc.pid
    _kill_group(child.leftovers, signal.SIGTERM)
    at = time.strftime("%H:%M:%S")
    if len(child.deaths) >= GIVE_UP_DEATHS:
        print(
            f"supervisor | {child.name} {how} at {at}: {len(child.deaths)} deaths within "
            f"{GIVE_UP_WINDOW_S:g} s, it keeps dying; stopping everything",
            flush=True,
        )
        return False
    child.restart_at = now + child.delay_s
    print(f"supervisor | {child.name} {how} at {at}; restarting it in {child.delay_s:g} s", flush=True)
    child.delay_s = min(child.delay_s * 2, RESTART_MAX_S)
    return True


def _kill_group(pgid: int | None, sig: signal.Signals) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nothing of it is left


def _stop_all(
    children: list[Child], sel: selectors.BaseSelector, buffers: dict[int, bytes], grace_s: float = 15.0
) -> None:
    """SIGTERM every child's group, SIGKILL what is left after ``grace_s`` (agents stop their jobs within it).

    Their output is still relayed meanwhile: an agent says how many jobs it stopped.
    """
    for c in children:
        if c.proc and c.proc.poll() is None:
            _kill_group(c.proc.pid, signal.SIGTERM)
    for c in children:
        _kill_group(c.leftovers, signal.SIGKILL)  # what a child that died left behind has had its SIGTERM
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(c.proc is not None and c.proc.poll() is None for c in children):
        _relay(sel, buffers, 0.1)
    for c in children:
        if c.proc is not None and c.proc.poll() is None:
            _kill_group(c.proc.pid, signal.SIGKILL)
            c.proc.wait()
    for _ in range(100):  # the last lines they wrote
        if not _relay(sel, buffers, 0):
            break


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
