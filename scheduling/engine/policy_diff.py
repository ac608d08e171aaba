"""What changed between two policies: as text, and as meaning.

The text diff is what a reviewer reads next to the editor; the semantic diff
is what goes into the history entry and the apply confirmation, where
"team inference: max.devices 16 → 24" says more than a moved line of YAML.
Semantic lines compare parsed policies, so reformatting, reordering keys or
writing ``120s`` as ``2m`` produce none.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from datetime import date
from functools import partial
from typing import Any

from scheduling.engine.policy_fields import (
    ORDERING_FIELDS,
    QUOTA_FIELDS,
    SPEC_FIELDS,
    PolicyField,
    resource_keys,
    show_classes,
    show_duration,
    show_flag,
    show_number,
)
from scheduling.engine.policy_model import Policy, Quota, Reservation, Schedule, TeamPolicy
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
    for f in ORDERING_FIELDS:
        before, after = getattr(old.ordering, f.attr), getattr(new.ordering, f.attr)
        _change(out, f"ordering.{f.yaml}", before, after, _shown(f, order))
    for f in SPEC_FIELDS:
        _change(out, f.yaml, getattr(old, f.attr), getattr(new, f.attr), _shown(f, order))
    _reservations(out, old, new, order)
    _keyed(
        out,
        "department",
        dict(old.departments),
        dict(new.departments),
        lambda label, a, b: _change(out, f"{label}: shares", a, b, show_number, sep=" "),
    )
    _keyed(
        out,
        "team",
        dict(old.teams),
        dict(new.teams),
        lambda label, a, b: _team(out, label, a, b, order),
    )
    _team(out, "defaults", old.defaults, new.defaults, order)
    for role in ("finance", "admins"):
        _change(out, f"directory.{role}", getattr(old.directory, role), getattr(new.directory, role), _opt, sep=" ")
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
        _change(out, f"{label}: preempts", a.preempts, b.preempts, partial(show_classes, order=order), sep=" ")
        _change(out, f"{label}: preemptible", a.preemptible, b.preemptible, show_flag, sep=" ")
        _change(
            out, f"{label}: starvationAfter", a.starvation_after_s, b.starvation_after_s, _policy_or_duration, sep=" "
        )
    if old.default_class.name != new.default_class.name:
        out.append(f"default priority class: {old.default_class.name} {ARROW} {new.default_class.name}")


def _reservations(out: list[str], old: Policy, new: Policy, order: list[str]) -> None:
    def compare(label: str, a: object, b: object) -> None:
        assert isinstance(a, Reservation) and isinstance(b, Reservation)
        _change(out, f"{label}: ratio", a.ratio, b.ratio, show_number, sep=" ")
        _change(out, f"{label}: chipModels", a.chip_models, b.chip_models, _chips, sep=" ")
        _change(
            out,
            f"{label}: forPriorityClasses",
            a.priority_classes,
            b.priority_classes,
            partial(show_classes, order=order),
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
    _change(out, f"{label}: shares", a.shares, b.shares, show_number, sep=" ")
    for role in ("members", "leads"):
        _change(
            out,
            f"{label}: directory.{role}",
            getattr(a.directory, role, None),
            getattr(b.directory, role, None),
            _opt,
            sep=" ",
        )
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
    for f in QUOTA_FIELDS:
        va, vb = getattr(a, f.attr), getattr(b, f.attr)
        if f.resources:
            for key in resource_keys(set(va) | set(vb)):
                _change(out, f"{label}: {f.yaml}.{key}", va.get(key), vb.get(key), _shown(f, order), sep=" ")
        else:
            _change(out, f"{label}: {f.yaml}", va, vb, _shown(f, order), sep=" ")


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
    _change(out, f"{label} dates", a.dates, b.dates, _dates, sep=" ")
    by_name = {f.yaml: f for f in QUOTA_FIELDS}
    for key in dict.fromkeys([*a.quota, *b.quota]):  # as written: the old schedule's fields, then new ones
        f = by_name[key]
        va, vb = a.quota.get(f.yaml, _INHERITED), b.quota.get(f.yaml, _INHERITED)
        if f.resources:
            ma = va if isinstance(va, Mapping) else {}
            mb = vb if isinstance(vb, Mapping) else {}
            for rkey in resource_keys(set(ma) | set(mb)):
                _change(
                    out,
                    f"{label} {f.yaml}.{rkey}",
                    ma.get(rkey, _INHERITED),
                    mb.get(rkey, _INHERITED),
                    partial(_override, field=f, order=order),
                    sep=" ",
                )
        else:
            _change(out, f"{label} {f.yaml}", va, vb, partial(_override, field=f, order=order), sep=" ")


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


def _policy_or_duration(value: object) -> str:
    return "(the policy's)" if value is None else show_duration(value)


def _opt(value: object) -> str:
    return "none" if value is None else str(value)


def _chips(value: object) -> str:
    return "all chips" if value is None else "[" + ", ".join(sorted(value)) + "]"  # type: ignore[call-overload]


def _window(schedule: Schedule) -> str:
    text = f"{format_days(schedule.days)} {format_between(schedule.start_min, schedule.end_min)}"
    return text if schedule.dates is None else f"{text}, {_dates(schedule.dates)}"


def _dates(dates: tuple[date, date] | None) -> str:
    if dates is None:
        return "every week"
    return f"{dates[0]} to {dates[1]}"


def _shown(f: PolicyField, order: list[str]) -> Callable[[object], str]:
    """A field's value in a diff line: its formatter, or what ``None`` means for it."""
    return lambda value: f.unset if value is None else f.show(value, order)


def _override(value: object, field: PolicyField, order: list[str]) -> str:
    """A schedule override value; absent means the base quota applies."""
    if value is _INHERITED:
        return "(base)"
    return _shown(field, order)(value)
