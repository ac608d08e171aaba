"""The account the demo's jobs run as: never root, never the account that holds the portal's secrets.

``make run`` starts one simulated agent per demo node. Its users have no POSIX accounts, so every job
runs as one account, picked here for the agents' command lines:

* under root, the unprivileged ``npuportal-demo`` (``NPUPORTAL_DEMO_JOB_ACCOUNT``), made with
  ``useradd`` when it is missing (no home, no login shell, uid 1000 or above as ``useradd`` gives),
  else ``nobody``; the agents get ``--jobs-as <account>``. ``var/`` (the database, the secret key,
  the agents' tokens and state, every job's output) is made ``0700``, so that account reaches none of it;
* otherwise, the account running ``make run``: it is already unprivileged (``--jobs-as-agent``).

``make run EXECUTOR=slurm`` runs no agents: the same account is given to ``sbatch --uid`` through
``NPUPORTAL_SLURM_JOBS_AS`` (:func:`demo_slurm_jobs_as`).

No Django here: the supervisor imports it before anything else runs.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import stat
import subprocess
from pathlib import Path

#: The demo's job account when ``make run`` runs as root.
DEMO_JOB_ACCOUNT = "npuportal-demo"
#: Used when the demo's own account cannot be made (no ``useradd``): present on every Linux system.
FALLBACK_ACCOUNT = "nobody"


@functools.cache
def demo_job_flags(var: Path) -> tuple[str, ...]:
    """The agent flags that choose the demo jobs' account (see the module docstring); made once per run."""
    if os.geteuid() != 0:
        return ("--jobs-as-agent",)
    keep_private(var)
    return ("--jobs-as", demo_account())


def demo_slurm_jobs_as(var: Path) -> str:
    """``NPUPORTAL_SLURM_JOBS_AS`` of ``make run EXECUTOR=slurm``: the account above under root, else empty.

    Run by anyone else, ``sbatch`` runs a job as the account that submits it, unprivileged already.
    """
    if os.geteuid() != 0:
        return ""
    keep_private(var)
    return demo_account()


def demo_account() -> str:
    """The name of an unprivileged account for the demo's jobs, made when missing (root only)."""
    name = os.environ.get("NPUPORTAL_DEMO_JOB_ACCOUNT", DEMO_JOB_ACCOUNT)
    if _exists(name):
        return name
    useradd = shutil.which("useradd") or "/usr/sbin/useradd"
    argv = [useradd, "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin"]
    argv += ["--comment", "npuportal demo jobs", name]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0 or _exists(name):  # made, or by another `make run` at the same moment
            return name
        why = done.stderr.strip() or f"status {done.returncode}"
    except OSError as exc:
        why = exc.strerror or str(exc)
    print(f"supervisor | could not create the account {name} ({why}); demo jobs run as {FALLBACK_ACCOUNT}", flush=True)
    return FALLBACK_ACCOUNT


def _exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def keep_private(var: Path) -> None:
    """Make ``var`` its owner's alone (0700), so a job's account reaches nothing below it.

    Only a directory this process owns, and never a shared one such as ``/tmp`` (sticky or
    writable by others), is changed.
    """
    try:
        info = var.stat()
    except OSError:
        return
    shared = info.st_mode & (stat.S_ISVTX | stat.S_IWOTH)
    if info.st_uid == os.geteuid() and not shared and stat.S_IMODE(info.st_mode) != 0o700:
        var.chmod(0o700)
