"""Weekly time windows of quota schedules, in wall-clock minutes.

A window is judged on the local wall clock of the policy's timezone, never on
elapsed time: "09:00-18:00" means what the clock on the office wall says, also
on the days the clocks change. That makes a window a set of *week minutes*
(0 = Monday 00:00 .. 10079 = Sunday 23:59), which is what the validator uses to
find overlaps and what :func:`covers` tests in constant time on every tick.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

DAY_NAMES: tuple[str, ...] = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
DAY_INDEX: dict[str, int] = {name: i for i, name in enumerate(DAY_NAMES)}
MINUTES_PER_DAY = 1440
MINUTES_PER_WEEK = 7 * MINUTES_PER_DAY

_BETWEEN_RE = re.compile(r"\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*")


def parse_between(text: str) -> tuple[int, int]:
    """``"HH:MM-HH:MM"`` to (start, end) minutes after midnight.

    ``24:00`` is accepted as an end only, so "18:00-24:00" can say "until
    midnight" without wrapping. Raises ``ValueError`` naming the text.
    """
    match = _BETWEEN_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not HH:MM-HH:MM")
    sh, sm, eh, em = (int(g) for g in match.groups())
    if sh > 23 or sm > 59 or em > 59 or eh > 24 or (eh == 24 and em != 0):
        raise ValueError(f"{text!r} is not HH:MM-HH:MM (times run from 00:00 to 24:00)")
    return sh * 60 + sm, eh * 60 + em


def format_between(start_min: int, end_min: int) -> str:
    """Inverse of :func:`parse_between`."""
    return f"{_hhmm(start_min)}-{_hhmm(end_min)}"


def wraps(start_min: int, end_min: int) -> bool:
    """True when the window runs past midnight into the next day.

    An end that is not after the start wraps, so "22:00-06:00" is a night and
    "00:00-00:00" is a full day.
    """
    return end_min <= start_min


def covers(days: frozenset[int] | None, start_min: int, end_min: int, weekday: int, minute: int) -> bool:
    """Whether the window is in force at local ``weekday`` (0 = Monday) and ``minute``.

    ``days`` name the day a window *starts*, so the early hours after midnight
    of a wrapping window belong to the previous day's entry.
    """
    if not wraps(start_min, end_min):
        return start_min <= minute < end_min and (days is None or weekday in days)
    if minute >= start_min:
        return days is None or weekday in days
    if minute < end_min:
        return days is None or (weekday - 1) % 7 in days
    return False


def week_intervals(days: frozenset[int] | None, start_min: int, end_min: int) -> list[tuple[int, int]]:
    """The window as half-open week-minute intervals, split at the week's end."""
    length = (end_min - start_min) % MINUTES_PER_DAY or MINUTES_PER_DAY
    out: list[tuple[int, int]] = []
    for day in sorted(range(7) if days is None else days):
        begin = day * MINUTES_PER_DAY + start_min
        end = begin + length
        if end <= MINUTES_PER_WEEK:
            out.append((begin, end))
        else:  # Sunday night runs into Monday morning
            out.append((begin, MINUTES_PER_WEEK))
            out.append((0, end - MINUTES_PER_WEEK))
    return out


def week_mask(days: frozenset[int] | None, start_min: int, end_min: int) -> int:
    """The window as a 10080-bit set of week minutes (bit i = week minute i)."""
    mask = 0
    for begin, end in week_intervals(days, start_min, end_min):
        mask |= ((1 << (end - begin)) - 1) << begin
    return mask


def first_minute(mask: int) -> int:
    """The earliest week minute in a non-empty mask."""
    return (mask & -mask).bit_length() - 1


def format_week_minute(minute: int) -> str:
    """``"fri 22:00"`` for a week minute, for messages."""
    day, rest = divmod(minute % MINUTES_PER_WEEK, MINUTES_PER_DAY)
    return f"{DAY_NAMES[day]} {_hhmm(rest)}"


def format_days(days: Iterable[int] | None) -> str:
    """``"mon, tue"`` or ``"every day"``."""
    if days is None:
        return "every day"
    return ", ".join(DAY_NAMES[d] for d in sorted(days))


def _hhmm(minutes: int) -> str:
    return f"{minutes // 60:02d}:{minutes % 60:02d}"
