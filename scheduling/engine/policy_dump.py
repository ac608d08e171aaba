"""Canonical YAML for a policy.

Every section is written out, defaults included, so an exported policy says
everything the engine will do and two exports differ only where meaning
differs. The layout follows the hand-written examples (one flow mapping per
list entry where it fits) so an export is also a good starting point for edits.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import yaml

from scheduling.engine.durations import format_duration
from scheduling.engine.policy import Ordering, Policy, PriorityClass, Quota, Schedule, TeamPolicy
from scheduling.engine.policy_parse import API_VERSION, KIND
from scheduling.engine.schedules import DAY_NAMES, format_between


class _Flow(dict):
    """A mapping written on one line: ``{name: low}``."""


class _FlowList(list):
    """A list written on one line: ``[mon, tue]``."""


class _Quoted(str):
    """A string written in double quotes (``"09:00-18:00"``) as in the examples."""


class _Dumper(yaml.SafeDumper):
    """Indents block lists under their key, as the examples and most editors do."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


_Dumper.add_representer(
    _Flow, lambda d, data: d.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=True)
)
_Dumper.add_representer(_Quoted, lambda d, data: d.represent_scalar("tag:yaml.org,2002:str", str(data), style='"'))
_Dumper.add_representer(_FlowList, lambda d, data: d.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=True))


def dump_policy(policy: Policy) -> str:
    """Canonical YAML of ``policy``; ``parse_policy(dump_policy(p)) == p``."""
    order = [pc.name for pc in policy.priority_classes]
    ordering = policy.ordering
    # The duration factor only where it is used, so the dumps of policies without it stay as they were.
    duration = {} if ordering.weight_duration == 0 else {"duration": _num(ordering.weight_duration)}
    long_job = {} if ordering.long_job_s == Ordering().long_job_s else {"longJob": format_duration(ordering.long_job_s)}
    spec: dict[str, Any] = {
        "timezone": policy.timezone,
        "priorityClasses": [_priority_class(pc, order) for pc in policy.priority_classes],
        "ordering": {
            "weights": _Flow(
                priorityClass=_num(ordering.weight_priority_class),
                fairShare=_num(ordering.weight_fair_share),
                age=_num(ordering.weight_age),
                jobSize=_num(ordering.weight_job_size),
                **duration,
            ),
            "maxAge": format_duration(ordering.max_age_s),
            "usageHalfLife": format_duration(ordering.usage_half_life_s),
            **long_job,
        },
        "placement": _Flow(strategy=policy.placement_strategy),
        "backfill": policy.backfill,
        "preemption": _Flow(gracePeriod=format_duration(policy.grace_period_s), onPreempt=policy.on_preempt),
        **(
            {}
            if policy.starvation_after_s is None
            else {"starvation": _Flow(after=format_duration(policy.starvation_after_s))}
        ),
        "reservations": [
            _Flow(
                name=r.name,
                ratio=_num(r.ratio),
                **({} if r.chip_models is None else {"chipModels": _FlowList(sorted(r.chip_models))}),
                forPriorityClasses=_FlowList(_ordered(r.priority_classes, order)),
            )
            for r in policy.reservations
        ],
        "departments": [_Flow(name=name, shares=_num(shares)) for name, shares in policy.departments.items()],
        "teams": [_team(team, order) for team in policy.teams.values()],
        "defaults": _team(policy.defaults, order, is_defaults=True),
    }
    document = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _Flow(name=policy.name),
        "spec": spec,
    }
    return yaml.dump(document, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=120, default_flow_style=False)


def _priority_class(pc: PriorityClass, order: list[str]) -> _Flow:
    out = _Flow(name=pc.name)
    if pc.preempts:
        out["preempts"] = _FlowList(_ordered(pc.preempts, order))
    if not pc.preemptible:
        out["preemptible"] = False
    if pc.default:
        out["default"] = True
    if pc.starvation_after_s is not None:
        out["starvationAfter"] = format_duration(pc.starvation_after_s)
    return out


def _team(team: TeamPolicy, order: list[str], *, is_defaults: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {} if is_defaults else {"name": team.name}
    if team.department is not None and not is_defaults:
        out["department"] = team.department
    out["shares"] = _num(team.shares)
    quota = _quota(team.quota, order)
    if quota:
        out["quota"] = quota
    if team.schedules:
        out["schedules"] = [_schedule(s, order) for s in team.schedules]
    return out


def _quota(quota: Quota, order: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if quota.guaranteed:
        out["guaranteed"] = _resources(quota.guaranteed)
    if quota.max:
        out["max"] = _resources(quota.max)
    if quota.max_concurrent_jobs is not None:
        out["maxConcurrentJobs"] = quota.max_concurrent_jobs
    if quota.device_hours_per_month is not None:
        out["deviceHoursPerMonth"] = _num(quota.device_hours_per_month)
    if quota.max_job_duration_s is not None:
        out["maxJobDuration"] = format_duration(quota.max_job_duration_s)
    if quota.allowed_priority_classes is not None:
        out["allowedPriorityClasses"] = _FlowList(_ordered(quota.allowed_priority_classes, order))
    return out


def _schedule(schedule: Schedule, order: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": schedule.name}
    if schedule.days is not None:
        out["days"] = _FlowList(DAY_NAMES[d] for d in sorted(schedule.days))
    out["between"] = _Quoted(format_between(schedule.start_min, schedule.end_min))
    override = override_to_yaml(schedule.quota, order)
    if override:
        out["quota"] = _Flow(override)
    return out


def override_to_yaml(override: Mapping[str, object], order: list[str]) -> dict[str, Any]:
    """A schedule's normalised override back in YAML terms (``None`` stays ``null``)."""
    out: dict[str, Any] = {}
    for key, value in override.items():
        if key in ("guaranteed", "max") and isinstance(value, Mapping):
            out[key] = _resources(value)
        elif value is None:
            out[key] = None
        elif key == "maxJobDuration":
            out[key] = format_duration(float(value))  # type: ignore[arg-type]
        elif key == "allowedPriorityClasses":
            out[key] = _FlowList(_ordered(value, order))  # type: ignore[arg-type]
        elif isinstance(value, float):
            out[key] = _num(value)
        else:
            out[key] = value
    return out


def _resources(resources: Mapping[str, float | None]) -> _Flow:
    """``devices`` first, then chip keys in name order."""
    keys = sorted(resources, key=lambda k: (k != "devices", k))
    return _Flow((k, None if resources[k] is None else _num(resources[k])) for k in keys)  # type: ignore[arg-type]


def _ordered(names: Collection[str], order: list[str]) -> list[str]:
    """Class names in priority order, so ``preempts`` reads highest first."""
    known = [n for n in order if n in names]
    return known + sorted(n for n in names if n not in order)


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else float(value)
