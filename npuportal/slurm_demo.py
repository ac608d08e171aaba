"""The Slurm of ``make run EXECUTOR=slurm``: a local one of the project's own, or the site's.

Without ``SLURM_CONF`` (or ``NPUPORTAL_SLURM_CONF``) the supervisor brings up a single-host Slurm
with :mod:`devices.slurm.cluster` — three nodes named as the demo's 910B4 nodes, each card its own
GRES type on ``ascend-b4-01`` and ``-02``, a count (``npu:8``) on ``ascend-b4-03``, slurmdbd on the
local MariaDB when there is one — and stops its daemons by pid when it stops. Its folder is named
``var/slurm``: a link to a fresh folder in the system's temporary directory, because the demo's jobs
run as an unprivileged account that must reach the cluster's configuration (``scontrol`` in a job
reads it) and its output folder, while ``var/`` stays its owner's alone (``npuportal/demo_accounts.py``).
A previous run's cluster still running there (a supervisor killed with SIGKILL) is stopped first.

With ``SLURM_CONF`` given it is the site's Slurm: none is started or stopped.

No Django here: the supervisor imports it before anything else runs.
"""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devices.slurm.cluster import PACKAGES, STATE_FILE, ClusterError, LocalCluster, SlurmNode, missing_commands

#: The demo's cluster: named as the demo's 910B4 nodes, so the import keeps two and adds the third.
DEMO_NODES = (
    SlurmNode("ascend-b4-01", per_card=True),
    SlurmNode("ascend-b4-02", per_card=True),
    SlurmNode("ascend-b4-03", per_card=False),
)
#: The commands the portal itself calls on a site's Slurm (devices/executors/slurm.py).
CLIENT_COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel")
#: The prefix of the cluster's folder in the system's temporary directory.
FOLDER_PREFIX = "npuportal-run-slurm-"


def site_conf() -> str:
    """The site's ``slurm.conf`` when one is given (``NPUPORTAL_SLURM_CONF``, else ``SLURM_CONF``), else empty."""
    return os.environ.get("NPUPORTAL_SLURM_CONF", "").strip() or os.environ.get("SLURM_CONF", "").strip()


def missing() -> str:
    """One line saying what to install when this machine cannot run ``make run EXECUTOR=slurm``; empty when it can."""
    if site_conf():
        lacking = [c for c in CLIENT_COMMANDS if shutil.which(c) is None]
        if lacking:
            return (
                f"make run EXECUTOR=slurm: Slurm's commands are not installed here (no {', '.join(lacking)}): "
                "apt-get install slurm-client"
            )
        return ""
    lacking = missing_commands()
    if lacking:
        return (
            f"make run EXECUTOR=slurm: Slurm is not installed here (no {', '.join(lacking)}): "
            f"apt-get install {' '.join(PACKAGES)}, or give SLURM_CONF=<your site's slurm.conf>"
        )
    return ""


@dataclass
class DemoSlurm:
    """The Slurm the run uses: ``conf`` for the portal, and the local cluster when the run started one."""

    conf: str
    cluster: LocalCluster | None = None

    @property
    def output_dir(self) -> str:
        """Where runs without an ``output`` write (the local cluster's ``out/``, writable by every account)."""
        return str(self.cluster.root / "out") if self.cluster else os.environ.get("NPUPORTAL_SLURM_OUTPUT_DIR", "")

    def env(self) -> dict[str, str]:
        """The portal's settings for this Slurm (``NPUPORTAL_SLURM_*``), for every child process."""
        env = {"NPUPORTAL_EXECUTOR": "slurm", "NPUPORTAL_SLURM_CONF": self.conf, "SLURM_CONF": self.conf}
        if self.output_dir:
            env["NPUPORTAL_SLURM_OUTPUT_DIR"] = self.output_dir
        return env

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def start(var: Path) -> DemoSlurm:
    """The site's Slurm when ``SLURM_CONF`` names one, else a local cluster started in ``var/slurm``.

    :class:`ClusterError` when the local cluster does not come up (every daemon it started is stopped).
    """
    conf = site_conf()
    if conf:
        return DemoSlurm(conf)
    root = fresh_folder(var)
    accounting = bool(shutil.which("mariadb") or shutil.which("mysql"))
    first = first_job_id()
    cluster = LocalCluster(root, nodes=DEMO_NODES, accounting=accounting, first_job_id=first)
    try:
        cluster.start()
    except ClusterError:
        if not accounting:
            raise
        # MariaDB is installed but does not answer: a cluster without accounting still runs jobs.
        cluster = LocalCluster(root, nodes=DEMO_NODES, accounting=False, first_job_id=first)
        cluster.start()
    except BaseException:  # Ctrl-C while it comes up: nothing of it is left running
        cluster.stop()
        raise
    return DemoSlurm(str(cluster.conf), cluster)


def first_job_id(now: float | None = None) -> int:
    """The first Slurm job id of this run's cluster: the seconds since 2026 (below Slurm's ``MaxJobId``).

    Each run's cluster is new and would count from 1 again, while the portal's database still holds
    the Slurm ids of the jobs the last run left running: a new job given such an id would be taken
    for the old one. Counting from the clock, a run's ids follow the last run's unless it started
    more jobs than seconds passed between the two starts.
    """
    seconds = int(time.time() if now is None else now) - 1767225600  # 2026-01-01T00:00:00Z
    return 1 + seconds % 60_000_000


def fresh_folder(var: Path) -> Path:
    """A new folder for the cluster, linked as ``var/slurm``; the previous run's is stopped and removed."""
    link = var / "slurm"
    if link.is_symlink() or link.exists():
        old = link.resolve()
        if (old / STATE_FILE).exists():
            print(f"supervisor | stopping the cluster a previous run left in {old}", flush=True)
            LocalCluster.load(old).stop()
        if link.is_symlink():
            link.unlink()
            if _ours(old):
                shutil.rmtree(old, ignore_errors=True)
        else:
            shutil.rmtree(link, ignore_errors=True)
    var.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
    link.symlink_to(root, target_is_directory=True)
    return root


def _ours(path: Path) -> bool:
    """A folder :func:`fresh_folder` made: in the temporary directory, with its prefix, owned by this account."""
    try:
        info = path.lstat()
    except OSError:
        return False
    in_tmp = path.parent == Path(tempfile.gettempdir()).resolve()
    return in_tmp and path.name.startswith(FOLDER_PREFIX) and stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def main() -> int:
    """``python -m npuportal.slurm_demo``: exit 1 with the one line of what to install, else 0 (``make run``)."""
    line = missing()
    if line:
        print(line, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
