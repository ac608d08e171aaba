"""The starvation guard: a job that has waited too long comes first, with cards held for it.

Fair share and age order the queue well on average, but a team above its share
can see a large job passed over for days: each tick some job of a team further
below its share, or a small job that backfills, goes first. Users accept waiting
their turn; they do not accept a job that never comes. The policy names how long
is too long::

    spec:
      starvation: {after: 24h}        # absent: the guard is off
      priorityClasses:
        - {name: high, starvationAfter: 2h}   # a class may set its own

A pending job whose wait beyond its own team's limits (``now - submitted_at -
own_limits_s``: the time it waited with a quota reason — its team at its
``max``, out of budget, a class or length its team may not run now — does not
count) is longer than its class's threshold (:meth:`Policy.starvation_after`) is
*starving*. A team that sits at its own cap has chosen that wait; the guard bounds
the wait other teams cause, which is what a user cannot do anything about. Counting
the whole wait made every job of a capped team "starving" the moment its team fell
below its cap, so that team's backlog jumped the queue and held cards everywhere
(on the Microsoft ITP trace with every ``max`` twice the guarantee: more lost work
and a slower tick, and no shorter waits for anyone else). The guard plugs in at
two points of the pipeline (``decide``'s docstring is the one place that says how
the rules combine):

* **order** (step 3, :func:`starving_first`): starving jobs go before every other
  job, oldest first (submission time, then id), as Volcano's ``sla`` plugin orders
  jobs past their ``sla-waiting-time``; the multifactor order applies among the
  rest. Admission still applies: a starving job its team's quota refuses waits
  with its quota reason and holds nothing (quota reasons never block);
* **hold** (step 4g, ``Tick.blocked_job``): a starving job that finds no free room
  and no victims gets a backfill reservation at its shadow time, on the chip model
  where it starts first, even when another job already holds cards there:
  reservations of starving jobs stack, in wait order, as Slurm's backfill plans
  beyond the first job. Each is worked out with the cards held for the ones before
  it busy until those jobs would end. Jobs behind still backfill: they start now
  on cards nobody holds, or on held cards if they end before that reservation's
  shadow time. A job within its team's guarantee may take the cards of an ordinary
  hold, never those of a starving job (else the guaranteed teams' stream of jobs
  would starve it again). At most :data:`MAX_HOLDS_PER_CHIP` starving jobs hold
  cards on one chip model per tick (a backfill pass looks at a bounded number of
  jobs); the ones after them still come first but wait without a hold this tick.
  A vNPU request that starves only comes first: a slice needs part of one card,
  which the first card to free gives it, and holds stack for whole cards only;
* **victims** (step 4f, :func:`served_late`): a running job that started more than
  its threshold after its submission costs a victim search its threshold's worth
  of its cards on top of the work it would lose (:mod:`work_lost`). Stopped, it
  would wait again and need its cards drained again, and the least-work rule
  alone picks exactly such a job, as it just started. Searches take it only when
  every other way loses more. (For a requeued job the time since submission
  includes its earlier runs: it too would start over.)

Pure functions of the policy and the job; no Django.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Final, cast

from scheduling.engine.durations import format_duration
from scheduling.engine.policy import Policy, zone
from scheduling.engine.snapshot import JobState

#: Reservations of starving jobs on one chip model in one tick (each costs a shadow replay).
MAX_HOLDS_PER_CHIP: Final = 16

#: "00" to "59", for the times in a hold's words (:func:`held_detail`).
_TWO_DIGITS: Final = [f"{i:02d}" for i in range(60)]


class Guard:
    """The policy's starvation thresholds by class, read once per tick."""

    __slots__ = ("by_class", "default", "on")

    def __init__(self, policy: Policy) -> None:
        #: Threshold in seconds of every class of the policy (``None``: never starving).
        self.by_class: dict[str, float | None] = {
            pc.name: policy.starvation_after(pc.name) for pc in policy.priority_classes
        }
        #: Threshold of a job whose class the policy no longer has.
        self.default: float | None = policy.starvation_after_s
        #: Whether any job could ever be starving under this policy.
        self.on: bool = self.default is not None or any(v is not None for v in self.by_class.values())

    def after(self, cls: str) -> float | None:
        """The threshold of class ``cls`` in seconds, ``None`` if its jobs never count as starving."""
        if cls in self.by_class:
            return self.by_class[cls]
        return self.default

    def starving(self, job: JobState, now: float) -> bool:
        """Whether ``job`` has waited longer than its class's threshold at ``now``."""
        limit = self.after(job.priority_class)
        return limit is not None and now - job.submitted_at - job.own_limits_s > limit


def starving_first(guard: Guard, pending: list[JobState], idx: list[int], now: float) -> tuple[list[int], int]:
    """``idx`` (indices into ``pending`` in priority order) with starving jobs moved in front.

    The starving ones longest-waiting first (by their wait beyond their own team's limits: the
    submission time plus the time those limits held them, then id); the others keep
    their order. Also returns how many jobs are starving: the first that many of the order
    (the tick tells them by their place, not by a set of their ids).
    """
    # One pass, with each job's threshold read from a dict by class and no call per job (this
    # runs over the whole queue every tick: 10,000 calls to :meth:`Guard.starving` were the
    # larger part of it).
    by_class = guard.by_class
    default = guard.default
    # The indices are read and kept as the objects the list holds: copied into the new order
    # without an int built again per job (most are not small ints).
    items = cast("list[object]", idx)
    times: list[float] = []  # the starving jobs' keys, ids and indices, in ``idx`` order
    ids: list[int] = []
    picked: list[object] = []
    rest: list[object] = []  # the others, in order
    # The order groups jobs by class first: the last class's threshold is kept, not looked up again.
    last_class = ""
    limit = by_class.get(last_class, default)
    for item in items:
        job = pending[cast(int, item)]
        cls = job.priority_class
        if cls is not last_class:
            last_class = cls
            limit = by_class.get(cls, default)
        if limit is not None and now - job.submitted_at - job.own_limits_s > limit:
            times.append(job.submitted_at + job.own_limits_s)
            ids.append(job.id)
            picked.append(item)
        else:
            rest.append(item)
    if not picked:
        return idx, 0
    # Sorted by time alone (a list of floats sorts with a float comparison, where a tuple per job
    # compared tuples), then each run of equal times by id, as sorting (time, id) would.
    order = sorted(range(len(times)), key=times.__getitem__)
    m = len(order)
    i = 0
    while i < m:
        t = times[order[i]]
        j = i + 1
        while j < m and times[order[j]] == t:
            j += 1
        if j - i > 1:
            order[i:j] = sorted(order[i:j], key=ids.__getitem__)
        i = j
    out = [picked[j] for j in order]
    out += rest
    return cast("list[int]", out), m


def served_late(guard: Guard, running: Iterable[JobState]) -> dict[int, float]:
    """Running jobs that started more than their class's threshold after submission: id -> threshold (s).

    What stopping each costs a victim search beyond its lost work (module docstring, *victims*).
    """
    out: dict[int, float] = {}
    for job in running:
        after = guard.after(job.priority_class)
        if (
            after is not None
            and job.started_at is not None
            and job.started_at - job.submitted_at - job.own_limits_s > after
        ):
            out[job.id] = after
    return out


def held_detail(guard: Guard, job: JobState, nodes: list[str], at: float, policy: Policy) -> str:
    """The reason's words for a starving job with cards held: what, where, from when (policy clock)."""
    limit = guard.after(job.priority_class) or 0.0
    day = datetime.fromtimestamp(at, zone(policy.timezone))
    # As ``strftime("%Y-%m-%d %H:%M %Z")`` writes it, from strings made once: a tick writes this
    # for each of up to :data:`MAX_HOLDS_PER_CHIP` holds per chip model, and both ``strftime``
    # and format specs cost several times the rest of a hold.
    two = _TWO_DIGITS
    when = f"{day.year}-{two[day.month]}-{two[day.day]} {two[day.hour]}:{two[day.minute]} {day.tzname()}"
    where = ", ".join(nodes) if len(nodes) <= 4 else f"{', '.join(nodes[:4])} and {len(nodes) - 4} more"
    return f"waiting more than {format_duration(limit)}: cards on {where} held for it from {when}"


def unheld_detail(guard: Guard, job: JobState, why: str) -> str:
    """The reason's words for a starving job that holds no cards this tick, and why not."""
    limit = guard.after(job.priority_class) or 0.0
    return f"waiting more than {format_duration(limit)}: served before other jobs; {why}"


def summary(policy: Policy) -> dict[str, object]:
    """The guard as ``policy effective`` shows it: ``{"after": "24h" | None, "classes": {name: "2h"}}``.

    ``classes`` lists the classes whose threshold is their own ``starvationAfter``.
    """
    return {
        "after": None if policy.starvation_after_s is None else format_duration(policy.starvation_after_s),
        "classes": {
            pc.name: format_duration(pc.starvation_after_s)
            for pc in policy.priority_classes
            if pc.starvation_after_s is not None
        },
    }
