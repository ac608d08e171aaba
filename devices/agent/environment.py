"""The environment a job starts with: a documented set of variables, and nothing of the agent's own.

The agent holds secrets in its environment (on a demo host: ``DATABASE_URL``, ``REDIS_URL``, the
portal's ``NPUPORTAL_*``), so a job never inherits it. A job sees, in this order (a later layer wins):

1. the base: ``PATH`` (:data:`DEFAULT_JOB_PATH` or ``--job-path``), ``HOME``, ``USER``, ``LOGNAME``
   and ``SHELL`` of the account it runs as, ``LANG`` (the agent's, else ``C.UTF-8``), and ``LC_ALL``
   and ``TZ`` when the agent has them;
2. the site's fixed variables of this node (``--job-env NAME=VALUE``, ``--job-env-file FILE``);
3. what the submitter asked for (the job's ``env``), which may not set a :func:`reserved` name;
4. what the backend and the launch plan set: device variables (``ASCEND_RT_VISIBLE_DEVICES``,
   ``CUDA_VISIBLE_DEVICES``, ``NPUPORTAL_VNPU_*``) and the rendezvous of a multi-node job;
5. ``NPUPORTAL_JOB_ID`` and ``NPUPORTAL_TEAM``; the job's identity in the portal by Slurm's names
   (``SLURM_JOB_ID``, ``SLURM_JOB_NAME``) and, for a copy of a job array, which copy it is
   (``NPUPORTAL_ARRAY_*``, ``SLURM_ARRAY_*``: :func:`identity_env`).

The portal validates a submission with :func:`check_submitted_env` too (the same rules, one place),
so a bad ``env`` is refused when it is submitted, not when it reaches a node.
Standard library only, like the rest of the agent.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from devices.agent.accounts import AccountPolicy

#: ``PATH`` of a job unless the agent is given ``--job-path``: the system's directories only.
DEFAULT_JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: What a variable name may look like (POSIX shells take nothing else).
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: At most this many variables in a job's ``env``.
MAX_ENV_VARS = 64
#: At most this many bytes (UTF-8) of names and values in a job's ``env``, ``NAME=VALUE`` each.
MAX_ENV_BYTES = 16 * 1024

#: Set by the agent from the account the job runs as, or the node: a submitter may not change them.
BASE_NAMES = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ")
#: The devices a job may use: set by the backend, never by the submitter (the job would leave its cards).
DEVICE_NAMES = (
    "ASCEND_RT_VISIBLE_DEVICES",
    "ASCEND_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
#: The rendezvous of a multi-node job: the same on every part, so set by the launch, not the submitter.
RENDEZVOUS_NAMES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "NNODES",
    "NODE_RANK",
    "NPROC_PER_NODE",
    "RANK_TABLE_FILE",
)
#: Would run code of the submitter's choosing inside the agent's own job wrapper (``runner.py``).
LOADER_NAMES = ("LD_PRELOAD", "LD_AUDIT")
#: The job in the portal and its place in an array, by Slurm's names, so Slurm scripts run unchanged
#: (:func:`identity_env`); with ``NPUPORTAL_ARRAY_ID``, ``_INDEX`` and ``_COUNT``.
SLURM_NAMES = (
    "SLURM_JOB_ID",
    "SLURM_JOB_NAME",
    "SLURM_ARRAY_JOB_ID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_COUNT",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_MAX",
)
#: Names the agent owns, besides :data:`RESERVED_NAMES`.
RESERVED_PREFIX = "NPUPORTAL_"
RESERVED_NAMES = frozenset((*BASE_NAMES, *DEVICE_NAMES, *RENDEZVOUS_NAMES, *LOADER_NAMES, *SLURM_NAMES))
#: An array's id as the portal gives it (``A`` and the id of its first job).
_ARRAY_ID_RE = re.compile(r"A[0-9]{1,18}")


def reserved(name: str) -> bool:
    """Whether the agent, not the submitter, decides this variable."""
    return name in RESERVED_NAMES or name.startswith(RESERVED_PREFIX)


def check_submitted_env(env: object) -> dict[str, str]:
    """The submitter's ``env`` checked: an object of at most 64 string values, 16 KiB, no reserved name.

    Raises ``ValueError`` with a sentence saying what is wrong (the caller names the field ``env``).
    """
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise ValueError("must be an object of NAME: value strings")
    if len(env) > MAX_ENV_VARS:
        raise ValueError(f"has {len(env)} variables; at most {MAX_ENV_VARS} are allowed")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"name {name!r} is not a valid variable name (letters, digits, _; no digit first)")
        if reserved(name):
            raise ValueError(f"{name} is set by the node agent and cannot be given (see docs/agent.md#environment)")
        if not isinstance(value, str):
            raise ValueError(f"{name} must be a string")
        if "\0" in value:
            raise ValueError(f"{name} must not contain NUL characters")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{name} must be valid text") from None
        checked[name] = value
    total = env_bytes(checked)
    if total > MAX_ENV_BYTES:
        raise ValueError(f"is {total:,} bytes; at most {MAX_ENV_BYTES:,} bytes of names and values are allowed")
    return checked


def env_bytes(env: Mapping[str, str]) -> int:
    """Bytes of a checked ``env`` as its limit counts them: ``NAME=VALUE`` in UTF-8, for each variable."""
    return sum(len(name) + 1 + len(value.encode("utf-8")) for name, value in env.items())


def check_site_env(env: Mapping[str, str]) -> dict[str, str]:
    """A site's fixed variables (``--job-env``, ``--job-env-file``): any valid name but the agent's own.

    A site may set ``PATH``, ``LD_LIBRARY_PATH`` or a toolkit's variables; it may not set the job's
    identity, its devices or the rendezvous, which the agent decides per job.
    """
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not ENV_NAME_RE.fullmatch(name):
            raise ValueError(f"{name!r} is not a variable name")
        if name.startswith(RESERVED_PREFIX) or name in DEVICE_NAMES or name in RENDEZVOUS_NAMES:
            raise ValueError(f"{name} is set by the agent for each job")
        if name in ("HOME", "USER", "LOGNAME", "SHELL"):
            raise ValueError(f"{name} comes from the account the job runs as")
        if "\0" in value:
            raise ValueError(f"{name} must not contain NUL characters")
        checked[name] = value
    return checked


def parse_assignment(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` (the value may be empty, and may hold ``=``); ``ValueError`` otherwise."""
    name, sep, value = text.partition("=")
    if not sep or not ENV_NAME_RE.fullmatch(name):
        raise ValueError(f"{text!r} is not NAME=VALUE")
    return name, value


def read_env_file(path: Path) -> dict[str, str]:
    """``NAME=VALUE`` lines; blank lines and ``#`` comments are skipped; no quoting, no expansion.

    Deliberately not a shell: a site that needs a script's effects (CANN's ``set_env.sh``) uses
    ``--job-wrapper``, which runs the script in the job itself.
    """
    env: dict[str, str] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("export "):
            stripped = stripped[len("export ") :].lstrip()
        try:
            name, value = parse_assignment(stripped)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        env[name] = value
    return env


def locale_env(agent_env: Mapping[str, str]) -> dict[str, str]:
    """``LANG`` (the agent's, else ``C.UTF-8``), ``LC_ALL`` and ``TZ`` when the agent has them."""
    out = {"LANG": agent_env.get("LANG") or "C.UTF-8"}
    for name in ("LC_ALL", "TZ"):
        if agent_env.get(name):
            out[name] = agent_env[name]
    return out


def identity_env(portal_job: object) -> dict[str, str]:
    """The variables that tell a job which job, and which copy of an array, it is; ``ValueError`` if malformed.

    ``portal_job`` is the launch's ``{"id": 12, "name": "sweep[3]", "array": {"id": "A10", "index": 3,
    "count": 16, "min": 0, "max": 15}}`` (``array`` only for a copy of a job array); ``None`` gives
    none (a launch from a portal that sends none). Slurm's names mean what they mean under Slurm:
    ``SLURM_ARRAY_JOB_ID`` is the array's first job's id, ``SLURM_ARRAY_TASK_ID`` the copy's index.
    """
    if portal_job is None:
        return {}
    if not isinstance(portal_job, Mapping):
        raise ValueError("must be an object {id, name, array}")
    job_id, name = portal_job.get("id"), portal_job.get("name")
    if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id < 1:
        raise ValueError("id must be the job's id in the portal, a whole number >= 1")
    if not isinstance(name, str) or not name.isprintable() or len(name) > 200:
        raise ValueError("name must be printable text of at most 200 characters")
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_NAME": name}
    array = portal_job.get("array")
    if array is None:
        return env
    if (
        not isinstance(array, Mapping)
        or not isinstance(array.get("id"), str)
        or not _ARRAY_ID_RE.fullmatch(array["id"])
    ):
        raise ValueError("array must be an object whose id is an array id such as A10")
    numbers = {}
    for key in ("index", "count", "min", "max"):
        value = array.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"array.{key} must be a whole number >= 0")
        numbers[key] = str(value)
    env.update(
        {
            "NPUPORTAL_ARRAY_ID": array["id"],
            "NPUPORTAL_ARRAY_INDEX": numbers["index"],
            "NPUPORTAL_ARRAY_COUNT": numbers["count"],
            "SLURM_ARRAY_JOB_ID": array["id"][1:],
            "SLURM_ARRAY_TASK_ID": numbers["index"],
            "SLURM_ARRAY_TASK_COUNT": numbers["count"],
            "SLURM_ARRAY_TASK_MIN": numbers["min"],
            "SLURM_ARRAY_TASK_MAX": numbers["max"],
        }
    )
    return env


def build_job_env(
    *,
    job_id: str,
    team: str | None,
    home: str,
    user: str,
    shell: str,
    submitted: Mapping[str, str],
    plan_env: Mapping[str, str],
    site_env: Mapping[str, str] | None = None,
    job_path: str = DEFAULT_JOB_PATH,
    agent_env: Mapping[str, str] | None = None,
    identity: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The whole environment of one job, built from nothing (see the module's docstring for the layers).

    ``agent_env`` is read for the locale only (default: this process's environment); nothing else
    of it is copied. ``identity``: :func:`identity_env` of the launch.
    """
    env = {"PATH": job_path, "HOME": home, "USER": user, "LOGNAME": user, "SHELL": shell}
    env.update(locale_env(os.environ if agent_env is None else agent_env))
    env.update(site_env or {})
    env.update({k: v for k, v in submitted.items() if not reserved(k)})
    env.update(plan_env)
    env["NPUPORTAL_JOB_ID"] = job_id
    if team:
        env["NPUPORTAL_TEAM"] = team
    env.update(identity or {})
    return env


@dataclass(frozen=True)
class JobSetup:
    """What this node's agent adds to every job: its ``PATH``, fixed variables, wrapper and account rule."""

    accounts: AccountPolicy
    job_path: str = DEFAULT_JOB_PATH
    site_env: Mapping[str, str] = field(default_factory=dict)
    #: A program run as ``WRAPPER /bin/sh -c COMMAND`` (``--job-wrapper``), e.g. one that sources CANN's set_env.sh.
    wrapper: str | None = None

    @classmethod
    def default(cls) -> JobSetup:
        """An agent's defaults: submitters' accounts when root, no site variables, no wrapper."""
        return cls(AccountPolicy.for_agent(socket.gethostname()))
