"""Parse ``npu-smi`` output from Huawei Ascend nodes.

npu-smi prints tables meant for people: column widths, column sets and even whitespace change between
driver releases, and the text we get is often cut short (a tool timeout, a pager, a copy from a web page).
The scheduler drains or fills nodes on what this module returns, so everything here follows one rule:
*a chip we could not read completely is never reported healthy*. We therefore split table lines on ``|``
and read cells by their meaning (a health word, a bus id, a ``used / total`` pair) instead of by character
position, take column order from the header when there is one, and downgrade ``OK`` to ``UNKNOWN`` for any
chip whose rows were cut.

Standard library only: this module runs inside the node agent.

Command line::

    python -m devices.agent.npusmi [--kind auto|info|info-vnpu|health|board|usages|common|...] FILE|-
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

HEALTH_VALUES: tuple[str, ...] = ("OK", "Warning", "Alarm", "Critical", "UNKNOWN")
"""Health words npu-smi prints, in its own spelling."""

HEALTH_SEVERITY: dict[str, int] = {"OK": 0, "UNKNOWN": 1, "Warning": 2, "Alarm": 3, "Critical": 4, "lost": 5}
"""Ranking used where several readings must collapse into one (npu-smi: the most severe alarm wins).

UNKNOWN ranks above OK so that one unreadable part never lets a device look healthy, and below the real
alarms because an alarm says more than "could not read"."""

CHIP_KEYS: tuple[str, ...] = (
    "npu_id",
    "chip_id",
    "device_id",
    "name",
    "vnpu_template",
    "health",
    "power_w",
    "temp_c",
    "hugepages_used",
    "hugepages_total",
    "bus_id",
    "aicore_pct",
    "memory_used_mb",
    "memory_total_mb",
    "hbm_used_mb",
    "hbm_total_mb",
    "processes",
)
"""Keys of every chip dict, always all present (``None`` where the layout has no such column)."""

DETAIL_KINDS: tuple[str, ...] = ("health", "board", "usages", "common", "memory", "temp", "power", "ecc", "kv")
"""``npu-smi info -t KIND`` outputs that are ``key : value`` lists and share one parser."""

Number = int | float

_HEALTH_CANON = {h.lower(): h for h in HEALTH_VALUES}
_NA_WORDS = frozenset({"na", "n/a", "-", "--", "[n/a]"})
_INT_RE = re.compile(r"[+-]?\d+")
_FLOAT_RE = re.compile(r"[+-]?(?:\d+\.\d*|\.\d+)")
_BUS_ID_RE = re.compile(r"[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f]")
_BORDER_RE = re.compile(r"^[+|][-=+| ]*$")
_NO_PROC_RE = re.compile(r"no running processes found", re.IGNORECASE)
_VNPU_NAME_RE = re.compile(r"^(?P<base>.+?)(?P<template>vir\d\w*)$")
_COMMAND_RE = re.compile(r"^\s*(?:\[[^\]]*\]\s*)?[#$]?\s*npu-smi\s+info\b(?P<args>.*)$")


class _Malformed(ValueError):
    """A cell did not hold the kind of value its column promises."""


@dataclass
class NpuSmiResult:
    """What ``npu-smi info`` told us.

    ``errors`` is never silently empty when something was skipped or cut: callers surface it next to the
    chips so an operator sees *why* a device shows UNKNOWN.
    """

    chips: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    version: str | None = None
    processes: list[dict[str, Any]] | None = None


# --------------------------------------------------------------------------------------------------
# small value helpers


def canonical_health(text: str | None) -> str | None:
    """Map a health word to npu-smi's spelling, or ``None`` if it is not one we know."""
    if text is None:
        return None
    return _HEALTH_CANON.get(text.strip().lower())


def worst_health(values: Iterable[str | None]) -> str:
    """Collapse several readings into one, as npu-smi does (most severe wins; nothing read → UNKNOWN)."""
    known = [v for v in values if v is not None]
    if not known:
        return "UNKNOWN"
    return max(known, key=lambda v: HEALTH_SEVERITY.get(v, HEALTH_SEVERITY["UNKNOWN"]))


def _number(token: str) -> Number | None:
    """Read one numeric cell token; ``NA``/``-`` mean "not measured" and become ``None``."""
    tok = token.strip()
    if tok.lower() in _NA_WORDS:
        return None
    if _INT_RE.fullmatch(tok):
        return int(tok)
    if _FLOAT_RE.fullmatch(tok):
        return float(tok)
    raise _Malformed(f"expected a number, got {token!r}")


def _is_int(token: str) -> bool:
    return bool(_INT_RE.fullmatch(token))


def _pair(token: str) -> tuple[Number | None, Number | None]:
    """Read a ``used/total`` token (already normalised to have no spaces around the slash)."""
    if token.lower() in _NA_WORDS:
        return None, None
    parts = token.split("/")
    if len(parts) != 2:
        raise _Malformed(f"expected used/total, got {token!r}")
    return _number(parts[0]), _number(parts[1])


def _tokens(cell: str) -> list[str]:
    """Split a data cell into value tokens, gluing ``a / b`` back into one ``a/b`` token.

    Pairs are printed with arbitrary padding (``65099/ 65536``, ``15   / 15``, ``0 / 0``), so the slash,
    not whitespace, is what binds them.
    """
    return re.sub(r"\s*/\s*", "/", cell.strip()).split()


def _vnpu_template(name: str | None) -> str | None:
    """Pull the vNPU template out of a chip name such as ``910B4vir05_1c_8g`` or ``310Pvir01``."""
    if not name:
        return None
    match = _VNPU_NAME_RE.match(name)
    return match.group("template") if match else None


# --------------------------------------------------------------------------------------------------
# main table layout


@dataclass(frozen=True)
class _Column:
    """One value column of a data cell: the key it fills and whether it is a ``used/total`` pair."""

    key: str | None  # None: a column we do not know; its token is consumed and dropped
    pair: bool | None  # None: accept either shape


_PAIR_KEYS = {
    "hugepages": ("hugepages_used", "hugepages_total"),
    "memory": ("memory_used_mb", "memory_total_mb"),
    "hbm": ("hbm_used_mb", "hbm_total_mb"),
}
_ROW1_DEFAULT = (_Column("power_w", False), _Column("temp_c", False), _Column("hugepages", True))
_ROW2_DEFAULT = (_Column("aicore_pct", False), _Column("memory", True), _Column("hbm", True))


def _column_for_label(label: str) -> _Column:
    low = label.lower()
    if low.startswith("power"):
        return _Column("power_w", False)
    if low.startswith("temp"):
        return _Column("temp_c", False)
    if low.startswith("hugepages"):
        return _Column("hugepages", True)
    if low.startswith("aicore"):
        return _Column("aicore_pct", False)
    if low.startswith("hbm"):
        return _Column("hbm", True)
    if low.startswith("memory"):
        return _Column("memory", True)
    return _Column(None, None)


def _header_labels(cell: str) -> list[str]:
    """Split a header cell into labels; a label ends at ``)`` so ``Memory Usage(MB)`` stays whole."""
    labels: list[str] = []
    pending: list[str] = []
    for tok in cell.split():
        pending.append(tok)
        if tok.endswith(")"):
            labels.append(" ".join(pending))
            pending = []
    labels.extend(pending)
    return labels


@dataclass
class _Layout:
    """Column order learnt from the header rows (defaults cover a header that was cut away)."""

    cells: int = 3
    row1: tuple[_Column, ...] = _ROW1_DEFAULT
    row2: tuple[_Column, ...] = _ROW2_DEFAULT
    row2_ids: tuple[str, ...] = ("chip_id", "device_id")
    from_header: bool = False


def _read_columns(cell: str, columns: Sequence[_Column], into: dict[str, Any]) -> list[str]:
    """Fill ``into`` from one data cell; return problems (missing or misshapen tokens) as messages."""
    problems: list[str] = []
    toks = _tokens(cell)
    for i, col in enumerate(columns):
        if i >= len(toks):
            problems.append(f"no value for {col.key or 'an unknown column'}")
            continue
        tok = toks[i]
        if col.key is None:
            continue
        try:
            if col.pair or (col.pair is None and "/" in tok):
                used_key, total_key = _PAIR_KEYS.get(col.key, (f"{col.key}_used", f"{col.key}_total"))
                into[used_key], into[total_key] = _pair(tok)
            else:
                into[col.key] = _number(tok)
        except _Malformed as exc:
            problems.append(f"{col.key}: {exc}")
    if len(toks) > len(columns):
        problems.append(f"{len(toks) - len(columns)} value(s) more than the header names")
    return problems


# --------------------------------------------------------------------------------------------------
# `npu-smi info`


@dataclass
class _ChipDraft:
    """A chip while its rows are being read; ``complete`` decides whether its health can be trusted."""

    values: dict[str, Any]
    row1_complete: bool
    row2_seen: bool = False
    row2_complete: bool = False
    line_no: int = 0


def _split_cells(line: str) -> tuple[list[str], bool]:
    """Cells of a ``| a | b |`` line and whether the line ended with its closing bar (i.e. was not cut)."""
    body = line.strip()
    complete = len(body) > 1 and body.endswith("|")
    inner = body[1:-1] if complete else body[1:]
    return [c.strip() for c in inner.split("|")], complete


def _looks_like_bus_cell(cell: str) -> bool:
    return bool(_BUS_ID_RE.fullmatch(cell)) or cell.lower() in _NA_WORDS


def _new_chip() -> dict[str, Any]:
    return dict.fromkeys(CHIP_KEYS)


_ROW1_FIELDS = ("npu_id", "name", "vnpu_template", "health", "power_w", "temp_c", "hugepages_used", "hugepages_total")


class _InfoParser:
    """Line-by-line state machine over ``npu-smi info``.

    States are only "which table are we in" (main or process) and "which NPU row are we under"; every
    row is classified by its content first and by position only when content is ambiguous, so collapsed
    whitespace or a missing header does not derail it.
    """

    def __init__(self) -> None:
        self.result = NpuSmiResult()
        self.layout = _Layout()
        self.mode: str | None = None  # None | "main" | "proc"
        self.drafts: list[_ChipDraft] = []
        self.current: _ChipDraft | None = None  # chip under the most recent NPU row, until a border
        self.saw_table = False
        self.last_table_line: str | None = None  # "border" | "row"
        self.processes: list[dict[str, Any]] = []
        self.saw_proc_table = False

    # -- entry point ------------------------------------------------------------------------------
    def parse(self, text: str) -> NpuSmiResult:
        for line_no, raw in enumerate(text.splitlines(), start=1):
            self._line(raw, line_no)
        self._finish()
        return self.result

    def _error(self, line_no: int, message: str) -> None:
        self.result.errors.append(f"line {line_no}: {message}")

    # -- dispatch ---------------------------------------------------------------------------------
    def _line(self, raw: str, line_no: int) -> None:
        line = raw.strip()
        if not line:
            return
        if line[0] not in "+|":
            return  # shell prompt, command echo or trailing chatter: not part of the table
        self.saw_table = True
        if _BORDER_RE.match(line) and not re.search(r"[A-Za-z0-9]", line):
            self.last_table_line = "border"
            self.current = None
            return
        self.last_table_line = "row"
        cells, complete = _split_cells(line)
        joined = " ".join(" ".join(cells).split()).lower()  # keywords below must not depend on spacing
        if "npu-smi" in joined and "version" in joined:
            match = re.search(r"version:\s*(\S+)", " ".join(cells), re.IGNORECASE)
            if match:
                self.result.version = match.group(1)
            return
        if "process id" in joined or "process name" in joined:
            self.mode = "proc"
            self.saw_proc_table = True
            self.current = None
            return
        if _NO_PROC_RE.search(joined):
            self.mode = "proc"
            self.saw_proc_table = True
            return
        if self._header(cells):
            return
        if self.mode == "proc":
            self._process_row(cells, complete, line_no)
            return
        self._main_row(cells, complete, line_no)

    def _header(self, cells: list[str]) -> bool:
        """Learn the layout from a header row; return whether the line was a header."""
        first = cells[0].split()
        if not first:
            return False
        rest = " ".join(cells[1:]).lower()
        if first[0] == "NPU" and ("health" in rest or (len(first) > 1 and first[1] == "Name")):
            self.mode = "main"
            self.layout.cells = len(cells)
            self.layout.from_header = True
            if len(cells) >= 3:
                self.layout.row1 = tuple(_column_for_label(lbl) for lbl in _header_labels(cells[2]))
            return True
        if first[0] == "Chip" and ("bus-id" in rest or "aicore" in rest):
            self.mode = "main"
            # "Chip", "Chip Device" or "Chip Phy-ID": the second id is the logical device number.
            self.layout.row2_ids = ("chip_id", "device_id")[: len(first)]
            if len(cells) >= 3:
                self.layout.row2 = tuple(_column_for_label(lbl) for lbl in _header_labels(cells[2]))
            return True
        return False

    # -- main table -------------------------------------------------------------------------------
    def _classify(self, cells: list[str]) -> str | None:
        """Decide whether a data row is an NPU row (``row1``) or a chip row (``row2``)."""
        toks = cells[0].split()
        if not toks or not _is_int(toks[0]):
            return None
        second = cells[1] if len(cells) > 1 else None
        if second is not None and canonical_health(second) is not None:
            return "row1"
        if len(toks) >= 2 and not all(_is_int(t) for t in toks):
            return "row1"
        if second and all(_is_int(t) for t in toks) and _looks_like_bus_cell(second):
            return "row2"
        # Ambiguous (a cut line, or an unknown health word on a numeric chip name such as "310"):
        # under an NPU row, a chip row is what comes next; otherwise a new NPU row is.
        if self.current is not None and not self.current.row2_seen:
            return "row2"
        if self.current is not None and all(_is_int(t) for t in toks) and len(toks) <= 2 and second is None:
            return "row2"
        return "row1"

    def _main_row(self, cells: list[str], complete: bool, line_no: int) -> None:
        kind = self._classify(cells)
        if kind is None:
            self._error(line_no, f"unrecognised table row skipped: {'|'.join(cells)[:80]!r}")
            return
        if self.mode is None:
            self.mode = "main"
            self._error(line_no, "table header missing; assuming the 910 column order")
        full = complete and len(cells) >= self.layout.cells
        if kind == "row1":
            self._row1(cells, full, line_no)
        else:
            self._row2(cells, full, line_no)

    def _row1(self, cells: list[str], full: bool, line_no: int) -> None:
        values = _new_chip()
        toks = cells[0].split()
        values["npu_id"] = int(toks[0])
        values["name"] = " ".join(toks[1:]) or None
        values["vnpu_template"] = _vnpu_template(values["name"])
        if len(cells) > 1:
            health = canonical_health(cells[1])
            if health is None and full:
                self._error(line_no, f"NPU {values['npu_id']}: unrecognised health {cells[1]!r}")
            values["health"] = health
        if len(cells) > 2:
            for problem in _read_columns(cells[2], self.layout.row1, values):
                self._error(line_no, f"NPU {values['npu_id']}: {problem}")
        draft = _ChipDraft(values=values, row1_complete=full, line_no=line_no)
        self.drafts.append(draft)
        self.current = draft

    def _row2(self, cells: list[str], full: bool, line_no: int) -> None:
        if self.current is None:
            self._error(line_no, "chip row without its NPU row skipped (output cut at the top?)")
            return
        draft = self.current
        if draft.row2_seen:
            # A second chip under one NPU row (dual-die layouts): it shares the NPU-level readings.
            values = _new_chip()
            for key in _ROW1_FIELDS:
                values[key] = draft.values[key]
            draft = _ChipDraft(values=values, row1_complete=self.current.row1_complete, line_no=line_no)
            self.drafts.append(draft)
            self.current = draft
        draft.row2_seen = True
        draft.row2_complete = full
        values = draft.values
        ids = cells[0].split()
        for key, tok in zip(self.layout.row2_ids, ids, strict=False):
            if key and _is_int(tok):
                values[key] = int(tok)
        if len(cells) > 1 and cells[1]:
            values["bus_id"] = None if cells[1].lower() in _NA_WORDS else cells[1]
        if len(cells) > 2:
            for problem in _read_columns(cells[2], self.layout.row2, values):
                self._error(line_no, f"NPU {values['npu_id']} chip {values['chip_id']}: {problem}")

    # -- process table ----------------------------------------------------------------------------
    def _process_row(self, cells: list[str], complete: bool, line_no: int) -> None:
        ids = cells[0].split()
        if not complete or len(cells) < 4 or len(ids) < 2 or not all(_is_int(t) for t in ids[:2]):
            self._error(line_no, "process row cut off or unreadable; process list may be incomplete")
            return
        try:
            pid = _number(cells[1])
            memory = _number(cells[3])
        except _Malformed as exc:
            self._error(line_no, f"process row: {exc}")
            return
        self.processes.append(
            {
                "npu_id": int(ids[0]),
                "chip_id": int(ids[1]),
                "pid": pid,
                "name": cells[2] or None,  # blank when the process lives in another container
                "memory_mb": memory,
            }
        )

    # -- wrap up ----------------------------------------------------------------------------------
    def _finish(self) -> None:
        errors = self.result.errors
        if not self.saw_table:
            errors.append("no npu-smi table found in the input")
            return
        if self.last_table_line != "border":
            errors.append("output ends in the middle of a table (truncated?)")
        if self.saw_proc_table:
            self.result.processes = self.processes
        for draft in self.drafts:
            values = draft.values
            complete = draft.row1_complete and draft.row2_seen and draft.row2_complete
            where = f"NPU {values['npu_id']}" + (f" chip {values['chip_id']}" if values["chip_id"] is not None else "")
            if not complete:
                errors.append(f"{where}: rows cut off or incomplete; health not trusted")
                if values["health"] in (None, "OK"):
                    values["health"] = "UNKNOWN"
            elif values["health"] is None:
                values["health"] = "UNKNOWN"
            if self.saw_proc_table:
                values["processes"] = [
                    {"pid": p["pid"], "name": p["name"], "memory_mb": p["memory_mb"]}
                    for p in self.processes
                    if p["npu_id"] == values["npu_id"] and p["chip_id"] == values["chip_id"]
                ]
            self.result.chips.append(values)


def parse_npu_smi_info(text: str) -> NpuSmiResult:
    """Parse ``npu-smi info`` (the main table plus the process table, if printed).

    Never raises on bad input: problems land in ``result.errors``; a chip whose rows were cut or whose
    health word is unreadable gets ``health == "UNKNOWN"``. ``processes`` on a chip is ``None`` when the
    output had no process table at all (older releases), ``[]`` when the table said there were none.
    """
    try:
        return _InfoParser().parse(text)
    except Exception as exc:  # last line of defence: a parser bug must not kill the agent
        return NpuSmiResult(errors=[f"internal parser error: {type(exc).__name__}: {exc}"])


# --------------------------------------------------------------------------------------------------
# `npu-smi info -t health|board|usages|common|...` (key : value lists)

_KV_RE = re.compile(r"^\s*(?P<key>[^:]+?)\s*:\s*(?P<value>.*?)\s*$")
_UNIT_SUFFIXES = {"%": "pct"}


def normalize_key(label: str) -> str:
    """``Memory Usage Rate(%)`` → ``memory_usage_rate_pct``; units stay in the name so values stay plain."""

    def unit(match: re.Match[str]) -> str:
        inner = match.group(1).strip()
        return "_" + _UNIT_SUFFIXES.get(inner, inner)

    key = re.sub(r"\(([^)]*)\)", unit, label.strip())
    key = re.sub(r"[^0-9A-Za-z]+", "_", key).strip("_").lower()
    return key or "field"


def _kv_value(key: str, text: str) -> Any:
    """Numbers become numbers, ``NA`` becomes ``None``, identifiers with leading zeros stay strings."""
    value = text.strip()
    if value.lower() in _NA_WORDS:
        return None
    if key in ("health", "health_status"):
        return canonical_health(value) or value
    if _INT_RE.fullmatch(value) and not re.fullmatch(r"[+-]?0\d+", value):
        return int(value)
    if _FLOAT_RE.fullmatch(value) and not re.fullmatch(r"[+-]?0\d+\..*", value):
        return float(value)
    return value


def _guess_detail_kind(keys: set[str]) -> str:
    if keys & {"product_name", "serial_number", "board_id", "firmware_version"}:
        return "board"
    if keys & {"health", "health_status", "error_code"}:
        return "health"
    if keys & {"memory_capacity_mb", "aicpu_usage_rate_pct", "hugepages_total_page", "ctrlcpu_usage_rate_pct"}:
        return "usages"
    if keys & {"aicore_freq_mhz", "temperature_c", "npu_real_time_power_w", "aicore_count"}:
        return "common"
    return "kv"


def _command_kind(line: str) -> tuple[bool, str | None]:
    """Whether ``line`` echoes an ``npu-smi info`` command, and the ``-t`` kind it asks for."""
    match = _COMMAND_RE.match(line)
    if not match:
        return False, None
    kind = re.search(r"-t\s+(\S+)", match.group("args"))
    return True, kind.group(1) if kind else "info"


def split_command_outputs(text: str) -> list[tuple[str | None, str]]:
    """Split text holding several pasted commands (``npu-smi info -t ... `` echo lines) into pieces.

    Returns ``(command line or None, body)`` pairs; text without any echo line is one piece.
    """
    pieces: list[tuple[str | None, list[str]]] = [(None, [])]
    for line in text.splitlines():
        is_cmd, _ = _command_kind(line)
        if is_cmd:
            pieces.append((line.strip(), []))
        else:
            pieces[-1][1].append(line)
    out = [(cmd, "\n".join(body)) for cmd, body in pieces]
    return [p for p in out if p[0] is not None or p[1].strip()]


def parse_npu_smi_detail(text: str, kind: str | None = None) -> dict[str, Any]:
    """Parse one ``npu-smi info -t KIND`` output (a ``key : value`` list) into a flat dict.

    Top-level keys are normalised (``NPU ID`` → ``npu_id``); each ``Chip ID`` block becomes an entry of
    ``chips``; blocks naming a ``Chip Name`` (the MCU) go to ``components``. For ``health`` outputs an
    overall ``health`` is added with the most severe reading, so a single Critical chip cannot hide.
    Unparseable lines are listed in ``errors``; nothing raises.
    """
    out: dict[str, Any] = {"kind": kind, "command": None}
    chips: list[dict[str, Any]] = []
    components: list[dict[str, Any]] = []
    errors: list[str] = []
    block: dict[str, Any] = {}
    seen_keys: set[str] = set()

    def flush() -> None:
        nonlocal block
        if not block:
            return
        if "chip_id" in block:
            chips.append(block)
        elif "chip_name" in block:
            components.append(block)
        else:
            for key, value in block.items():
                if key in out and out[key] != value:
                    errors.append(f"{key} given twice ({out[key]!r}, {value!r}); keeping the first")
                else:
                    out.setdefault(key, value)
        block = {}

    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            flush()
            continue
        is_cmd, cmd_kind = _command_kind(line)
        if is_cmd:
            out["command"] = line.strip()
            if out["kind"] is None:
                out["kind"] = cmd_kind
            continue
        match = _KV_RE.match(line)
        if not match:
            errors.append(f"line {line_no}: not a 'key : value' line: {line.strip()[:80]!r}")
            continue
        key = normalize_key(match.group("key"))
        seen_keys.add(key)
        if key in block or (key == "chip_id" and block):
            flush()
        block[key] = _kv_value(key, match.group("value"))
    flush()
    out["chips"] = chips
    out["components"] = components
    if out["kind"] is None:
        out["kind"] = _guess_detail_kind(seen_keys)
    if out["kind"] == "health":
        readings = [out.get("health"), out.get("health_status")]
        readings += [c.get("health") for c in chips + components]
        read = [r for r in readings if r is not None]
        unknown = [r for r in read if r not in HEALTH_SEVERITY]
        errors.extend(f"unrecognised health {r!r}" for r in unknown)
        out["overall_health"] = worst_health("UNKNOWN" if r in unknown else r for r in read)
    if not seen_keys:
        errors.append("no 'key : value' lines found")
    out["errors"] = errors
    return out


# --------------------------------------------------------------------------------------------------
# `npu-smi info -t info-vnpu`


def _free_total(token: str) -> dict[str, Number | None]:
    try:
        free, total = _pair(token)
    except _Malformed:
        free, total = None, None
    return {"free": free, "total": total}


def parse_npu_smi_info_vnpu(text: str) -> dict[str, Any]:
    """Parse ``npu-smi info -t info-vnpu``: free/total of each resource and the list of vNPUs.

    ``memory`` is in GB (npu-smi prints a ``GB`` unit row under the resource names). The convenience keys
    ``aicore_free``/``aicore_total``, ``memory_free_gb``/``memory_total_gb``, ``aicpu_free``/``aicpu_total``
    are what a placement decision needs; ``resources`` keeps every column.
    """
    out: dict[str, Any] = {
        "kind": "info-vnpu",
        "resources": {},
        "memory_unit": None,
        "vnpu_count": None,
        "vnpus": [],
    }
    errors: list[str] = []
    names: list[str] | None = None
    vnpu_columns: list[str] | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("|") or not re.search(r"[A-Za-z0-9]", line):
            continue
        cells, complete = _split_cells(line)
        joined = " ".join(" ".join(cells).split())
        low = joined.lower()
        count = re.search(r"total number of vnpu:\s*(\d+)", low)
        if count:
            out["vnpu_count"] = int(count.group(1))
            continue
        if "aicore" in low and "memory" in low and names is None:
            names = [normalize_key(t) for t in joined.split()]
            continue
        if "vnpu id" in low:
            vnpu_columns = [normalize_key(c) for c in cells]
            continue
        if names is not None and not out["resources"]:
            toks = _tokens(joined)
            if toks and all("/" not in t for t in toks):
                out["memory_unit"] = toks[0] if len(toks) == 1 else " ".join(toks)
                continue
            if any("/" in t for t in toks):
                if len(toks) != len(names) or not complete:
                    errors.append(f"line {line_no}: {len(toks)} values for {len(names)} resources (cut off?)")
                for name, tok in zip(names, toks, strict=False):
                    out["resources"][name] = _free_total(tok)
                continue
        if vnpu_columns is not None:
            if not complete or len(cells) != len(vnpu_columns):
                errors.append(f"line {line_no}: vNPU row cut off or unreadable")
                continue
            entry: dict[str, Any] = {}
            for col, cell in zip(vnpu_columns, cells, strict=True):
                key = "template" if col == "template_name" else col
                entry[key] = cell if key in ("container_id", "template") else _kv_value(key, cell)
            out["vnpus"].append(entry)
            continue
        if "static info" in low or "format:" in low:
            continue
        errors.append(f"line {line_no}: unrecognised line: {line[:80]!r}")
    res = out["resources"]
    for name, prefix in (("aicore", "aicore"), ("memory", "memory"), ("aicpu", "aicpu")):
        suffix = "_gb" if name == "memory" else ""
        out[f"{prefix}_free{suffix}"] = res.get(name, {}).get("free")
        out[f"{prefix}_total{suffix}"] = res.get(name, {}).get("total")
    if not res:
        errors.append("no resource free/total row found")
    if out["vnpu_count"] is not None and out["vnpu_count"] != len(out["vnpus"]):
        errors.append(f"output says {out['vnpu_count']} vNPU(s) but lists {len(out['vnpus'])} (cut off?)")
    out["errors"] = errors
    return out


# --------------------------------------------------------------------------------------------------
# kind detection and command line


def detect_kind(text: str) -> str:
    """Guess which ``npu-smi info`` variant produced ``text`` (``info``, ``info-vnpu`` or a detail kind)."""
    low = text.lower()
    if "vnpu id" in low or "resource static info" in low:
        return "info-vnpu"
    if re.search(r"^\s*[|+]", text, re.MULTILINE) and ("health" in low or "bus-id" in low or "npu-smi" in low):
        return "info"
    for line in text.splitlines():
        is_cmd, kind = _command_kind(line)
        if is_cmd and kind and kind != "info":
            return kind
    keys = {normalize_key(m.group("key")) for m in map(_KV_RE.match, text.splitlines()) if m}
    if keys:
        return _guess_detail_kind(keys)
    return "info"


def parse_any(text: str, kind: str = "auto") -> tuple[Any, list[str], bool]:
    """Parse ``text`` as ``kind`` (or detect it); return ``(data, errors, parsed_anything)``.

    For ``info`` the data is the list of chip dicts; for the other kinds a dict (or a list of dicts when
    the text holds several pasted command outputs, as vendor examples often do).
    """
    if kind == "auto":
        kind = detect_kind(text)
    if kind == "info":
        result = parse_npu_smi_info(text)
        return result.chips, result.errors, bool(result.chips)
    if kind == "info-vnpu":
        data = parse_npu_smi_info_vnpu(text)
        errors = data.pop("errors")
        return data, errors, bool(data["resources"] or data["vnpus"])
    pieces = split_command_outputs(text)
    parsed: list[dict[str, Any]] = []
    errors: list[str] = []
    for command, body in pieces:
        piece_kind = None if kind in ("auto", "kv") else kind
        if command is not None:
            piece_kind = _command_kind(command)[1] or piece_kind
        data = parse_npu_smi_detail(body, piece_kind)
        if command is not None:
            data["command"] = command
        errors.extend(data.pop("errors"))
        parsed.append(data)
    bookkeeping = {"kind", "command", "chips", "components", "overall_health"}
    anything = any(set(p) - bookkeeping or p["chips"] or p["components"] for p in parsed)
    return (parsed[0] if len(parsed) == 1 else parsed), errors, anything


def print_json(data: Any) -> int:
    """Print ``data`` as JSON on stdout; a reader that went away (``| head``) is not a crash."""
    try:
        json.dump(data, sys.stdout, indent=2)
        sys.stdout.write("\n")
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # keep exit-time flush quiet
        return 1
    return 0


def _read_input(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: print parsed JSON on stdout, problems on stderr; exit 1 when nothing could be parsed."""
    parser = argparse.ArgumentParser(
        prog="python -m devices.agent.npusmi",
        description="Parse npu-smi output (npu-smi info, or npu-smi info -t KIND) into JSON.",
    )
    parser.add_argument(
        "--kind",
        default="auto",
        choices=("auto", "info", "info-vnpu", *DETAIL_KINDS),
        help="which npu-smi output FILE holds (default: detect)",
    )
    parser.add_argument("file", metavar="FILE", help="file with the tool's output, or - for stdin")
    args = parser.parse_args(argv)
    try:
        text = _read_input(args.file)
    except OSError as exc:
        print(f"npusmi: error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    data, errors, anything = parse_any(text, args.kind)
    for message in errors:
        print(f"npusmi: warning: {message}", file=sys.stderr)
    if not anything:
        print("npusmi: error: nothing could be parsed from the input", file=sys.stderr)
        return 1
    return print_json(data)


if __name__ == "__main__":
    sys.exit(main())
