"""A simulated accelerator node, so the portal and the scheduler can be exercised without hardware.

It reports readings shaped exactly like a real npu-smi node, moves them with the jobs it runs (a busy
device heats up, draws power, shows AI Core load and HBM use) and takes injected faults, which persist
in the state dir like a real broken card survives an agent restart. Figures are a fixed function of
device index and load rather than random, so tests and demos can assert on them.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.agent.backends import Backend, DeviceReport, DeviceUse, LaunchPlan, device_entry
from devices.agent.errors import ApiError
from devices.agent.npusmi import worst_health
from devices.agent.procfs import read_json, write_json_atomic
from devices.agent.ranktable import sim_device_ips

FAULT_KINDS: tuple[str, ...] = ("ecc", "overheat", "lost", "recover")
"""``ecc``: +1 uncorrectable ECC error, health Critical. ``overheat``: 98 °C, health Alarm.
``lost``: the device drops off the bus (health ``lost``, no readings). ``recover``: back to OK at normal
temperature; the cumulative ECC count is kept, as on real hardware."""

OVERHEAT_TEMP_C = 98
_CONDITION_HEALTH = {"ecc": "Critical", "overheat": "Alarm", "lost": "lost"}
_VNPU_TEMPLATE_RE = re.compile(r"^vir(?P<cores>\d{1,2})(?:_(?P<cpus>\d+)c)?(?:_(?P<gb>\d+)g)?(?:_[a-z]+)?$")
_VNPUS_PER_DEVICE = 16


@dataclass(frozen=True)
class SimChip:
    """Published figures of one Ascend chip model, enough for plausible readings."""

    hbm_mb: int
    aicores: int
    idle_w: float
    busy_w: float
    idle_temp_c: int


SIM_CHIPS: dict[str, SimChip] = {
    "910A": SimChip(32768, 32, 65.0, 290.0, 36),
    "910PremiumA": SimChip(32768, 32, 70.0, 300.0, 37),
    "910B1": SimChip(65536, 25, 90.0, 380.0, 37),
    "910B2": SimChip(65536, 24, 90.0, 370.0, 37),
    "910B3": SimChip(65536, 20, 85.0, 330.0, 36),
    "910B4": SimChip(32768, 20, 75.0, 300.0, 35),
    "Ascend910": SimChip(65536, 24, 95.0, 400.0, 38),
    "310P3": SimChip(24576, 8, 20.0, 70.0, 40),
    "310": SimChip(8192, 2, 8.0, 12.8, 50),
}


def parse_topology(spec: str, count: int) -> tuple[str, list[list[int]]]:
    """``none``, ``mesh``, ``ring`` (HCCS groups of 4, as on 910A boards) or ``ring:N``.

    Raises ``ValueError`` with a message fit for the command line.
    """
    spec = spec.strip().lower()
    if spec in ("", "none"):
        return "none", []
    if spec == "mesh":
        return "mesh", [list(range(count))]
    match = re.fullmatch(r"ring(?::(\d+))?", spec)
    if not match:
        raise ValueError(f"unknown topology {spec!r} (use none, mesh, ring or ring:N)")
    size = int(match.group(1) or 4)
    if size < 1 or count % size:
        raise ValueError(f"ring groups of {size} do not divide {count} devices")
    return "ring", [list(range(start, start + size)) for start in range(0, count, size)]


class SimBackend(Backend):
    """Simulated Ascend node: ``count`` chips of one model, faults kept in ``<state>/sim_faults.json``."""

    name = "sim"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def __init__(self, chip_model: str, count: int, state_dir: Path, topology: str = "none") -> None:
        self.chip_model = chip_model
        self.chip = SIM_CHIPS[chip_model]
        self.count = count
        self.topology_kind, self.groups = parse_topology(topology, count)
        self._faults_path = state_dir / "sim_faults.json"
        self._lock = threading.Lock()
        self._faults: dict[int, dict[str, Any]] = self._load_faults()

    # -- faults -----------------------------------------------------------------------------------
    def _load_faults(self) -> dict[int, dict[str, Any]]:
        try:
            raw = read_json(self._faults_path)
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError):
            raw = {}  # a damaged file must not stop the agent; faults are re-injectable
        faults: dict[int, dict[str, Any]] = {}
        for key, value in (raw.get("devices", {}) if isinstance(raw, dict) else {}).items():
            if str(key).isdigit() and int(key) < self.count and isinstance(value, dict):
                conditions = [c for c in value.get("conditions", []) if c in _CONDITION_HEALTH]
                faults[int(key)] = {"conditions": conditions, "ecc_errors": int(value.get("ecc_errors", 0))}
        return faults

    def inject_fault(self, payload: Any) -> dict[str, Any]:
        """Apply ``{"device": index, "kind": ...}`` and persist it; returns the device's fault state."""
        if not isinstance(payload, dict):
            raise ApiError(400, "body must be a JSON object", "body")
        device = payload.get("device")
        if isinstance(device, bool) or not isinstance(device, int):
            raise ApiError(400, "device must be an integer device index", "device")
        if not 0 <= device < self.count:
            raise ApiError(400, f"unknown device index {device} (this node has 0..{self.count - 1})", "device")
        kind = payload.get("kind")
        if kind not in FAULT_KINDS:
            raise ApiError(400, f"kind must be one of {', '.join(FAULT_KINDS)}", "kind")
        with self._lock:
            state = self._faults.setdefault(device, {"conditions": [], "ecc_errors": 0})
            if kind == "recover":
                state["conditions"] = []
            else:
                if kind == "ecc":
                    state["ecc_errors"] += 1
                if kind not in state["conditions"]:
                    state["conditions"].append(kind)
            write_json_atomic(self._faults_path, {"devices": {str(k): v for k, v in sorted(self._faults.items())}})
            return {"device": device, "kind": kind, **state, "health": self._health(device)}

    def _health(self, index: int) -> str:
        conditions = self._faults.get(index, {}).get("conditions", [])
        return worst_health([_CONDITION_HEALTH[c] for c in conditions]) if conditions else "OK"

    # -- Backend ----------------------------------------------------------------------------------
    def known_indices(self) -> set[int]:
        return set(range(self.count))

    def unusable_reason(self, index: int) -> str | None:
        with self._lock:
            if self._health(index) == "lost":
                return f"device {index} is lost (simulated fault)"
        return None

    def collect(self, usage: Mapping[int, Sequence[DeviceUse]]) -> DeviceReport:
        with self._lock:
            devices = [self._reading(i, usage.get(i, ())) for i in range(self.count)]
        extra: dict[str, Any] = {}
        if self.groups:
            extra["topology"] = {"kind": self.topology_kind, "groups": self.groups}
        return DeviceReport(devices=devices, extra=extra)

    def _reading(self, index: int, uses: Sequence[DeviceUse]) -> dict[str, Any]:
        chip = self.chip
        fault = self._faults.get(index, {"conditions": [], "ecc_errors": 0})
        health = self._health(index)
        group = next((g for g, members in enumerate(self.groups) if index in members), None)
        common = {
            "ecc_errors": fault["ecc_errors"],
            "npu_id": index,
            "chip_id": 0,
            "bus_id": f"0000:{0xC1 + index:02X}:00.0",
            "topology_group": group,
            "job_ids": [u.job_id for u in uses],
            "vnpus": [dict(u.vnpu) for u in uses if u.vnpu],
        }
        if health == "lost":
            return device_entry(index, self.chip_model, "lost", processes=[], **common)
        exclusive = any(u.vnpu is None for u in uses)
        vnpu_cores = sum(int(u.vnpu["aicores"]) for u in uses if u.vnpu)
        load = 1.0 if exclusive else min(1.0, vnpu_cores / chip.aicores)
        baseline_mb = chip.hbm_mb * 3 // 100  # firmware and runtime reserve, present even when idle
        if exclusive:
            used_mb = baseline_mb + chip.hbm_mb * 85 // 100
        else:
            used_mb = baseline_mb + sum(int(u.vnpu["memory_mb"]) for u in uses if u.vnpu)
        temp = chip.idle_temp_c + index % 4 + round(load * 22)
        if "overheat" in fault["conditions"]:
            temp = OVERHEAT_TEMP_C
        processes = [
            {
                "pid": u.pid,
                "name": _process_name(u.command),
                "memory_mb": (u.vnpu["memory_mb"] if u.vnpu else chip.hbm_mb * 85 // 100 // max(1, len(uses))),
            }
            for u in uses
        ]
        return device_entry(
            index,
            self.chip_model,
            health,
            temp_c=temp,
            power_w=round(chip.idle_w + load * (chip.busy_w - chip.idle_w) - (index % 4) * 0.7, 1),
            aicore_pct=round(load * (88 + (index % 3) * 4)),
            hbm_used_mb=min(used_mb, chip.hbm_mb),
            hbm_total_mb=chip.hbm_mb,
            processes=processes,
            **common,
        )

    needs_device_ips = True

    def device_ips(self, indices: Sequence[int], node: str) -> dict[int, str]:
        """Made-up, stable addresses (see :func:`ranktable.sim_device_ips`)."""
        return sim_device_ips(node, indices)

    def plan_launch(
        self, devices: Sequence[int], vnpu: Mapping[str, Any] | None, usage: Mapping[int, Sequence[DeviceUse]]
    ) -> LaunchPlan:
        """Plain jobs get their devices; a vNPU job gets a slice of one device, if the template fits."""
        plan = super().plan_launch(devices, None, usage)
        if vnpu is None:
            return plan
        device = int(vnpu["device"])
        template = str(vnpu["template"])
        match = _VNPU_TEMPLATE_RE.fullmatch(template)
        if not match:
            raise ApiError(400, f"unknown vNPU template {template!r} (expected e.g. vir05_1c_8g)", "vnpu.template")
        cores = int(match.group("cores"))
        if match.group("gb"):
            memory_mb = int(match.group("gb")) * 1024
        else:  # templates without a size (vir01, vir02 ...) get memory in proportion to their AI cores
            memory_mb = self.chip.hbm_mb * cores // self.chip.aicores
        slices = [u.vnpu for u in usage.get(device, ()) if u.vnpu]
        free_cores = self.chip.aicores - sum(int(s["aicores"]) for s in slices)
        if cores < 1 or cores > free_cores:
            raise ApiError(
                409, f"template {template} needs {cores} AI cores; device {device} has {free_cores} free", "vnpu"
            )
        taken = {int(s["vnpu_id"]) for s in slices}
        base = 100 + device * _VNPUS_PER_DEVICE
        vnpu_id = next((v for v in range(base, base + _VNPUS_PER_DEVICE) if v not in taken), None)
        if vnpu_id is None:
            raise ApiError(409, f"device {device} already has {_VNPUS_PER_DEVICE} vNPUs", "vnpu")
        record = {"template": template, "device": device, "vnpu_id": vnpu_id, "aicores": cores, "memory_mb": memory_mb}
        env = dict(plan.env)
        env["NPUPORTAL_VNPU_ID"] = str(vnpu_id)
        env["NPUPORTAL_VNPU_TEMPLATE"] = template
        return LaunchPlan(env=env, vnpu=record)


def _process_name(command: str) -> str:
    """What npu-smi would show: the program name, cut to 15 characters."""
    try:
        first = shlex.split(command)[0]
    except (ValueError, IndexError):
        first = command.split()[0] if command.split() else "sh"
    return first.rsplit("/", 1)[-1][:15]
