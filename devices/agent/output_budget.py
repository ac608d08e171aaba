"""How much of a node's disk jobs' output may take: one budget per node, a share of it per team.

One run's output is capped (``--max-log-bytes``, 64 MiB), but a 1,000-copy array on one node could
still write 64 GB, kept for ``--keep-finished-days``. So the agent keeps all output it holds within
``--output-budget`` (4 GiB):

1. **A team's running jobs** may hold at most ``--output-team-share`` of the budget (half). Past it,
   the output of each of the team's running jobs stops: its wrapper writes one line saying why and
   drops the rest, and the job itself keeps running (it never blocks on a full pipe).
2. **Over the budget**, the output of ended jobs is removed, the one that ended first first; their
   records stay and say when and why (``GET /v1/jobs/<id>/log`` answers with a ``note``, which the
   portal and ``npuctl logs`` pass on).
3. **Still over** (running jobs alone fill the budget): the output of every running job stops, as in 1.

The check runs once a second (:data:`CHECK_INTERVAL_S`) on running counts, never scanning the disk:
ended jobs' sizes are known from when they ended (:class:`OutputLedger`), and a running job's is one
``stat`` of its log. A run may write past a limit for the second until the next check and the moment
its wrapper looks (:data:`STOP_LOOK_INTERVAL_S` in ``runner.py``), never past ``--max-log-bytes``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

#: ``--output-budget``: all job output one node's agent keeps.
DEFAULT_OUTPUT_BUDGET = 4 * 1024**3
#: ``--output-team-share``: the part of the budget one team's running jobs may hold.
DEFAULT_TEAM_SHARE = 0.5
#: How often the monitor compares the output held with the budget.
CHECK_INTERVAL_S = 1.0


def size_words(size: int) -> str:
    """``4 GiB``, ``1.5 MiB``, ``900 bytes``: sizes as the flags take them (powers of 1024)."""
    if size < 1024:
        return f"{size} bytes"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1024 or unit == "TiB":
            break
    return f"{value:.1f}".removesuffix(".0") + f" {unit}"


@dataclass(frozen=True)
class RunningOutput:
    """What a running job's log holds now."""

    job_id: str
    team: str | None
    size: int
    stopped: bool


@dataclass
class Plan:
    """What to do to keep the budget: ended jobs whose output goes (oldest first), running ones whose output stops."""

    remove: list[str] = field(default_factory=list)
    stop: dict[str, str] = field(default_factory=dict)  # job id -> why, in words


class OutputLedger:
    """The output of ended jobs the node keeps, in the order they ended, with a running total."""

    def __init__(self, budget: int = DEFAULT_OUTPUT_BUDGET, team_share: float = DEFAULT_TEAM_SHARE) -> None:
        self.budget = budget
        self.team_share = team_share
        self._ended: dict[str, int] = {}  # job id -> bytes; insertion order is end order
        self.ended_bytes = 0

    def reset(self, ended: Iterable[tuple[str, int]]) -> None:
        """Start over from ``(job id, bytes)`` of every ended job whose output is kept, oldest first."""
        self._ended.clear()
        self.ended_bytes = 0
        for job_id, size in ended:
            self.ended(job_id, size)

    def ended(self, job_id: str, size: int) -> None:
        """A job ended with ``size`` bytes of output: the newest the budget removes last."""
        self.forget(job_id)
        self._ended[job_id] = size
        self.ended_bytes += size

    def forget(self, job_id: str) -> None:
        """The job's output is gone (removed for the budget, or pruned with its record)."""
        self.ended_bytes -= self._ended.pop(job_id, 0)

    def team_limit(self) -> int:
        return int(self.budget * self.team_share)

    def plan(self, running: Sequence[RunningOutput]) -> Plan:
        """What keeps the node within its budget now; reads nothing but the counts it is given."""
        plan = Plan()
        teams: dict[str | None, list[RunningOutput]] = {}
        for run in running:
            teams.setdefault(run.team, []).append(run)
        limit = self.team_limit()
        for team, runs in teams.items():
            held = sum(run.size for run in runs)
            if held > limit:
                who = f"the running jobs of team {team}" if team else "the running jobs without a team"
                why = (
                    f"{who} on this node hold {size_words(held)} of output, more than a team's share of the "
                    f"node's output budget ({self.team_share:.0%} of {size_words(self.budget)})"
                )
                plan.stop.update((run.job_id, why) for run in runs if not run.stopped)
        total = self.ended_bytes + sum(run.size for run in running)
        for job_id, size in self._ended.items():
            if total <= self.budget:
                break
            plan.remove.append(job_id)
            total -= size
        if total > self.budget:
            why = f"this node's output budget ({size_words(self.budget)}) is full with running jobs' output"
            for run in running:
                if not run.stopped and run.job_id not in plan.stop:
                    plan.stop[run.job_id] = why
        return plan

    def removed_words(self, when: str) -> str:
        """What a job whose output was removed says (its log answers' ``note``)."""
        return (
            f"this run's output was removed from the node at {when} to keep the node's output budget "
            f"({size_words(self.budget)}; the output of the jobs that ended first goes first)"
        )
