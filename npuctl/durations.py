"""Durations as people type them: ``90s``, ``15m``, ``2h``, ``1d``, ``1h30m`` or plain seconds; and times."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
#: The API refuses anything longer (366 days); say so before asking it.
MAX_SECONDS = 366 * 86400


def parse_duration(text: str) -> int:
    """Whole seconds in ``text``; ``ValueError`` with a sentence saying what is accepted."""
    value = text.strip().lower()
    if value.isdigit():
        seconds = float(value)
    else:
        pos, seconds = 0, 0.0
        for match in _PART.finditer(value):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNITS[match.group(2)]
            pos = match.end()
        if not value or pos != len(value):
            raise ValueError(f"{text!r} is not a duration like 90s, 15m, 2h, 1d or 1h30m")
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


def parse_moment(text: str, now: datetime | None = None) -> datetime:
    """An aware time from what people type, as sacct's ``--starttime`` reads it; ``ValueError`` saying the forms.

    ``2026-11-01`` (midnight), ``2026-11-01T08:00`` or ``2026-11-01 08:00[:SS]`` in this laptop's
    zone unless an offset is given (``...+08:00``, ``...Z``); ``now``; or a duration ago: ``7d``,
    ``12h``, ``1h30m``.
    """
    value = text.strip()
    now = (now or datetime.now().astimezone()).astimezone()
    if value.lower() == "now":
        return now
    if value and not value.isdigit() and value[-1:].lower() in _UNITS:
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
    return moment if moment.tzinfo is not None else moment.astimezone()
