"""Plain-text tables: left-aligned columns, one space-padded header line, like squeue and sinfo."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], *, right: Sequence[str] = ()) -> str:
    """The rows under their headers; columns named in ``right`` are right-aligned (numbers)."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))

    def line(values: Sequence[str]) -> str:
        out = []
        for i, value in enumerate(values):
            out.append(value.rjust(widths[i]) if headers[i] in right else value.ljust(widths[i]))
        return "  ".join(out).rstrip()

    return "\n".join([line(list(headers)), *(line(row) for row in cells)])


def _cell(value: object) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}" if not value.is_integer() else str(int(value))
    return str(value).replace("\n", " ")


def when(value: str | None, *, seconds: bool = False) -> str:
    """An API timestamp as local ``MM-DD HH:MM``; ``-`` when there is none."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(value).astimezone()
    except ValueError:
        return value
    return moment.strftime("%m-%d %H:%M:%S" if seconds else "%m-%d %H:%M")
