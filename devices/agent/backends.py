"""Where device readings come from: the vendor tool (npu-smi, nvidia-smi) or the simulator.

Every backend answers in one device shape (see ``device_entry``) so the portal never needs to know which
vendor a node has. The tools are slow and occasionally hang or crash; a failed reading is reported as
``UNKNOWN`` devices with an ``error`` — never as the last good reading and never as a silent ``OK`` — and
a device that vanishes from a *complete* reading is reported ``lost``.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devices.agent import npusmi, nvsmi, ranktable
from devices.agent.errors import ApiError

DEVICE_KEYS: tuple[str, ...] = (
    "index",
    "chip_model",
    "health",
    "temp_c",
    "power_w",
    "aicore_pct",
    "hbm_used_mb",
    "hbm_total_mb",
    "ecc_errors",
    "processes",
)
"""Keys every ``/v1/devices`` entry carries; backends may add their own after these."""


@dataclass(frozen=True)
class DeviceUse:
    """A running job's claim on a device, as the backends need to see it."""

    job_id: str
    pid: int | None
    command: str
    vnpu: Mapping[str, Any] | None = None


@dataclass
class DeviceReport:
    """One reading of all devices; ``error`` is set whenever anything in it is not first-hand."""

    devices: list[dict[str, Any]]
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ProcessTable:
    """Who holds accelerator memory, as the vendor tool's process table lists it.

    ``processes`` maps a device index to its rows (``{"pid", "name", "memory_mb"}``); a device the
    reading did not cover (the tool failed, the card was cut from the output) is missing, and ``error``
    says why when there was a problem.
    """

    processes: dict[int, list[dict[str, Any]]]
    error: str | None = None


@dataclass(frozen=True)
class LaunchPlan:
    """What a backend adds to a job launch: environment for the process and the vNPU it got, if any."""

    env: dict[str, str]
    vnpu: dict[str, Any] | None = None


def device_entry(index: int, chip_model: str | None, health: str, **values: Any) -> dict[str, Any]:
    """A device dict with every contract key present (``None`` where unmeasured), extras after them."""
    entry: dict[str, Any] = dict.fromkeys(DEVICE_KEYS)
    entry.update(index=index, chip_model=chip_model, health=health)
    entry.update(values)
    return entry


class Backend:
    """Base class: device readings, device validation, and the per-launch environment."""

    name = "base"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"

    def collect(self, usage: Mapping[int, Sequence[DeviceUse]]) -> DeviceReport:
        """Read every device now; ``usage`` tells which jobs hold which device."""
        raise NotImplementedError

    def known_indices(self) -> set[int] | None:
        """Device indices a job may ask for; ``None`` when the backend cannot tell right now."""
        raise NotImplementedError

    def unusable_reason(self, index: int) -> str | None:
        """Why a device must not get new work (gone off the bus), or ``None``."""
        return None

    def plan_launch(
        self, devices: Sequence[int], vnpu: Mapping[str, Any] | None, usage: Mapping[int, Sequence[DeviceUse]]
    ) -> LaunchPlan:
        """Environment that confines the job to ``devices``; backends without vNPU support refuse one."""
        if vnpu is not None:
            raise ApiError(400, f"vNPU jobs are not supported by the {self.name} backend", "vnpu")
        return LaunchPlan(env={self.visible_devices_env: ",".join(str(d) for d in devices)})

    #: Whether a multi-node job needs each card's IP (HCCL's rank table); without one it is refused.
    needs_device_ips = False

    def device_ips(self, indices: Sequence[int], node: str) -> dict[int, str]:
        """``{device: IP of its RoCE port}`` for the rank table of a multi-node job; missing ones are left out."""
        return {}

    def may_list_processes(self) -> bool:
        """Whether :meth:`process_table` may answer (a cheap guess, no tool call): the simulator never does."""
        return False

    def process_table(self) -> ProcessTable | None:
        """The processes holding accelerator memory on each device now; ``None``: this node prints no such table."""
        return None


class ToolBackend(Backend):
    """Shared plumbing for backends that shell out to a vendor tool."""

    def __init__(self, tool: str, timeout_s: float) -> None:
        self.tool = tool
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # the vendor tools misbehave when run concurrently
        self._known: dict[int, str | None] = {}  # index -> chip model, from the last readings
        self._health: dict[int, str] = {}
        self._lists_processes: bool | None = None  # whether the last complete reading had a process table

    def run_tool(self, args: Sequence[str]) -> tuple[str | None, str | None]:
        """Run the tool; return ``(stdout, None)`` or ``(None, why it failed)``."""
        cmd = [self.tool, *args]
        try:
            done = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except FileNotFoundError:
            return None, f"{self.tool} not found"
        except subprocess.TimeoutExpired:
            return None, f"{' '.join(cmd)} timed out after {self.timeout_s:g} s"
        except OSError as exc:
            return None, f"{' '.join(cmd)} could not run: {exc}"
        if done.returncode != 0:
            detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
            return None, f"{' '.join(cmd)} exited with status {done.returncode}: {detail[0][:200]}"
        return done.stdout, None

    def known_indices(self) -> set[int] | None:
        if not self._known:
            self.collect({})
        return set(self._known) if self._known else None

    def unusable_reason(self, index: int) -> str | None:
        if self._health.get(index) == "lost":
            return f"device {index} is lost (missing from the last {self.tool} reading)"
        return None

    def may_list_processes(self) -> bool:
        return self._lists_processes is not False  # not read yet: ask the tool

    def process_table(self) -> ProcessTable | None:
        """One reading of the tool: each device's ``processes`` (``None`` on releases without the table)."""
        report = self.collect({})
        tables = {d["index"]: d["processes"] for d in report.devices if d.get("processes") is not None}
        if not tables and report.error is None:
            return None
        return ProcessTable(tables, report.error)

    def _unknown_report(self, error: str, usage: Mapping[int, Sequence[DeviceUse]]) -> DeviceReport:
        """The tool could not be read: every device we know of is UNKNOWN, and we say why."""
        devices = [
            device_entry(idx, model, "UNKNOWN", job_ids=[u.job_id for u in usage.get(idx, ())])
            for idx, model in sorted(self._known.items())
        ]
        return DeviceReport(devices=devices, error=error)

    def _finish(
        self, devices: list[dict[str, Any]], errors: list[str], usage: Mapping[int, Sequence[DeviceUse]]
    ) -> DeviceReport:
        """Add lost devices, remember what we saw, and attach the job ids holding each device."""
        seen = {d["index"] for d in devices}
        for idx, model in sorted(self._known.items()):
            if idx in seen:
                continue
            # Missing from a reading that had problems: we cannot tell, so UNKNOWN; from a clean one: lost.
            health = "UNKNOWN" if errors else "lost"
            devices.append(device_entry(idx, model, health))
        devices.sort(key=lambda d: d["index"])
        if not errors:
            self._lists_processes = any(d.get("processes") is not None for d in devices)
        for dev in devices:
            dev["job_ids"] = [u.job_id for u in usage.get(dev["index"], ())]
            self._known.setdefault(dev["index"], dev["chip_model"])
            self._health[dev["index"]] = dev["health"]
        return DeviceReport(devices=devices, error="; ".join(errors) if errors else None)


def npu_device_index(chip: Mapping[str, Any], chips: Sequence[Mapping[str, Any]]) -> int | None:
    """The index a job names for this chip, i.e. what ``ASCEND_RT_VISIBLE_DEVICES`` counts.

    That is the logical device id: npu-smi prints it as ``Device``/``Phy-ID`` on multi-chip layouts; on
    one-chip-per-NPU layouts (910A/910B) it is the NPU id. ``None`` when the row was cut before it.
    """
    if chip.get("device_id") is not None:
        return int(chip["device_id"])
    npu_id = chip.get("npu_id")
    if npu_id is None or any(c.get("device_id") is not None for c in chips):
        return None
    if sum(1 for c in chips if c.get("npu_id") == npu_id) != 1:
        return None
    return int(npu_id)


class NpuSmiBackend(ToolBackend):
    """Huawei Ascend nodes: ``npu-smi info``."""

    name = "npu-smi"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    needs_device_ips = True
    #: Where an admin's ``hccn_tool`` configuration is kept, and the tool that reads it live.
    hccn_conf = Path("/etc/hccn.conf")
    hccn_tool = "hccn_tool"

    def device_ips(self, indices: Sequence[int], node: str) -> dict[int, str]:
        """From ``/etc/hccn.conf`` (no tool call), then ``hccn_tool -i N -ip -g`` for the cards it does not list."""
        try:
            known = ranktable.parse_hccn_conf(self.hccn_conf.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            known = {}
        found = {i: known[i] for i in indices if i in known}
        for index in indices:
            if index in found:
                continue
            try:
                done = subprocess.run(
                    [self.hccn_tool, "-i", str(index), "-ip", "-g"],
                    capture_output=True,
                    text=True,
                    errors="replace",
                    timeout=self.timeout_s,
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
            except (OSError, subprocess.TimeoutExpired):
                break  # no tool (or a hung one): the other cards would fare no better
            ip = ranktable.parse_hccn_tool_ip(done.stdout) if done.returncode == 0 else None
            if ip is not None:
                found[index] = ip
        return found

    def collect(self, usage: Mapping[int, Sequence[DeviceUse]]) -> DeviceReport:
        with self._lock:
            out, error = self.run_tool(["info"])
            if out is None:
                return self._unknown_report(error or "npu-smi failed", usage)
            result = npusmi.parse_npu_smi_info(out)
            if not result.chips:
                return self._unknown_report("; ".join(result.errors) or "npu-smi printed no chips", usage)
            errors = list(result.errors)
            devices: list[dict[str, Any]] = []
            for chip in result.chips:
                index = npu_device_index(chip, result.chips)
                if index is None:
                    errors.append(f"NPU {chip['npu_id']}: no device index readable; chip skipped")
                    continue
                has_hbm = chip["hbm_total_mb"] is not None
                devices.append(
                    device_entry(
                        index,
                        chip["name"],
                        chip["health"],
                        temp_c=chip["temp_c"],
                        power_w=chip["power_w"],
                        aicore_pct=chip["aicore_pct"],
                        # 310-class chips have no HBM; their device memory is the DDR column.
                        hbm_used_mb=chip["hbm_used_mb"] if has_hbm else chip["memory_used_mb"],
                        hbm_total_mb=chip["hbm_total_mb"] if has_hbm else chip["memory_total_mb"],
                        ecc_errors=None,  # `npu-smi info` does not print ECC counters; health carries ECC alarms
                        processes=chip["processes"],
                        npu_id=chip["npu_id"],
                        chip_id=chip["chip_id"],
                        bus_id=chip["bus_id"],
                        vnpu_template=chip["vnpu_template"],
                    )
                )
            return self._finish(devices, errors, usage)


class NvidiaSmiBackend(ToolBackend):
    """NVIDIA nodes: ``nvidia-smi --query-gpu`` plus ``--query-compute-apps`` for processes."""

    name = "nvidia-smi"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"

    def collect(self, usage: Mapping[int, Sequence[DeviceUse]]) -> DeviceReport:
        with self._lock:
            query = f"--query-gpu={','.join(nvsmi.AGENT_QUERY_FIELDS)}"
            out, error = self.run_tool([query, "--format=csv,noheader,nounits"])
            if out is None:
                return self._unknown_report(error or "nvidia-smi failed", usage)
            result = nvsmi.parse_query_csv(out, nvsmi.AGENT_QUERY_FIELDS)
            if not result.gpus:
                return self._unknown_report("; ".join(result.errors) or "nvidia-smi printed no GPUs", usage)
            errors = list(result.errors)
            apps_query = f"--query-compute-apps={','.join(nvsmi.AGENT_QUERY_APPS_FIELDS)}"
            apps_out, apps_error = self.run_tool([apps_query, "--format=csv,noheader,nounits"])
            procs: dict[str, list[dict[str, Any]]] | None = None
            if apps_out is None:
                errors.append(f"process list unavailable: {apps_error}")
            else:
                procs, proc_errors = nvsmi.parse_query_apps_csv(apps_out)
                errors.extend(proc_errors)
            devices = [
                device_entry(
                    int(gpu["index"]),
                    gpu["name"],
                    gpu["health"],
                    temp_c=gpu["temp_c"],
                    power_w=gpu["power_w"],
                    aicore_pct=gpu["util_pct"],
                    hbm_used_mb=gpu["memory_used_mb"],
                    hbm_total_mb=gpu["memory_total_mb"],
                    ecc_errors=gpu["ecc_errors"],
                    processes=None if procs is None else procs.get((gpu["bus_id"] or "").lower(), []),
                    bus_id=gpu["bus_id"],
                    uuid=gpu["uuid"],
                )
                for gpu in result.gpus
            ]
            return self._finish(devices, errors, usage)
