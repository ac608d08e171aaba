"""What changed between two policies: as text, and as meaning.

The text diff is what a reviewer reads next to the editor; the semantic diff
is what goes into the history entry and the apply confirmation, where
"team inference: max.devices 16 → 24" says more than a moved line of YAML.
Semantic lines compare parsed policies, so reformatting, reordering keys or
writing ``120s`` as ``2m`` produce none.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Collection, Mapping
from functools import partial
from typing import Any

from scheduling.engine.durations import format_duration
from scheduling.engine.policy import Policy, Quota, Reservation, Schedule, TeamPolicy
from scheduling.engine.schedules import format_between, format_days

ARROW = "→"


def diff_policies(old_text: str, new_text: str, *, old_name: str = "old", new_name: str = "new") -> str:
    """Unified diff of two policy texts; empty when they are equal."""
    lines = difflib.unified_diff(_lines(old_text), _lines(new_text), fromfile=old_name, tofile=new_name)
    return "".join(lines)


def _lines(text: str) -> list[str]:
    """Lines with endings, the last one terminated so hunks never glue together."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    return lines


def semantic_diff(old: Policy, new: Policy) -> list[str]:
    """One human line per change of meaning, in document order."""
    out: list[str] = []
    order = [pc.name for pc in new.priority_classes]
    _change(out, "metadata.name", old.name, new.name)
    _change(out, "timezone", old.timezone, new.timezone)
    _classes(out, old, new, order)
    for label, attr, fmt in (
        ("ordering.weights.priorityClass", "weight_priority_class", _number),
        ("ordering.weights.fairShare", "weight_fair_share", _number),
        ("ordering.weights.age", "weight_age", _number),
        ("ordering.weights.jobSize", "weight_job_size", _number),
        ("ordering.weights.duration", "weight_duration", _number),
        ("ordering.maxAge", "max_age_s", _duration),
        ("ordering.usageHalfLife", "usage_half_life_s", _duration),
        ("ordering.longJob", "long_job_s", _duration),
    ):
        _change(out, label, getattr(old.ordering, attr), getattr(new.ordering, attr), fmt)
    _change(out, "placement.strategy", old.placement_strategy, new.placement_strategy)
    _change(out, "backfill", old.backfill, new.backfill, _bool)
    _change(out, "preemption.gracePeriod", old.grace_period_s, new.grace_period_s, _duration)
    _change(out, "preemption.onPreempt", old.on_preempt, new.on_preempt)
    _change(out, "starvation.after", old.starvation_after_s, new.starvation_after_s, _off_or_duration)
    _reservations(out, old, new, order)
    _keyed(
        out,
        "department",
        dict(old.departments),
        dict(new.departments),
        lambda label, a, b: _change(out, f"{label}: shares", a, b, _number, sep=" "),
    )
    _keyed(
        out,
        "team",
        dict(old.teams),
        dict(new.teams),
        lambda label, a, b: _team(out, label, a, b, order),
    )
    _team(out, "defaults", old.defaults, new.defaults, order)
    return out


# -- sections ------------------------------------------------------------------


def _classes(out: list[str], old: Policy, new: Policy, order: list[str]) -> None:
    before = {pc.name: pc for pc in old.priority_classes}
    after = {pc.name: pc for pc in new.priority_classes}
    for name in after:
        if name not in before:
            out.append(f"priority class {name}: added")
    for name in before:
        if name not in after:
            out.append(f"priority class {name}: removed")
    kept_before = [n for n in before if n in after]
    kept_after = [n for n in after if n in before]
    if kept_before != kept_after:
        out.append(f"priority class order: {', '.join(kept_before)} {ARROW} {', '.join(kept_after)}")
    for name in kept_after:
        a, b = before[name], after[name]
        label = f"priority class {name}"
        _change(out, f"{label}: preempts", a.preempts, b.preempts, lambda v: _names(v, order), sep=" ")
        _change(out, f"{label}: preemptible", a.preemptible, b.preemptible, _bool, sep=" ")
        _change(
            out, f"{label}: starvationAfter", a.starvation_after_s, b.starvation_after_s, _policy_or_duration, sep=" "
        )
    if old.default_class.name != new.default_class.name:
        out.append(f"default priority class: {old.default_class.name} {ARROW} {new.default_class.name}")


def _reservations(out: list[str], old: Policy, new: Policy, order: list[str]) -> None:
    def compare(label: str, a: object, b: object) -> None:
        assert isinstance(a, Reservation) and isinstance(b, Reservation)
        _change(out, f"{label}: ratio", a.ratio, b.ratio, _number, sep=" ")
        _change(out, f"{label}: chipModels", a.chip_models, b.chip_models, _chips, sep=" ")
        _change(
            out,
            f"{label}: forPriorityClasses",
            a.priority_classes,
            b.priority_classes,
            lambda v: _names(v, order),
            sep=" ",
        )

    _keyed(
        out,
        "reservation",
        {r.name: r for r in old.reservations},
        {r.name: r for r in new.reservations},
        compare,
    )


def _team(out: list[str], label: str, a: TeamPolicy, b: TeamPolicy, order: list[str]) -> None:
    _change(out, f"{label}: department", a.department, b.department, _opt, sep=" ")
    _change(out, f"{label}: shares", a.shares, b.shares, _number, sep=" ")
    _quota(out, label, a.quota, b.quota, order)
    before = {s.name: s for s in a.schedules}
    after = {s.name: s for s in b.schedules}
    for name, schedule in after.items():
        if name not in before:
            out.append(f"{label}: schedule {name} added ({_window(schedule)})")
    for name in before:
        if name not in after:
            out.append(f"{label}: schedule {name} removed")
    kept_before = [n for n in before if n in after]
    kept_after = [n for n in after if n in before]
    if kept_before != kept_after:
        out.append(
            f"{label}: schedule order {', '.join(kept_before)} {ARROW} {', '.join(kept_after)}"
            " (the first matching schedule wins)"
        )
    for name in kept_after:
        _schedule(out, f"{label}: schedule {name}:", before[name], after[name], order)


def _quota(out: list[str], label: str, a: Quota, b: Quota, order: list[str]) -> None:
    for key in _keys(a.guaranteed, b.guaranteed):
        _change(out, f"{label}: guaranteed.{key}", a.guaranteed.get(key), b.guaranteed.get(key), _guarantee, sep=" ")
    for key in _keys(a.max, b.max):
        _change(out, f"{label}: max.{key}", a.max.get(key), b.max.get(key), _cap, sep=" ")
    _change(out, f"{label}: maxConcurrentJobs", a.max_concurrent_jobs, b.max_concurrent_jobs, _limit, sep=" ")
    _change(out, f"{label}: deviceHoursPerMonth", a.device_hours_per_month, b.device_hours_per_month, _limit, sep=" ")
    _change(
        out,
        f"{label}: maxJobDuration",
        a.max_job_duration_s,
        b.max_job_duration_s,
        lambda v: "unlimited" if v is None else _duration(v),
        sep=" ",
    )
    _change(
        out,
        f"{label}: allowedPriorityClasses",
        a.allowed_priority_classes,
        b.allowed_priority_classes,
        lambda v: "all" if v is None else _names(v, order),
        sep=" ",
    )


def _schedule(out: list[str], label: str, a: Schedule, b: Schedule, order: list[str]) -> None:
    _change(out, f"{label} days", a.days, b.days, format_days, sep=" ")
    _change(
        out,
        f"{label} between",
        (a.start_min, a.end_min),
        (b.start_min, b.end_min),
        lambda w: format_between(*w),
        sep=" ",
    )
    keys = list(dict.fromkeys([*a.quota, *b.quota]))
    for key in keys:
        va, vb = a.quota.get(key, _INHERITED), b.quota.get(key, _INHERITED)
        if key in ("guaranteed", "max"):
            ma = va if isinstance(va, Mapping) else {}
            mb = vb if isinstance(vb, Mapping) else {}
            for rkey in _keys(ma, mb):
                _change(
                    out,
                    f"{label} {key}.{rkey}",
                    ma.get(rkey, _INHERITED),
                    mb.get(rkey, _INHERITED),
                    partial(_override, key=key),
                    sep=" ",
                )
        else:
            _change(out, f"{label} {key}", va, vb, partial(_override, key=key, order=order), sep=" ")


def _keyed(
    out: list[str],
    noun: str,
    before: dict[str, object],
    after: dict[str, object],
    compare: Callable[[str, Any, Any], None],
) -> None:
    """Added, removed, then changed entries of a named list (teams, reservations...)."""
    for name in after:
        if name not in before:
            out.append(f"{noun} {name}: added")
    for name in before:
        if name not in after:
            out.append(f"{noun} {name}: removed")
    for name in after:
        if name in before and before[name] != after[name]:
            compare(f"{noun} {name}", before[name], after[name])


# -- formatting ------------------------------------------------------------------


class _Inherited:
    def __repr__(self) -> str:
        return "(inherited)"


_INHERITED = _Inherited()


def _change(
    out: list[str],
    label: str,
    a: object,
    b: object,
    fmt: Callable[[Any], str] | None = None,
    *,
    sep: str = ": ",
) -> None:
    """Append ``"<label><sep><a> → <b>"`` when the values differ."""
    if a == b:
        return
    show = fmt or (lambda v: str(v))
    out.append(f"{label}{sep}{show(a)} {ARROW} {show(b)}")


def _keys(a: Mapping[str, object], b: Mapping[str, object]) -> list[str]:
    return sorted(set(a) | set(b), key=lambda k: (k != "devices", k))


def _number(value: object) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _duration(value: object) -> str:
    return str(format_duration(float(value)))  # type: ignore[arg-type]


def _off_or_duration(value: object) -> str:
    return "off" if value is None else _duration(value)


def _policy_or_duration(value: object) -> str:
    return "(the policy's)" if value is None else _duration(value)


def _bool(value: object) -> str:
    return "true" if value else "false"


def _opt(value: object) -> str:
    return "none" if value is None else str(value)


def _guarantee(value: object) -> str:
    return "none" if value is None else _number(value)


def _cap(value: object) -> str:
    return "no cap" if value is None else _number(value)


def _limit(value: object) -> str:
    return "unlimited" if value is None else _number(value)


def _names(value: object, order: list[str]) -> str:
    names: Collection[str] = value  # type: ignore[assignment]
    known = [n for n in order if n in names]
    return "[" + ", ".join(known + sorted(n for n in names if n not in order)) + "]"


def _chips(value: object) -> str:
    return "all chips" if value is None else "[" + ", ".join(sorted(value)) + "]"  # type: ignore[call-overload]


def _window(schedule: Schedule) -> str:
    return f"{format_days(schedule.days)} {format_between(schedule.start_min, schedule.end_min)}"


def _override(value: object, key: str = "", order: list[str] | None = None) -> str:
    """A schedule override value; absent means the base quota applies."""
    if value is _INHERITED:
        return "(base)"
    if value is None:
        return {"guaranteed": "none", "max": "no cap"}.get(key, "unlimited")
    if key == "maxJobDuration":
        return _duration(value)
    if key == "allowedPriorityClasses":
        return _names(value, order or [])
    return _number(value)
