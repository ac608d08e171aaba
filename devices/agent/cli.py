"""Command line of the node agent: check the flags, wire the parts together, serve until told to stop.

Mistakes in flags are reported before anything is started (exit status 2, like any argparse tool), so a
systemd unit with a typo fails loudly at once instead of running a half-configured agent.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pwd
import re
import signal
import socket
import stat
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import IO

from devices.agent import AGENT_VERSION, cgroups
from devices.agent.accounts import ACCOUNT_NAME_RE, DEFAULT_MIN_UID, Account, AccountPolicy
from devices.agent.backends import Backend, NpuSmiBackend, NvidiaSmiBackend
from devices.agent.device_memory import DEFAULT_RELEASE_WAIT_S
from devices.agent.environment import (
    DEFAULT_JOB_PATH,
    JobSetup,
    check_site_env,
    parse_assignment,
    read_env_file,
)
from devices.agent.http_api import AgentContext, AgentServer
from devices.agent.jobs import DEFAULT_MAX_LOG_BYTES, JobManager
from devices.agent.output_budget import DEFAULT_TEAM_SHARE, OutputLedger, size_words
from devices.agent.rendezvous import DEFAULT_PORTS, parse_port_range, valid_host
from devices.agent.sim import SIM_CHIPS, SimBackend, parse_topology

BACKENDS = ("npu-smi", "nvidia-smi", "sim")
MAX_SIM_DEVICES = 64
#: A stop the portal waits for (``DELETE ...?wait=``, at most 120 s) must be able to end within it.
MAX_MEMORY_RELEASE_WAIT_S = 60.0


def parse_listen(value: str) -> tuple[str, int, socket.AddressFamily]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` → (host, port, address family); ``ValueError`` says what is wrong."""
    match = re.fullmatch(r"\[(?P<v6>[0-9A-Fa-f:.]+)\]:(?P<port>\d+)|(?P<host>[^:\[\]]+):(?P<port4>\d+)", value.strip())
    if not match:
        raise ValueError(f"--listen must be HOST:PORT (or [IPv6]:PORT), got {value!r}")
    port = int(match.group("port") or match.group("port4"))
    if port > 65535:
        raise ValueError(f"--listen port {port} is out of range (0-65535)")
    if match.group("v6"):
        return match.group("v6"), port, socket.AF_INET6
    return match.group("host"), port, socket.AF_INET


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devices.agent",
        description="npuportal node agent: reports accelerators and runs jobs on this node over HTTP.",
    )
    parser.add_argument("--backend", required=True, choices=BACKENDS, help="where device readings come from")
    parser.add_argument("--listen", required=True, metavar="HOST:PORT", help="address to serve the API on")
    parser.add_argument("--token-file", required=True, type=Path, help="file holding the API bearer token")
    parser.add_argument("--state-dir", required=True, type=Path, help="directory for job records and logs")
    parser.add_argument("--node-name", help="name reported to the portal (default: the host name)")
    parser.add_argument("--tool-path", help="path of npu-smi / nvidia-smi (default: found on PATH)")
    parser.add_argument("--tool-timeout", type=float, default=15.0, help="seconds before a tool call is abandoned")
    parser.add_argument("--kill-grace", type=float, default=10.0, help="default seconds between SIGTERM and SIGKILL")
    parser.add_argument(
        "--memory-release-wait",
        type=float,
        default=DEFAULT_RELEASE_WAIT_S,
        metavar="S",
        help="seconds an ended job waits for the tool's process table to list no process on its cards before it "
        "is reported ended; after them it is reported all the same, saying who holds the memory "
        "(npu-smi, nvidia-smi; default %(default)g, 0: do not check)",
    )
    parser.add_argument(
        "--keep-finished-days", type=float, default=14.0, help="forget finished jobs after this long (0: never)"
    )
    parser.add_argument(
        "--max-log-bytes",
        type=int,
        default=DEFAULT_MAX_LOG_BYTES,
        help="cap of one job attempt's output file; beyond it output is dropped, with a line saying so (64 MiB)",
    )
    parser.add_argument(
        "--output-budget",
        default="4G",
        metavar="SIZE",
        help="all job output this node keeps, bytes or e.g. 4G (powers of 1024); over it the output of the jobs "
        "that ended first is removed, saying so on them (default %(default)s)",
    )
    parser.add_argument(
        "--output-team-share",
        type=float,
        default=DEFAULT_TEAM_SHARE,
        metavar="F",
        help="part of --output-budget one team's running jobs may hold; past it their output stops, with a "
        "line saying why, and the jobs keep running (default %(default)s)",
    )
    parser.add_argument(
        "--stop-jobs-on-exit",
        action="store_true",
        help="stop every job when the agent stops (the demo: nothing outlives `make run`); "
        "by default jobs keep running and a restarted agent re-adopts them",
    )
    jobs = parser.add_argument_group("jobs' accounts and environment (docs/agent.md)")
    jobs.add_argument(
        "--allow-root-jobs",
        action="store_true",
        help="let a job run as root (an account with uid 0, or any job of --jobs-as-agent under root)",
    )
    jobs.add_argument(
        "--jobs-as-agent",
        action="store_true",
        help="run every job as the agent's own account, whoever submitted it (as root it "
        "also needs --allow-root-jobs). By default a root agent runs each job as its submitter's account",
    )
    jobs.add_argument(
        "--jobs-as",
        metavar="USER",
        help="run every job as this one POSIX account, whoever submitted it (a root agent; the demo's "
        "npuportal-demo). By default a root agent runs each job as its submitter's account",
    )
    jobs.add_argument(
        "--min-uid",
        type=int,
        default=DEFAULT_MIN_UID,
        metavar="UID",
        help="lowest uid a job may run as: accounts below it are the system's and are refused "
        "(default %(default)s; root, uid 0, only with --allow-root-jobs)",
    )
    jobs.add_argument("--job-path", default=DEFAULT_JOB_PATH, metavar="PATH", help=f"PATH of jobs ({DEFAULT_JOB_PATH})")
    jobs.add_argument(
        "--job-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a fixed variable of every job on this node (repeatable)",
    )
    jobs.add_argument("--job-env-file", type=Path, metavar="FILE", help="NAME=VALUE lines of fixed variables")
    jobs.add_argument(
        "--job-wrapper",
        metavar="PROGRAM",
        help='run each job as PROGRAM /bin/sh -c COMMAND (e.g. a script sourcing CANN\'s set_env.sh, then exec "$@")',
    )
    multi = parser.add_argument_group("multi-node jobs (docs/agent.md)")
    multi.add_argument(
        "--advertise-address",
        metavar="HOST",
        help="address other servers reach this node at: MASTER_ADDR and the rank table's server_id "
        "(default: the --listen address unless it is 0.0.0.0 or ::; then the portal uses the node's agent URL host)",
    )
    multi.add_argument(
        "--rendezvous-ports",
        default=f"{DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}",
        metavar="LOW-HIGH",
        help="ports this node offers as MASTER_PORT when it is a multi-node job's first server (default %(default)s); "
        "agents sharing one host should get disjoint ranges",
    )
    parser.add_argument(
        "--cgroup-root",
        type=Path,
        help="cgroup v2 directory delegated to the agent for job cgroups "
        "(default: npuportal-jobs under the agent's own cgroup; none usable: jobs are tracked by their processes)",
    )
    parser.add_argument(
        "--no-cgroups", action="store_true", help="do not put jobs in cgroups; track their processes instead"
    )
    parser.add_argument("--job-memory-max", help="memory limit of each job, bytes or e.g. 64G (needs job cgroups)")
    parser.add_argument("--job-cpu-max", type=float, help="CPU limit of each job in cores, e.g. 8 (needs job cgroups)")
    sim = parser.add_argument_group("simulated backend (--backend sim)")
    sim.add_argument("--sim-chip", help=f"chip model to simulate: {', '.join(SIM_CHIPS)} (default 910B4)")
    sim.add_argument("--sim-devices", type=int, help=f"number of devices, 1-{MAX_SIM_DEVICES} (default 8)")
    sim.add_argument("--sim-topology", help="none (default), mesh, ring (HCCS groups of 4, as 910A) or ring:N")
    parser.add_argument("--version", action="version", version=f"npuportal-agent {AGENT_VERSION}")
    return parser


def _read_token(parser: argparse.ArgumentParser, path: Path) -> bytes:
    try:
        token = path.read_bytes().strip()
        mode = path.stat().st_mode
    except OSError as exc:
        parser.error(f"--token-file {path}: {exc.strerror or exc}")
    if not token:
        parser.error(f"--token-file {path} is empty")
    if len(token) < 16:
        parser.error(f"--token-file {path}: token is shorter than 16 characters; use a long random token")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(f"npuportal-agent: warning: {path} is readable by other users; chmod 600 it", file=sys.stderr)
    return token


def _make_backend(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Backend:
    sim_values = {"--sim-chip": args.sim_chip, "--sim-devices": args.sim_devices, "--sim-topology": args.sim_topology}
    sim_flags = [flag for flag, value in sim_values.items() if value is not None]
    if args.backend != "sim":
        if sim_flags:
            parser.error(f"{', '.join(sim_flags)} only apply to --backend sim")
        if args.tool_timeout <= 0:
            parser.error("--tool-timeout must be positive")
        tool = args.tool_path or args.backend
        if args.backend == "npu-smi":
            return NpuSmiBackend(tool, args.tool_timeout)
        return NvidiaSmiBackend(tool, args.tool_timeout)
    if args.tool_path:
        parser.error("--tool-path does not apply to --backend sim")
    names = {name.lower(): name for name in SIM_CHIPS}
    chip = names.get((args.sim_chip or "910B4").lower())
    if chip is None:
        parser.error(f"--sim-chip {args.sim_chip!r} is not one of: {', '.join(SIM_CHIPS)}")
    count = 8 if args.sim_devices is None else args.sim_devices
    if not 1 <= count <= MAX_SIM_DEVICES:
        parser.error(f"--sim-devices must be between 1 and {MAX_SIM_DEVICES}")
    try:
        parse_topology(args.sim_topology or "none", count)
    except ValueError as exc:
        parser.error(f"--sim-topology: {exc}")
    return SimBackend(chip, count, args.state_dir, args.sim_topology or "none")


def _job_setup(parser: argparse.ArgumentParser, args: argparse.Namespace, node: str) -> JobSetup:
    """The jobs' account rule and environment from the flags; a bad one is a usage error (status 2)."""
    if args.jobs_as_agent and os.geteuid() == 0 and not args.allow_root_jobs:
        parser.error("--jobs-as-agent under root runs every job as root: add --allow-root-jobs to mean it")
    if args.min_uid < 0:
        parser.error("--min-uid must be a uid, 0 or more")
    if args.jobs_as is not None:
        _check_jobs_as(parser, args, node)
    site: dict[str, str] = {}
    if args.job_env_file is not None:
        try:
            site.update(read_env_file(args.job_env_file))
        except OSError as exc:
            parser.error(f"--job-env-file {args.job_env_file}: {exc.strerror or exc}")
        except (ValueError, UnicodeDecodeError) as exc:
            parser.error(f"--job-env-file {args.job_env_file}: {exc}")
    for text in args.job_env:
        try:
            name, value = parse_assignment(text)
        except ValueError as exc:
            parser.error(f"--job-env: {exc}")
        site[name] = value
    try:
        site = check_site_env(site)
    except ValueError as exc:
        parser.error(f"--job-env: {exc}")
    if not args.job_path or "\0" in args.job_path:
        parser.error("--job-path must be a non-empty PATH")
    wrapper = args.job_wrapper
    if wrapper is not None and not (os.path.isabs(wrapper) and os.access(wrapper, os.X_OK)):
        parser.error(f"--job-wrapper {wrapper}: not an executable file given by its absolute path")
    accounts = AccountPolicy.for_agent(
        node,
        jobs_as_agent=args.jobs_as_agent,
        allow_root=args.allow_root_jobs,
        jobs_as=args.jobs_as,
        min_uid=args.min_uid,
    )
    return JobSetup(accounts, args.job_path, site, wrapper)


def _check_jobs_as(parser: argparse.ArgumentParser, args: argparse.Namespace, node: str) -> None:
    """``--jobs-as USER``: an account of this node that jobs may run as, which this agent can switch to."""
    if args.jobs_as_agent:
        parser.error("give --jobs-as USER or --jobs-as-agent, not both")
    name = args.jobs_as
    if not ACCOUNT_NAME_RE.fullmatch(name):
        parser.error(f"--jobs-as {name!r} is not a POSIX account name")
    try:
        account = Account.of(pwd.getpwnam(name))
    except KeyError:
        parser.error(f"--jobs-as {name}: no such POSIX account on this node (create it: useradd {name})")
    if os.geteuid() != 0 and account.uid != os.geteuid():
        parser.error(f"--jobs-as {name}: only an agent running as root can run jobs as another account")
    policy = AccountPolicy(node, switch=True, allow_root=args.allow_root_jobs, min_uid=args.min_uid)
    refusal = policy.refusal(account)
    if refusal is not None:
        parser.error(f"--jobs-as: {refusal}")


def _lock_state_dir(state_dir: Path) -> IO[str] | None:
    """Two agents on one state dir would both adopt and kill the same jobs: allow only one."""
    handle = (state_dir / "agent.lock").open("a+", encoding="ascii")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def main(argv: Sequence[str] | None = None) -> int:
    """Run the agent; returns the process exit status (2: bad flags, 1: could not start, 0: stopped)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        host, port, family = parse_listen(args.listen)
    except ValueError as exc:
        parser.error(str(exc))
    for flag, value in (("--kill-grace", args.kill_grace), ("--keep-finished-days", args.keep_finished_days)):
        if not 0 <= value < float("inf"):
            parser.error(f"{flag} must be a non-negative number")
    if not 0 <= args.memory_release_wait <= MAX_MEMORY_RELEASE_WAIT_S:
        parser.error(f"--memory-release-wait must be between 0 and {MAX_MEMORY_RELEASE_WAIT_S:g} seconds")
    if args.max_log_bytes < 1024:
        parser.error("--max-log-bytes must be at least 1024")
    try:
        output_budget = cgroups.parse_bytes(args.output_budget)
    except ValueError as exc:
        parser.error(f"--output-budget: {exc}")
    if output_budget < 1024:
        parser.error("--output-budget must be at least 1024 bytes")
    if not 0 < args.output_team_share <= 1:
        parser.error("--output-team-share must be a fraction of the budget, more than 0 and at most 1")
    try:
        ports = parse_port_range(args.rendezvous_ports)
    except ValueError as exc:
        parser.error(str(exc))
    advertise = args.advertise_address
    if advertise is not None and not valid_host(advertise):
        parser.error(f"--advertise-address {advertise!r} is not an address or host name")
    if advertise is None and host not in ("", "0.0.0.0", "::"):
        advertise = host
    token = _read_token(parser, args.token_file)
    try:
        args.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        probe = args.state_dir / ".write-test"
        probe.write_text("", encoding="ascii")
        probe.unlink()
    except OSError as exc:
        parser.error(f"--state-dir {args.state_dir}: not a writable directory ({exc.strerror or exc})")
    backend = _make_backend(parser, args)
    node = args.node_name or socket.gethostname()
    setup = _job_setup(parser, args, node)

    lock = _lock_state_dir(args.state_dir)
    if lock is None:
        print(f"npuportal-agent: error: another agent is already using {args.state_dir}", file=sys.stderr)
        return 1
    keep = args.keep_finished_days * 86400 if args.keep_finished_days > 0 else None
    try:
        memory_max = cgroups.parse_bytes(args.job_memory_max) if args.job_memory_max else None
    except ValueError as exc:
        parser.error(f"--job-memory-max: {exc}")
    if args.job_cpu_max is not None and not 0 < args.job_cpu_max < float("inf"):
        parser.error("--job-cpu-max must be a positive number of cores")
    cgroup_root, cgroup_note = (
        (None, "disabled by --no-cgroups") if args.no_cgroups else cgroups.detect(args.cgroup_root)
    )
    if cgroup_root is None and args.cgroup_root is not None and not args.no_cgroups:
        parser.error(f"--cgroup-root: {cgroup_note}")
    jobs = JobManager(
        args.state_dir,
        backend,
        default_grace_s=args.kill_grace,
        keep_finished_s=keep,
        max_log_bytes=args.max_log_bytes,
        setup=setup,
        cgroup_root=cgroup_root,
        job_memory_max=memory_max,
        job_cpu_max=args.job_cpu_max,
        memory_release_wait_s=args.memory_release_wait,
        output=OutputLedger(output_budget, args.output_team_share),
    )
    jobs.rendezvous.configure(node=node, advertise=advertise, ports=ports)
    tracking = "own cgroup" if cgroup_root else "process tracking (environment mark and session)"
    print(f"npuportal-agent: jobs are stopped by {tracking}: {cgroup_note}", file=sys.stderr, flush=True)
    jobs.load()
    for warning in jobs.warnings:
        print(f"npuportal-agent: warning: {warning}", file=sys.stderr)
    try:
        server = AgentServer((host, port), AgentContext(node, backend, jobs, token), family)
    except OSError as exc:
        print(f"npuportal-agent: error: cannot listen on {args.listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    jobs.start()

    def stop(signum: int, frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, so it must not run on the serving thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound_host, bound_port = server.server_address[:2]
    print(
        f"npuportal-agent {AGENT_VERSION}: node {node}, backend {backend.name}, "
        f"listening on {bound_host}:{bound_port}, state {args.state_dir}, "
        f"{jobs.running_count()} job(s) running",
        file=sys.stderr,
        flush=True,
    )
    print(f"npuportal-agent: {setup.accounts.describe()}", file=sys.stderr, flush=True)
    print(
        f"npuportal-agent: job output kept within {size_words(output_budget)}, "
        f"one team's running jobs at most {args.output_team_share:.0%} of it",
        file=sys.stderr,
        flush=True,
    )
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        stopped = jobs.stop_all(args.kill_grace) if args.stop_jobs_on_exit else None
        jobs.close()
        lock.close()
    if stopped is not None:
        print(f"npuportal-agent: stopped, and stopped its {stopped} running job(s)", file=sys.stderr)
    else:
        print("npuportal-agent: stopped; running jobs keep running and are re-adopted on restart", file=sys.stderr)
    return 0
