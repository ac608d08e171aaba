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
  ``deviceHoursPerMonth`` allows in a whole month.

Limits that depend on what runs now (``maxConcurrentJobs``, the devices the
team holds, the month's usage so far) are "for now" and are not checked here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from scheduling.engine import reasons
from scheduling.engine.capacity import ClusterState
from scheduling.engine.placement import Need, need_of_key
from scheduling.engine.policy import DEVICES, Policy, Quota, TeamPolicy, chip_resource, merge_quota
from scheduling.engine.snapshot import DeviceState, NodeState, Snapshot, VnpuTemplate

#: The wait reason of a job that can no longer run (after a policy or inventory change).
NEVER_RUNNABLE = "NeverRunnable"
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
    #: What admission counts: the job's ``max_duration_s``, else its estimate.
    duration_s: float = 0.0
    #: For the monthly budget: device units × estimated hours.
    estimated_duration_s: float = 0.0


@dataclass(frozen=True)
class Impossible:
    """Why a job can never run: the submission field to blame and the reason in words."""

    field: str
    reason: str


def quota_variants(team: TeamPolicy) -> list[Quota]:
    """Every quota the team can have in force: its base quota and each time-of-day window's."""
    out = [team.quota]
    for schedule in team.schedules:
        out.append(schedule.resolved_quota or merge_quota(team.quota, schedule.quota))
    return out


def shape_chips(
    policy: Policy,
    nodes: Sequence[NodeState],
    templates: Mapping[tuple[str, str], VnpuTemplate],
    chip_model: str | None,
    template: str | None,
    n: int,
) -> tuple[dict[str, float], str | None, str]:
    """Chip models the shape fits with all the inventory healthy: ``({chip: units}, reason, detail)``.

    Uses :mod:`placement`'s own rules on the inventory with every card usable,
    so "fits some day" means exactly what the tick would place.
    """
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
    snapshot = Snapshot(now=_EPOCH, policy=policy, nodes=whole, pending=[], running=[], templates=templates)
    state = ClusterState(snapshot, "binpack", 0.0)
    try:
        cache: dict[tuple, Need] = {}
        need = need_of_key(state, (chip_model, template, n), cache)
        detail = need.detail
        if not need.units and chip_model is None and len(state.chips) > 1:
            # Say why for each chip model, not only the first one tried.
            each = [f"{name}: {need_of_key(state, (name, template, n), cache).detail}" for name in state.chips]
            detail = "no chip model fits it (" + "; ".join(each) + ")"
        return dict(need.units), need.reason, detail
    finally:
        state.release()


def never_runnable(
    policy: Policy,
    request: Request,
    nodes: Sequence[NodeState],
    templates: Mapping[tuple[str, str], VnpuTemplate],
) -> Impossible | None:
    """Why ``request`` can never run under ``policy`` on ``nodes``; ``None`` if some day it can."""
    units, reason, detail = shape_chips(
        policy, nodes, templates, request.chip_model, request.vnpu_template, request.num_devices
    )
    if not units:
        if request.vnpu_template:
            blame = "vnpu_template"
        elif reason == reasons.CHIP_MODEL_UNAVAILABLE and request.chip_model:
            blame = "chip_model"
        else:
            blame = "num_devices"
        return Impossible(blame, detail or reasons.describe(reason or reasons.TOPOLOGY))
    variants = quota_variants(policy.team(request.team))
    pclass = policy.resolve_class(request.priority_class).name
    if all(q.allowed_priority_classes is not None and pclass not in q.allowed_priority_classes for q in variants):
        allowed = sorted(set().union(*(q.allowed_priority_classes or frozenset() for q in variants)))
        return Impossible(
            "priority_class",
            f"team {request.team} may never use class {pclass!r}"
            f" (allowed at some time: {', '.join(allowed) or 'none'})",
        )
    if all(q.max_job_duration_s is not None and request.duration_s > q.max_job_duration_s for q in variants):
        longest = max(q.max_job_duration_s or 0.0 for q in variants)
        field = "max_duration_s" if request.duration_s != request.estimated_duration_s else "estimated_duration_s"
        return Impossible(field, f"longer than team {request.team}'s longest maxJobDuration ({int(longest)} s)")
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
            f"{_num(asked)} devices is more than team {request.team} may ever hold ({_num(best_cap)} at most, "
            "under every quota schedule)",
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


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value
