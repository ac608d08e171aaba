"""What runs jobs, behind one small interface: the node agents today, a Slurm cluster next.

The portal decides where a job runs (the tick writes its allocations) and records a job's life
(``scheduling.transitions``); an executor carries that out and reports back. It

- **launches** a placed job: the job is ``running`` in the database with open allocations on
  exact cards; the executor starts its run there (a run id per start, so a retried launch is
  harmless) and, when the launch cannot take, records it through the transitions (retried,
  requeued, failed for good);
- **stops** a job's run with a grace period (SIGTERM, then SIGKILL after ``grace_s``), saying why;
- **observes** what runs: it reconciles what it runs with what the database says should run,
  and reports each run's end through the transitions (``finish``, ``requeue``...), stopping what
  must not run. A run ended by the system rather than the job (its node went away, its agent shut
  down) is requeued as ``node_fail`` without counting a retry; a multi-node run completes when
  every node's part has succeeded, and fails with the part that failed first;
- reports the **inventory** it serves: its nodes and their cards;
- is told when an operator takes a node **out of service** in the portal or puts it back
  (cordon, drain, uncordon), so that what it runs there follows: Slurm drains or resumes the node,
  the agents need nothing (the portal places no work on it).

Nothing outside an executor knows which one runs: callers take ``devices.executors.get_executor()``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

log = logging.getLogger(__name__)

#: SIGTERM → SIGKILL grace when a user cancels a job.
CANCEL_GRACE_S = 10.0
#: Grace when the portal takes devices back: failed device, preemption after its grace, walltime, stale runs.
EVICT_GRACE_S = 5.0


@dataclass
class Observation:
    """What one observation of the executor found and did (ids of jobs; ``node:run`` of stale runs)."""

    polled: int = 0
    failed: int = 0
    errors: dict[str, str] = field(default_factory=dict)
    finished: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    relaunched: list[int] = field(default_factory=list)
    failed_devices: list[int] = field(default_factory=list)
    stale_stopped: list[str] = field(default_factory=list)
    #: Jobs requeued because their executor left their run waiting too long (Slurm: its cards were taken).
    withdrawn: list[int] = field(default_factory=list)
    #: Cards found in use outside the portal (a job submitted to Slurm directly).
    outside_cards: int = 0


@dataclass(frozen=True)
class ServedNode:
    """A node an executor runs jobs on, with the indexes of its cards."""

    name: str
    devices: tuple[int, ...]


@runtime_checkable
class Executor(Protocol):
    """The one interface between the portal and what runs its jobs (see the module docstring)."""

    #: The name ``NPUPORTAL_EXECUTOR`` selects it by.
    name: str

    def launch(self, job_ids: Iterable[int]) -> dict[int, bool]:
        """Start the current run of each placed job; ``{job id: taken on every node}``."""
        ...

    def stop(self, job_id: int, *, grace_s: float, cause: str) -> None:
        """Stop the run of a job that no longer runs in the database, on every node it used."""
        ...

    def observe(self) -> Observation:
        """Reconcile what runs with the database; ends are recorded through ``scheduling.transitions``."""
        ...

    def inventory(self) -> list[ServedNode]:
        """The nodes and cards this executor serves."""
        ...

    def set_node_service(self, node: str, *, in_service: bool, reason: str) -> str | None:
        """An operator cordoned or drained ``node`` (``in_service`` false) or uncordoned it, saying ``reason``.

        Called after the portal's change is committed; a failure is logged and returned in words
        naming the node and the executor's own message (``None`` when done), never raised: the
        portal's state stands (it places no work on the node either way).
        """
        ...


#: Called with the ids of jobs whose run ended in an observation, once its transactions are
#: committed. The portal registers what it does then (keeping their output) at start-up
#: (``scheduling.apps``), so an executor needs nothing of the portal's services.
_RUNS_ENDED: list[Callable[[Sequence[int]], object]] = []


def on_runs_ended(hook: Callable[[Sequence[int]], object]) -> Callable[[Sequence[int]], object]:
    """Register ``hook`` for :func:`runs_ended` (once per hook)."""
    if hook not in _RUNS_ENDED:
        _RUNS_ENDED.append(hook)
    return hook


def runs_ended(job_ids: Sequence[int]) -> None:
    """An executor saw these jobs' runs end (finished or requeued): run the registered hooks."""
    for hook in _RUNS_ENDED:
        hook(list(job_ids))
