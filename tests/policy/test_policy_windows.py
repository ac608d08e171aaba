"""When is which quota in force: window edges, midnight, weekdays, DST, precedence."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from scheduling.engine.policy import (
    Policy,
    Quota,
    as_policy_time,
    effective_quotas,
    parse_policy,
    quota_at,
    week_grid,
)

pytestmark = pytest.mark.clock


def make(schedules: str, tz: str = "UTC", base: str = "{guaranteed: {devices: 2}, max: {devices: 10}}") -> Policy:
    return parse_policy(
        f"""\
apiVersion: npuportal/v1
kind: SchedulingPolicy
spec:
  timezone: {tz}
  teams:
    - name: t
      quota: {base}
      schedules: {schedules}
  defaults: {{shares: 2, quota: {{max: {{devices: 3}}, maxConcurrentJobs: 1}}}}
"""
    )


def schedule_at(policy: Policy, at: datetime) -> str | None:
    return quota_at(policy, "t", at)[1]


def local(policy: Policy, text: str) -> datetime:
    """A wall-clock time in the policy's zone (2026-11-27 is a Friday)."""
    return datetime.fromisoformat(text).replace(tzinfo=ZoneInfo(policy.timezone))


DAY = make('[{name: day, between: "09:00-18:00"}]')
FRI_NIGHT = make('[{name: n, days: [fri], between: "22:00-06:00"}]')
SUN_NIGHT = make('[{name: n, days: [sun], between: "22:00-06:00"}]')
TO_MIDNIGHT = make('[{name: evening, between: "18:00-24:00"}]')
FULL_DAY = make('[{name: all, days: [wed], between: "00:00-00:00"}]')
WEEKDAYS = make('[{name: wd, days: [mon, tue, wed, thu, fri], between: "00:00-24:00"}]')


@pytest.mark.parametrize(
    ("policy", "when", "expected"),
    [
        # start inclusive, end exclusive
        (DAY, "2026-11-27T09:00", "day"),
        (DAY, "2026-11-27T08:59:59", None),
        (DAY, "2026-11-27T17:59:59", "day"),
        (DAY, "2026-11-27T18:00", None),
        # midnight wrap: days name the day the window starts
        (FRI_NIGHT, "2026-11-27T22:00", "n"),  # Fri 22:00
        (FRI_NIGHT, "2026-11-27T21:59", None),
        (FRI_NIGHT, "2026-11-28T02:00", "n"),  # Sat 02:00 belongs to Friday's window
        (FRI_NIGHT, "2026-11-28T05:59", "n"),
        (FRI_NIGHT, "2026-11-28T06:00", None),  # Sat 06:00: end exclusive
        (FRI_NIGHT, "2026-11-27T02:00", None),  # Fri 02:00 would be Thursday's window
        (FRI_NIGHT, "2026-11-28T22:00", None),  # Sat 22:00: not a Friday
        (FRI_NIGHT, "2026-11-29T02:00", None),
        # weekday boundary: Sunday's night runs into Monday
        (SUN_NIGHT, "2026-11-29T23:59", "n"),
        (SUN_NIGHT, "2026-11-30T00:00", "n"),  # Monday 00:00
        (SUN_NIGHT, "2026-11-30T05:59", "n"),
        (SUN_NIGHT, "2026-11-30T06:00", None),
        (SUN_NIGHT, "2026-11-29T05:00", None),  # Sunday morning is Saturday's
        # 24:00 as an end: until midnight, no wrap
        (TO_MIDNIGHT, "2026-11-27T23:59:59", "evening"),
        (TO_MIDNIGHT, "2026-11-28T00:00", None),
        (TO_MIDNIGHT, "2026-11-27T17:59", None),
        # equal start and end: a full day from the start
        (FULL_DAY, "2026-11-25T00:00", "all"),
        (FULL_DAY, "2026-11-25T23:59", "all"),
        (FULL_DAY, "2026-11-26T00:00", None),
        (FULL_DAY, "2026-11-24T23:59", None),
        (WEEKDAYS, "2026-11-27T23:59", "wd"),
        (WEEKDAYS, "2026-11-28T00:00", None),
        (WEEKDAYS, "2026-11-30T00:00", "wd"),
    ],
)
def test_window_edges(policy: Policy, when: str, expected: str | None) -> None:
    assert schedule_at(policy, local(policy, when)) == expected


def test_at_is_converted_to_the_policy_timezone() -> None:
    policy = make('[{name: day, between: "09:00-18:00"}]', tz="Asia/Shanghai")
    # Shanghai is UTC+8 all year (no DST): 01:00Z is 09:00 local, 10:00Z is 18:00 local.
    for month in (1, 7):
        assert schedule_at(policy, datetime(2026, month, 15, 1, 0, tzinfo=UTC)) == "day"
        assert schedule_at(policy, datetime(2026, month, 15, 0, 59, tzinfo=UTC)) is None
        assert schedule_at(policy, datetime(2026, month, 15, 9, 59, tzinfo=UTC)) == "day"
        assert schedule_at(policy, datetime(2026, month, 15, 10, 0, tzinfo=UTC)) is None
    # an aware time in another zone is the same instant
    berlin = datetime(2026, 1, 15, 2, 0, tzinfo=ZoneInfo("Europe/Berlin"))  # 01:00Z
    assert schedule_at(policy, berlin) == "day"


def test_naive_time_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        quota_at(DAY, "t", datetime(2026, 11, 27, 9, 0))  # noqa: DTZ001
    with pytest.raises(ValueError, match="aware"):
        effective_quotas(DAY, datetime(2026, 11, 27, 9, 0))  # noqa: DTZ001


def test_as_policy_time_reads_naive_as_policy_wall_clock() -> None:
    policy = make("[]", tz="Asia/Shanghai")
    at = as_policy_time(policy, datetime(2026, 11, 27, 23, 30))  # noqa: DTZ001
    assert at.utcoffset() == timedelta(hours=8)
    assert as_policy_time(policy, datetime(2026, 11, 27, 15, 30, tzinfo=UTC)) == at


def _minutes(day: datetime, hours: int = 26) -> list[datetime]:
    return [day + timedelta(minutes=m) for m in range(hours * 60)]


BERLIN = "Europe/Berlin"


@pytest.mark.parametrize(
    ("utc", "expected"),
    [
        # spring forward, Sunday 2026-03-29: 02:00 CET jumps to 03:00 CEST (01:00Z)
        ("2026-03-29T00:00", "early"),  # 01:00 CET
        ("2026-03-29T00:59", "early"),  # 01:59 CET
        ("2026-03-29T01:00", None),  # 03:00 CEST: end exclusive
        ("2026-03-29T06:59", None),  # 08:59 CEST
        ("2026-03-29T07:00", "office"),  # 09:00 CEST
        ("2026-03-29T15:59", "office"),  # 17:59 CEST
        ("2026-03-29T16:00", None),  # 18:00 CEST
        # fall back, Sunday 2026-10-25: 03:00 CEST falls back to 02:00 CET (01:00Z)
        ("2026-10-24T23:59", "early"),  # 01:59 CEST
        ("2026-10-25T00:00", "early"),  # 02:00 CEST, first pass
        ("2026-10-25T00:59", "early"),  # 02:59 CEST
        ("2026-10-25T01:00", "early"),  # 02:00 CET, second pass: still before 03:00
        ("2026-10-25T01:59", "early"),  # 02:59 CET
        ("2026-10-25T02:00", None),  # 03:00 CET
        ("2026-10-25T07:59", None),  # 08:59 CET
        ("2026-10-25T08:00", "office"),  # 09:00 CET
        ("2026-10-25T16:59", "office"),  # 17:59 CET
        ("2026-10-25T17:00", None),  # 18:00 CET
    ],
)
def test_dst_europe_berlin(utc: str, expected: str | None) -> None:
    policy = make('[{name: early, between: "01:00-03:00"}, {name: office, between: "09:00-18:00"}]', tz=BERLIN)
    at = datetime.fromisoformat(utc).replace(tzinfo=UTC)
    assert schedule_at(policy, at) == expected


def test_dst_skipped_hour_window_never_applies_that_day() -> None:
    policy = make('[{name: lost, between: "02:00-03:00"}]', tz=BERLIN)
    start = datetime(2026, 3, 28, 22, 0, tzinfo=UTC)
    hits = [t for t in _minutes(start) if schedule_at(policy, t) == "lost"]
    assert hits == []
    # ...and the repeated hour of the autumn change applies twice: 120 real minutes
    start = datetime(2026, 10, 24, 22, 0, tzinfo=UTC)
    hits = [t for t in _minutes(start) if schedule_at(policy, t) == "lost"]
    assert len(hits) == 120
    assert hits[0] == datetime(2026, 10, 25, 0, 0, tzinfo=UTC)
    assert hits[-1] == datetime(2026, 10, 25, 1, 59, tzinfo=UTC)


def test_dst_wall_clock_length_of_a_night_window() -> None:
    """22:00-06:00 is 8 wall-clock hours: 7 real hours in spring, 9 in autumn."""
    policy = make('[{name: n, days: [sat], between: "22:00-06:00"}]', tz=BERLIN)
    spring = [t for t in _minutes(datetime(2026, 3, 28, 12, 0, tzinfo=UTC), 24) if schedule_at(policy, t)]
    autumn = [t for t in _minutes(datetime(2026, 10, 24, 12, 0, tzinfo=UTC), 24) if schedule_at(policy, t)]
    assert len(spring) == 7 * 60
    assert len(autumn) == 9 * 60


@pytest.mark.parametrize(
    ("utc", "expected"),
    [
        ("2026-03-08T06:59", "early"),  # 01:59 EST
        ("2026-03-08T07:00", None),  # 03:00 EDT (02:00 does not exist)
        ("2026-11-01T05:30", "early"),  # 01:30 EDT
        ("2026-11-01T06:30", "early"),  # 01:30 EST, the hour again
        ("2026-11-01T07:00", "early"),  # 02:00 EST
        ("2026-11-01T08:00", None),  # 03:00 EST
    ],
)
def test_dst_america_new_york(utc: str, expected: str | None) -> None:
    policy = make('[{name: early, between: "01:00-03:00"}]', tz="America/New_York")
    assert schedule_at(policy, datetime.fromisoformat(utc).replace(tzinfo=UTC)) == expected


def test_first_match_wins() -> None:
    policy = make(
        "[{name: first, days: [fri], between: '08:00-20:00', quota: {max: {devices: 5}}},"
        " {name: second, between: '00:00-24:00', quota: {max: {devices: 7}}}]"
    )
    quota, name = quota_at(policy, "t", local(policy, "2026-11-27T10:00"))
    assert (name, quota.max) == ("first", {"devices": 5})
    quota, name = quota_at(policy, "t", local(policy, "2026-11-27T21:00"))
    assert (name, quota.max) == ("second", {"devices": 7})
    quota, name = quota_at(policy, "t", local(policy, "2026-11-26T10:00"))
    assert (name, quota.max) == ("second", {"devices": 7})


BASE = (
    "{guaranteed: {devices: 4, devices/910B4: 2}, max: {devices: 16, devices/910B4: 8}, maxConcurrentJobs: 5,"
    " deviceHoursPerMonth: 100, maxJobDuration: 2h, allowedPriorityClasses: [normal, low]}"
)
BASE_QUOTA = Quota(
    guaranteed={"devices": 4, "devices/910B4": 2},
    max={"devices": 16, "devices/910B4": 8},
    max_concurrent_jobs=5,
    device_hours_per_month=100,
    max_job_duration_s=7200,
    allowed_priority_classes=frozenset({"normal", "low"}),
)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("{}", BASE_QUOTA),
        (
            "{max: {devices: 24}}",
            Quota(
                {"devices": 4, "devices/910B4": 2},
                {"devices": 24, "devices/910B4": 8},
                5,
                100,
                7200,
                frozenset({"normal", "low"}),
            ),
        ),
        (
            "{guaranteed: {devices: 8}, maxConcurrentJobs: 9, maxJobDuration: 30m}",
            Quota(
                {"devices": 8, "devices/910B4": 2},
                {"devices": 16, "devices/910B4": 8},
                9,
                100,
                1800,
                frozenset({"normal", "low"}),
            ),
        ),
        (  # null removes a cap / a guarantee, or makes a scalar unlimited
            "{max: {devices/910B4: null}, guaranteed: {devices/910B4: null}, deviceHoursPerMonth: null,"
            " allowedPriorityClasses: null}",
            Quota({"devices": 4}, {"devices": 16}, 5, None, 7200, None),
        ),
        (
            "{allowedPriorityClasses: [high]}",
            Quota(
                {"devices": 4, "devices/910B4": 2},
                {"devices": 16, "devices/910B4": 8},
                5,
                100,
                7200,
                frozenset({"high"}),
            ),
        ),
        (  # a cap below the inherited guarantee lowers that guarantee
            "{max: {devices: 3}}",
            Quota(
                {"devices": 3, "devices/910B4": 2},
                {"devices": 3, "devices/910B4": 8},
                5,
                100,
                7200,
                frozenset({"normal", "low"}),
            ),
        ),
    ],
)
def test_partial_override_merges_key_by_key(override: str, expected: Quota) -> None:
    policy = make(f"[{{name: s, between: '00:00-24:00', quota: {override}}}]", base=BASE)
    quota, name = quota_at(policy, "t", datetime(2026, 11, 27, 12, tzinfo=UTC))
    assert name == "s"
    assert quota == expected


def test_base_quota_outside_any_window() -> None:
    policy = make("[{name: s, between: '09:00-10:00', quota: {max: {devices: 1}}}]", base=BASE)
    assert quota_at(policy, "t", datetime(2026, 11, 27, 12, tzinfo=UTC)) == (BASE_QUOTA, None)


def test_unnamed_teams_get_the_defaults() -> None:
    quota, name = quota_at(DAY, "never-heard-of", datetime(2026, 11, 27, 10, tzinfo=UTC))
    assert name is None
    assert quota == Quota({}, {"devices": 3}, max_concurrent_jobs=1)
    assert DAY.team("never-heard-of").name == "*"
    assert DAY.team("never-heard-of").shares == 2


def test_defaults_may_have_schedules_too() -> None:
    policy = parse_policy(
        "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nspec:\n"
        "  defaults: {quota: {max: {devices: 8}}, schedules: [{name: night, between: '22:00-06:00',"
        " quota: {max: {devices: 2}}}]}\n"
    )
    quota, name = quota_at(policy, "anyone", datetime(2026, 11, 27, 23, tzinfo=UTC))
    assert (name, quota.max) == ("night", {"devices": 2})


def test_week_grid_is_7_by_24_on_the_wall_clock() -> None:
    policy = parse_policy(
        (__import__("pathlib").Path(__file__).resolve().parents[2] / "examples/policies/default.yaml").read_text()
    )
    grid = week_grid(policy, "inference", date(2026, 11, 23))  # a Monday
    assert len(grid) == 7 and all(len(row) == 24 for row in grid)
    assert grid[0][9] == {
        "date": "2026-11-23",
        "weekday": "mon",
        "hour": 9,
        "schedule": "business-hours",
        "guaranteed": 12,
        "max": 24,
    }
    assert grid[0][8]["schedule"] is None and grid[0][8]["max"] == 16
    assert grid[0][18]["schedule"] is None
    assert [grid[0][h]["schedule"] for h in (22, 23, 0, 5, 6)] == ["night", "night", "night", "night", None]
    assert grid[5][12]["schedule"] is None  # Saturday noon
    assert grid[5][12]["weekday"] == "sat"
    assert grid[6][23] == {
        "date": "2026-11-29",
        "weekday": "sun",
        "hour": 23,
        "schedule": "night",
        "guaranteed": 4,
        "max": 4,
    }
    # unnamed team: defaults, no cap means None
    free = week_grid(make("[]", base="{}"), "t", date(2026, 11, 25))
    assert free[0][0] == {
        "date": "2026-11-25",
        "weekday": "wed",
        "hour": 0,
        "schedule": None,
        "guaranteed": 0,
        "max": None,
    }


def test_week_grid_keeps_the_skipped_dst_hour() -> None:
    policy = make('[{name: lost, between: "02:00-03:00"}]', tz=BERLIN)
    grid = week_grid(policy, "t", date(2026, 3, 23))
    assert grid[6][0]["date"] == "2026-03-29"
    assert grid[6][2]["schedule"] == "lost"  # the cell exists although 02:00 does not that day


DOCS_EXAMPLE = make(
    "[{name: business-hours, days: [mon, tue, wed, thu, fri], between: '09:00-18:00',"
    "  quota: {guaranteed: {devices: 12}, max: {devices: 24}}},"
    " {name: friday-night, days: [fri], between: '22:00-06:00', quota: {max: {devices: 32}, maxConcurrentJobs: 40}},"
    " {name: night, between: '22:00-06:00', quota: {max: {devices: 4}}}]",
    tz="Asia/Shanghai",
    base="{guaranteed: {devices: 8}, max: {devices: 16}, maxConcurrentJobs: 20}",
)


@pytest.mark.parametrize(
    ("when", "schedule", "guaranteed", "cap", "jobs"),
    [
        ("2026-11-23T08:59", None, 8, 16, 20),  # Mon
        ("2026-11-23T09:00", "business-hours", 12, 24, 20),
        ("2026-11-23T18:00", None, 8, 16, 20),
        ("2026-11-26T23:00", "night", 4, 4, 20),  # Thu
        ("2026-11-27T23:00", "friday-night", 8, 32, 40),  # Fri
        ("2026-11-28T02:00", "friday-night", 8, 32, 40),  # Sat
        ("2026-11-28T06:00", None, 8, 16, 20),
        ("2026-11-28T23:00", "night", 4, 4, 20),
    ],
)
def test_docs_schedule_table(when: str, schedule: str | None, guaranteed: float, cap: float, jobs: int) -> None:
    """The table in docs/policy.md, "Time-of-day schedules"."""
    quota, name = quota_at(DOCS_EXAMPLE, "t", local(DOCS_EXAMPLE, when))
    assert (name, quota.guaranteed["devices"], quota.max["devices"], quota.max_concurrent_jobs) == (
        schedule,
        guaranteed,
        cap,
        jobs,
    )
