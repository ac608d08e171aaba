"""Canonical YAML for a policy.

Every section is written out, defaults included, so an exported policy says
everything the engine will do and two exports differ only where meaning
differs. The layout follows the hand-written examples (one flow mapping per
list entry where it fits) so an export is also a good starting point for edits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from scheduling.engine.durations import format_duration
from scheduling.engine.policy_fields import (
    API_VERSION,
    KIND,
    ORDERING_FIELDS,
    QUOTA_FIELDS,
    SPEC_FIELDS,
    PolicyField,
    num,
    ordered_classes,
)
from scheduling.engine.policy_model import Policy, PriorityClass, Quota, Schedule, TeamPolicy
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
    spec: dict[str, Any] = {
        "timezone": policy.timezone,
        "priorityClasses": [_priority_class(pc, order) for pc in policy.priority_classes],
        "ordering": _section(policy.ordering, ORDERING_FIELDS, order),
        **_section(policy, SPEC_FIELDS, order),
        "reservations": [
            _Flow(
                name=r.name,
                ratio=num(r.ratio),
                **({} if r.chip_models is None else {"chipModels": _FlowList(sorted(r.chip_models))}),
                forPriorityClasses=_FlowList(ordered_classes(r.priority_classes, order)),
            )
            for r in policy.reservations
        ],
        "departments": [_Flow(name=name, shares=num(shares)) for name, shares in policy.departments.items()],
        "teams": [_team(team, order) for team in policy.teams.values()],
        "defaults": _team(policy.defaults, order, is_defaults=True),
    }
    roles = {key: getattr(policy.directory, key) for key in ("finance", "admins")}
    if any(roles.values()):
        spec["directory"] = _Flow({key: group for key, group in roles.items() if group})
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
        out["preempts"] = _FlowList(ordered_classes(pc.preempts, order))
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
    out["shares"] = num(team.shares)
    quota = _quota(team.quota, order)
    if quota:
        out["quota"] = quota
    if team.schedules:
        out["schedules"] = [_schedule(s, order) for s in team.schedules]
    if team.directory is not None and not is_defaults:
        out["directory"] = _Flow(members=team.directory.members)
        if team.directory.leads:
            out["directory"]["leads"] = team.directory.leads
    return out


def _section(record: object, fields: Sequence[PolicyField], order: list[str]) -> dict[str, Any]:
    """The rows of ``fields`` that are set, sub-mappings on one line (``weights``, ``preemption``).

    A row new since the first exports (``omit_default``) is written only when it is not the default.
    """
    out: dict[str, Any] = {}
    default = None
    if any(f.omit_default and f.default is None for f in fields):
        default = type(record)()
    for f in fields:
        value = getattr(record, f.attr)
        if f.omit_default and value == (f.default if f.default is not None else getattr(default, f.attr)):
            continue
        if value is None:
            continue
        into = out.setdefault(f.group, _Flow()) if f.group else out
        into[f.key] = _written(f, value, order)
    return out


def _quota(quota: Quota, order: list[str]) -> dict[str, Any]:
    """The fields that are set (an empty resource mapping is not)."""
    out: dict[str, Any] = {}
    for f in QUOTA_FIELDS:
        value = getattr(quota, f.attr)
        if value is None or (f.resources and not value):
            continue
        out[f.yaml] = _written(f, value, order)
    return out


def _written(f: PolicyField, value: object, order: list[str]) -> Any:
    """A field's value as written back, in the layout of the examples (mappings and lists on one line)."""
    if value is None:
        return None
    written = f.write(value, order)
    if isinstance(written, dict):
        return _Flow(written)
    if isinstance(written, list):
        return _FlowList(written)
    return written


def _schedule(schedule: Schedule, order: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": schedule.name}
    if schedule.days is not None:
        out["days"] = _FlowList(DAY_NAMES[d] for d in sorted(schedule.days))
    out["between"] = _Quoted(format_between(schedule.start_min, schedule.end_min))
    if schedule.dates is not None:
        out["dates"] = _Flow({"from": schedule.dates[0], "until": schedule.dates[1]})
    override = override_to_yaml(schedule.quota, order)
    if override:
        out["quota"] = _Flow(override)
    return out


def override_to_yaml(override: Mapping[str, object], order: list[str]) -> dict[str, Any]:
    """A schedule's normalised override back in YAML terms (``None`` stays ``null``)."""
    return {f.yaml: _written(f, override[f.yaml], order) for f in QUOTA_FIELDS if f.yaml in override}
