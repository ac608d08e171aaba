"""Job arrays as Slurm's ``--array`` writes them: which indices, how many run at once, and the array's shape.

``array`` of a submission is a count ``N`` (indices ``0`` to ``N-1``), or Slurm's index list: ranges
and single indices joined by commas, a range with an optional step (``0-15``, ``1,3,5``,
``0-15:4`` for 0, 4, 8, 12), and ``%N`` at the end for at most N copies running at once
(``0-15%4``). Copy ``i`` is named ``name[i]`` and told its index (``SLURM_ARRAY_TASK_ID``,
docs/agent.md#environment); the at-most-N is the engine's rule (``scheduling.engine.array_throttle``).
"""

from __future__ import annotations

import re

from django.conf import settings

from scheduling.launch_spec import array_shape as array_shape  # where it lived before

#: Highest index of a copy (Slurm's MaxArraySize is a bound of the same kind).
MAX_INDEX = 1_000_000
_ITEM = re.compile(r"(?P<low>\d{1,7})(?:-(?P<high>\d{1,7})(?::(?P<step>\d{1,7}))?)?")
SHAPES = "a whole number >= 1, or indices like 0-15, 1,3,5, 0-15:4 or 0-15%4"


class ArrayError(ValueError):
    """``array`` cannot be taken; the message says why (the caller names the field)."""


def parse_array(value: object) -> tuple[list[int], int | None]:
    """``(indices in ascending order, at most this many running at once or None)``; ``ArrayError`` if bad.

    The count is worked out before any index list is built, so a range of a million copies is
    refused as such (``NPUPORTAL_MAX_ARRAY``), not built first.
    """
    if isinstance(value, bool):
        raise ArrayError(f"must be {SHAPES}")
    if isinstance(value, int):
        if value < 1:
            raise ArrayError(f"must be {SHAPES}")
        _check_count(value)
        return list(range(value)), None
    if not isinstance(value, str) or not value.strip():
        raise ArrayError(f"must be {SHAPES}")
    text = value.strip()
    if text.isdigit():
        return parse_array(int(text))
    body, sep, limit_text = text.partition("%")
    limit: int | None = None
    if sep:
        if not limit_text.isdigit() or int(limit_text) < 1:
            raise ArrayError(f"%{limit_text}: the number after % (copies running at once) must be 1 or more")
        limit = int(limit_text)
    ranges: list[range] = []
    for item in body.split(","):
        m = _ITEM.fullmatch(item.strip())
        if m is None:
            raise ArrayError(f"{item.strip()!r} is not an index or a range; {SHAPES}")
        low = int(m["low"])
        high = int(m["high"]) if m["high"] is not None else low
        step = int(m["step"]) if m["step"] is not None else 1
        if high < low:
            raise ArrayError(f"{item.strip()!r}: the range ends before it starts")
        if step < 1:
            raise ArrayError(f"{item.strip()!r}: the step must be 1 or more")
        if high > MAX_INDEX:
            raise ArrayError(f"index {high:,} is above the highest allowed, {MAX_INDEX:,}")
        ranges.append(range(low, high + 1, step))
    _check_count(sum(len(r) for r in ranges))
    indices = sorted({i for r in ranges for i in r})
    if len(indices) < sum(len(r) for r in ranges):
        raise ArrayError("names an index twice")
    return indices, limit


def _check_count(count: int) -> None:
    if count > settings.MAX_ARRAY:
        raise ArrayError(f"asks for {count:,} copies; at most {settings.MAX_ARRAY:,} in one array")
