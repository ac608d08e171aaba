"""The scheduling policy as the engine sees it: typed, validated, time-aware.

The YAML format (``apiVersion: npuportal/v1``, ``kind: SchedulingPolicy``) is a
contract with admins and their scripts; this module is the one place that turns
that text into immutable objects, so the engine, the simulator, the dry run and
the console can never disagree about what a policy means.

Reading and checking the text lives in :mod:`policy_parse`, writing it back in
:mod:`policy_dump`, comparing versions in :mod:`policy_diff`; the functions
below are the public face of all of them, so callers import from here only.
Everything here is pure (stdlib + PyYAML): no Django.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Any, Literal
from zoneinfo import ZoneInfo

from scheduling.engine.durations import format_duration
from scheduling.engine.record import Record
from scheduling.engine.schedules import DAY_NAMES, covers

#: Resource key for all chips, counted in card equivalents.
DEVICES = "devices"

Severity = Literal["error", "warning"]


def chip_resource(chip_model: str) -> str:
    """Resource key of one chip model, e.g. ``devices/910B4``."""
    return f"{DEVICES}/{chip_model}"


@dataclass(frozen=True, slots=True)
class PolicyIssue(Record):
    """One thing wrong with a policy text, located by its path in the document.

    ``line`` (1-based, when known) is for editors that highlight the spot; it is
    left out of equality so tests and callers can compare issues by meaning.
    """

    path: str
    message: str
    severity: Severity = "error"
    line: int | None = field(default=None, compare=False)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class PolicyError(ValueError):
    """A policy text with at least one error; ``issues`` holds all of them.

    Raised only after the whole text was checked, so one round trip shows an
    admin every problem instead of the first.
    """

    def __init__(self, issues: list[PolicyIssue]) -> None:
        self.issues = issues
        errors = [i for i in issues if i.severity == "error"]
        lines = "\n".join(f"  {i}" for i in errors)
        super().__init__(f"invalid policy ({len(errors)} error(s)):\n{lines}")


@dataclass(frozen=True, slots=True)
class PriorityClass(Record):
    """One priority class; ``rank`` 0 is the highest (first in the YAML list)."""

    name: str
    rank: int
    preempts: frozenset[str] = frozenset()
    preemptible: bool = True
    default: bool = False
    #: ``starvationAfter``: this class's own starvation threshold in seconds (``None``: the policy's).
    starvation_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Quota(Record):
    """A team's limits in force at one moment.

    ``guaranteed`` and ``max`` map resource keys (``devices``,
    ``devices/<chip>``) to device units. A key that is absent means "no
    guarantee" for ``guaranteed`` and "no cap" for ``max``.
    ``None`` elsewhere means unlimited / all allowed.
    """

    guaranteed: Mapping[str, float] = field(default_factory=dict)
    max: Mapping[str, float] = field(default_factory=dict)
    max_concurrent_jobs: int | None = None
    device_hours_per_month: float | None = None
    max_job_duration_s: float | None = None
    allowed_priority_classes: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Schedule(Record):
    """A time-of-day quota window of one team.

    ``days`` holds weekday numbers (0 = Monday) on which the window *starts*;
    ``None`` means every day. ``start_min``/``end_min`` are minutes after
    midnight in the policy's timezone; a window whose end is not after its start
    wraps midnight. ``quota`` is the partial override as written, keyed by the
    YAML field names, with values normalised (numbers as floats, durations in
    seconds, class lists as frozensets; ``None`` where the text says ``null``,
    which removes a resource key or makes a scalar unlimited); fields it omits
    keep the base quota. ``resolved_quota`` is that override already merged onto
    the team's base quota by the parser, so matching a schedule on a tick costs
    no allocation.
    """

    name: str
    days: frozenset[int] | None
    start_min: int
    end_min: int
    quota: Mapping[str, object]
    resolved_quota: Quota | None = None

    def covers(self, weekday: int, minute: int) -> bool:
        """Whether the window is in force at local ``weekday``/``minute``."""
        return covers(self.days, self.start_min, self.end_min, weekday, minute)


@dataclass(frozen=True, slots=True)
class TeamPolicy(Record):
    name: str
    department: str | None
    shares: float
    quota: Quota
    schedules: tuple[Schedule, ...] = ()


@dataclass(frozen=True, slots=True)
class Reservation(Record):
    """A fraction of healthy devices held for some priority classes.

    ``chip_models`` ``None`` means the ratio applies to all chips overall.
    """

    name: str
    ratio: float
    chip_models: frozenset[str] | None
    priority_classes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Ordering(Record):
    """Multifactor priority weights (Slurm style) and the fair-share clock."""

    weight_priority_class: float = 10000.0
    weight_fair_share: float = 5000.0
    weight_age: float = 1000.0
    weight_job_size: float = 0.0
    max_age_s: float = 7 * 86400.0
    usage_half_life_s: float = 7 * 86400.0
    #: Weight of the duration factor (shorter runs first); 0 leaves it out.
    weight_duration: float = 0.0
    #: A job of this duration (maximum, else estimate) or longer gets the duration factor 0.
    long_job_s: float = 7 * 86400.0


@dataclass(frozen=True, slots=True)
class Policy(Record):
    """A whole parsed policy. Build it with :func:`parse_policy`."""

    name: str
    timezone: str
    priority_classes: tuple[PriorityClass, ...]
    ordering: Ordering
    placement_strategy: str  # "binpack" | "spread"
    backfill: bool
    grace_period_s: float
    on_preempt: str  # "requeue" | "cancel"
    reservations: tuple[Reservation, ...]
    departments: Mapping[str, float]  # department name -> shares
    teams: Mapping[str, TeamPolicy]
    defaults: TeamPolicy  # for teams the policy does not name (name "*")
    #: ``spec.starvation.after`` in seconds: a job waiting longer is served first and has cards
    #: held for it (:mod:`starvation`); ``None`` = the guard is off (classes may still set their own).
    starvation_after_s: float | None = None

    def team(self, name: str) -> TeamPolicy:
        """The team's policy, or the defaults for a team the policy does not name."""
        return self.teams.get(name) or self.defaults

    def class_by_name(self, name: str) -> PriorityClass | None:
        """The class called ``name``, or ``None`` if the policy has none.

        ``None`` rather than ``KeyError`` because jobs outlive policies: a job
        queued under a class that a later policy dropped is normal, and the
        caller decides (usually :meth:`resolve_class`). A linear scan beats a
        dict here: policies have a handful of classes.
        """
        for pc in self.priority_classes:
            if pc.name == name:
                return pc
        return None

    @property
    def default_class(self) -> PriorityClass:
        """The class of jobs submitted without one.

        The parser marks exactly one class ``default``; the fallbacks
        ("normal", else the lowest) only matter for hand-built policies.
        """
        for pc in self.priority_classes:
            if pc.default:
                return pc
        return self.class_by_name("normal") or self.priority_classes[-1]

    def resolve_class(self, name: str | None) -> PriorityClass:
        """The class called ``name``; the default class when unset or unknown."""
        return (self.class_by_name(name) if name else None) or self.default_class

    def may_preempt(self, preemptor: str | None, victim: str | None) -> bool:
        """Whether a job of class ``preemptor`` may evict a job of class ``victim``."""
        attacker = self.resolve_class(preemptor)
        target = self.resolve_class(victim)
        return target.preemptible and target.name in attacker.preempts

    def quota_at(self, team: str, at: datetime) -> tuple[Quota, str | None]:
        """Same as the module function :func:`quota_at`."""
        return quota_at(self, team, at)

    def starvation_after(self, cls: str) -> float | None:
        """Seconds after which a waiting job of class ``cls`` counts as starving (``None``: never).

        A class's own ``starvationAfter`` wins over ``spec.starvation.after``; a job of a
        class the policy no longer has takes the policy's threshold.
        """
        pc = self.class_by_name(cls)
        if pc is not None and pc.starvation_after_s is not None:
            return pc.starvation_after_s
        return self.starvation_after_s


# --------------------------------------------------------------------------
# Time: which quota is in force when


@lru_cache(maxsize=64)
def zone(name: str) -> ZoneInfo:
    """The ``ZoneInfo`` of a (validated) timezone name, cached for the tick."""
    return ZoneInfo(name)


def as_policy_time(policy: Policy, value: datetime) -> datetime:
    """``value`` in the policy's timezone; a naive value is read as local time there.

    For command lines and forms where an admin types "2026-11-27T23:30" and
    means the cluster's wall clock. :func:`quota_at` itself refuses naive
    times, because inside the engine a naive time is always a bug.
    """
    tz = zone(policy.timezone)
    if value.tzinfo is None or value.utcoffset() is None:
        return value.replace(tzinfo=tz)
    return value.astimezone(tz)


def merge_quota(base: Quota, override: Mapping[str, object]) -> Quota:
    """``base`` with a schedule's partial override applied.

    ``guaranteed``/``max`` merge key by key (``None`` removes a key); scalar
    fields the override names replace the base value, ``None`` included.
    A guarantee is then clamped to the cap of the same key: a night window
    that only says ``max: {devices: 4}`` means "at most 4 tonight", and a
    guarantee of 8 inherited from the base quota cannot outlive that cap.
    (The validator rejects a schedule that *itself* guarantees more than it
    allows, so the clamp only ever lowers inherited guarantees.)
    """
    guaranteed = _merge_resources(base.guaranteed, override.get("guaranteed"))
    maximum = _merge_resources(base.max, override.get("max"))
    if any(key in maximum and maximum[key] < amount for key, amount in guaranteed.items()):
        guaranteed = {key: min(amount, maximum.get(key, amount)) for key, amount in guaranteed.items()}
    classes: Any = override.get("allowedPriorityClasses", base.allowed_priority_classes)
    return Quota(
        guaranteed=guaranteed,
        max=maximum,
        max_concurrent_jobs=_scalar(override, "maxConcurrentJobs", base.max_concurrent_jobs),
        device_hours_per_month=_scalar(override, "deviceHoursPerMonth", base.device_hours_per_month),
        max_job_duration_s=_scalar(override, "maxJobDuration", base.max_job_duration_s),
        allowed_priority_classes=None if classes is None else frozenset(classes),
    )


def _merge_resources(base: Mapping[str, float], override: object) -> Mapping[str, float]:
    if not isinstance(override, Mapping) or not override:
        return base
    merged = dict(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = float(value)
    return merged


def _scalar(override: Mapping[str, object], key: str, default: Any) -> Any:
    """The override's value if it names ``key`` (validated by the parser), else ``default``."""
    return override[key] if key in override else default


def quota_for_team(team: TeamPolicy, weekday: int, minute: int) -> tuple[Quota, str | None]:
    """The team's quota at a local wall-clock ``weekday`` (0 = Monday) and minute.

    First matching schedule wins; the base quota when none matches.
    """
    for schedule in team.schedules:
        if covers(schedule.days, schedule.start_min, schedule.end_min, weekday, minute):
            quota = schedule.resolved_quota or merge_quota(team.quota, schedule.quota)
            return quota, schedule.name
    return team.quota, None


def quota_at(policy: Policy, team: str, at: datetime) -> tuple[Quota, str | None]:
    """The team's quota in force at ``at`` and the schedule that produced it.

    ``at`` must be timezone-aware: it is converted to the policy's wall clock,
    which is what schedule windows are written in (so a window keeps meaning
    "09:00-18:00 on the office clock" across DST changes).
    """
    weekday, minute = policy_clock(policy, at)
    return quota_for_team(policy.team(team), weekday, minute)


def policy_clock(policy: Policy, at: datetime) -> tuple[int, int]:
    """``(weekday, minute of the day)`` of ``at`` on the policy's wall clock (a tick reads it once)."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("quota_at needs an aware datetime (got a naive one)")
    local = at.astimezone(zone(policy.timezone))
    return local.weekday(), local.hour * 60 + local.minute


def _num(value: float) -> int | float:
    """Whole numbers as ints, so JSON and YAML show ``8`` rather than ``8.0``."""
    return int(value) if float(value).is_integer() else float(value)


def _ordered_classes(policy: Policy, names: Collection[str]) -> list[str]:
    """Class names in the policy's priority order (unknown ones last, sorted)."""
    known = [pc.name for pc in policy.priority_classes if pc.name in names]
    return known + sorted(n for n in names if n not in known)


def quota_to_json(policy: Policy, quota: Quota) -> dict[str, object]:
    """A quota in the YAML's field names, JSON-ready (``None`` = unlimited)."""
    duration = quota.max_job_duration_s
    classes = quota.allowed_priority_classes
    return {
        "guaranteed": {k: _num(v) for k, v in sorted(quota.guaranteed.items())},
        "max": {k: _num(v) for k, v in sorted(quota.max.items())},
        "maxConcurrentJobs": quota.max_concurrent_jobs,
        "deviceHoursPerMonth": (None if quota.device_hours_per_month is None else _num(quota.device_hours_per_month)),
        "maxJobDuration": None if duration is None else format_duration(duration),
        "allowedPriorityClasses": None if classes is None else _ordered_classes(policy, classes),
    }


def effective_quotas(policy: Policy, at: datetime, teams: Iterable[str] | None = None) -> dict[str, object]:
    """Every team's quota in force at ``at``, as the console and CLI show it.

    Shape: ``{"at": iso, "teams": {team: {"schedule": name | None, "guaranteed":
    {...}, "max": {...}, "maxConcurrentJobs": ..., "deviceHoursPerMonth": ...,
    "maxJobDuration": "24h" | seconds | None, "allowedPriorityClasses": [...] |
    None}}}``. ``teams`` ``None`` means the teams the policy names; any other
    name (``"*"`` included) gets the defaults. ``at`` is reported on the
    policy's wall clock, which is the clock the schedules are written in.
    """
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("effective_quotas needs an aware datetime (got a naive one)")
    local = at.astimezone(zone(policy.timezone))
    names = list(policy.teams) if teams is None else list(teams)
    out: dict[str, object] = {}
    for name in names:
        quota, schedule = quota_at(policy, name, local)
        out[name] = {"schedule": schedule, **quota_to_json(policy, quota)}
    return {"at": local.isoformat(), "teams": out}


def week_grid(policy: Policy, team: str, week_start: date) -> list[list[dict[str, object]]]:
    """The team's quota at each hour of a week, for a heatmap: 7 rows of 24 cells.

    Row ``d`` is ``week_start + d days``; cell ``h`` is the quota at ``h:00`` on
    the policy's wall clock (read as wall clock directly, so the hour that a
    spring-forward day skips still gets a cell). Each cell is ``{"date": iso,
    "weekday": "mon", "hour": h, "schedule": name | None, "guaranteed": devices,
    "max": devices | None}``; ``guaranteed`` 0 means no guarantee, ``max`` None
    means no cap.
    """
    tp = policy.team(team)
    grid: list[list[dict[str, object]]] = []
    for offset in range(7):
        day = week_start + timedelta(days=offset)
        weekday = day.weekday()
        row: list[dict[str, object]] = []
        for hour in range(24):
            quota, schedule = quota_for_team(tp, weekday, hour * 60)
            cap = quota.max.get(DEVICES)
            row.append(
                {
                    "date": day.isoformat(),
                    "weekday": DAY_NAMES[weekday],
                    "hour": hour,
                    "schedule": schedule,
                    "guaranteed": _num(quota.guaranteed.get(DEVICES, 0.0)),
                    "max": None if cap is None else _num(cap),
                }
            )
        grid.append(row)
    return grid


# --------------------------------------------------------------------------
# Text in, text out. Implemented in sibling modules; imported lazily because
# those modules build on the types above.


def parse_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> Policy:
    """The policy in ``text``; raises :class:`PolicyError` listing every error.

    Warnings do not stop parsing (call :func:`validate_policy` to see them).
    """
    from scheduling.engine.policy_parse import parse_policy as _parse

    return _parse(text, chip_models=chip_models, capacity=capacity)


def load_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> tuple[Policy | None, list[PolicyIssue]]:
    """``(policy, issues)``; never raises. The policy is ``None`` if any issue is an error."""
    from scheduling.engine.policy_parse import load_policy as _load

    return _load(text, chip_models=chip_models, capacity=capacity)


def validate_policy(
    text: str,
    *,
    chip_models: Collection[str] | None = None,
    capacity: Mapping[str, float] | None = None,
) -> list[PolicyIssue]:
    """Every error and warning in ``text`` at once, in document order.

    ``chip_models``: the cluster's chip models; when given, naming another one
    is an error. ``capacity``: healthy capacity per resource key, in device
    units; when given, guarantees summing above it are a warning.
    """
    return load_policy(text, chip_models=chip_models, capacity=capacity)[1]


def dump_policy(policy: Policy) -> str:
    """Canonical YAML of ``policy``; ``parse_policy(dump_policy(p)) == p``."""
    from scheduling.engine.policy_dump import dump_policy as _dump

    return _dump(policy)


def diff_policies(old_text: str, new_text: str, *, old_name: str = "old", new_name: str = "new") -> str:
    """A unified diff of two policy texts ("" when they are equal)."""
    from scheduling.engine.policy_diff import diff_policies as _diff

    return _diff(old_text, new_text, old_name=old_name, new_name=new_name)


def semantic_diff(old: Policy, new: Policy) -> list[str]:
    """What changed in meaning, one human line per change.

    E.g. ``"team inference: max.devices 16 → 24"``, ``"team research: added"``.
    Formatting-only edits produce no lines.
    """
    from scheduling.engine.policy_diff import semantic_diff as _semantic

    return _semantic(old, new)
