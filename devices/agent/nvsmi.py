"""Parse ``nvidia-smi`` output so GPU nodes report in the same shape as Ascend nodes.

The portal schedules NVIDIA and Ascend nodes side by side, so each GPU becomes a dict with the same
keys the npu-smi parser uses where they apply. Three outputs are understood: ``--query-gpu ... --format=csv``
(with or without header and units; what the agent itself runs), ``nvidia-smi -q`` and the plain table.
As with npu-smi, a GPU whose readings were cut off or unreadable is reported ``UNKNOWN``, never ``OK``.

Standard library only: this module runs inside the node agent.

Command line::

    python -m devices.agent.nvsmi [--kind auto|csv|q|table] [--fields a,b,c] FILE|-
"""

from __future__ import annotations

import argparse
import csv
import io
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from devices.agent.npusmi import print_json, worst_health

GPU_KEYS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "bus_id",
    "health",
    "temp_c",
    "power_w",
    "util_pct",
    "memory_used_mb",
    "memory_total_mb",
    "ecc_errors",
    "processes",
    "extra",
)
"""Keys of every GPU dict, always all present (``None`` where the output did not carry the value).

``extra`` holds query fields without a common key, as the raw strings nvidia-smi printed."""

AGENT_QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "temperature.gpu",
    "power.draw",
    "utilization.gpu",
    "memory.used",
    "memory.total",
    "ecc.errors.uncorrected.volatile.total",
)
"""The ``--query-gpu`` fields the agent asks for (with ``noheader,nounits``, so order is the contract)."""

AGENT_QUERY_APPS_FIELDS: tuple[str, ...] = ("gpu_bus_id", "pid", "process_name", "used_memory")

_FIELD_KEYS = {
    "index": "index",
    "name": "name",
    "uuid": "uuid",
    "pci.bus_id": "bus_id",
    "temperature.gpu": "temp_c",
    "power.draw": "power_w",
    "power.draw.instant": "power_w",
    "power.draw.average": "power_w",
    "utilization.gpu": "util_pct",
    "memory.used": "memory_used_mb",
    "memory.total": "memory_total_mb",
    "ecc.errors.uncorrected.volatile.total": "ecc_errors",
}
_NUMERIC_KEYS = frozenset({"index", "temp_c", "power_w", "util_pct", "memory_used_mb", "memory_total_mb", "ecc_errors"})
_NA_RE = re.compile(r"^\[?\s*(n/a|not supported|na|insufficient permissions)\s*\]?$", re.IGNORECASE)
_LOST_RE = re.compile(r"gpu is lost", re.IGNORECASE)
_BROKEN_RE = re.compile(r"requires reset|unknown error|err!", re.IGNORECASE)
_NUM_WITH_UNIT_RE = re.compile(r"^([+-]?\d+(?:\.\d+)?)\s*(?:%|mib|w|c|mhz|kb/s)?$", re.IGNORECASE)


@dataclass
class NvSmiResult:
    """GPUs read from one nvidia-smi output, plus every problem met on the way."""

    gpus: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    driver_version: str | None = None


def _new_gpu() -> dict[str, Any]:
    gpu = dict.fromkeys(GPU_KEYS)
    gpu["extra"] = {}
    return gpu


def _value(text: str) -> tuple[Any, str | None]:
    """Return ``(value, problem)``: numbers lose their unit, ``[N/A]`` becomes ``None``.

    ``problem`` names readings that mean the GPU itself is in trouble (``[GPU is lost]``,
    ``[GPU requires reset]``, ``ERR!``), which decide health, so callers must not drop them.
    """
    raw = text.strip()
    if not raw or _NA_RE.match(raw):
        return None, None
    if _LOST_RE.search(raw):
        return None, "lost"
    if _BROKEN_RE.search(raw):
        return None, raw
    match = _NUM_WITH_UNIT_RE.match(raw)
    if match:
        num = match.group(1)
        return (float(num) if "." in num else int(num)), None
    return raw, None


def _number_or_none(value: Any) -> int | float | None:
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def _text_or_none(text: str) -> str | None:
    raw = text.strip()
    return None if not raw or _NA_RE.match(raw) else raw


def _derive_health(gpu: dict[str, Any], problems: list[str], complete: bool) -> str:
    """nvidia-smi has no health column, so derive one that errs on the side of "look at this GPU"."""
    readings: list[str] = []
    if any(p == "lost" for p in problems):
        readings.append("lost")
    if any(p != "lost" for p in problems) or not complete:
        readings.append("UNKNOWN")
    ecc = gpu.get("ecc_errors")
    if isinstance(ecc, int) and ecc > 0:
        readings.append("Critical")  # volatile uncorrectable ECC: the GPU needs a reset before reuse
    return worst_health(readings) if readings else "OK"


# --------------------------------------------------------------------------------------------------
# --query-gpu=... --format=csv


def _strip_unit_suffix(header: str) -> str:
    return re.sub(r"\s*\[[^\]]*\]\s*$", "", header.strip()).strip().lower()


_QUERY_FIELD_RE = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z0-9_]+)*")


def _looks_like_header(row: Sequence[str]) -> bool:
    """A header row names query fields (``memory.used [MiB]``): every cell must look like one."""
    names = [_strip_unit_suffix(c) for c in row]
    return all(_QUERY_FIELD_RE.fullmatch(n) for n in names) and any(n in _FIELD_KEYS or "." in n for n in names)


def parse_query_csv(text: str, fields: Sequence[str] | None = None) -> NvSmiResult:
    """Parse ``nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]``.

    Field names come from the header row when present, else from ``fields`` (the list passed to
    ``--query-gpu``). Fields without a common key are kept under ``extra``. Never raises.
    """
    result = NvSmiResult()
    try:
        rows = [r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)]
    except csv.Error as exc:
        result.errors.append(f"not CSV: {exc}")
        return result
    if not rows:
        result.errors.append("empty input")
        return result
    if _looks_like_header(rows[0]):
        names = [_strip_unit_suffix(c) for c in rows[0]]
        rows = rows[1:]
    elif fields:
        names = [f.strip().lower() for f in fields]
    else:
        result.errors.append("no header row and no --fields given: cannot tell which column is which")
        return result
    # nvidia-smi ends every row with a newline; a last row without one may be cut inside its last value.
    last_cut = not text.endswith("\n")
    for row_no, row in enumerate(rows, start=1):
        gpu = _new_gpu()
        problems: list[str] = []
        complete = len(row) == len(names) and not (last_cut and row_no == len(rows))
        if not complete:
            result.errors.append(f"row {row_no}: {len(row)} values for {len(names)} fields, or cut off")
        for name, cell in zip(names, row, strict=False):
            value, problem = _value(cell)
            if problem:
                problems.append(problem)
                result.errors.append(f"row {row_no}: {name} reads {cell.strip()!r}")
            key = _FIELD_KEYS.get(name)
            if key is None:
                gpu["extra"][name] = None if value is None else cell.strip()  # versions must stay strings
            elif key in _NUMERIC_KEYS:
                gpu[key] = _number_or_none(value)
            else:
                gpu[key] = value if value is None else str(value)
        if gpu["index"] is None:
            gpu["index"] = row_no - 1
        gpu["health"] = _derive_health(gpu, problems, complete)
        result.gpus.append(gpu)
    return result


def parse_query_apps_csv(text: str) -> tuple[dict[str, list[dict[str, Any]]], list[str]]:
    """Parse ``--query-compute-apps=gpu_bus_id,pid,process_name,used_memory --format=csv,noheader,nounits``.

    Returns processes keyed by lower-cased bus id, the key both queries share.
    """
    by_bus: dict[str, list[dict[str, Any]]] = {}
    errors: list[str] = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not any(c.strip() for c in row):
            continue
        if len(row) != 4:
            errors.append(f"process row with {len(row)} values skipped")
            continue
        if _looks_like_header(row) or row[1].strip().lower() == "pid":
            continue
        pid, _ = _value(row[1])
        memory, _ = _value(row[3])
        by_bus.setdefault(row[0].strip().lower(), []).append(
            {"pid": _number_or_none(pid), "name": _text_or_none(row[2]), "memory_mb": _number_or_none(memory)}
        )
    return by_bus, errors


# --------------------------------------------------------------------------------------------------
# nvidia-smi -q


@dataclass
class _Node:
    key: str
    value: str | None
    children: list[_Node] = field(default_factory=list)

    def find(self, *path: str) -> _Node | None:
        node: _Node | None = self
        for part in path:
            if node is None:
                return None
            node = next((c for c in node.children if c.key.lower() == part.lower()), None)
        return node

    def get(self, *path: str) -> str | None:
        node = self.find(*path)
        return node.value if node else None


def _q_tree(text: str) -> _Node:
    """Turn the indented ``-q`` report into a tree, keeping repeated keys (processes repeat them)."""
    root = _Node("", None)
    stack: list[tuple[int, _Node]] = [(-1, root)]
    for line in text.splitlines():
        if not line.strip() or line.strip().startswith("==="):
            continue
        indent = len(line) - len(line.lstrip())
        if ":" in line:
            key, _, value = line.partition(":")
            node = _Node(key.strip(), value.strip())
        else:
            node = _Node(line.strip(), None)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack[-1][1].children.append(node)
        stack.append((indent, node))
    return root


def _q_processes(gpu_node: _Node) -> list[dict[str, Any]] | None:
    procs_node = gpu_node.find("Processes")
    if procs_node is None:
        return None
    if procs_node.value and procs_node.value.lower() == "none":
        return []
    processes: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None

    def visit(node: _Node) -> None:
        nonlocal current
        key = node.key.lower()
        if key == "process id":
            current = {"pid": _number_or_none(_value(node.value or "")[0]), "name": None, "memory_mb": None}
            processes.append(current)
        elif current is not None and key == "name":
            current["name"] = node.value or None
        elif current is not None and key == "used gpu memory":
            current["memory_mb"] = _number_or_none(_value(node.value or "")[0])
        for child in node.children:
            visit(child)

    for child in procs_node.children:
        visit(child)
    return processes


def parse_query_q(text: str) -> NvSmiResult:
    """Parse ``nvidia-smi -q``. GPUs are numbered in the order printed, which is nvidia-smi's index order."""
    result = NvSmiResult()
    root = _q_tree(text)
    result.driver_version = root.get("Driver Version")
    gpu_nodes = [n for n in root.children if re.match(r"^GPU [0-9A-Fa-f:.]+$", n.key)]
    if not gpu_nodes:
        result.errors.append("no 'GPU <bus id>' section found")
    attached = _value(root.get("Attached GPUs") or "")[0]
    if isinstance(attached, int) and attached != len(gpu_nodes):
        result.errors.append(f"report says {attached} GPU(s) attached but has {len(gpu_nodes)} section(s) (cut off?)")
    for index, node in enumerate(gpu_nodes):
        gpu = _new_gpu()
        problems: list[str] = []

        def read(*path: str, _node: _Node = node, _problems: list[str] = problems) -> Any:
            raw = _node.get(*path)
            if raw is None:
                return None
            value, problem = _value(raw)
            if problem:
                _problems.append(problem)
            return value

        gpu["index"] = index
        gpu["name"] = node.get("Product Name")
        gpu["uuid"] = node.get("GPU UUID")
        gpu["bus_id"] = node.get("PCI", "Bus Id") or node.key.split(" ", 1)[1]
        gpu["temp_c"] = _number_or_none(read("Temperature", "GPU Current Temp"))
        power = read("GPU Power Readings", "Power Draw")
        gpu["power_w"] = _number_or_none(power if power is not None else read("Power Readings", "Power Draw"))
        gpu["util_pct"] = _number_or_none(read("Utilization", "Gpu"))
        gpu["memory_used_mb"] = _number_or_none(read("FB Memory Usage", "Used"))
        gpu["memory_total_mb"] = _number_or_none(read("FB Memory Usage", "Total"))
        volatile = node.find("ECC Errors", "Volatile")
        if volatile is not None:
            # Newer drivers list "... Uncorrectable ..." counters; older ones a "Double Bit" block with a Total.
            counts = [
                _number_or_none(_value(c.value or "")[0])
                if "uncorrectable" in c.key.lower()
                else _number_or_none(_value(c.get("Total") or "")[0])
                for c in volatile.children
                if "uncorrectable" in c.key.lower() or c.key.lower() == "double bit"
            ]
            known = [c for c in counts if isinstance(c, int)]
            gpu["ecc_errors"] = sum(known) if known else None
        gpu["processes"] = _q_processes(node)
        # "Processes" is the last entry of every GPU section: without it the report was cut short.
        complete = gpu["name"] is not None and node.find("Processes") is not None
        if not complete:
            result.errors.append(f"GPU {gpu['bus_id']}: section incomplete (cut off before its Processes entry)")
        health = _derive_health(gpu, problems, complete)
        flags = [
            ("Critical", node.get("GPU Reset Status", "Reset Required")),
            ("Critical", node.get("Remapped Rows", "Remapping Failure Occurred")),
            ("Warning", node.get("Remapped Rows", "Pending")),
        ]
        raised = [level for level, flag in flags if (flag or "").lower() == "yes"]
        gpu["health"] = worst_health([health, *raised])
        result.gpus.append(gpu)
    return result


# --------------------------------------------------------------------------------------------------
# plain `nvidia-smi` table

_TABLE_ROW1_RE = re.compile(r"^(?P<index>\d+)\s+(?P<name>.*?)\s+(?P<persist>On|Off)$")
_TABLE_BUS_RE = re.compile(r"(?P<bus>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])")
_TABLE_PROC_RE = re.compile(
    r"^(?P<gpu>\d+)\s+(?:(?P<gi>\S+)\s+(?P<ci>\S+)\s+)?(?P<pid>\d+)\s+(?P<type>[CGM+]+)\s+(?P<name>.*?)\s+(?P<mem>\d+)MiB$"
)


def parse_table(text: str) -> NvSmiResult:
    """Parse the plain ``nvidia-smi`` table (two or three rows per GPU, then the process table)."""
    result = NvSmiResult()
    driver = re.search(r"Driver Version:\s*(\S+)", text)
    result.driver_version = driver.group(1) if driver else None
    gpus: dict[int, dict[str, Any]] = {}
    state: dict[int, dict[str, Any]] = {}  # per GPU: problems, whether row 2 was read
    current: int | None = None
    in_processes = False
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("|"):
            if line.startswith("+"):
                current = None
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        complete = line.endswith("|") and len(line) > 1
        if cells and cells[0].lower().startswith("processes"):
            in_processes = True
            continue
        if in_processes:
            match = _TABLE_PROC_RE.match(cells[0]) if complete and len(cells) == 1 else None
            owner = gpus.get(int(match.group("gpu"))) if match else None
            if match and owner is not None:
                owner["processes"] = owner["processes"] or []
                owner["processes"].append(
                    {"pid": int(match.group("pid")), "name": match.group("name"), "memory_mb": int(match.group("mem"))}
                )
            elif not complete:
                result.errors.append(f"line {line_no}: process row cut off")
            continue
        row1 = _TABLE_ROW1_RE.match(cells[0]) if cells else None
        if row1 and len(cells) >= 2 and _TABLE_BUS_RE.search(cells[1]):
            index = int(row1.group("index"))
            gpu = _new_gpu()
            gpu["index"] = index
            gpu["name"] = row1.group("name")
            gpu["bus_id"] = _TABLE_BUS_RE.search(cells[1]).group("bus")  # type: ignore[union-attr]
            problems: list[str] = []
            if len(cells) >= 3:
                ecc, problem = _value(cells[2])
                gpu["ecc_errors"] = ecc if isinstance(ecc, int) else None
                if problem:
                    problems.append(problem)
            gpus[index] = gpu
            state[index] = {"problems": problems, "row1_complete": complete and len(cells) >= 3, "row2": False}
            current = index
            continue
        if current is not None and len(cells) >= 2 and "MiB" in cells[1] and not state[current]["row2"]:
            gpu, st = gpus[current], state[current]
            st["row2"] = complete and len(cells) >= 3
            temp = re.search(r"(\d+)C\b", cells[0])
            gpu["temp_c"] = int(temp.group(1)) if temp else None
            power = re.search(r"(\d+(?:\.\d+)?)W\s*/", cells[0])
            gpu["power_w"] = _number_or_none(_value(power.group(1))[0]) if power else None
            mem = re.search(r"(\d+)MiB\s*/\s*(\d+)MiB", cells[1])
            if mem:
                gpu["memory_used_mb"], gpu["memory_total_mb"] = int(mem.group(1)), int(mem.group(2))
            util = re.search(r"(\d+)%", cells[2]) if len(cells) >= 3 else None
            gpu["util_pct"] = int(util.group(1)) if util else None
            if "ERR!" in line:
                st["problems"].append("ERR!")
                result.errors.append(f"line {line_no}: GPU {current} shows ERR!")
    if not gpus:
        result.errors.append("no GPU rows found in the nvidia-smi table")
    for index, gpu in sorted(gpus.items()):
        if in_processes and gpu["processes"] is None:
            gpu["processes"] = []  # the process table was printed and listed nothing for this GPU
        st = state[index]
        complete = st["row1_complete"] and st["row2"]
        if not complete:
            result.errors.append(f"GPU {index}: rows cut off or incomplete; health not trusted")
        gpu["health"] = _derive_health(gpu, st["problems"], complete)
        result.gpus.append(gpu)
    return result


# --------------------------------------------------------------------------------------------------
# detection and command line


def detect_kind(text: str) -> str:
    """``q`` for the ``-q`` report, ``table`` for the plain table, else ``csv``."""
    if "NVSMI LOG" in text or re.search(r"^Attached GPUs\s*:", text, re.MULTILINE):
        return "q"
    if re.search(r"^\|.*NVIDIA-SMI", text, re.MULTILINE) or re.search(r"^\|\s*GPU\s+Name", text, re.MULTILINE):
        return "table"
    return "csv"


def parse_nvidia_smi(text: str, kind: str = "auto", fields: Sequence[str] | None = None) -> NvSmiResult:
    """Parse any supported nvidia-smi output; never raises (a parser bug becomes an error entry)."""
    try:
        kind = detect_kind(text) if kind == "auto" else kind
        if kind == "q":
            return parse_query_q(text)
        if kind == "table":
            return parse_table(text)
        return parse_query_csv(text, fields)
    except Exception as exc:  # last line of defence: a parser bug must not kill the agent
        return NvSmiResult(errors=[f"internal parser error: {type(exc).__name__}: {exc}"])


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: JSON list of GPUs on stdout, problems on stderr; exit 1 when nothing could be parsed."""
    parser = argparse.ArgumentParser(
        prog="python -m devices.agent.nvsmi",
        description="Parse nvidia-smi output (--query-gpu CSV, -q report or the plain table) into JSON.",
    )
    parser.add_argument("--kind", default="auto", choices=("auto", "csv", "q", "table"))
    parser.add_argument("--fields", help="comma-separated --query-gpu field list, for CSV without a header")
    parser.add_argument("file", metavar="FILE", help="file with the tool's output, or - for stdin")
    args = parser.parse_args(argv)
    try:
        if args.file == "-":
            text = sys.stdin.read()
        else:
            with open(args.file, encoding="utf-8", errors="replace") as fh:
                text = fh.read()
    except OSError as exc:
        print(f"nvsmi: error: cannot read {args.file}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    fields = [f.strip() for f in args.fields.split(",")] if args.fields else None
    result = parse_nvidia_smi(text, args.kind, fields)
    for message in result.errors:
        print(f"nvsmi: warning: {message}", file=sys.stderr)
    if not result.gpus:
        print("nvsmi: error: nothing could be parsed from the input", file=sys.stderr)
        return 1
    return print_json(result.gpus)


if __name__ == "__main__":
    sys.exit(main())
