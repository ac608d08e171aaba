"""Can this job ever run, under this policy and this inventory?

One answer for every place that asks: the API, the console form and ``npuctl``
refuse such a job at submission, the tick gives a job that became impossible
after a policy or inventory change the reason ``NeverRunnable`` (never "for
now"), and the simulator skips such trace rows (``never_runnable``).

A job can never run when, whatever the time of day and whatever the cluster's
health:

* its **shape** fits no server group: no device of its chip model or vNPU
  template exists, or the cards do not fit the servers as :mod:`placement`
  places them (a multi-server size that is not whole servers, more cards on
  one node than whole HCCS rings give, more than any chip pool holds). Only
  the inventory counts here, healthy or not: a sick or cordoned card comes
  back, a card that does not exist does not;
* its team's **quota** refuses it under every schedule (the base quota and
  each time-of-day window): more devices than ``max`` (overall or per chip
  model, on every chip model the shape fits), a priority class the team may
  never use, longer than ``maxJobDuration``, or more device-hours than
  ``deviceHoursPerMonth`` allows in a whole month;
* a **reservation** of other classes leaves it too few cards on every chip
  model it fits: one that holds ``R = floor(ratio x N)`` of the ``N`` cards in
  its scope for other classes lets a job at most ``N - R`` of them, ever (with
  the scope idle ``R`` must stay free; the reserved classes' own jobs take from
  the same ``R``, :mod:`reservations`).

Limits that depend on what runs now (``maxConcurrentJobs``, the devices the
team holds, the month's usage so far) are "for now" and are not checked here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from scheduling.engine import reasons, run_time
from scheduling.engine.capacity import ClusterState
from scheduling.engine.placement import Need, need_of_key
from scheduling.engine.policy import (
    DEVICES,
    Policy,
    Quota,
    Reservation,
    TeamPolicy,
    chip_resource,
    merge_quota,
    policy_clock,
)
from scheduling.engine.snapshot import Decisions, DeviceState, JobState, NodeState, Snapshot, VnpuTemplate, Wait
from scheduling.engine.words import a_run, count, duration_words, sized_job

#: The wait reason of a job that can no longer run (after a policy or inventory change).
NEVER_RUNNABLE = reasons.NEVER_RUNNABLE
#: Any fixed time: the shape check reads no clock.
_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Request:
    """The shape and limits of a job, as submitted."""

    team: str
    num_devices: int
    chip_model: str | None = None
    vnpu_template: str | None = None
    priority_class: str | None = None
    #: What admission counts: the job's run-time limit (:func:`run_time.limit`).
    duration_s: float = 0.0
    #: For the monthly budget: device units × estimated hours.
    estimated_duration_s: float = 0.0
    #: The date the question is asked on, on the policy's clock: a dated schedule (``dates``)
    #: that ended before it can no longer let the job run. ``None``: every schedule counts.
    today: date | None = None


@dataclass(frozen=True)
class Impossible:
    """Why a job can never run: the submission field to blame and the reason in words."""

    field: str
    reason: str


def quota_variants(team: TeamPolicy, today: date | None = None) -> list[Quota]:
    """Every quota the team can have in force from ``today`` on: its base quota and each window's.

    A window with ``dates`` that ended before ``today`` is left out: an approved quota request
    that is over must not keep a job its team can no longer hold waiting as if it could run
    some day. (One still to come counts; ``today`` ``None`` counts every window.)
    """
    out = [team.quota]
    for schedule in team.schedules:
        if today is not None and schedule.dates is not None and schedule.dates[1] < today:
            continue
        out.append(schedule.resolved_quota or merge_quota(team.quota, schedule.quota))
    return out


class Shapes:
    """Which chip models each request shape fits with the whole inventory healthy (one layout, answers kept).

    Uses :mod:`placement`'s own rules on the inventory with every card usable, so "fits some
    day" means exactly what the tick would place. :meth:`close` hands the layout back.
    """

    def __init__(
        self, policy: Policy, nodes: Sequence[NodeState], templates: Mapping[tuple[str, str], VnpuTemplate]
    ) -> None:
        whole = [
            NodeState(
                node.name,
                [
                    DeviceState(
                        d.id, d.node, d.index, d.chip_model, d.topology_group, d.hbm_mb, d.ai_cores, d.ai_cpus, True
                    )
                    for d in node.devices
                ],
            )
            for node in nodes
        ]
        # A layout of its own: found by a key no tick uses and never handed back (no
        # ``release``), so the ticks' cache of layouts never holds this all-healthy one.
        snapshot = Snapshot(
            now=_EPOCH,
            policy=policy,
            nodes=whole,
            pending=[],
            running=[],
            templates=templates,
            inventory_key=object(),
        )
        self._state: ClusterState | None = ClusterState(snapshot, "binpack", 0.0)
        #: Cards of each chip model in the inventory, largest pool first (ties by name).
        counts: dict[str, int] = {}
        for node in nodes:
            for dev in node.devices:
                counts[dev.chip_model] = counts.get(dev.chip_model, 0) + 1
        self.cards: dict[str, int] = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
        self._cache: dict[tuple, Need] = {}
        self._answers: dict[tuple, tuple[dict[str, float], str | None, str]] = {}

    def fit(self, chip_model: str | None, template: str | None, n: int) -> tuple[dict[str, float], str | None, str]:
        """``({chip model: device units}, reason, detail)``; no chip models when it fits none."""
        key = (chip_model, template, n)
        found = self._answers.get(key)
        if found is not None:
            return found
        state = self._state
        assert state is not None, "Shapes used after close()"
        need = need_of_key(state, key, self._cache)
        detail = need.detail
        if not need.units and chip_model is None and len(state.chips) > 1:
            # Say why for each chip model, not only the first one tried.
            each = [f"{name}: {need_of_key(state, (name, template, n), self._cache).detail}" for name in state.chips]
            detail = "no chip model fits it (" + "; ".join(each) + ")"
        found = self._answers[key] = (dict(need.units), need.reason, detail)
        return found

    def close(self) -> None:
        self._state = None


def never_runnable(
    policy: Policy,
    request: Request,
    nodes: Sequence[NodeState],
    templates: Mapping[tuple[str, str], VnpuTemplate],
) -> Impossible | None:
    """Why ``request`` can never run under ``policy`` on ``nodes``; ``None`` if some day it can."""
    shapes = Shapes(policy, nodes, templates)
    try:
        return check(policy, request, shapes)
    finally:
        shapes.close()


def check(policy: Policy, request: Request, shapes: Shapes) -> Impossible | None:
    """:func:`never_runnable` with the inventory's shapes already laid out (many questions, one layout)."""
    too_many = pool_check(request, shapes.cards)
    if too_many is not None:
        return too_many
    units, reason, detail = shapes.fit(request.chip_model, request.vnpu_template, request.num_devices)
    if units:
        return quota_check(policy, request, units) or reservation_check(policy, request, units, shapes.cards)
    if not units:
        if request.vnpu_template:
            blame = "vnpu_template"
        elif reason == reasons.CHIP_MODEL_UNAVAILABLE and request.chip_model:
            blame = "chip_model"
        else:
            blame = "num_devices"
        return Impossible(blame, detail or reasons.describe(reason or reasons.TOPOLOGY))
    return None


def pool_check(request: Request, cards: Mapping[str, int]) -> Impossible | None:
    """More whole cards than any chip pool the job may use holds (``cards``: chip model -> cards, largest first).

    Asked first, since it is the plainest reason: a job of 25 cards on a cluster whose largest
    pool has 16 is refused for that, not for how 25 cards would have to be laid on its servers.
    A chip model the cluster does not have is the shape check's to name.
    """
    if request.vnpu_template is not None:
        return None
    n = request.num_devices
    if request.chip_model is not None:
        held = cards.get(request.chip_model)
        if held is not None and n > held:
            return Impossible(
                "num_devices", f"{sized_job(n)}; the cluster has {count(held, 'card')} of {request.chip_model}"
            )
        return None
    if cards and n > max(cards.values()):
        pools = ", ".join(f"{chip}: {count}" for chip, count in cards.items())
        return Impossible("num_devices", f"{sized_job(n)}; no chip model has that many cards ({pools})")
    return None


def quota_check(policy: Policy, request: Request, units: Mapping[str, float]) -> Impossible | None:
    """Whether the team's quota refuses ``request`` under every schedule, given the units it takes per chip model."""
    variants = quota_variants(policy.team(request.team), request.today)
    pclass = policy.resolve_class(request.priority_class).name
    if all(q.allowed_priority_classes is not None and pclass not in q.allowed_priority_classes for q in variants):
        allowed = sorted(set().union(*(q.allowed_priority_classes or frozenset() for q in variants)))
        return Impossible(
            "priority_class",
            f"team {request.team} may never use class {pclass!r}"
            f" (allowed at some time of day: {', '.join(allowed) or 'none'})",
        )
    if all(q.max_job_duration_s is not None and request.duration_s > q.max_job_duration_s for q in variants):
        longest = max(q.max_job_duration_s or 0.0 for q in variants)
        field = "max_duration_s" if request.duration_s != request.estimated_duration_s else "estimated_duration_s"
        return Impossible(
            field,
            f"{a_run(request.duration_s)} is more than team {request.team}'s "
            f"{duration_words(longest)} limit on run time",
        )
    fits_somewhere = False
    best_cap = 0.0
    for q in variants:
        overall = q.max.get(DEVICES)
        for chip, amount in units.items():
            cap = min(overall if overall is not None else float("inf"), q.max.get(chip_resource(chip), float("inf")))
            best_cap = max(best_cap, cap)
            if amount <= cap + 1e-9:
                fits_somewhere = True
                break
        if fits_somewhere:
            break
    if not fits_somewhere:
        asked = max(units.values())
        return Impossible(
            "num_devices",
            f"{sized_job(asked)} is more than team {request.team} may ever hold ({count(_num(best_cap), 'card')} "
            "at most, at any time of day)",
        )
    hours = request.estimated_duration_s / 3600.0
    budgets = [q.device_hours_per_month for q in variants]
    if all(b is not None for b in budgets):
        need_hours = min(units.values()) * hours
        largest = max(b for b in budgets if b is not None)
        if need_hours > largest + 1e-9:
            return Impossible(
                "estimated_duration_s",
                f"{_num(round(need_hours, 1))} device-hours is more than team {request.team}'s monthly budget "
                f"({_num(largest)} device-hours)",
            )
    return None


def reservation_check(
    policy: Policy, request: Request, units: Mapping[str, float], cards: Mapping[str, int]
) -> Impossible | None:
    """Whether other classes' reservations leave ``request`` too few cards on every chip model it fits.

    ``units``: what the job takes per chip model it fits; ``cards``: the inventory's cards per
    chip model. The most a job of a class outside a reservation ever gets in its scope is the
    scope's cards less the reserved ones (module docstring); the smallest such room of the
    reservations that apply decides per chip model.
    """
    if not policy.reservations:
        return None
    pclass = policy.resolve_class(request.priority_class).name
    tightest: tuple[float, str, str] | None = None  # (room, chip, why) of the first chip model tried
    for chip, amount in units.items():
        room = float("inf")
        why = ""
        for spec in policy.reservations:
            if pclass in spec.priority_classes or (spec.chip_models is not None and chip not in spec.chip_models):
                continue
            scope, held = _scope_and_held(spec, cards)
            if scope - held < room:
                room = float(scope - held)
                where = ", ".join(sorted(spec.chip_models)) if spec.chip_models is not None else "all"
                for_classes = ", ".join(sorted(spec.priority_classes))
                why = (
                    f"reservation {spec.name} holds {held} of the {scope} {where} cards for {for_classes}: "
                    f"a {pclass} job can have at most {_num(room)} of them"
                )
        if amount <= room + 1e-9:
            return None
        if tightest is None:
            tightest = (room, chip, why)
    assert tightest is not None
    asked = max(units.values())
    return Impossible("num_devices", f"{sized_job(asked)} is more than the reservations leave: {tightest[2]}")


def _scope_and_held(spec: Reservation, cards: Mapping[str, int]) -> tuple[int, int]:
    """The inventory's cards in ``spec``'s scope, and how many of them it holds with all healthy
    (as :class:`reservations._Held` counts them from the usable ones)."""
    scope = sum(n for model, n in cards.items() if spec.chip_models is None or model in spec.chip_models)
    return scope, math.floor(spec.ratio * scope + 1e-9)


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


#: Waiting reasons that may hide a job that can never run: the team's own limits, which read as
#: "for now". (A shape no server offers already waits with ``Topology`` or ``ChipModelUnavailable``,
#: which say so.) Only jobs waiting for one of these are checked after a tick, so a tick of jobs
#: waiting for capacity pays nothing.
SUSPECT_REASONS = frozenset(
    {
        reasons.QUOTA_CLASS_NOT_ALLOWED,
        reasons.QUOTA_MAX_DURATION,
        reasons.MONTHLY_BUDGET_EXHAUSTED,
        reasons.QUOTA_MAX_DEVICES,
        reasons.RESERVED_CAPACITY,
    }
)


def mark_never_runnable(snapshot: Snapshot, decisions: Decisions) -> int:
    """The pipeline's last step: a job its team's limits stop under every schedule waits with ``NeverRunnable``.

    A job accepted at submission can become impossible when the policy changes (its team's
    max lowered, a class taken away): its wait then says so, with the reason, instead of a
    quota reason that reads "for now", and the console offers to cancel it. Only jobs waiting
    for their team's limits are looked at (a tick of jobs waiting for cards pays nothing), and
    each shape is checked once. Returns how many jobs were marked.
    """
    waiting = decisions.waiting
    suspects = [
        job for job in snapshot.pending if (w := waiting.get(job.id)) is not None and w.reason in SUSPECT_REASONS
    ]
    if not suspects:
        return 0
    cores, cards = _inventory(snapshot)
    # No reservation leaves a job of another class fewer whole cards than this: a job held back
    # by one and asking no more (or a slice) waits for cards, not for ever, and is passed over.
    rooms = [scope - held for scope, held in (_scope_and_held(r, cards) for r in snapshot.policy.reservations)]
    least_room = min(rooms, default=0)
    verdicts: dict[tuple, Wait | None] = {}
    by_time: dict[str, bool] = {}  # team -> whether a job's length can make it never runnable
    today = policy_clock(snapshot.policy, snapshot.now)[2]
    marked = 0
    for job in suspects:
        reserved_only = waiting[job.id].reason == reasons.RESERVED_CAPACITY
        if reserved_only:
            if job.vnpu_template is not None or job.num_devices <= least_room:
                continue
            # Only the reservations can make it impossible (its team's limits admitted it): a
            # short key, as a long queue held back by a reservation has many jobs of few shapes.
            key: tuple = (job.priority_class, job.chip_model, job.vnpu_template, job.num_devices)
        else:
            timed = by_time.get(job.team)
            if timed is None:
                timed = by_time[job.team] = _limits_run_time(snapshot.policy, job.team, today)
            # A team with no run-time limit and no monthly budget under some schedule refuses no
            # job for its length: jobs of one shape then share one verdict (in a long queue held
            # at a team's max, every job has a length of its own).
            key = (
                job.team,
                job.chip_model,
                job.vnpu_template,
                job.num_devices,
                job.priority_class,
                job.max_duration_s if timed else None,
                job.estimated_duration_s if timed else None,
            )
        if key not in verdicts:
            verdicts[key] = _verdict(snapshot, job, cores, cards, reserved_only, today)
        verdict = verdicts[key]
        if verdict is not None:
            waiting[job.id] = verdict
            marked += 1
    return marked


#: ``Snapshot.inventory_key`` -> :func:`_inventory`'s answer, for callers that vouch for equal
#: inventories by key (the simulator, the benchmarks): reading 1,408 cards each tick was most of
#: this step's cost when a long queue waits at its teams' limits. A few keys: replays in one process.
_INVENTORIES: dict[object, tuple[dict[str, int], dict[str, int]]] = {}


def _inventory(snapshot: Snapshot) -> tuple[dict[str, int], dict[str, int]]:
    """``(cores, cards)``: chip model -> most AI cores of one card (a slice's share of a card), and
    chip model -> cards in the inventory."""
    key = snapshot.inventory_key
    if key is not None and (known := _INVENTORIES.get(key)) is not None:
        return known
    cores: dict[str, int] = {}
    cards: dict[str, int] = {}
    for node in snapshot.nodes:
        for dev in node.devices:
            chip = dev.chip_model
            cards[chip] = cards.get(chip, 0) + 1
            if dev.ai_cores > cores.get(chip, -1):
                cores[chip] = dev.ai_cores
    if key is not None:
        if len(_INVENTORIES) >= 8:
            _INVENTORIES.clear()
        _INVENTORIES[key] = (cores, cards)
    return cores, cards


def _limits_run_time(policy: Policy, team: str, today: date | None) -> bool:
    """Whether :func:`quota_check` can refuse a job of ``team`` for its length: only when every
    schedule of the team limits run time, or every one has a monthly budget."""
    variants = quota_variants(policy.team(team), today)
    return all(q.max_job_duration_s is not None for q in variants) or all(
        q.device_hours_per_month is not None for q in variants
    )


def _verdict(
    snapshot: Snapshot,
    job: JobState,
    cores: Mapping[str, int],
    cards: Mapping[str, int],
    reserved_only: bool,
    today: date,
) -> Wait | None:
    chips = [job.chip_model] if job.chip_model else list(cores)
    units: dict[str, float] = {}
    for chip in chips:
        if chip not in cores:
            continue
        if job.vnpu_template is None:
            units[chip] = float(job.num_devices)
        else:
            tmpl = snapshot.templates.get((chip, job.vnpu_template))
            if tmpl is not None:
                units[chip] = tmpl.ai_cores / max(1, cores[chip])
    if not units:
        return None  # the shape's own reasons (Topology, ChipModelUnavailable) say it already
    request = Request(
        team=job.team,
        num_devices=job.num_devices,
        chip_model=job.chip_model,
        vnpu_template=job.vnpu_template,
        priority_class=job.priority_class,
        duration_s=float(run_time.limit(job)),
        estimated_duration_s=float(job.estimated_duration_s),
        today=today,
    )
    found = None if reserved_only else quota_check(snapshot.policy, request, units)
    found = found or reservation_check(snapshot.policy, request, units, cards)
    return None if found is None else Wait(NEVER_RUNNABLE, f"cannot run under the current policy: {found.reason}")
