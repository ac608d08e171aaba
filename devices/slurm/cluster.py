"""A single-host Slurm cluster of its own: munged, slurmdbd, slurmctld and one ``slurmd`` per node.

``make run EXECUTOR=slurm`` (when no ``SLURM_CONF`` is given) and the tests bring one up with this:
every daemon on 127.0.0.1 with a port of its own, every file in one folder, stopped by pid. Several
nodes share the host as Slurm allows (``NodeName=… NodeHostname=<this host> NodeAddr=127.0.0.1
Port=…``, started with ``slurmd -N name``), and their cards are character devices made in the
folder (``mknod …/dev/<node>/davinciN c 1 3``, the same device as ``/dev/null``), declared with
``AutoDetect=off``.

A node's cards are declared one of two ways, as a site may:

- **per card** (``per_card=True``): each card its own GRES type, ``Gres=npu:c0:1,…,npu:c7:1``, so a
  job can be given exactly the cards the portal chose (``--gres=npu:c3:1,npu:c5:1``);
- **by count** (``Gres=npu:8``): a job asks for a node and a count, and ``scontrol show job -d``
  says which cards (``IDX``) Slurm gave.

The chip model is the node's feature (``Features=910B4``). Accounting goes to slurmdbd on the local
MariaDB (root, no password, 127.0.0.1:3306) in a database of this cluster's own, dropped when it
stops; without MariaDB there is none (``accounting=False``). What was learnt bringing this up:

- ``sacctmgr`` talks to slurmdbd over munge's default socket unless ``AccountingStoragePass`` names
  another: the folder's munged is named there as well as in ``AuthInfo``.
- On a machine with fewer cores than the nodes declare, ``SlurmdParameters=config_overrides``
  keeps the declared CPUs (or each node would be INVALID: "Low CPUs").
- After a fatal slurmctld error the slurmds loop on registration and ignore SIGTERM: every wait has
  a deadline and every stop ends with SIGKILL.

``python -m devices.slurm.cluster up DIR`` / ``down DIR`` do the same from a shell.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: The Debian packages the cluster needs (``make test`` installs them when run as root).
PACKAGES = ("slurm-wlm", "slurmctld", "slurmd", "slurmdbd", "munge", "slurm-client")
#: The commands that must be on ``PATH``.
COMMANDS = ("munged", "slurmctld", "slurmd", "slurmdbd", "sbatch", "squeue", "sacct", "scontrol", "scancel", "sinfo")
STATE_FILE = "cluster.json"
#: How long a start may take on a loaded two-core machine before it is called failed.
START_DEADLINE_S = 120.0


@dataclass(frozen=True)
class SlurmNode:
    """One fake node: its name, chip model (its feature), cards, and how the cards are declared."""

    name: str
    chip: str = "910B4"
    cards: int = 8
    per_card: bool = True
    cpus: int = 16
    memory_mb: int = 64000


#: The test cluster of the project's integration tests: exact cards on two nodes, a count on one.
TEST_NODES = (
    SlurmNode("npu1", per_card=True),
    SlurmNode("npu2", per_card=True),
    SlurmNode("npu3", per_card=False),
)


class ClusterError(RuntimeError):
    """The cluster could not be started; the message says which daemon and what its log says."""


def missing_commands() -> list[str]:
    """The Slurm and munge commands not on ``PATH`` (empty when the cluster can run here)."""
    return [c for c in COMMANDS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _which(command: str) -> str:
    found = shutil.which(command) or (f"/usr/sbin/{command}" if Path("/usr/sbin", command).exists() else None)
    if found is None:
        raise ClusterError(f"{command} is not installed (apt-get install {' '.join(PACKAGES)})")
    return found


@dataclass
class LocalCluster:
    """A cluster in ``root``; :meth:`start` brings it up, :meth:`stop` takes every daemon down by pid."""

    root: Path
    nodes: Sequence[SlurmNode] = TEST_NODES
    name: str = "npuportal"
    accounting: bool = True
    partition: str = "main"
    #: Slurm's ``ReturnToService``: 2 brings a node an administrator set DOWN back as soon as its
    #: slurmd registers again; 1 (Slurm's default) keeps it down until ``State=RESUME``.
    return_to_service: int = 2
    #: Slurm's ``FirstJobId``: the id of the first job. A cluster started afresh counts from it again,
    #: so a caller whose database remembers job ids of an earlier cluster starts each one elsewhere.
    first_job_id: int = 1
    pids: dict[str, int] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)
    database: str = ""

    # -- paths --------------------------------------------------------------------------------------
    @property
    def conf(self) -> Path:
        return self.root / "etc" / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.root / "munge" / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this cluster's commands: ``SLURM_CONF``."""
        return {"SLURM_CONF": str(self.conf)}

    def device_path(self, node: str, index: int) -> Path:
        return self.root / "dev" / node / f"davinci{index}"

    # -- start and stop -----------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Write the configuration and start every daemon; wait until each node is idle."""
        started = time.monotonic()
        for command in COMMANDS:
            _which(command)
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("etc", "state", "log", "run", "spool", "out"):
            (self.root / sub).mkdir(exist_ok=True)
        self.root.chmod(0o755)
        (self.root / "out").chmod(0o1777)  # jobs run as people's accounts write their output here
        self.ports = {"ctld": free_port(), "dbd": free_port(), **{n.name: free_port() for n in self.nodes}}
        self._make_devices()
        self._start_munge()
        if self.accounting:
            self.database = f"npuportal_slurm_{secrets.token_hex(4)}"
            self._mysql(f"CREATE DATABASE {self.database}")
        self._write_configs()
        try:
            if self.accounting:
                self._spawn("slurmdbd", [_which("slurmdbd"), "-D"])
                self._wait(lambda: self._run(["sacctmgr", "-n", "-P", "show", "cluster"]) is not None, "slurmdbd")
                if self._run(["sacctmgr", "-i", "add", "cluster", self.name]) is None:
                    raise ClusterError(f"sacctmgr could not add cluster {self.name}: {self._tail('slurmdbd')}")
            self._spawn("slurmctld", [_which("slurmctld"), "-D", "-i"])
            for node in self.nodes:
                self._spawn(f"slurmd-{node.name}", [_which("slurmd"), "-D", "-N", node.name])
            self._wait(self._all_idle, "the nodes to be idle")
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - started
        self._save()
        return self

    def stop(self) -> None:
        """SIGTERM every daemon, SIGKILL what is left after 5 s (slurmd may ignore SIGTERM), drop the database."""
        for name, pid in list(self.pids.items()):
            if name.startswith("slurmd-") or name == "slurmstepd":
                _signal(pid, signal.SIGKILL)
            else:
                _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_alive(p) for p in self.pids.values()):
            time.sleep(0.1)
        for pid in self.pids.values():
            _signal(pid, signal.SIGKILL)
        for proc in getattr(self, "_procs", {}).values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self._kill_steps()
        self.pids.clear()
        if self.database:
            self._mysql(f"DROP DATABASE IF EXISTS {self.database}", check=False)
            self.database = ""
        state = self.root / STATE_FILE
        if state.exists():
            state.unlink()

    # -- faults, for the tests that break the cluster on purpose ----------------------------------------
    def _argv(self, name: str) -> list[str]:
        """How daemon ``name`` is started (``slurmctld``, ``slurmd-<node>``), as :meth:`start` does."""
        if name == "slurmctld":
            return [_which("slurmctld"), "-D", "-i"]
        if name.startswith("slurmd-"):
            return [_which("slurmd"), "-D", "-N", name.removeprefix("slurmd-")]
        raise ClusterError(f"no daemon {name!r} to restart (slurmctld or slurmd-<node>)")

    def kill_daemon(self, name: str, signum: int = signal.SIGTERM) -> None:
        """Stop one daemon by its pid (SIGKILL after :data:`START_DEADLINE_S` if it ignores ``signum``)."""
        pid = self.pids.pop(name)
        _signal(pid, signum)
        proc = getattr(self, "_procs", {}).pop(name, None)
        deadline = time.monotonic() + START_DEADLINE_S
        while _alive(pid) and time.monotonic() < deadline:
            if proc is not None and proc.poll() is not None:
                break
            time.sleep(0.1)
        if _alive(pid):
            _signal(pid, signal.SIGKILL)
        if proc is not None:
            proc.wait(timeout=30)

    def restart_daemon(self, name: str) -> None:
        """Start a daemon :meth:`kill_daemon` stopped again, and wait until every node is up (idle or busy)."""
        self._spawn(name, self._argv(name))
        self._wait(self._all_up, f"{name} to be back")
        self._save()

    def _all_up(self) -> bool:
        """Every node answers (``sinfo``): idle, mixed or allocated, none down or still not responding."""
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %T"])
        if out is None:
            return False
        states = dict(line.split() for line in out.splitlines() if line.strip())
        up = ("idle", "mix", "mixed", "alloc", "allocated", "completing")
        return len(states) == len(self.nodes) and all(s.rstrip("*~#!%$@^-") in up for s in states.values())

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pieces -------------------------------------------------------------------------------------
    def _make_devices(self) -> None:
        for node in self.nodes:
            folder = self.root / "dev" / node.name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(node.cards):
                path = self.device_path(node.name, i)
                if not path.exists():
                    os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))

    def _start_munge(self) -> None:
        key_dir = self.root / "munge-key"
        key_dir.mkdir(mode=0o700, exist_ok=True)
        key = key_dir / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
        sock_dir = self.munge_socket.parent
        sock_dir.mkdir(exist_ok=True)
        sock_dir.chmod(0o755)
        argv = [
            _which("munged"),
            "--foreground",
            "--force",
            f"--socket={self.munge_socket}",
            f"--key-file={key}",
            f"--log-file={self.root / 'log' / 'munged.log'}",
            f"--pid-file={self.root / 'run' / 'munged.pid'}",
            f"--seed-file={self.root / 'run' / 'munged.seed'}",
        ]
        self._spawn("munged", argv)
        self._wait(self.munge_socket.exists, "munged's socket")

    def _write_configs(self) -> None:
        host = socket.gethostname()
        r = self.root
        lines = [
            f"ClusterName={self.name}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={self.ports['ctld']}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "CredType=cred/munge",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool' / '%n'}",
            f"SlurmctldPidFile={r / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'run' / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'log' / 'slurmd-%n.log'}",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SchedulerType=sched/backfill",
            # Only the backfill pass starts a heterogeneous job (a multi-node run whose nodes take
            # different --gres): every second here rather than Slurm's default 30 s.
            "SchedulerParameters=bf_interval=1",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "GresTypes=npu",
            "MinJobAge=600",
            f"ReturnToService={self.return_to_service}",
            f"FirstJobId={self.first_job_id}",
            "MpiDefault=none",
            "KillWait=5",
            "InactiveLimit=0",
            "SlurmctldTimeout=30",
            "SlurmdTimeout=30",
            "JobCompType=jobcomp/none",
        ]
        if self.accounting:
            lines += [
                "AccountingStorageType=accounting_storage/slurmdbd",
                "AccountingStorageHost=127.0.0.1",
                f"AccountingStoragePort={self.ports['dbd']}",
                f"AccountingStoragePass={self.munge_socket}",
                "AccountingStorageTRES=gres/npu",
                "AccountingStoreFlags=job_comment",
            ]
        gres = ["AutoDetect=off"]
        for node in self.nodes:
            if node.per_card:
                declared = ",".join(f"npu:c{i}:1" for i in range(node.cards))
                gres += [
                    f"NodeName={node.name} Name=npu Type=c{i} File={self.device_path(node.name, i)}"
                    for i in range(node.cards)
                ]
            else:
                declared = f"npu:{node.cards}"
                files = self.root / "dev" / node.name / f"davinci[0-{node.cards - 1}]"
                gres.append(f"NodeName={node.name} Name=npu File={files}")
            lines.append(
                f"NodeName={node.name} NodeHostname={host} NodeAddr=127.0.0.1 Port={self.ports[node.name]} "
                f"CPUs={node.cpus} RealMemory={node.memory_mb} Gres={declared} Features={node.chip} State=UNKNOWN"
            )
        names = ",".join(n.name for n in self.nodes)
        lines.append(f"PartitionName={self.partition} Nodes={names} Default=YES MaxTime=INFINITE State=UP")
        self.conf.write_text("\n".join(lines) + "\n")
        (self.conf.parent / "gres.conf").write_text("\n".join(gres) + "\n")
        if self.accounting:
            dbd = self.conf.parent / "slurmdbd.conf"
            dbd.write_text(
                "\n".join(
                    [
                        "AuthType=auth/munge",
                        f"AuthInfo=socket={self.munge_socket}",
                        "DbdHost=localhost",
                        "DbdAddr=127.0.0.1",
                        f"DbdPort={self.ports['dbd']}",
                        "SlurmUser=root",
                        f"LogFile={r / 'log' / 'slurmdbd.log'}",
                        f"PidFile={r / 'run' / 'slurmdbd.pid'}",
                        "StorageType=accounting_storage/mysql",
                        "StorageHost=127.0.0.1",
                        "StoragePort=3306",
                        "StorageUser=root",
                        f"StorageLoc={self.database}",
                    ]
                )
                + "\n"
            )
            dbd.chmod(0o600)

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.root / "log" / f"{name}.out", "ab")  # the daemon holds it from here
        proc = subprocess.Popen(
            argv,
            env={**os.environ, **self.env},
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.pids[name] = proc.pid
        self.__dict__.setdefault("_procs", {})[name] = proc

    def _run(self, argv: list[str], timeout: float = 10) -> str | None:
        try:
            done = subprocess.run(
                argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=timeout, check=False
            )
        except (subprocess.TimeoutExpired, OSError):
            return None
        return done.stdout if done.returncode == 0 else None

    def _all_idle(self) -> bool:
        out = self._run(["sinfo", "-h", "-N", "-o", "%N %T"])
        if out is None:
            return False
        states = dict(line.split() for line in out.splitlines() if line.strip())
        bad = [n for n, s in states.items() if s.startswith(("inval", "drain", "down"))]
        if bad:
            raise ClusterError(f"node(s) {', '.join(bad)} came up {states[bad[0]]}: {self._tail('slurmctld')}")
        return len(states) == len(self.nodes) and all(s == "idle" for s in states.values())

    def _wait(self, condition: object, what: str) -> None:
        deadline = time.monotonic() + START_DEADLINE_S
        while time.monotonic() < deadline:
            for name, proc in getattr(self, "_procs", {}).items():
                if proc.poll() is not None:
                    why = f"{name} exited ({proc.returncode}) while waiting for {what}"
                    raise ClusterError(f"{why}: {self._tail(name)}")
            if callable(condition) and condition():
                return
            time.sleep(0.1)
        raise ClusterError(f"timed out waiting for {what}: {self._tail('slurmctld')}")

    def _tail(self, name: str, lines: int = 5) -> str:
        for candidate in (f"{name}.log", f"{name}.out"):
            path = self.root / "log" / candidate
            if path.exists():
                text = path.read_text(errors="replace").strip().splitlines()[-lines:]
                return " | ".join(text)
        return "(no log)"

    def _mysql(self, statement: str, *, check: bool = True) -> None:
        client = shutil.which("mariadb") or shutil.which("mysql")
        if client is None:
            raise ClusterError("no mariadb client: start with accounting=False")
        done = subprocess.run(
            [client, "-h", "127.0.0.1", "-P", "3306", "-u", "root", "-e", statement],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if check and done.returncode != 0:
            raise ClusterError(f"MariaDB refused {statement!r}: {done.stderr.strip()}")

    def _kill_steps(self) -> None:
        """Job steps (slurmstepd and the job's processes) left by the slurmds just killed.

        A job's processes carry this cluster's ``SLURM_CONF`` and a ``SLURM_JOB_ID`` in their
        environment (a ``sleep`` the batch script started names neither the spool nor the script);
        a shell that merely exported ``SLURM_CONF`` to run ``squeue`` has no job id and is left alone.
        """
        spool = str(self.root / "spool")
        conf = f"SLURM_CONF={self.conf}\0"
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                cmdline = (proc_dir / "cmdline").read_bytes().decode(errors="replace")
                environ = (proc_dir / "environ").read_bytes().decode(errors="replace")
            except OSError:
                continue
            ours = conf in environ
            stepd = cmdline.startswith("slurmstepd") and ours
            job = ours and ("\0SLURM_JOB_ID=" in environ or environ.startswith("SLURM_JOB_ID="))
            if (stepd or job or spool in cmdline) and int(proc_dir.name) not in _ancestors():
                _signal(int(proc_dir.name), signal.SIGKILL)

    def _save(self) -> None:
        data = {"pids": self.pids, "ports": self.ports, "database": self.database, "conf": str(self.conf)}
        data["nodes"] = [asdict(n) for n in self.nodes]
        (self.root / STATE_FILE).write_text(json.dumps(data, indent=2))

    @classmethod
    def load(cls, root: Path) -> LocalCluster:
        """The cluster :meth:`start` left running in ``root`` (to stop it from another process)."""
        data = json.loads((root / STATE_FILE).read_text())
        cluster = cls(root, nodes=tuple(SlurmNode(**n) for n in data["nodes"]))
        cluster.pids, cluster.ports, cluster.database = data["pids"], data["ports"], data["database"]
        return cluster


def _ancestors() -> set[int]:
    """This process and its parents: never signalled, whatever their environment says."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def running(root: Path, **options: object) -> Iterator[LocalCluster]:
    """``with running(tmp_path) as cluster:`` a cluster for the block, stopped whatever happens."""
    cluster = LocalCluster(root, **options)  # type: ignore[arg-type]
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devices.slurm.cluster", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a cluster in DIR and print its SLURM_CONF")
    up.add_argument("dir", type=Path)
    up.add_argument("--no-accounting", action="store_true", help="no slurmdbd (no MariaDB here)")
    down = sub.add_parser("down", help="stop the cluster running in DIR")
    down.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    root = args.dir.resolve()
    if args.command == "up":
        try:
            cluster = LocalCluster(root, accounting=not args.no_accounting).start()
        except ClusterError as exc:
            print(f"slurm cluster: {exc}", file=sys.stderr)
            return 1
        stop = f"python -m devices.slurm.cluster down {root}"
        print(f"SLURM_CONF={cluster.conf}  (up in {cluster.started_in_s:.1f} s; stop: {stop})")
        return 0
    if not (root / STATE_FILE).exists():
        print(f"slurm cluster: no cluster running in {root}", file=sys.stderr)
        return 1
    LocalCluster.load(root).stop()
    print(f"slurm cluster in {root}: stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
