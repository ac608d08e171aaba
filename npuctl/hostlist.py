"""Node names written as Slurm writes them: ``ascend-b4-[01-03,05],ascend-a-01``.

Names that differ only in a trailing number of the same width share one prefix, and runs of
consecutive numbers become ranges, as squeue's NODELIST and sacct's NodeList show them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_TRAILING_NUMBER = re.compile(r"^(.*?)(\d+)$")


def compress(names: Iterable[str]) -> str:
    """``names`` as one short hostlist expression, in sorted order; ``""`` for none."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in sorted(set(names)):
        match = _TRAILING_NUMBER.match(name)
        if match is None:
            plain.append(name)
            continue
        prefix, digits = match.groups()
        groups.setdefault((prefix, len(digits)), []).append(int(digits))
    parts: list[tuple[str, str]] = [(name, name) for name in plain]
    for (prefix, width), numbers in groups.items():
        if len(numbers) == 1:
            parts.append((prefix, f"{prefix}{numbers[0]:0{width}d}"))
            continue
        ranges = []
        for first, last in _runs(sorted(numbers)):
            ranges.append(f"{first:0{width}d}" if first == last else f"{first:0{width}d}-{last:0{width}d}")
        parts.append((prefix, f"{prefix}[{','.join(ranges)}]"))
    return ",".join(text for _, text in sorted(parts))


def _runs(numbers: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for n in numbers:
        if out and n == out[-1][1] + 1:
            out[-1] = (out[-1][0], n)
        else:
            out.append((n, n))
    return out
