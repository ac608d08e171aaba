"""The policy format's fields, described once: how each is read, written back, shown and compared.

A field of the YAML (``maxConcurrentJobs``) is one row: its YAML name, the attribute it fills
(``Quota.max_concurrent_jobs``), the reader that checks it, the formatter that writes it back
(canonical YAML, the effective-quota JSON) and the label and words of a semantic diff. The
parser (:mod:`policy_parse`), the exporter (:mod:`policy_dump`), the differ (:mod:`policy_diff`)
and the quota merge (:func:`policy_model.merge_quota`) all walk these tables, so adding a field
to a section is adding one row here (and its attribute to the record it fills).

Three sections are tables: a quota (:data:`QUOTA_FIELDS`), ``spec.ordering``
(:data:`ORDERING_FIELDS`) and ``spec``'s single settings (:data:`SPEC_FIELDS`). The named lists
(priority classes, reservations, departments, teams, schedules) are read by hand in
:mod:`policy_parse`, because what is checked there is mostly between entries (duplicate names,
references, ratios that must sum below 1), not field by field.

Readers get the parser through :class:`FieldReader` (a protocol), so this module imports nothing
of the parser and sits below every module that reads or writes a policy. Pure Python, no Django.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from scheduling.engine.durations import format_duration

API_VERSION = "npuportal/v1"
KIND = "SchedulingPolicy"
PLACEMENT_STRATEGIES = ("binpack", "spread")
ON_PREEMPT = ("requeue", "cancel")


class FieldReader(Protocol):
    """What a row's reader may ask of the parser: checked values, errors reported at ``path``.

    Each returns ``None`` when the value is unusable (its error already reported).
    """

    def number(self, value: object, path: str, *, integer: bool = False) -> float | None: ...

    def duration(self, value: object, path: str, *, positive: bool) -> float | None: ...

    def flag(self, value: object, path: str) -> bool | None: ...

    def choice(self, value: object, path: str, choices: Sequence[str]) -> str | None: ...

    def class_list(self, value: object, path: str) -> frozenset[str] | None: ...

    def resources(self, value: object, path: str, *, allow_null: bool) -> dict[str, float | None] | None: ...


#: ``read(reader, value, path, partial)``: the checked value, or ``None`` when it is unusable.
#: ``partial`` is true in a schedule's override, where ``null`` may remove a resource key.
Read = Callable[[FieldReader, object, str, bool], object]
#: ``write(value, class order)``: a value (never ``None``) as the YAML and the JSON write it.
Write = Callable[[object, Sequence[str]], object]
#: ``show(value, class order)``: a value (never ``None``) in a semantic diff line.
Show = Callable[[object, Sequence[str]], str]


@dataclass(frozen=True, slots=True)
class PolicyField:
    """One field of a section of the policy (a row of :data:`QUOTA_FIELDS` or :data:`ORDERING_FIELDS`)."""

    #: Name in the YAML, relative to its section (``maxAge``, ``weights.age``).
    yaml: str
    #: Attribute of the record the section reads into (``Quota``, ``Ordering``).
    attr: str
    read: Read
    write: Write
    show: Show
    #: A value as an admin writes it (not the default): for the reference and the round-trip tests.
    example: object = None
    #: How ``None`` reads in a diff: what an unset value means (``unlimited``, ``all``).
    unset: str = "unlimited"
    #: What ``null`` in the YAML does: ``unset`` the value (quotas: unlimited), keep the ``default``,
    #: or ``read`` it like any value (so the reader refuses it, naming the field).
    null: str = "unset"
    #: The value when the YAML leaves the field out, for records that have no default of their own (``Policy``).
    default: object = None
    #: The field must be written when its sub-mapping is (``starvation: {after: ...}``).
    required: bool = False
    #: A mapping of resource keys (``devices``, ``devices/<chip>``): merged and compared key by key.
    resources: bool = False
    #: Written back only when it differs from the record's default, so older exports stay as they were.
    omit_default: bool = False

    @property
    def key(self) -> str:
        """The field's own key in its mapping (``age`` for ``weights.age``)."""
        return self.yaml.rpartition(".")[2]

    @property
    def group(self) -> str:
        """The sub-mapping the field sits in within its section (``weights``), ``""`` for none."""
        return self.yaml.rpartition(".")[0]


# -- values as written back ----------------------------------------------------------------------


def num(value: float) -> int | float:
    """Whole numbers as ints, so YAML and JSON show ``8`` rather than ``8.0``."""
    return int(value) if float(value).is_integer() else float(value)


def ordered_classes(names: Collection[str], order: Sequence[str]) -> list[str]:
    """Class names in the policy's priority order (highest first; unknown ones last, sorted)."""
    known = [n for n in order if n in names]
    return known + sorted(n for n in names if n not in order)


def resource_keys(keys: Collection[str]) -> list[str]:
    """``devices`` first, then chip keys in name order."""
    return sorted(keys, key=lambda k: (k != "devices", k))


def _write_number(value: object, order: Sequence[str]) -> object:
    return num(value)  # type: ignore[arg-type]


def _write_count(value: object, order: Sequence[str]) -> object:
    return value


def _write_duration(value: object, order: Sequence[str]) -> object:
    return format_duration(float(value))  # type: ignore[arg-type]


def _write_classes(value: object, order: Sequence[str]) -> object:
    return ordered_classes(value, order)  # type: ignore[arg-type]


def _write_resources(value: object, order: Sequence[str]) -> object:
    amounts: Mapping[str, float | None] = value  # type: ignore[assignment]
    return {k: None if amounts[k] is None else num(amounts[k]) for k in resource_keys(amounts)}  # type: ignore[arg-type]


# -- values in a diff line ------------------------------------------------------------------------


def show_number(value: object, order: Sequence[str] = ()) -> str:
    """``8`` for 8.0, ``0.5`` for 0.5, an int as it is."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def show_duration(value: object, order: Sequence[str] = ()) -> str:
    """The canonical text of a number of seconds (``24h``, ``90m``)."""
    return str(format_duration(float(value)))  # type: ignore[arg-type]


def show_classes(value: object, order: Sequence[str] = ()) -> str:
    """``[high, normal]``: class names in priority order."""
    return "[" + ", ".join(ordered_classes(value, order)) + "]"  # type: ignore[arg-type]


# -- readers -------------------------------------------------------------------------------------


def _read_resources(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.resources(value, path, allow_null=partial)


def _read_count(r: FieldReader, value: object, path: str, partial: bool) -> object:
    number = r.number(value, path, integer=True)
    return None if number is None else int(number)


def _read_number(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.number(value, path)


def _read_positive_duration(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.duration(value, path, positive=True)


def _read_classes(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.class_list(value, path)


def _read_duration(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.duration(value, path, positive=False)


def _read_flag(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.flag(value, path)


def _read_strategy(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.choice(value, path, PLACEMENT_STRATEGIES)


def _read_on_preempt(r: FieldReader, value: object, path: str, partial: bool) -> object:
    return r.choice(value, path, ON_PREEMPT)


def _write_as_is(value: object, order: Sequence[str]) -> object:
    return value


def show_text(value: object, order: Sequence[str] = ()) -> str:
    return str(value)


def show_flag(value: object, order: Sequence[str] = ()) -> str:
    return "true" if value else "false"


# -- the tables ------------------------------------------------------------------------------------

#: A team's quota (``quota:`` of a team or of ``defaults``, and a schedule's partial ``quota:``),
#: in the order they are written; ``null`` sets a scalar to its ``unset`` meaning.
QUOTA_FIELDS: tuple[PolicyField, ...] = (
    # YAML name, attribute, reader, formatter, diff formatter; then an example, and what null means
    PolicyField(
        "guaranteed", "guaranteed", _read_resources, _write_resources, show_number,
        example={"devices": 4}, unset="none", resources=True,
    ),
    PolicyField(
        "max", "max", _read_resources, _write_resources, show_number,
        example={"devices": 8, "devices/910B": 4}, unset="no cap", resources=True,
    ),
    PolicyField(
        "maxConcurrentJobs", "max_concurrent_jobs", _read_count, _write_count, show_number,
        example=3,
    ),
    PolicyField(
        "deviceHoursPerMonth", "device_hours_per_month", _read_number, _write_number, show_number,
        example=1500.5,
    ),
    PolicyField(
        "maxJobDuration", "max_job_duration_s", _read_positive_duration, _write_duration, show_duration,
        example="36h",
    ),
    PolicyField(
        "allowedPriorityClasses", "allowed_priority_classes", _read_classes, _write_classes, show_classes,
        example=["high", "normal"], unset="all",
    ),
)  # fmt: skip

#: ``spec.ordering``: the multifactor weights and the clocks of age and fair share.
ORDERING_FIELDS: tuple[PolicyField, ...] = (
    PolicyField(
        "weights.priorityClass", "weight_priority_class", _read_number, _write_number, show_number,
        example=20000, null="read",
    ),
    PolicyField(
        "weights.fairShare", "weight_fair_share", _read_number, _write_number, show_number,
        example=2500, null="read",
    ),
    PolicyField(
        "weights.age", "weight_age", _read_number, _write_number, show_number,
        example=500, null="read",
    ),
    PolicyField(
        "weights.jobSize", "weight_job_size", _read_number, _write_number, show_number,
        example=100, null="read",
    ),
    PolicyField(
        "weights.duration", "weight_duration", _read_number, _write_number, show_number,
        example=300, null="read", omit_default=True,
    ),
    PolicyField(
        "maxAge", "max_age_s", _read_positive_duration, _write_duration, show_duration,
        example="14d", null="default",
    ),
    PolicyField(
        "usageHalfLife", "usage_half_life_s", _read_positive_duration, _write_duration, show_duration,
        example="3d", null="default",
    ),
    PolicyField(
        "longJob", "long_job_s", _read_positive_duration, _write_duration, show_duration,
        example="2d", null="default", omit_default=True,
    ),
)  # fmt: skip


#: ``spec``'s single settings after ``ordering``: where jobs go, backfill, preemption, starvation.
SPEC_FIELDS: tuple[PolicyField, ...] = (
    PolicyField(
        "placement.strategy", "placement_strategy", _read_strategy, _write_as_is, show_text,
        example="spread", default="binpack", null="read",
    ),
    PolicyField(
        "backfill", "backfill", _read_flag, _write_as_is, show_flag,
        example=False, default=True, null="default",
    ),
    PolicyField(
        "preemption.gracePeriod", "grace_period_s", _read_duration, _write_duration, show_duration,
        example="5m", default=120.0, null="default",
    ),
    PolicyField(
        "preemption.onPreempt", "on_preempt", _read_on_preempt, _write_as_is, show_text,
        example="cancel", default="requeue", null="read",
    ),
    PolicyField(
        "preemption.reclaimLossLimit", "reclaim_loss_limit_s", _read_positive_duration, _write_duration,
        show_duration, example="30m", default=7200.0, null="default", omit_default=True,
    ),
    PolicyField(
        "starvation.after", "starvation_after_s", _read_positive_duration, _write_duration, show_duration,
        example="6h", unset="off", null="read", required=True,
    ),
)  # fmt: skip


def section_keys(fields: Sequence[PolicyField], group: str = "") -> tuple[str, ...]:
    """The keys a section's mapping (``group`` ``""``) or one of its sub-mappings may hold, in table order.

    A section's own keys include the name of each sub-mapping (``weights``) where its first row is.
    """
    keys: list[str] = []
    for f in fields:
        if f.group == group:
            key = f.key
        elif not group:
            key = f.group
        else:
            continue
        if key not in keys:
            keys.append(key)
    return tuple(keys)
