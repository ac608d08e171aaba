"""Plain-text tables: left-aligned columns, one space-padded header line, like squeue and sinfo."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, tzinfo


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


class Clock:
    """How npuctl prints a time: on the policy's clock, labelled with its zone (``12-03 09:15 CST``).

    The console, the events and the quota schedules all read on the policy's ``timezone``; the
    command line does too, so one instant reads the same everywhere. ``utc=True`` (``--utc``, for
    scripts) prints ISO 8601 in UTC instead (``2026-12-03T01:15:00Z``). The zone is asked for only
    when a time is first printed (``zone`` is called once): a command printing none asks nothing.
    """

    def __init__(self, zone: Callable[[], tzinfo | None] | None = None, *, utc: bool = False) -> None:
        self._load = zone
        self._zone: tzinfo | None = None
        self._loaded = zone is None
        self.utc = utc

    @property
    def zone(self) -> tzinfo | None:
        """The zone times are read and printed on (``None``: this computer's own)."""
        if self.utc:
            return UTC
        if not self._loaded and self._load is not None:
            self._zone = self._load()
            self._loaded = True
        return self._zone

    def when(self, value: str | None, *, seconds: bool = False) -> str:
        """An API timestamp on this clock, labelled: ``MM-DD HH:MM CST`` (``--utc``: ISO 8601); ``-`` for none."""
        if not value:
            return "-"
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            return value
        if self.utc:
            return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        local = moment.astimezone(self.zone)
        return f"{local.strftime('%m-%d %H:%M:%S' if seconds else '%m-%d %H:%M')} {local.tzname() or ''}".rstrip()
