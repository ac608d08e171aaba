"""Durations as people type them, and times: the one grammar of every duration in npuportal.

A duration is written with units, largest first, each at most once: ``90s``, ``15m``, ``2h``,
``1d``, ``1w``, ``1h30m``, ``1.5h`` (spaces between the parts are allowed: ``1h 30m``); or as
Slurm writes a time limit: ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``
(``30:00``, ``2:00:00``, ``1-12:00``); or as a plain number.

A plain number is **seconds** everywhere (``npuctl --time 90``, the console's forms, the API's
``*_s`` fields, policy files), except where Slurm's own text is read: ``#SBATCH --time=30``
means 30 minutes, as sbatch reads it (``bare="minutes"``).

The command line, the console, the API, the batch-script directives and the scheduling
engine's policy parser all read durations with :func:`parse_seconds`. Standard library only, so
``npuctl`` installs alone and the engine (pure Python) imports it too.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, tzinfo
from typing import Literal

#: Seconds of each unit a duration may be written in.
UNITS = {"w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1}
_NUMBER = r"\d+(?:\.\d+)?"
# Units in decreasing order, each at most once, so "1h30m" is accepted and the ambiguous "30m1h" is not.
_UNIT_RE = re.compile(r"\s*".join(rf"(?:(?P<{unit}>{_NUMBER})\s*{unit})?" for unit in UNITS), re.IGNORECASE)
_PLAIN_RE = re.compile(_NUMBER)
# Slurm's time formats (sbatch --time): [D-]HH[:MM[:SS]] with a day part, else MM:SS or HH:MM:SS.
_DAYS_RE = re.compile(r"(?P<d>\d+)-(?P<h>\d+)(?::(?P<m>\d+)(?::(?P<s>\d+))?)?")
_CLOCK_RE = re.compile(r"(?:(?P<h>\d+):)?(?P<m>\d+):(?P<s>\d+)")

#: Shown in error messages, so a typo is fixed in one go.
EXAMPLES = "90s, 15m, 2h, 1h30m, 1d, 30:00, 2:00:00 or 1-12:00"
#: The API and the command line refuse anything longer (366 days); say so before asking it.
MAX_SECONDS = 366 * 86400


def parse_seconds(text: str, *, bare: Literal["seconds", "minutes"] = "seconds") -> float:
    """Seconds in ``text``, any duration form above; ``ValueError`` naming the forms when it is none.

    No bounds are applied (``0s`` is 0): each caller says what it allows. ``bare`` is what a plain
    number counts: seconds, or minutes in Slurm's own directives.
    """
    value = text.strip()
    if _PLAIN_RE.fullmatch(value):
        return float(value) * (60 if bare == "minutes" else 1)
    clock = _DAYS_RE.fullmatch(value) or _CLOCK_RE.fullmatch(value)
    if clock is not None:
        return _clock_seconds(text, clock)
    match = _UNIT_RE.fullmatch(value)
    if not value or match is None or not any(match.groupdict().values()):
        raise ValueError(f"{text!r} is not a duration like {EXAMPLES}")
    return float(sum(float(match.group(unit)) * size for unit, size in UNITS.items() if match.group(unit)))


def _clock_seconds(text: str, clock: re.Match[str]) -> float:
    """Seconds of a Slurm-style time; the parts after the first must be below 60 (hours below 24 after days)."""
    parts = {key: int(value) for key, value in clock.groupdict().items() if value is not None}
    first = next(key for key in "dhms" if key in parts)
    for key, limit in (("h", 24), ("m", 60), ("s", 60)):
        if key in parts and key != first and parts[key] >= limit:
            raise ValueError(f"{text!r}: {parts[key]} is not below {limit} in a time like 1-12:30:00 (D-HH:MM:SS)")
    return float(sum(parts.get(key, 0) * UNITS[key] for key in "dhms"))


def parse_duration(text: str, *, bare: Literal["seconds", "minutes"] = "seconds") -> int:
    """Whole seconds in ``text``, from one second to 366 days; ``ValueError`` with a sentence saying why not."""
    seconds = parse_seconds(text, bare=bare)
    if seconds < 1:
        raise ValueError(f"{text!r} is shorter than one second")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{text!r} is longer than 366 days")
    return round(seconds)


def format_duration(seconds: float | None) -> str:
    """``5400`` → ``1h30m``; ``None`` → ``-``."""
    if seconds is None:
        return "-"
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if left >= size:
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts) or "0s"


def parse_moment(text: str, now: datetime | None = None, zone: tzinfo | None = None) -> datetime:
    """An aware time from what people type, as sacct's ``--starttime`` reads it; ``ValueError`` saying the forms.

    ``2026-11-01`` (midnight), ``2026-11-01T08:00`` or ``2026-11-01 08:00[:SS]`` on ``zone``'s clock
    (default: this computer's) unless an offset is given (``...+08:00``, ``...Z``); ``now``; or a
    duration ago: ``7d``, ``12h``, ``1h30m``.
    """
    value = text.strip()
    now = (now or datetime.now().astimezone()).astimezone(zone)
    if value.lower() == "now":
        return now
    if value and not value.isdigit() and value[-1:].lower() in UNITS:
        try:
            return now - timedelta(seconds=parse_duration(value))
        except ValueError:
            pass  # not a duration after all: say which forms are accepted, below
    try:
        moment = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "zZ" and value else value)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time like 2026-11-01, 2026-11-01T08:00, now, or a time ago like 7d or 12h"
        ) from None
    if moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=zone) if zone is not None else moment.astimezone()
