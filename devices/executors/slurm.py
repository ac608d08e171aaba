"""A Slurm cluster as an executor: the portal decides who runs where and when, Slurm runs it.

``NPUPORTAL_EXECUTOR=slurm``. Everything goes through Slurm's command-line tools on ``PATH``
(``sbatch``, ``squeue``, ``sacct``, ``scontrol``, ``scancel``), with the cluster's ``SLURM_CONF``
(``settings.NPUPORTAL_SLURM_CONF``, else the process's own): they are the dependable interface of
Debian's Slurm 22.05 (its slurmrestd has no JWT plugin; ``sacct --json`` reports wrong exit codes).
Every call has a timeout and none goes through a shell.

- **launch**: each start the tick decided is one ``sbatch`` of a batch script (``#!/bin/bash``,
  the job's environment as ``export`` lines, then its command) with ``--comment=npuportal:<job
  id>:<attempt>``. Before submitting, ``squeue`` is asked for that comment, so a launch retried
  after a lost answer (or a worker killed mid-submission) never submits twice. The node is pinned
  (``-w``); where the node declares each card as its own GRES type (``npu:c0:1,…``) the exact cards
  the portal chose are asked for (``--gres=npu:c3:1,npu:c5:1``), otherwise a count
  (``--gres=npu:2``), and the cards Slurm gave (``scontrol show job -d``, ``IDX``) are read back and
  recorded on the job's allocations. Slurm's job id is kept in ``Job.agent_job_id``.
- **multi-node**: a job on N nodes is one Slurm job with one task per node (:func:`multinode_script`):
  ``--nodes=N --nodelist=a,b --gres=…`` when every node takes the same ``--gres``, else a
  heterogeneous job of one component per node (``#SBATCH hetjob``; only Slurm's backfill pass
  starts one, every ``bf_interval``). The batch script, on node rank 0 (the first node by name, as
  the agents rank them), takes a free ``MASTER_PORT``, has each node record its cards and their IPs
  (``/etc/hccn.conf``, ``hccn_tool``), writes the HCCL rank table with the agents' own code
  (:mod:`devices.agent.ranktable`, run by ``python3`` there), then ``srun`` runs the command once
  per node with the agents' rendezvous variables (``Rendezvous.env``: ``NODE_RANK``,
  ``RANK_TABLE_FILE``…) and the node's own cards, each node's output to its own file. The first
  part to fail ends the others (``--kill-on-bad-exit``) and the run, with its exit code and node.
  A heterogeneous job's components (``12+0``, ``12+1``) are read as the one job ``12``.
- **arrays**: each copy is a job of its own, told its index as the agents tell it
  (``SLURM_ARRAY_TASK_ID``, ``NPUPORTAL_ARRAY_INDEX``… of ``identity_env``), not a Slurm array.
- **stop**: ``scancel --full --signal=TERM``, then ``scancel`` after the grace.
- **observe**: ``squeue`` says what is still queued or running; a job that left it is looked up in
  ``sacct`` (``scontrol show job`` where there is no accounting) and its end goes through the
  transitions with the agents' words: ``COMPLETED`` finishes, ``FAILED`` fails with ``exit code 3``,
  ``TIMEOUT`` is ``timeout``, ``OUT_OF_MEMORY`` ``out_of_memory``, ``NODE_FAIL`` is requeued as
  ``node_fail`` without costing a retry, a cancel from outside the portal is ``Killed``. A Slurm job
  of ours the database no longer runs is cancelled.
- **inventory**: the nodes and cards ``scontrol show node`` lists.
- **nodes' service**: a node Slurm drains or downs is drained or unreachable in the portal at each
  observation, and an operator's cordon, drain or uncordon in the portal drains or resumes the node
  in Slurm (``devices.slurm.health``).

- **outside jobs**: the cards Slurm jobs without the portal's comment hold are marked at each
  observation (:mod:`devices.slurm.foreign`), so the tick gives none of them; a run Slurm keeps
  pending longer than ``NPUPORTAL_SLURM_PENDING_S`` after the portal started it (it lost its cards
  to such a job) is withdrawn and its job queued again in its place (``HeldInSlurm``).

Not yet: vNPU slices (refused at launch, with the reason).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import shlex
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from devices.agent.environment import build_job_env, identity_env
from devices.agent.exit_words import exit_words
from devices.agent.jobs import read_log
from devices.executors.base import EVICT_GRACE_S, Observation, ServedNode, runs_ended
from devices.slurm import survey
from devices.slurm.commands import SlurmError, expand_hostlist, expand_indexes, key_values, run, slurm_env
from devices.slurm.foreign import HOLDING_STATES, HeldCards, parse_job_details, record_outside_use
from devices.slurm.health import reconcile, slurm_reason
from npuportal.cluster_lock import lock_cluster
from quotas.models import posix_account
from scheduling import transitions
from scheduling.launch_spec import output_file
from scheduling.models import Allocation, Job

log = logging.getLogger(__name__)

#: What the ``--comment`` of a job the portal submitted looks like: its job id and attempt.
COMMENT_RE = re.compile(r"npuportal:([0-9]+):([0-9]+)")
#: Slurm's states of a job that is not over (``squeue``'s default listing holds only these).
ACTIVE_STATES = frozenset(
    {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING", "SIGNALING", "STOPPED"}
)
#: The state given a job Slurm neither lists, accounts for nor remembers (gone past ``MinJobAge`` without accounting).
LOST = "LOST"
#: Ends the system caused, not the job: requeued in its place without costing a retry (as an agent's shutdown).
SYSTEM_ENDS = frozenset({"NODE_FAIL", "BOOT_FAIL", "PREEMPTED", "REQUEUE_FED", "REQUEUE_HOLD"})
#: The bash lines that find the cards Slurm gave a job that asked for a count (``npu:2``): Slurm
#: sets no card variable for a GRES named ``npu``, so ``ASCEND_RT_VISIBLE_DEVICES`` is read from
#: ``scontrol show job -d`` (``Nodes=npu3 … GRES=npu:2(IDX:2-3)``, the line of the node it runs on,
#: ``SLURMD_NODENAME``) and its ranges written out (``2,3``).
COUNT_CARDS_SCRIPT = r"""_npu_idx=$(scontrol show job -d "$SLURM_JOB_ID" 2>/dev/null \
  | sed -n 's/^ *Nodes=\([^ ]*\) .*GRES=[^ ]*IDX:\([^)]*\)).*/\1 \2/p' \
  | while read -r _n _x; do
      if scontrol show hostnames "$_n" 2>/dev/null | grep -qxF "$SLURMD_NODENAME"; then echo "$_x"; break; fi
    done)
_npu_list=""
IFS=, read -ra _npu_parts <<< "$_npu_idx"
for _p in "${_npu_parts[@]}"; do
  if [[ $_p == *-* ]]; then
    for ((_i=${_p%-*}; _i<=${_p#*-}; _i++)); do _npu_list+="${_npu_list:+,}$_i"; done
  else
    _npu_list+="${_npu_list:+,}$_p"
  fi
done
export ASCEND_RT_VISIBLE_DEVICES="$_npu_list"
unset _npu_idx _npu_list _npu_parts _p _i _n _x
"""


# --------------------------------------------------------------------------------------------------
# the commands


@dataclass(frozen=True)
class QueuedJob:
    """One line of ``squeue``: a Slurm job that is not over (or, with ``-t all``, recently over)."""

    slurm_id: str
    state: str
    comment: str
    nodes: str
    user: str
    started: datetime | None = None
    #: Why Slurm keeps it pending (``Resources``, ``Priority``); ``None`` when it runs.
    reason: str = ""
    #: When Slurm got it (``sbatch``'s time).
    submitted: datetime | None = None

    @property
    def portal_run(self) -> tuple[int, int] | None:
        """``(job id, attempt)`` when the portal submitted it (its comment says so)."""
        found = COMMENT_RE.fullmatch(self.comment)
        return (int(found.group(1)), int(found.group(2))) if found else None


def squeue(*, every_state: bool = False) -> dict[str, QueuedJob]:
    """Slurm's jobs by id: those not over, or with ``every_state`` those the controller still remembers."""
    argv = ["squeue", "-h", "-o", "%i|%T|%u|%N|%S|%V|%r|%k"]
    if every_state:
        argv += ["-t", "all"]
    found: dict[str, QueuedJob] = {}
    for line in run(argv).splitlines():
        parts = line.split("|", 7)
        if len(parts) == 8:
            slurm_id, state, user, nodes, started, submitted, reason, comment = (p.strip() for p in parts)
            queued = QueuedJob(slurm_id, state, comment, nodes, user, _when(started), reason, _when(submitted))
            leader, plus, _offset = slurm_id.partition("+")
            if plus:  # a component of a heterogeneous job (``12+1``): one job, the leader's id
                queued = _fold_component(found.get(leader), replace(queued, slurm_id=leader), first=_offset == "0")
            found[queued.slurm_id] = queued
    return found


def _fold_component(seen: QueuedJob | None, component: QueuedJob, *, first: bool) -> QueuedJob:
    """A heterogeneous job as one: the state, times and reason of its first component, every component's nodes."""
    if seen is None:
        return component
    lead, other = (component, seen) if first else (seen, component)
    nodes = ",".join(n for n in (lead.nodes, other.nodes) if n)
    return replace(lead, nodes=nodes)


@dataclass(frozen=True)
class EndedJob:
    """How a Slurm job ended: its state (``CANCELLED by 0``), exit status and signal, nodes, end time."""

    slurm_id: str
    state: str
    exit_code: int
    signal: int
    nodes: str
    ended_at: datetime | None
    started_at: datetime | None = None

    @property
    def base_state(self) -> str:
        return self.state.split()[0] if self.state else ""

    @property
    def code(self) -> int:
        """The status as the agents give it: the exit code, or minus the signal that ended it."""
        return -self.signal if self.signal else self.exit_code


def parse_exit(text: str) -> tuple[int, int]:
    """``(exit code, signal)`` of sacct's ``3:0``; ``(0, 0)`` for anything else."""
    code, _, sig = text.partition(":")
    try:
        return int(code), int(sig or 0)
    except ValueError:
        return 0, 0


def _when(text: str) -> datetime | None:
    """A time Slurm prints (``2026-12-03T17:52:29``, the host's local time) as an aware datetime."""
    try:
        return datetime.fromisoformat(text).astimezone()
    except ValueError:
        return None


def parse_sacct(text: str) -> dict[str, EndedJob]:
    """``sacct -n -P -o JobID,State,ExitCode,NodeList,End,Start`` lines by job id (``Start`` may be left out).

    Steps (``12.batch``) are read only for the batch step's status: a job Slurm ended at its time
    limit or cancelled shows ``0:0`` on its own line and the signal (``0:15``) on its batch step's,
    and the agents' words for such an end name the signal (``killed by signal SIGTERM``).
    """
    found: dict[str, EndedJob] = {}
    batch: dict[str, tuple[int, int]] = {}
    others: dict[str, list[EndedJob]] = {}
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 5:
            continue
        slurm_id, state, exit_text, nodes, end = (p.strip() for p in parts[:5])
        code, sig = parse_exit(exit_text)
        job_id, dot, step = slurm_id.partition(".")
        job_id, plus, offset = job_id.partition("+")  # a heterogeneous job's component: ``12+1``
        if dot:
            if step == "batch":
                batch[job_id] = (code, sig)
            continue
        started = _when(parts[5].strip()) if len(parts) > 5 else None
        ended = EndedJob(job_id, state, code, sig, nodes, _when(end), started)
        if plus and offset != "0":
            others.setdefault(job_id, []).append(ended)
        else:
            found[job_id] = ended
    for slurm_id, components in others.items():
        if slurm_id in found:
            found[slurm_id] = _fold_ends(found[slurm_id], components)
    for slurm_id, (code, sig) in batch.items():
        ended = found.get(slurm_id)
        if ended is not None and (ended.exit_code, ended.signal) == (0, 0) and ended.base_state != "COMPLETED":
            found[slurm_id] = replace(ended, exit_code=code, signal=sig)
    return found


def _fold_ends(first: EndedJob, others: Sequence[EndedJob]) -> EndedJob:
    """A heterogeneous job's end as one: its first component's (the batch script's), every node.

    A component the system ended (``NODE_FAIL`` on its node) ends the whole job so.
    """
    nodes = ",".join(e.nodes for e in (first, *others) if e.nodes)
    ends = [e.ended_at for e in (first, *others) if e.ended_at is not None]
    folded = replace(first, nodes=nodes, ended_at=max(ends) if ends else None)
    system = [e for e in others if e.base_state in SYSTEM_ENDS]
    if system and folded.base_state not in SYSTEM_ENDS:
        folded = replace(folded, state=system[0].state)
    return folded


def ended_jobs(slurm_ids: Sequence[str]) -> dict[str, EndedJob]:
    """How these jobs ended: ``sacct``'s text output, else ``scontrol show job`` (no accounting, or not yet in it).

    An end accounted without its status yet (:func:`_status_unknown`) takes the controller's.
    """
    if not slurm_ids:
        return {}
    found: dict[str, EndedJob] = {}
    try:
        found = parse_sacct(
            run(["sacct", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,End,Start", "-j", ",".join(slurm_ids)])
        )
    except SlurmError as exc:
        log.info("sacct could not say how jobs ended (%s); asking the controller", exc)
    for slurm_id in slurm_ids:
        accounted = found.get(slurm_id)
        if accounted is not None and accounted.base_state not in ACTIVE_STATES and not _status_unknown(accounted):
            continue
        try:
            # A heterogeneous job is a line per component, its first component's first.
            lines = run(["scontrol", "show", "job", "-o", slurm_id]).splitlines() or [""]
            fields = key_values(lines[0])
            nodes = ",".join(n for n in (key_values(line).get("NodeList", "") for line in lines) if n)
        except SlurmError as exc:
            if "invalid job id" in str(exc).lower() and slurm_id not in found:
                found[slurm_id] = EndedJob(slurm_id, LOST, 0, 0, "", None)  # neither accounted for nor remembered
            continue
        code, sig = parse_exit(fields.get("ExitCode", ""))
        state = fields.get("JobState", "")
        if accounted is not None and accounted.base_state not in ACTIVE_STATES:
            # Accounted, but without its batch step's status yet: the controller's is the same one.
            if state and state not in ACTIVE_STATES and (code, sig) != (0, 0):
                found[slurm_id] = replace(accounted, exit_code=code, signal=sig)
            continue
        if state and state not in ACTIVE_STATES:
            found[slurm_id] = EndedJob(
                slurm_id,
                state,
                code,
                sig,
                nodes,
                _when(fields.get("EndTime", "")),
                _when(fields.get("StartTime", "")),
            )
    return found


def _status_unknown(ended: EndedJob) -> bool:
    """Whether ``sacct`` gave this end without the status that says how it ended.

    A job Slurm stopped (``TIMEOUT``, ``CANCELLED``) reads ``0:0`` on its own line; the signal is on
    its batch step's line, which can reach the accounting a moment after the job's (slurmdbd is
    told of each apart), so an observation right after the end may find the job's line alone.
    """
    return ended.base_state not in {"COMPLETED", *SYSTEM_ENDS} and (ended.exit_code, ended.signal) == (0, 0)


def cards_given(slurm_id: str) -> dict[str, list[int]]:
    """The cards Slurm gave a running job, by node (``scontrol show job -d``: ``Nodes=npu3 … GRES=npu:2(IDX:2-3)``)."""
    given: dict[str, list[int]] = {}
    for line in run(["scontrol", "show", "job", "-d", slurm_id]).splitlines():
        found = re.search(r"\bNodes=(\S+)\s.*\bGRES=(\S+)", line)
        if found:
            indexes = sorted({i for idx in re.findall(r"IDX:([0-9,-]+)", found.group(2)) for i in expand_indexes(idx)})
            given.update({node: list(indexes) for node in expand_hostlist(found.group(1))})  # ``npu[1-2]``: each
    return given


@dataclass(frozen=True)
class SlurmNodeLayout:
    """One node as Slurm declares it: its cards, and whether each card is its own GRES type."""

    name: str
    cards: tuple[int, ...]
    per_card: bool
    state: str
    #: Where the other nodes of a multi-node job reach it (``NodeAddr``): ``MASTER_ADDR``, its ``server_id``.
    address: str = ""


def node_layouts() -> dict[str, SlurmNodeLayout]:
    """Slurm's nodes by name (``scontrol show node -o``, read by :func:`devices.slurm.survey.nodes`)."""
    return {n.name: SlurmNodeLayout(n.name, n.cards, n.per_card, n.state, n.address) for n in survey.nodes()}


#: A job Slurm has run for less than this may not have its processes yet: Slurm shows it ``RUNNING``
#: while its node still sets up the batch step (loading the account's environment for ``--uid``),
#: and a signal sent then is lost. Such a job is sent SIGTERM again each second until it is this old.
YOUNG_S = 5.0


def _signal_term(slurm_ids: Sequence[str]) -> None:
    try:
        run(["scancel", "--full", "--signal=TERM", *slurm_ids])
    except SlurmError as exc:
        log.info("scancel --signal=TERM %s: %s", ",".join(slurm_ids), exc)


def _cancel(slurm_ids: Sequence[str]) -> None:
    try:
        run(["scancel", *slurm_ids])
    except SlurmError as exc:
        log.warning("scancel %s: %s", ",".join(slurm_ids), exc)


def scancel(slurm_ids: Sequence[str], *, grace_s: float) -> None:
    """SIGTERM every process of these jobs, then cancel what is still there after ``grace_s``.

    A job still pending in Slurm has no process to signal: it is cancelled at once. A job that
    has only just started is sent SIGTERM again until it is :data:`YOUNG_S` old (see there).
    """
    if not slurm_ids:
        return
    try:
        active: dict[str, QueuedJob] | None = squeue()
    except SlurmError:
        active = None
    if active is not None:
        pending = [s for s in slurm_ids if s in active and active[s].state == "PENDING"]
        if pending:
            _cancel(pending)
        left = [s for s in slurm_ids if s in active and s not in pending]
    else:
        left = list(slurm_ids)
    if not left:
        return
    _signal_term(left)
    signalled = time.monotonic()
    deadline = signalled + grace_s
    while left and time.monotonic() < deadline:
        time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        try:
            active = squeue()
        except SlurmError:
            break
        left = [s for s in left if s in active]
        now = timezone.now()
        young = [
            s for s in left if active[s].started is not None and (now - active[s].started).total_seconds() < YOUNG_S
        ]
        if young and time.monotonic() - signalled >= 1.0:
            _signal_term(young)
            signalled = time.monotonic()
    if left:
        _cancel(left)


# --------------------------------------------------------------------------------------------------
# what a job is told and where its output goes


def output_dir() -> Path:
    """Where a run's output goes when its job names no ``output`` (``NPUPORTAL_SLURM_OUTPUT_DIR``).

    Shared storage on a multi-host cluster: the portal reads it back for the job's log.
    """
    configured = getattr(settings, "NPUPORTAL_SLURM_OUTPUT_DIR", "")
    return Path(configured) if configured else Path(settings.BASE_DIR) / "var" / "slurm-output"


def account_of(job: Job) -> pwd.struct_passwd:
    """The POSIX account the job runs as: its submitter's when the portal runs as root, else the portal's own.

    ``NPUPORTAL_SLURM_JOBS_AS`` names one account for every job instead (the demo's, as the demo
    agents' ``--jobs-as``); root is refused either way.
    """
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid())
    name = getattr(settings, "NPUPORTAL_SLURM_JOBS_AS", "") or posix_account(job.submitter)
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise LaunchRefused(f"no POSIX account {name!r} here to run the job as (sbatch --uid)") from None
    if entry.pw_uid == 0:
        raise LaunchRefused(f"account {name!r} is root; jobs never run as root through Slurm")
    return entry


def start_dir(job: Job, account: pwd.struct_passwd) -> str:
    """``--chdir``: the job's ``cwd``, else its account's home when there is one, else ``/tmp``."""
    if job.cwd:
        return job.cwd
    return account.pw_dir if account.pw_dir and os.path.isdir(account.pw_dir) else "/tmp"


def run_output(
    job: Job, attempt: int, node: str, account: pwd.struct_passwd | None = None, *, first: bool = True
) -> Path:
    """The file a run's output on ``node`` goes to: the job's ``output`` (patterns filled in) or one of its own.

    Without an ``output``, ``<job>.<attempt>.out`` on the run's first node (``first``, as for every
    single-node run) and ``<job>.<attempt>.<node>.out`` on the other nodes of a multi-node run.
    """
    if not job.output:
        return output_dir() / (f"{job.pk}.{attempt}.out" if first else f"{job.pk}.{attempt}.{node}.out")
    path = Path(output_file(job, node))
    if not path.is_absolute():
        path = Path(start_dir(job, account or account_of(job))) / path
    return path


def batch_script(job: Job, env: dict[str, str], *, count_cards: bool) -> str:
    """The batch script: the environment as ``export`` lines, the cards of a count request, the command."""
    lines = ["#!/bin/bash", f"# npuportal job {job.pk}"]
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(env.items())]
    if count_cards:
        lines.append(COUNT_CARDS_SCRIPT.rstrip("\n"))
    lines.append(job.command)
    return "\n".join(lines) + "\n"


def job_env(job: Job, run_id: str, account: pwd.struct_passwd, cards: Sequence[int] | None) -> dict[str, str]:
    """The documented job environment (docs/agent.md#environment) as the agents build it.

    Slurm's own ``SLURM_JOB_ID`` and ``SLURM_JOB_NAME`` stay Slurm's (``srun`` in the script needs
    them); ``NPUPORTAL_JOB_ID`` is the portal's run. ``cards``: the exact cards, ``None`` when
    Slurm chooses them (the script reads them back).
    """
    from devices.executors.agents import portal_job

    identity = {k: v for k, v in identity_env(portal_job(job)).items() if k not in {"SLURM_JOB_ID", "SLURM_JOB_NAME"}}
    plan = {"ASCEND_RT_VISIBLE_DEVICES": ",".join(str(c) for c in cards)} if cards is not None else {}
    return build_job_env(
        job_id=run_id,
        team=job.team.name,
        home=account.pw_dir,
        user=account.pw_name,
        shell=account.pw_shell or "/bin/sh",
        submitted={"JOB_NAME": job.name, "JOB_TEAM": job.team.name, **(job.env or {})},
        plan_env=plan,
        identity=identity,
    )


# --------------------------------------------------------------------------------------------------
# a job on several nodes

#: Bash lines, run on node rank 0 (where the batch script runs), that move ``MASTER_PORT`` past ports
#: something already listens on there: the port each process is given is one the job can bind.
PORT_SCRIPT = """for _npu_try in $(seq 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$MASTER_PORT") 2>/dev/null || break
  MASTER_PORT=$((MASTER_PORT + 1))
done
export MASTER_PORT
unset _npu_try"""
#: What each node's task of the gathering step writes to ``<folder>/<node>.cards``: its cards (first
#: line), ``/etc/hccn.conf``, and ``hccn_tool``'s answer for each card (``## card N`` before each).
GATHER_SCRIPT = r"""{
  echo "$ASCEND_RT_VISIBLE_DEVICES"
  cat /etc/hccn.conf 2>/dev/null
  if command -v hccn_tool >/dev/null 2>&1; then
    for _c in ${ASCEND_RT_VISIBLE_DEVICES//,/ }; do echo "## card $_c"; hccn_tool -i "$_c" -ip -g 2>/dev/null; done
  fi
} > "$1/$SLURMD_NODENAME.cards"
"""
#: The end of the program that writes the rank table on node rank 0 (after :mod:`devices.agent.ranktable`'s
#: source): each node's ``.cards`` file gives its cards and their IPs as the agents read them (the
#: file first, then ``hccn_tool``); ``argv``: the folder, the table's path, then ``node=address`` in rank order.
RANK_TABLE_MAIN = """
def _main(folder, table, nodes):
    import json, os, pathlib
    servers = []
    for item in nodes:
        node, _, address = item.partition("=")
        text = (pathlib.Path(folder) / (node + ".cards")).read_text()
        first, _, rest = text.partition("\\n")
        conf, *tools = rest.split("## card ")
        ips = parse_hccn_conf(conf)
        for tool in tools:
            card, _, answer = tool.partition("\\n")
            if card.strip().isdigit() and int(card) not in ips and parse_hccn_tool_ip(answer):
                ips[int(card)] = parse_hccn_tool_ip(answer)
        cards = [int(c) for c in first.split(",") if c.strip().isdigit()]
        servers.append(ServerCards(address, tuple((c, ips.get(c, "")) for c in cards)))
    part = table + ".part"
    pathlib.Path(part).write_text(json.dumps(build_rank_table(servers), indent=2) + "\\n")
    os.replace(part, table)


import sys
_main(sys.argv[1], sys.argv[2], sys.argv[3:])
"""


#: Each node's task of the run: its variables, then the command, its output to the node's file. The
#: first part to fail writes ``<node> <exit code>`` to ``failed`` (``set -C``: only the first does);
#: ``srun --kill-on-bad-exit`` then ends the other parts.
PART_SCRIPT = r""". "$1/node.sh" || exit 1
bash "$1/command.sh" >>"$_npu_out" 2>&1
_npu_rc=$?
if [ "$_npu_rc" -ne 0 ]; then (set -C; echo "$SLURMD_NODENAME $_npu_rc" > "$1/failed") 2>/dev/null; fi
exit "$_npu_rc"
"""
#: After the run's step: the run ends with the exit code of its first part to fail, named as the agents
#: name it (``the part on ascend-b4-02 failed (exit code 3)``), not with that of a part ended after it.
ENDING_SCRIPT = r"""_npu_rc=$?
if [ -s "$_npu_dir/failed" ]; then
  read -r _npu_node _npu_rc < "$_npu_dir/failed"
  echo "npuportal: the part on $_npu_node failed (exit code $_npu_rc)" >&2
fi
exit "$_npu_rc"
"""


def rendezvous_dir(job_id: int, attempt: int) -> Path:
    """Where a multi-node run keeps its rank table and its nodes' scripts: the shared output folder."""
    return output_dir() / f"{job_id}.{attempt}.rendezvous"


def failed_part(job_id: int, attempt: int) -> str | None:
    """The node of a multi-node run whose part failed first (its ``failed`` file: :data:`PART_SCRIPT`), if one did."""
    try:
        words = (rendezvous_dir(job_id, attempt) / "failed").read_text().split()
    except OSError:
        return None
    return words[0] if words else None


def node_env(job: Job, attempt: int, parts: Sequence[NodePart]) -> list[dict[str, str]]:
    """Each node's rendezvous variables, node rank 0 first: what the agents give each part (``Rendezvous.env``).

    ``MASTER_ADDR`` and the rank table's ``server_id`` are Slurm's ``NodeAddr`` of each node;
    ``MASTER_PORT`` is where node rank 0 starts looking for a free port (:data:`PORT_SCRIPT`), in
    the agents' default range; ``ASCEND_RT_VISIBLE_DEVICES`` is the node's own cards where they are exact.
    """
    from devices.agent.ranktable import ServerCards
    from devices.agent.rendezvous import DEFAULT_PORTS, Rendezvous

    low, high = DEFAULT_PORTS
    servers = tuple(ServerCards(p.layout.address or p.node, tuple((c, "") for c in p.cards)) for p in parts)
    table = rendezvous_dir(job.pk, attempt) / "ranktable.json"
    found = []
    for rank, part in enumerate(parts):
        env = Rendezvous(servers[0].server_id, low + job.pk % (high - low + 1), rank, servers).env(table)
        if part.layout.per_card:
            env["ASCEND_RT_VISIBLE_DEVICES"] = ",".join(str(c) for c in part.cards)
        found.append(env)
    return found


def multinode_script(
    job: Job, attempt: int, account: pwd.struct_passwd, parts: Sequence[NodePart], *, heterogeneous: bool
) -> str:
    """The batch script of a run on several nodes: one task per node, each with its node's environment.

    It runs on node rank 0. It writes ``node.sh`` (each node's variables, by ``SLURMD_NODENAME``) and
    the job's command to the run's folder on shared storage (:func:`rendezvous_dir`), takes a free
    ``MASTER_PORT``, runs a first step on every node that records its cards and their IPs, writes
    the HCCL rank table from them with the agents' own code (``python3`` on node rank 0), then runs
    the command once per node (``srun``, one task per node, ended on every node if one fails), each
    node's output to its own file (:func:`run_output`).
    """
    import inspect

    from devices.agent import ranktable

    folder = rendezvous_dir(job.pk, attempt)
    common = job_env(job, f"{job.pk}.{attempt}", account, None)
    per_node = node_env(job, attempt, parts)
    common["MASTER_PORT"] = per_node[0].pop("MASTER_PORT")
    lines = ["#!/bin/bash"]
    if heterogeneous:
        for n, part in enumerate(parts):
            if n:
                lines.append("#SBATCH hetjob")
            lines.append(f"#SBATCH --nodelist={part.node} --nodes=1 --ntasks-per-node=1 --gres={part.gres}")
        step = ["srun", "--export=ALL", "--kill-on-bad-exit=1", f"--het-group={','.join(map(str, range(len(parts))))}"]
    else:
        step = ["srun", "--export=ALL", "--kill-on-bad-exit=1", f"--nodes={len(parts)}", f"--ntasks={len(parts)}"]
        step.append("--ntasks-per-node=1")
    lines.append(f"# npuportal job {job.pk}: {len(parts)} nodes, one task on each")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in sorted(common.items())]
    cases = ['case "$SLURMD_NODENAME" in']
    for n, (part, env) in enumerate(zip(parts, per_node, strict=True)):
        env.pop("MASTER_PORT", None)
        out = run_output(job, attempt, part.node, account, first=n == 0)
        assigned = " ".join(f"{name}={shlex.quote(value)}" for name, value in sorted(env.items()))
        cases.append(f"  {shlex.quote(part.node)})")
        cases.append(f"    export {assigned}")
        cases.append(f"    _npu_out={shlex.quote(str(out))}")
        if not part.layout.per_card:
            cases += ["    " + line for line in COUNT_CARDS_SCRIPT.rstrip("\n").splitlines()]
        cases.append("    ;;")
    cases += ['  *) echo "npuportal: $SLURMD_NODENAME is not a node of this run" >&2; exit 1 ;;', "esac"]
    program = inspect.getsource(ranktable) + RANK_TABLE_MAIN
    addresses = [f"{part.node}={part.layout.address or part.node}" for part in parts]
    where = shlex.quote(str(folder))
    lines += [
        f"_npu_dir={where}",
        'mkdir -p -m 700 "$_npu_dir" || exit 1',
        f'printf "%s\\n" {shlex.quote(chr(10).join(cases))} > "$_npu_dir/node.sh"',
        f'printf "%s\\n" {shlex.quote(job.command)} > "$_npu_dir/command.sh"',
        PORT_SCRIPT,
        shlex.join([*step, "bash", "-c", '. "$1/node.sh" && ' + GATHER_SCRIPT, "_", str(folder)]) + " || exit 1",
        shlex.join(["python3", "-c", program, str(folder), str(folder / "ranktable.json"), *addresses]) + " || exit 1",
        shlex.join([*step, "bash", "-c", PART_SCRIPT, "_", str(folder)]),
        ENDING_SCRIPT,
    ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# launch


class LaunchRefused(ValueError):
    """A launch no retry can change (a vNPU slice, an account that does not exist): the job fails."""


@dataclass(frozen=True)
class Submission:
    """One run's ``sbatch``: its comment (the run's name in Slurm), arguments, script and account."""

    comment: str
    argv: list[str]
    script: str
    account: str


def _comment(job_id: int, attempt: int) -> str:
    return f"npuportal:{job_id}:{attempt}"


@dataclass(frozen=True)
class NodePart:
    """One node of a run: the cards the portal chose there and how Slurm declares that node's cards."""

    node: str
    cards: tuple[int, ...]
    layout: SlurmNodeLayout

    @property
    def gres(self) -> str:
        """``--gres``: the exact cards where each is its own GRES type, else a count (Slurm picks, read back)."""
        if self.layout.per_card:
            return ",".join(f"npu:c{c}:1" for c in self.cards)
        return f"npu:{len(self.cards)}"


def _parts(allocs: Sequence[Allocation], layouts: dict[str, SlurmNodeLayout]) -> list[NodePart]:
    """The run's nodes in node-name order (node rank 0 first, as the agents rank them); refuses a vNPU slice."""
    if any(a.vnpu_template_id is not None for a in allocs):
        raise LaunchRefused("a vNPU slice cannot run on Slurm through npuportal yet")
    cards: dict[str, list[int]] = {}
    for alloc in allocs:
        cards.setdefault(alloc.device.node.name, []).append(alloc.device.index)
    parts = []
    for node in sorted(cards):
        layout = layouts.get(node)
        if layout is None:
            raise LaunchRefused(f"Slurm has no node {node}")
        parts.append(NodePart(node, tuple(sorted(cards[node])), layout))
    if not parts:
        raise LaunchRefused("the job holds no cards")
    return parts


def _submission(
    job: Job, attempt: int, allocs: Sequence[Allocation], layouts: dict[str, SlurmNodeLayout]
) -> Submission:
    """The ``sbatch`` of one run; :class:`LaunchRefused` for what this executor cannot run.

    A run on one node is one task there. A run on several nodes is one Slurm job with one task per
    node (:func:`multinode_script`): ``--nodes=N --nodelist=a,b --gres=…`` when every node gets the
    same ``--gres``, else a heterogeneous job of one component per node (``#SBATCH hetjob``).
    """
    parts = _parts(allocs, layouts)
    account = account_of(job)
    chdir = start_dir(job, account)
    out = run_output(job, attempt, parts[0].node, account)
    if not job.output:
        _make_output_dir(out.parent)
    argv = [
        "sbatch",
        "--parsable",
        f"--job-name={job.name}",
        f"--comment={_comment(job.pk, attempt)}",
    ]
    heterogeneous = len({part.gres for part in parts}) > 1
    if not heterogeneous:  # else each node's request is a component of the script's (#SBATCH hetjob)
        argv += [
            f"--nodelist={','.join(part.node for part in parts)}",
            f"--nodes={len(parts)}",
            "--ntasks-per-node=1",
            f"--gres={parts[0].gres}",
        ]
    argv += [
        f"--chdir={chdir}",
        f"--output={str(out).replace('%', '%%')}",
        "--open-mode=append",
        "--export=NONE",
        # The portal requeues (through its transitions, as a new attempt with its own comment);
        # a run Slurm requeued by itself would come back pending under the same id, behind its back.
        "--no-requeue",
    ]
    partition = getattr(settings, "NPUPORTAL_SLURM_PARTITION", "")
    if partition:
        argv.append(f"--partition={partition}")
    if os.geteuid() == 0:
        argv += [f"--uid={account.pw_uid}", f"--gid={account.pw_gid}"]
    if job.max_duration_s:
        elapsed = (timezone.now() - job.started_at).total_seconds() if job.started_at else 0
        argv.append(f"--time={max(1, -(-int(job.max_duration_s - elapsed) // 60))}")  # minutes, rounded up
    run_id = f"{job.pk}.{attempt}"
    if len(parts) == 1:
        part = parts[0]
        env = job_env(job, run_id, account, part.cards if part.layout.per_card else None)
        script = batch_script(job, env, count_cards=not part.layout.per_card)
    else:
        script = multinode_script(job, attempt, account, parts, heterogeneous=heterogeneous)
    return Submission(_comment(job.pk, attempt), argv, script, account.pw_name)


def _make_output_dir(path: Path) -> None:
    """The shared output folder; writable by every job's account (sticky, as ``/tmp``) when the portal makes it."""
    if not path.exists():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o1777)


def _submit(sub: Submission) -> str:
    """Slurm's job id of this run: the one already submitted under its comment, else a new ``sbatch``'s."""
    for queued in squeue(every_state=True).values():
        if queued.comment == sub.comment:
            return queued.slurm_id
    out = run(sub.argv, stdin=sub.script).strip()
    return out.split(";", 1)[0]


def _record_failure(job_id: int, attempt: int, text: str, *, for_good: bool) -> None:
    """A launch that did not take: failed for good, or retried by the next observation (then requeued)."""
    with transaction.atomic():
        lock_cluster()
        job = Job.objects.select_for_update().filter(pk=job_id).first()
        if job is None or job.state != Job.State.RUNNING:
            return
        now = timezone.now()
        run_id = f"{job_id}.{attempt}"
        if for_good:
            transitions.fail(job_id, reason="LaunchFailed", detail=f"run {run_id} not submitted to Slurm: {text}")
            return
        failures = transitions.record_launch_failure(job, at=now, detail=f"run {run_id}: {text}")
        if failures >= transitions.RETRY_BUDGET:
            transitions.requeue(
                job_id,
                reason="LaunchFailed",
                detail=f"Slurm refused run {run_id} {failures} times; last: {text}",
                at=now,
            )


def _launch_one(job_id: int, layouts: dict[str, SlurmNodeLayout]) -> tuple[bool, tuple[int, str, bool] | None]:
    """Submit the current run of one running job, holding its row the while.

    The lock makes the comment check and the ``sbatch`` one step: a launch retried by another
    worker (the tick's task and an observation's relaunch) waits, then finds the run by its comment.
    Returns ``(taken, failure)``, ``failure`` being ``(attempt, words, for good)`` to record after the commit.
    """
    from devices.executors.agents import current_attempts

    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",))
            .select_related("team", "submitter__profile")
            .filter(pk=job_id, state=Job.State.RUNNING)
            .first()
        )
        if job is None:
            return False, None
        attempt = current_attempts([job_id])[job_id]
        allocs = list(job.allocations.filter(end__isnull=True).select_related("device__node").order_by("device__index"))
        try:
            sub = _submission(job, attempt, allocs, layouts)
            slurm_id = _submit(sub)
        except LaunchRefused as exc:
            return False, (attempt, str(exc), True)
        except (SlurmError, OSError) as exc:
            return False, (attempt, str(exc), False)
        Job.objects.filter(pk=job_id).update(agent_job_id=slurm_id, launched=True, ran_as=sub.account)
    return True, None


class SlurmExecutor:
    """Jobs run by a Slurm cluster (``NPUPORTAL_EXECUTOR=slurm``; see the module docstring)."""

    name = "slurm"

    def __init__(self) -> None:
        #: Slurm jobs whose cards were read back after a count request (once each), by cluster
        #: (``SLURM_CONF``) and id: ids start again at 1 on another cluster. Kept to the jobs still queued.
        self._placed: set[tuple[str, str]] = set()

    # -- launch -------------------------------------------------------------------------------------
    def launch(self, job_ids: Iterable[int]) -> dict[int, bool]:
        from devices.executors.agents import current_attempts

        results: dict[int, bool] = {}
        layouts: dict[str, SlurmNodeLayout] | None = None
        for job_id in job_ids:
            taken = False
            failure: tuple[int, str, bool] | None = None
            if layouts is None:
                try:
                    layouts = node_layouts()  # once per batch of launches
                except SlurmError as exc:
                    failure = (current_attempts([job_id])[job_id], str(exc), False)
            if layouts is not None:
                taken, failure = _launch_one(job_id, layouts)
            results[job_id] = taken
            if failure is not None:  # after the job's lock: a transition takes the cluster's lock first
                attempt, text, for_good = failure
                log.warning("launch of job %s on Slurm failed: %s", job_id, text)
                _record_failure(job_id, attempt, text, for_good=for_good)
        return results

    # -- stop ---------------------------------------------------------------------------------------
    def stop(self, job_id: int, *, grace_s: float, cause: str) -> None:
        """Cancel the Slurm jobs of a job that no longer runs in the database (its stored one and any by comment)."""
        row = Job.objects.filter(pk=job_id).values("state", "agent_job_id").first()
        if row is None or row["state"] == Job.State.RUNNING:
            return
        ids = {row["agent_job_id"]} if row["agent_job_id"].isdigit() else set()
        try:
            ids |= {s for s, q in squeue().items() if q.portal_run is not None and q.portal_run[0] == job_id}
        except SlurmError as exc:
            log.info("could not list Slurm's jobs before stopping job %s: %s", job_id, exc)
        log.info("stopping job %s on Slurm (%s): %s", job_id, cause or "stop", ", ".join(sorted(ids)) or "nothing")
        scancel(sorted(ids), grace_s=grace_s)

    # -- observe ------------------------------------------------------------------------------------
    def observe(self) -> Observation:
        from devices.executors.agents import current_attempts

        summary = Observation()
        try:
            active = squeue()
        except SlurmError as exc:
            summary.failed = 1
            summary.errors["slurm"] = str(exc)
            return summary
        summary.polled = 1
        self._placed = {key for key in self._placed if key[1] in active}
        self._see_outside(active, summary)
        rows = list(Job.objects.filter(state=Job.State.RUNNING).values_list("pk", "agent_job_id", "started_at"))
        gone = [sid for _, sid, _ in rows if sid and sid not in active]
        try:
            ends = ended_jobs(gone)
        except SlurmError as exc:
            summary.errors["sacct"] = str(exc)
            ends = {}
        relaunch: list[int] = []
        pending_s = float(getattr(settings, "NPUPORTAL_SLURM_PENDING_S", 60))
        now = timezone.now()
        for pk, sid, started_at in rows:
            if not sid:
                relaunch.append(pk)
            elif sid in active:
                if active[sid].state == "RUNNING":
                    self._note_running(pk, active[sid])
                elif active[sid].state == "PENDING" and started_at:
                    # Counted from the later of the tick's start and the sbatch (a launch retried
                    # after the controller was away is not withdrawn for the time it was away).
                    since = max(started_at, active[sid].submitted or started_at)
                    if (now - since).total_seconds() > pending_s:
                        self._withdraw(pk, active[sid], (now - since).total_seconds(), summary)
            elif sid in ends:
                self._record_end(pk, sid, ends[sid], summary)
            else:
                summary.errors[str(pk)] = f"Slurm job {sid} is neither queued nor accounted for"
        # After the ends above, so that a job Slurm ended NODE_FAIL reads so: a node Slurm has down
        # requeues the jobs still running there (NodeUnreachable), whose runs are then stale.
        pushes = self._follow_nodes(summary)
        # After both: a run whose job was just requeued or ended is no longer the job's.
        attempts = current_attempts(Job.objects.filter(state=Job.State.RUNNING).values_list("pk", flat=True))
        stale = [
            q.slurm_id
            for q in active.values()
            if q.portal_run is not None
            and (q.portal_run[0] not in attempts or attempts[q.portal_run[0]] != q.portal_run[1])
        ]
        if stale:
            summary.stale_stopped.extend(stale)
            scancel(stale, grace_s=EVICT_GRACE_S)
        if relaunch:
            self.launch(relaunch)
            summary.relaunched.extend(relaunch)
        for node, in_service, reason in pushes:
            self.set_node_service(node, in_service=in_service, reason=reason)
        if summary.finished or summary.requeued:
            runs_ended(summary.finished + summary.requeued)
        return summary

    def _see_outside(self, active: dict[str, QueuedJob], summary: Observation) -> None:
        """Mark the cards held by jobs submitted to Slurm directly: the tick gives none of them (``foreign``)."""
        outside = [q for q in active.values() if q.portal_run is None and q.state in HOLDING_STATES]
        held: list[HeldCards] = []
        if outside:
            try:
                details = parse_job_details(run(["scontrol", "show", "job", "-d"]))
            except SlurmError as exc:
                summary.errors["outside"] = f"could not read the cards of jobs outside npuportal: {exc}"
                return
            held = [details[q.slurm_id] for q in outside if q.slurm_id in details]
        record_outside_use(held)
        summary.outside_cards = sum(len(c) for h in held for c in h.cards.values())

    def _withdraw(self, job_id: int, queued: QueuedJob, waited_s: float, summary: Observation) -> None:
        """A run Slurm still keeps pending long after the portal started it: queue the job again in its place.

        Usually it lost a race: a job submitted to Slurm directly took its cards between the
        observation that freed them and the ``sbatch``. The portal's decision no longer holds, so
        its cards go back to the tick (which now sees the outside job's) and the job keeps its
        submit time, without costing a retry. The pending Slurm job, no longer the job's run, is
        cancelled as a stale run at the end of this observation.
        """
        with transaction.atomic():
            lock_cluster()
            transitions.requeue(
                job_id,
                reason="HeldInSlurm",
                detail=f"Slurm kept job {queued.slurm_id} pending for {waited_s:.0f} s "
                f"({queued.reason or 'no reason given'}): its cards went to a job outside npuportal; "
                "queued again in its place",
                count_retry=False,
            )
        summary.requeued.append(job_id)
        summary.withdrawn.append(job_id)
        log.info("job %s withdrawn from Slurm (job %s pending: %s)", job_id, queued.slurm_id, queued.reason)

    def _note_running(self, job_id: int, queued: QueuedJob) -> None:
        """A run Slurm runs: keep who it runs as, when it started and, after a count request, the cards it got."""
        Job.objects.filter(pk=job_id, state=Job.State.RUNNING).exclude(ran_as=queued.user).update(ran_as=queued.user)
        if queued.started is not None:
            record_start(job_id, queued.started)
        key = (slurm_env().get("SLURM_CONF", ""), queued.slurm_id)
        if key in self._placed:
            return
        try:
            given = cards_given(queued.slurm_id)
        except SlurmError as exc:
            log.info("could not read the cards of Slurm job %s: %s", queued.slurm_id, exc)
            return
        self._placed.add(key)
        record_cards(job_id, given)

    def _record_end(self, job_id: int, slurm_id: str, ended: EndedJob, summary: Observation) -> None:
        state = ended.base_state
        code = ended.code
        where = ended.nodes or "its node"
        with transaction.atomic():
            lock_cluster()
            if ended.started_at is not None:  # a run shorter than the poll was never seen running
                record_start(job_id, ended.started_at)
            if state == LOST:
                transitions.requeue(
                    job_id,
                    reason="LostOnAgent",
                    detail=f"Slurm no longer knows job {slurm_id}: neither queued, accounted for nor remembered",
                )
                summary.requeued.append(job_id)
                return
            if state in SYSTEM_ENDS:
                transitions.requeue(
                    job_id,
                    reason="NodeFail",
                    detail=f"Slurm ended job {slurm_id} on {where} ({ended.state}): the system ended it, not the job; "
                    "queued again in its place",
                    count_retry=False,
                    at=ended.ended_at,
                    reported_at=ended.ended_at,
                )
                summary.requeued.append(job_id)
                return
            exit_code, reason, detail = outcome(ended)
            if reason != "Completed":
                # A multi-node job is one unit: the part that failed first ended it, named as the agents name it.
                from devices.executors.agents import current_attempts

                failing = failed_part(job_id, current_attempts([job_id])[job_id])
                if failing:
                    detail = f"on {failing}: {detail}"
            transitions.finish(job_id, exit_code=exit_code, ended_at=ended.ended_at, detail=detail, reason=reason)
        summary.finished.append(job_id)
        log.info("Slurm job %s of job %s ended %s (%s)", slurm_id, job_id, state, exit_words(code))

    # -- inventory and the nodes' service ----------------------------------------------------------
    def inventory(self) -> list[ServedNode]:
        return [ServedNode(n.name, n.cards) for n in sorted(node_layouts().values(), key=lambda n: n.name)]

    def _follow_nodes(self, summary: Observation) -> list[tuple[str, bool, str]]:
        """Nodes Slurm drained, resumed, downed or has up again, followed in the portal (``devices.slurm.health``).

        Returns what Slurm still needs to be told of the portal's own cordons and uncordons.
        """
        try:
            reports = survey.nodes()
        except SlurmError as exc:
            summary.errors["nodes"] = str(exc)
            return []
        return reconcile(reports, summary)

    def set_node_service(self, node: str, *, in_service: bool, reason: str) -> str | None:
        """Drain ``node`` in Slurm (``Reason="npuportal: <reason>"``), or resume it if Slurm has it drained.

        Slurm refuses ``State=RESUME`` for a node that is not drained or down, so it is asked first.
        Returns what failed, naming the node and with Slurm's message (``None`` when done).
        """
        try:
            if in_service:
                found = [n for n in survey.parse_nodes(run(["scontrol", "show", "node", "-o", node])) if n.name == node]
                if not found or not found[0].drained:
                    return None
                run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
                log.info("node %s resumed in Slurm: %s", node, reason)
            else:
                run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={slurm_reason(reason)}"])
                log.info("node %s drained in Slurm: %s", node, reason)
        except SlurmError as exc:
            problem = f"could not {'resume' if in_service else 'drain'} node {node} in Slurm: {exc}"
            log.warning("%s", problem)
            return problem
        return None

    # -- output -------------------------------------------------------------------------------------
    def output_reader(self, node: str) -> SlurmOutput:
        """What ``scheduling.services.output`` reads a run's output through (the agent client's ``log``)."""
        return SlurmOutput(node)


def outcome(ended: EndedJob) -> tuple[int | None, str, str]:
    """``(exit code, event reason, detail)`` of a Slurm job's end, in the agents' words (``outcome`` there)."""
    state, code = ended.base_state, ended.code
    if state == "COMPLETED" and code == 0:
        return 0, "Completed", "exit code 0"
    if state == "TIMEOUT":
        return code, "Walltime", f"Slurm stopped it at its time limit: {exit_words(code)}"
    if state == "OUT_OF_MEMORY":
        return code, "OutOfMemory", f"in Slurm: out of memory ({exit_words(code)})"
    if state in {"CANCELLED", "DEADLINE"}:
        return code, "Killed", f"stopped in Slurm ({ended.state}): {exit_words(code)}"
    return code, "NonZeroExit", exit_words(code)


def record_start(job_id: int, started: datetime) -> None:
    """Start the job's open allocations when Slurm started its run, where that is later than the tick's start.

    The tick holds the cards from its own time; Slurm runs the job an ``sbatch`` and a scheduling
    pass later (a second or so, or much later when it lost its cards to a job submitted around
    the portal). Usage is what Slurm ran, so chargeback and ``sacct`` agree
    (``manage.py slurm reconcile``). Slurm's times are whole seconds: one that reads earlier than
    the tick's is left alone.
    """
    Allocation.objects.filter(job_id=job_id, end__isnull=True, start__lt=started).update(start=started)


def record_cards(job_id: int, given: dict[str, list[int]]) -> None:
    """Point the job's open allocations at the cards Slurm gave it, where they differ and are free in the portal."""
    with transaction.atomic():
        lock_cluster()
        allocs = list(Allocation.objects.filter(job_id=job_id, end__isnull=True).select_related("device__node"))
        for node, indexes in given.items():
            mine = [a for a in allocs if a.device.node.name == node]
            have = sorted(a.device.index for a in mine)
            if not indexes or have == indexes or len(indexes) != len(mine):
                continue
            from devices.models import Device

            devices = {d.index: d for d in Device.objects.filter(node__name=node, index__in=indexes)}
            held = set(
                Allocation.objects.filter(device__in=devices.values(), end__isnull=True)
                .exclude(job_id=job_id)
                .values_list("device__index", flat=True)
            )
            if held or len(devices) != len(indexes):
                log.warning(
                    "Slurm gave job %s cards %s on %s, the portal chose %s; cards %s are the portal's for other jobs",
                    job_id,
                    indexes,
                    node,
                    have,
                    sorted(held),
                )
                continue
            # Only the allocations on cards Slurm did not give move, to the cards given that none holds:
            # one open allocation per card, so a move never lands on a card this job still holds.
            kept = {a.device.index for a in mine if a.device.index in indexes}
            moving = [a for a in mine if a.device.index not in kept]
            for alloc, index in zip(moving, [i for i in indexes if i not in kept], strict=True):
                Allocation.objects.filter(pk=alloc.pk).update(device=devices[index])


class SlurmOutput:
    """A run's output file read as an agent serves it (``GET /v1/jobs/<id>/log``): on this host, or shared storage."""

    def __init__(self, node: str) -> None:
        self.node = node

    def log(self, run_id: str | int, *, offset: int | None = None, tail: int | None = None) -> dict[str, Any] | None:
        job_text, _, attempt_text = str(run_id).partition(".")
        if not (job_text.isdigit() and attempt_text.isdigit()):
            return None
        job = Job.objects.select_related("submitter__profile").filter(pk=int(job_text)).first()
        if job is None:
            return None
        attempt = int(attempt_text)
        try:
            path = run_output(job, attempt, self.node, first=_first_node(job, attempt) in {None, self.node})
        except LaunchRefused:
            return None
        if not path.exists() and job.is_final:
            return None
        return read_log(path, offset=offset, tail=tail)


def _first_node(job: Job, attempt: int) -> str | None:
    """The first node (node rank 0) of a run, from its allocations; ``None`` for a run the portal has no record of."""
    # The runs in start order, each with its nodes: what ``scheduling.services.output.runs_of``
    # reads, asked here directly (what runs jobs does not call the portal's use cases).
    starts: dict[object, set[str]] = {}
    for start, node in Allocation.objects.filter(job=job).order_by("start").values_list("start", "device__node__name"):
        starts.setdefault(start, set()).add(node)
    runs = [sorted(nodes) for nodes in starts.values()]
    return runs[attempt - 1][0] if 0 < attempt <= len(runs) else None
