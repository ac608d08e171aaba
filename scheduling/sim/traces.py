"""Job traces and cluster descriptions for the simulator and the policy dry run.

A *trace* is a CSV in the shared schema (``/work/shared/traces/README.md``)::

    job_id,submit_time_s,duration_s,num_devices,tenant,user,status

plus optional columns used when present: ``priority_class``, ``chip_model``,
``gpu_milli`` (thousandths of one device; below 1000 the job wants a fraction of
a device, which the simulator maps to a vNPU template) and ``checkpoint_interval_s``
(the job saves its state that often, in seconds; empty: it does not).

A *cluster* is a small YAML document (format in ``docs/simulator.md``)::

    nodeGroups:
      - {name: b4, count: 16, chipModel: 910B4, devicesPerNode: 8,
         hbmMb: 32768, aiCores: 20, aiCpus: 7, topology: {groupSize: 4}}
    vnpuTemplates:
      - {chipModel: 910B4, name: vir05_1c_8g, memoryMb: 8192, aiCores: 5, aiCpus: 1}

Both loaders raise :class:`InputError` with a message that names the file, the
line or key and the field, so the command line can print it without a traceback.
"""

from __future__ import annotations

import csv
import gzip
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scheduling.engine.snapshot import DeviceState, NodeState, VnpuTemplate

#: Columns every trace must have, in the shared order.
REQUIRED_COLUMNS = ("job_id", "submit_time_s", "duration_s", "num_devices", "tenant", "user", "status")
#: Columns used when present.
OPTIONAL_COLUMNS = ("priority_class", "chip_model", "gpu_milli", "checkpoint_interval_s")


class InputError(ValueError):
    """A trace, cluster or policy file the simulator cannot use; the message names the field."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One job of a trace, as recorded (no cluster or policy applied yet)."""

    job_id: str
    submit_time_s: float
    duration_s: float
    num_devices: int
    tenant: str
    user: str
    status: str = ""
    priority_class: str | None = None
    chip_model: str | None = None
    gpu_milli: int | None = None
    checkpoint_interval_s: float | None = None

    @classmethod
    def from_mapping(cls, row: Mapping[str, Any], where: str = "row") -> TraceRow:
        """Build a row from a mapping with the trace's column names (CSV row, recorded DB job)."""
        for column in REQUIRED_COLUMNS:
            if column not in row or row[column] is None:
                raise InputError(f"{where}: missing column {column!r}")
        return cls(
            job_id=str(row["job_id"]),
            submit_time_s=_number(row["submit_time_s"], "submit_time_s", where),
            duration_s=_number(row["duration_s"], "duration_s", where),
            num_devices=_integer(row["num_devices"], "num_devices", where),
            tenant=_text(row["tenant"], "tenant", where),
            user=str(row["user"]).strip() or _text(row["tenant"], "tenant", where),
            status=str(row["status"]),
            priority_class=_optional_text(row.get("priority_class")),
            chip_model=_optional_text(row.get("chip_model")),
            gpu_milli=(
                None if _optional_text(row.get("gpu_milli")) is None else _integer(row["gpu_milli"], "gpu_milli", where)
            ),
            checkpoint_interval_s=_optional_positive(row.get("checkpoint_interval_s"), "checkpoint_interval_s", where),
        )


def load_trace(path: str | Path) -> list[TraceRow]:
    """Read a trace CSV (gzip-compressed when the name ends in ``.gz``); rows come back sorted by submission time.

    Compressed traces let the full ones ship with the examples at a third of their size.
    """
    path = Path(path)
    try:
        if path.suffix == ".gz":
            handle = gzip.open(path, "rt", newline="", encoding="utf-8")
        else:
            handle = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read trace: {exc.strerror}") from None
    try:
        with handle:
            reader = csv.DictReader(handle)
            header = reader.fieldnames or []
            missing = [c for c in REQUIRED_COLUMNS if c not in header]
            if missing:
                raise InputError(
                    f"{path}: missing column {', '.join(repr(c) for c in missing)} (header: {','.join(header)})"
                )
            rows = [TraceRow.from_mapping(row, f"{path}:{reader.line_num}") for row in reader]
    except (OSError, EOFError, UnicodeDecodeError) as exc:  # a corrupt or truncated .gz, or not text
        raise InputError(f"{path}: cannot read trace: {exc}") from None
    rows.sort(key=lambda r: r.submit_time_s)
    return rows


def trace_rows(rows: Iterable[TraceRow | Mapping[str, Any]]) -> list[TraceRow]:
    """Normalise rows given as :class:`TraceRow` or mappings; sorted by submission time."""
    out = [r if isinstance(r, TraceRow) else TraceRow.from_mapping(r, f"row {i + 1}") for i, r in enumerate(rows)]
    out.sort(key=lambda r: r.submit_time_s)
    return out


# --- cluster ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeGroup:
    """``count`` identical nodes; ``group_size`` devices share one topology group (HCCS ring)."""

    name: str
    count: int
    chip_model: str
    devices_per_node: int
    hbm_mb: int
    ai_cores: int
    ai_cpus: int
    group_size: int


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    node_groups: tuple[NodeGroup, ...]
    vnpu_templates: tuple[VnpuTemplate, ...] = ()

    @property
    def total_devices(self) -> int:
        return sum(g.count * g.devices_per_node for g in self.node_groups)

    def devices_by_chip(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.node_groups:
            out[g.chip_model] = out.get(g.chip_model, 0) + g.count * g.devices_per_node
        return out

    def templates(self) -> dict[tuple[str, str], VnpuTemplate]:
        """Templates keyed like :attr:`Snapshot.templates`."""
        return {(t.chip_model, t.name): t for t in self.vnpu_templates}

    def build_nodes(self) -> list[NodeState]:
        """The cluster's nodes and devices: node ``<group>-<n>``, device ids from 1, groups ``<node>/g<k>``."""
        nodes: list[NodeState] = []
        next_id = 1
        for g in self.node_groups:
            width = max(3, len(str(g.count - 1)))
            for n in range(g.count):
                name = f"{g.name}-{n:0{width}d}"
                devices = [
                    DeviceState(
                        id=next_id + i,
                        node=name,
                        index=i,
                        chip_model=g.chip_model,
                        topology_group=f"{name}/g{i // g.group_size}",
                        hbm_mb=g.hbm_mb,
                        ai_cores=g.ai_cores,
                        ai_cpus=g.ai_cpus,
                    )
                    for i in range(g.devices_per_node)
                ]
                next_id += g.devices_per_node
                nodes.append(NodeState(name=name, devices=devices))
        return nodes


def load_cluster(path: str | Path) -> ClusterSpec:
    """Read and validate a cluster YAML file."""
    import yaml

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read cluster: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InputError(f"{path}: not valid YAML: {exc}") from None
    return parse_cluster(data, where=str(path))


def parse_cluster(data: object, where: str = "cluster") -> ClusterSpec:
    """Validate a parsed cluster document (see the module docstring)."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping with 'nodeGroups'")
    unknown = set(data) - {"nodeGroups", "vnpuTemplates", "name", "description"}
    if unknown:
        raise InputError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    raw_groups = data.get("nodeGroups")
    if not isinstance(raw_groups, list) or not raw_groups:
        raise InputError(f"{where}: 'nodeGroups' must be a non-empty list")
    groups: list[NodeGroup] = []
    names: set[str] = set()
    for i, raw in enumerate(raw_groups):
        at = f"{where}: nodeGroups[{i}]"
        if not isinstance(raw, Mapping):
            raise InputError(f"{at}: expected a mapping")
        _no_unknown(raw, {"name", "count", "chipModel", "devicesPerNode", "hbmMb", "aiCores", "aiCpus", "topology"}, at)
        name = _req_text(raw, "name", at)
        if name in names:
            raise InputError(f"{at}.name: duplicate node group {name!r}")
        names.add(name)
        per_node = _req_int(raw, "devicesPerNode", at, minimum=1)
        topology = raw.get("topology") or {}
        if not isinstance(topology, Mapping):
            raise InputError(f"{at}.topology: expected a mapping like {{groupSize: 4}}")
        _no_unknown(topology, {"groupSize"}, f"{at}.topology")
        group_size = (
            _req_int(topology, "groupSize", f"{at}.topology", minimum=1) if "groupSize" in topology else per_node
        )
        if per_node % group_size:
            raise InputError(f"{at}.topology.groupSize: {group_size} does not divide devicesPerNode {per_node}")
        groups.append(
            NodeGroup(
                name=name,
                count=_req_int(raw, "count", at, minimum=1),
                chip_model=_req_text(raw, "chipModel", at),
                devices_per_node=per_node,
                hbm_mb=_req_int(raw, "hbmMb", at, minimum=0),
                ai_cores=_req_int(raw, "aiCores", at, minimum=1),
                ai_cpus=_req_int(raw, "aiCpus", at, minimum=0),
                group_size=group_size,
            )
        )
    raw_templates = data.get("vnpuTemplates") or []
    if not isinstance(raw_templates, list):
        raise InputError(f"{where}: 'vnpuTemplates' must be a list")
    chips = {g.chip_model: g for g in groups}
    templates: list[VnpuTemplate] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(raw_templates):
        at = f"{where}: vnpuTemplates[{i}]"
        if not isinstance(raw, Mapping):
            raise InputError(f"{at}: expected a mapping")
        _no_unknown(raw, {"chipModel", "name", "memoryMb", "aiCores", "aiCpus"}, at)
        t = VnpuTemplate(
            chip_model=_req_text(raw, "chipModel", at),
            name=_req_text(raw, "name", at),
            memory_mb=_req_int(raw, "memoryMb", at, minimum=1),
            ai_cores=_req_int(raw, "aiCores", at, minimum=1),
            ai_cpus=_req_int(raw, "aiCpus", at, minimum=0),
        )
        chip = chips.get(t.chip_model)
        if chip is None:
            raise InputError(f"{at}.chipModel: {t.chip_model!r} is not the chip of any node group")
        if t.ai_cores > chip.ai_cores or t.memory_mb > chip.hbm_mb or t.ai_cpus > chip.ai_cpus:
            raise InputError(f"{at}: template {t.name!r} is larger than one {t.chip_model} device")
        if (t.chip_model, t.name) in seen:
            raise InputError(f"{at}.name: duplicate template {t.name!r} for {t.chip_model}")
        seen.add((t.chip_model, t.name))
        templates.append(t)
    return ClusterSpec(node_groups=tuple(groups), vnpu_templates=tuple(templates))


# --- small validators -------------------------------------------------------------------------


def _number(value: object, field: str, where: str) -> float:
    try:
        out = float(str(value).strip())
    except ValueError:
        raise InputError(f"{where}: {field} {value!r} is not a number") from None
    if not math.isfinite(out):
        raise InputError(f"{where}: {field} {value!r} is not a finite number")
    return out


def _integer(value: object, field: str, where: str) -> int:
    number = _number(value, field, where)
    if number != int(number):
        raise InputError(f"{where}: {field} {value!r} is not a whole number")
    return int(number)


def _optional_positive(value: object, field: str, where: str) -> float | None:
    if _optional_text(value) is None:
        return None
    out = _number(value, field, where)
    if out <= 0:
        raise InputError(f"{where}: {field} {value!r} must be a positive number of seconds")
    return out


def _text(value: object, field: str, where: str) -> str:
    out = str(value).strip()
    if not out:
        raise InputError(f"{where}: {field} is empty")
    return out


def _optional_text(value: object) -> str | None:
    if value is None:
        return None
    out = str(value).strip()
    return out or None


def _no_unknown(raw: Mapping[str, Any], allowed: set[str], at: str) -> None:
    for key in raw:
        if key not in allowed:
            raise InputError(f"{at}: unknown key {key!r} (expected one of {', '.join(sorted(allowed))})")


def _req_text(raw: Mapping[str, Any], key: str, at: str) -> str:
    value = raw.get(key)
    if value is None or not str(value).strip():
        raise InputError(f"{at}.{key}: required")
    return str(value).strip()


def _req_int(raw: Mapping[str, Any], key: str, at: str, minimum: int) -> int:
    value = raw.get(key)
    if value is None:
        raise InputError(f"{at}.{key}: required")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InputError(f"{at}.{key}: expected a whole number, got {value!r}")
    if value < minimum:
        raise InputError(f"{at}.{key}: must be at least {minimum}, got {value}")
    return value
