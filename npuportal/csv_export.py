"""Every CSV the project writes goes through :func:`writer`, so no cell can run as a spreadsheet formula.

A name typed by anyone — a job called ``=HYPERLINK("http://evil/x","click")``, a user
``+cmd|' /C calc'!A0``, an adjustment reason ``@SUM(1+1)`` — lands in finance's exports,
and Excel or LibreOffice would run it as a formula when the file is opened (OWASP's
"CSV injection"). The rule, OWASP's, applied to every cell of every row:

* a **text** cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return
  gets a single quote in front (``'=HYPERLINK(...)``): spreadsheets show it as text and
  never evaluate it; strip the one leading quote to get the original text back;
* a **number** (an ``int``, ``Decimal`` or finite ``float`` value, not a string) is written
  as it is, so a credit of ``-12.50`` stays a number finance can add up — a number cannot
  be a formula;
* everything else is written as it is (``None`` as an empty cell, as ``csv`` does).

The writers do not look at what a column means, so a new column or a new export is
covered without anybody remembering to be.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Protocol

#: What a cell may not start with: spreadsheets read these as the start of a formula (OWASP).
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: Put in front of such a cell: spreadsheets take the cell as text.
TEXT_MARK = "'"


class _Writable(Protocol):
    def write(self, text: str, /) -> Any: ...


def is_number(value: object) -> bool:
    """A real number value (not text, not a bool): written as it is, whatever its sign."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, Decimal):
        return value.is_finite()
    return False


def safe_cell(value: object) -> object:
    """``value`` as a cell no spreadsheet evaluates: numbers as they are, text marked when it could be a formula."""
    if value is None or is_number(value):
        return value
    text = str(value)
    if text.startswith(FORMULA_STARTS):
        return TEXT_MARK + text
    return text


class SafeWriter:
    """``csv.writer`` whose every cell passes :func:`safe_cell` first, and whose line breaks are always quoted.

    ``csv`` quotes a field holding a character of the line terminator only: with ``\n``
    lines, a name holding a bare carriage return went out unquoted, and spreadsheets
    that end a row there started a new row inside it — whose first cell could be a
    formula. Each row is therefore formatted with ``\r\n`` (so both characters get a
    field quoted) and written with the line terminator asked for.
    """

    def __init__(self, out: _Writable, *, lineterminator: str = "\n", **options: Any) -> None:
        self._out = out
        self._lineterminator = lineterminator
        self._row = io.StringIO()
        self._writer = csv.writer(self._row, lineterminator="\r\n", **options)

    def writerow(self, row: Iterable[object]) -> Any:
        self._row.seek(0)
        self._row.truncate()
        self._writer.writerow([safe_cell(value) for value in row])
        return self._out.write(self._row.getvalue()[:-2] + self._lineterminator)

    def writerows(self, rows: Iterable[Iterable[object]]) -> None:
        for row in rows:
            self.writerow(row)


def writer(out: _Writable, **options: Any) -> SafeWriter:
    """The project's CSV writer (``csv.writer`` options; lines end with ``\\n`` unless told otherwise)."""
    return SafeWriter(out, **options)


def csv_text(rows: Iterable[Iterable[object]]) -> str:
    """Rows (the header first) as CSV text, through :func:`writer`."""
    out = io.StringIO()
    writer(out).writerows(rows)
    return out.getvalue()
