"""Durations in policy files, read with the one grammar of :mod:`npuctl.durations`.

Admins write ``90s``, ``15m``, ``24h``, ``7d``, ``1h30m``, Slurm's ``2:00:00`` or ``1-12:00``,
or a plain number of seconds; this module adds what a policy value may be beyond text (a YAML
number) and the canonical form it is shown back in.

The policy stores seconds as floats so the engine never re-parses text on a
tick; :func:`format_duration` is its inverse, used wherever a duration is shown
back to a human (canonical YAML, effective quotas, diffs) so that a value reads
the same way everywhere.
"""

from __future__ import annotations

import math

from npuctl.durations import EXAMPLES, UNITS, parse_seconds

#: The grammar's units the canonical form writes, largest first: never weeks (``14d`` reads plainer than ``2w``).
_UNITS: tuple[tuple[str, int], ...] = tuple((unit, size) for unit, size in UNITS.items() if unit != "w")

#: Shown in error messages so a typo is fixed in one go.
DURATION_EXAMPLES = f"e.g. {EXAMPLES}"


def parse_duration(value: object) -> float:
    """Seconds for ``value``: a duration string or a plain number of seconds.

    Raises ``ValueError`` with a message fit to show after the field's path.
    Booleans are refused although they are ints in Python: ``maxAge: yes`` is
    a mistake, not one second.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError(f"must be a duration ({DURATION_EXAMPLES}), got {_show(value)}")
    if isinstance(value, int | float):
        seconds = float(value)
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"must be a duration >= 0, got {_show(value)}")
        return seconds
    if not isinstance(value, str):
        raise ValueError(f"must be a duration ({DURATION_EXAMPLES}), got {_show(value)}")
    return parse_seconds(value)


def format_duration(seconds: float) -> str | float:
    """Canonical text for whole seconds, else the number itself.

    One unit, the largest that divides exactly (``90m``, ``7d``, ``90s``), so
    the text is short and never ambiguous; days only from two days on, because
    admins write a day-long limit as ``24h``. Fractional seconds are returned
    as a number because no unit string could round-trip them exactly.
    """
    if not float(seconds).is_integer():
        return float(seconds)
    whole = int(seconds)
    for unit, size in _UNITS:
        if whole % size == 0 and (unit != "d" or whole >= 2 * size) and whole:
            return f"{whole // size}{unit}"
    return f"{whole}s"


def _show(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value)
