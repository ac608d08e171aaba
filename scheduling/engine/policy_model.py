"""The scheduling policy's records and what they mean over time: the types the engine decides with.

:mod:`policy` is the public face (import from there); this module holds the immutable records a
parsed policy is made of, the quota merge of a time-of-day schedule, and which quota is in force
when. Reading, writing and comparing the text build on it (:mod:`policy_parse`,
:mod:`policy_dump`, :mod:`policy_diff`), as does the table of fields they share
(:mod:`policy_fields`), so nothing here imports them. Pure Python: no Django.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from functools import lru_cache
from typing import Any, Literal
from zoneinfo import ZoneInfo

from scheduling.engine.policy_fields import QUOTA_FIELDS, num
from scheduling.engine.record import Record
from scheduling.engine.schedules import DAY_NAMES, covers

#: Resource key for all chips, counted in card equivalents.
DEVICES = "devices"
#: The default of ``spec.preemption.reclaimLossLimit``: two hours of a run's work per card.
RECLAIM_LOSS_LIMIT_S = 7200.0

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
    #: ``dates: {from, until}``: the window is in force only on these local dates, both included
    #: (a time-bounded change, such as an approved quota request); ``None``: every week.
    dates: tuple[date, date] | None = None

    def covers(self, weekday: int, minute: int, day: date | None = None) -> bool:
        """Whether the window is in force at local ``weekday``/``minute`` (on local date ``day``)."""
        return in_dates(self.dates, day) and covers(self.days, self.start_min, self.end_min, weekday, minute)


def in_dates(dates: tuple[date, date] | None, day: date | None) -> bool:
    """Whether a schedule's ``dates`` admit local date ``day``; an undated schedule admits every day,
    a dated one none when the date is not known (a week in general, as the capacity warnings ask)."""
    if dates is None:
        return True
    return day is not None and dates[0] <= day <= dates[1]


@dataclass(frozen=True, slots=True)
class TeamDirectory(Record):
    """``teams[].directory``: the site directory's groups whose members make up the team.

    Each is a group's cn or its DN, compared without regard to case. A team with ``members``
    is run from the directory: sign-ins and ``directory sync`` set who is in it, not the console.
    """

    members: str
    leads: str | None = None


@dataclass(frozen=True, slots=True)
class DirectoryRoles(Record):
    """``spec.directory``: the directory groups that make people finance or admins."""

    finance: str | None = None
    admins: str | None = None


@dataclass(frozen=True, slots=True)
class TeamPolicy(Record):
    name: str
    department: str | None
    shares: float
    quota: Quota
    schedules: tuple[Schedule, ...] = ()
    directory: TeamDirectory | None = None


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
    #: ``spec.preemption.reclaimLossLimit`` in seconds: a guarantee reclaim never stops a run that
    #: would lose more than this much of its work per card (:mod:`preemption`, *Reclaim bound*).
    reclaim_loss_limit_s: float = RECLAIM_LOSS_LIMIT_S
    #: ``spec.directory``: which directory groups make people finance or admins.
    directory: DirectoryRoles = DirectoryRoles()

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
    values: dict[str, Any] = {}
    for f in QUOTA_FIELDS:
        current = getattr(base, f.attr)
        if f.resources:
            values[f.attr] = _merge_resources(current, override.get(f.yaml))
        else:
            values[f.attr] = override[f.yaml] if f.yaml in override else current
    guaranteed, maximum = values["guaranteed"], values["max"]
    if any(key in maximum and maximum[key] < amount for key, amount in guaranteed.items()):
        values["guaranteed"] = {key: min(amount, maximum.get(key, amount)) for key, amount in guaranteed.items()}
    classes = values["allowed_priority_classes"]
    values["allowed_priority_classes"] = None if classes is None else frozenset(classes)
    return Quota(**values)


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


def quota_for_team(team: TeamPolicy, weekday: int, minute: int, day: date | None = None) -> tuple[Quota, str | None]:
    """The team's quota at a local wall-clock ``weekday`` (0 = Monday) and minute, on local date ``day``.

    First matching schedule wins; the base quota when none matches. A dated schedule matches
    only on its dates (never when ``day`` is not given).
    """
    for schedule in team.schedules:
        if schedule.dates is not None and not in_dates(schedule.dates, day):
            continue
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
    weekday, minute, day = policy_clock(policy, at)
    return quota_for_team(policy.team(team), weekday, minute, day)


def policy_clock(policy: Policy, at: datetime) -> tuple[int, int, date]:
    """``(weekday, minute of the day, date)`` of ``at`` on the policy's wall clock (a tick reads it once)."""
    if at.tzinfo is None or at.utcoffset() is None:
        raise ValueError("quota_at needs an aware datetime (got a naive one)")
    local = at.astimezone(zone(policy.timezone))
    return local.weekday(), local.hour * 60 + local.minute, local.date()


def quota_to_json(policy: Policy, quota: Quota) -> dict[str, object]:
    """A quota in the YAML's field names, JSON-ready (``None`` = unlimited)."""
    order = [pc.name for pc in policy.priority_classes]
    out: dict[str, object] = {}
    for f in QUOTA_FIELDS:
        value = getattr(quota, f.attr)
        out[f.yaml] = None if value is None else f.write(value, order)
    return out


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
            quota, schedule = quota_for_team(tp, weekday, hour * 60, day)
            cap = quota.max.get(DEVICES)
            row.append(
                {
                    "date": day.isoformat(),
                    "weekday": DAY_NAMES[weekday],
                    "hour": hour,
                    "schedule": schedule,
                    "guaranteed": num(quota.guaranteed.get(DEVICES, 0.0)),
                    "max": None if cap is None else num(cap),
                }
            )
        grid.append(row)
    return grid
