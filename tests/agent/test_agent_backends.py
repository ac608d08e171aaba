"""The npu-smi and nvidia-smi backends, fed by fake tools that print the real fixture outputs.

What matters on a real node: the index a job names is the one the runtime counts, device memory is HBM
where there is HBM and DDR otherwise, and a tool that fails, hangs or drops a device never yields a
silent "OK".
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devices.agent.backends import DeviceUse, NpuSmiBackend, NvidiaSmiBackend, npu_device_index
from devices.agent.errors import ApiError
from tests.waiting import ceiling, wait_for

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "npu-smi"
TOKEN = "backend-test-token-8c2f61a9"


class FakeTool:
    """An executable that prints whatever file ``mode`` names, fails on ``fail`` and hangs on ``hang``."""

    def __init__(self, tmp: Path, name: str) -> None:
        self.path = tmp / name
        self.mode_file = tmp / f"{name}.mode"
        self.path.write_text(
            "#!/bin/sh\n"
            f'mode=$(cat "{self.mode_file}")\n'
            'case "$mode" in\n'
            "  fail) echo 'dcmi module initialize failed. ret is -8005' >&2; exit 1 ;;\n"
            "  hang) exec sleep 600 ;;\n"
            '  *) case "$*" in *query-compute-apps*) cat "$mode.apps" 2>/dev/null ;; *) cat "$mode" ;; esac ;;\n'
            "esac\n"
        )
        self.path.chmod(0o755)

    def serve(self, mode: str | Path) -> None:
        self.mode_file.write_text(str(mode))


@pytest.fixture
def npu_smi(tmp_path: Path) -> FakeTool:
    return FakeTool(tmp_path, "npu-smi")


def fixture(name: str) -> Path:
    return next(FIXTURES.glob(f"{name}*"))


def test_910b1_devices_from_npu_smi(npu_smi: FakeTool) -> None:
    npu_smi.serve(fixture("05_"))
    backend = NpuSmiBackend(str(npu_smi.path), timeout_s=5)
    usage = {2: [DeviceUse("job-9", 123, "python train.py")]}
    report = backend.collect(usage)
    assert report.error is None
    assert [d["index"] for d in report.devices] == list(range(8))
    dev = report.devices[0]
    assert dev["chip_model"] == "910B1" and dev["health"] == "OK"
    assert (dev["temp_c"], dev["power_w"], dev["aicore_pct"]) == (41, 271.1, 55)
    assert (dev["hbm_used_mb"], dev["hbm_total_mb"]) == (65099, 65536)
    assert dev["ecc_errors"] is None  # npu-smi info has no ECC counter; not invented as 0
    assert dev["processes"] == [{"pid": 576489, "name": "python", "memory_mb": 60703}]
    assert dev["bus_id"] == "0000:C1:00.0"
    assert report.devices[2]["job_ids"] == ["job-9"]
    assert backend.known_indices() == set(range(8))


def test_310_card_uses_logical_device_ids_and_ddr_memory(npu_smi: FakeTool) -> None:
    npu_smi.serve(fixture("04_"))
    report = NpuSmiBackend(str(npu_smi.path), timeout_s=5).collect({})
    assert [d["index"] for d in report.devices] == [3, 4, 5, 6]
    assert [d["npu_id"] for d in report.devices] == [6, 6, 6, 6]
    assert [(d["hbm_used_mb"], d["hbm_total_mb"]) for d in report.devices] == [(2703, 8192)] + [(2867, 8192)] * 3
    assert report.devices[0]["processes"] is None  # no process table in this layout: unknown


def test_device_index_rules() -> None:
    one_per_npu = [{"npu_id": 0, "device_id": None}, {"npu_id": 1, "device_id": None}]
    assert [npu_device_index(c, one_per_npu) for c in one_per_npu] == [0, 1]
    cut_310 = [{"npu_id": 6, "device_id": 3}, {"npu_id": 6, "device_id": None}]
    assert [npu_device_index(c, cut_310) for c in cut_310] == [3, None]  # never guess an index


def test_tool_failure_marks_known_devices_unknown(npu_smi: FakeTool) -> None:
    backend = NpuSmiBackend(str(npu_smi.path), timeout_s=0.5)
    npu_smi.serve("fail")
    first = backend.collect({})
    assert first.devices == [] and "exited with status 1" in (first.error or "")
    npu_smi.serve(fixture("02_"))
    assert backend.collect({}).error is None
    npu_smi.serve("fail")
    failed = backend.collect({})
    assert [d["index"] for d in failed.devices] == list(range(8))
    assert {d["health"] for d in failed.devices} == {"UNKNOWN"}
    assert "dcmi module initialize failed" in (failed.error or "")
    npu_smi.serve("hang")
    t0 = time.monotonic()
    hung = backend.collect({})
    assert time.monotonic() - t0 < ceiling(60)  # cut off at its timeout, not waited out
    assert {d["health"] for d in hung.devices} == {"UNKNOWN"}
    assert "timed out" in (hung.error or "")


def test_missing_tool_is_reported(tmp_path: Path) -> None:
    report = NpuSmiBackend(str(tmp_path / "no-such-npu-smi"), timeout_s=1).collect({})
    assert report.devices == [] and "not found" in (report.error or "")


def test_device_missing_from_a_complete_reading_is_lost(npu_smi: FakeTool, tmp_path: Path) -> None:
    text = fixture("02_").read_text()
    lines = text.splitlines(keepends=True)
    without_npu_7 = "".join(lines[:-3] + lines[-1:])  # drop NPU 7's two rows and its separator
    (tmp_path / "seven.txt").write_text(without_npu_7)
    backend = NpuSmiBackend(str(npu_smi.path), timeout_s=5)
    npu_smi.serve(fixture("02_"))
    backend.collect({})
    npu_smi.serve(tmp_path / "seven.txt")
    report = backend.collect({})
    assert report.error is None
    assert report.devices[7]["health"] == "lost" and report.devices[7]["temp_c"] is None
    assert [d["health"] for d in report.devices[:7]] == ["OK"] * 7
    assert backend.unusable_reason(7) is not None and backend.unusable_reason(6) is None


def test_device_missing_from_a_cut_reading_is_unknown_not_lost(npu_smi: FakeTool, tmp_path: Path) -> None:
    text = fixture("02_").read_text()
    (tmp_path / "cut.txt").write_text(text[: text.index("| 4     910A")] + "| 4     910A           | OK    ")
    backend = NpuSmiBackend(str(npu_smi.path), timeout_s=5)
    npu_smi.serve(fixture("02_"))
    backend.collect({})
    npu_smi.serve(tmp_path / "cut.txt")
    report = backend.collect({})
    health = {d["index"]: d["health"] for d in report.devices}
    assert health == {0: "OK", 1: "OK", 2: "OK", 3: "OK", 4: "UNKNOWN", 5: "UNKNOWN", 6: "UNKNOWN", 7: "UNKNOWN"}
    assert "truncated" in (report.error or "")


def test_vnpu_is_refused_by_real_backends(npu_smi: FakeTool) -> None:
    with pytest.raises(ApiError) as err:
        NpuSmiBackend(str(npu_smi.path), timeout_s=1).plan_launch([0], {"template": "vir05_1c_8g", "device": 0}, {})
    assert (err.value.status, err.value.field) == (400, "vnpu")


GPU_CSV = (
    "0, NVIDIA A100-SXM4-80GB, GPU-aaa, 00000000:07:00.0, 34, 61.25, 0, 4, 81920, 0\n"
    "1, NVIDIA A100-SXM4-80GB, GPU-bbb, 00000000:0B:00.0, 71, 398.10, 100, 80000, 81920, 3\n"
)
APPS_CSV = "00000000:0B:00.0, 4242, python, 79000\n"


def test_nvidia_backend(tmp_path: Path) -> None:
    tool = FakeTool(tmp_path, "nvidia-smi")
    (tmp_path / "gpus.csv").write_text(GPU_CSV)
    (tmp_path / "gpus.csv.apps").write_text(APPS_CSV)
    tool.serve(tmp_path / "gpus.csv")
    backend = NvidiaSmiBackend(str(tool.path), timeout_s=5)
    report = backend.collect({})
    assert report.error is None
    first, second = report.devices
    assert (first["index"], first["chip_model"], first["health"]) == (0, "NVIDIA A100-SXM4-80GB", "OK")
    assert (first["temp_c"], first["power_w"], first["aicore_pct"], first["hbm_total_mb"]) == (34, 61.25, 0, 81920)
    assert first["processes"] == []
    assert (second["health"], second["ecc_errors"]) == ("Critical", 3)
    assert second["processes"] == [{"pid": 4242, "name": "python", "memory_mb": 79000}]
    assert backend.plan_launch([1, 0], None, {}).env == {"CUDA_VISIBLE_DEVICES": "1,0"}


# --------------------------------------------------------------------------------------------------
# the agent process on the npu-smi backend


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(port: int, method: str, path: str, body: object = None) -> tuple[int, dict]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=ceiling(60))
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.request(method, path, body=data, headers={"Authorization": f"Bearer {TOKEN}"})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def npu_agent(tmp_path: Path, npu_smi: FakeTool) -> Iterator[int]:
    npu_smi.serve(fixture("04_"))
    (tmp_path / "token").write_text(TOKEN)
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "devices.agent",
            "--backend",
            "npu-smi",
            "--tool-path",
            str(npu_smi.path),
            "--tool-timeout",
            "2",
            "--listen",
            f"127.0.0.1:{port}",
            "--token-file",
            str(tmp_path / "token"),
            "--state-dir",
            str(tmp_path / "state"),
            "--jobs-as-agent",
            "--allow-root-jobs",
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def up() -> bool:
        assert proc.poll() is None, "the agent exited"
        return call(port, "GET", "/v1/health")[0] == 200

    wait_for(up, ignore=(OSError,), message=f"the agent on port {port} to answer")
    yield port
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=ceiling(60))


def test_agent_on_npu_smi_backend(npu_agent: int, npu_smi: FakeTool) -> None:
    status, body = call(npu_agent, "GET", "/v1/devices")
    assert (status, body["backend"], body["error"]) == (200, "npu-smi", None)
    assert [d["index"] for d in body["devices"]] == [3, 4, 5, 6]
    status, reply = call(npu_agent, "POST", "/v1/jobs", {"job_id": 1, "command": "true", "devices": [0]})
    assert (status, reply["field"]) == (400, "devices")
    assert "3, 4, 5, 6" in reply["error"]
    status, reply = call(
        npu_agent, "POST", "/v1/jobs", {"job_id": 2, "command": "true", "vnpu": {"template": "vir01", "device": 3}}
    )
    assert (status, reply["field"]) == (400, "vnpu")
    status, reply = call(
        npu_agent, "POST", "/v1/jobs", {"job_id": 3, "command": "echo $ASCEND_RT_VISIBLE_DEVICES", "devices": [6, 4]}
    )
    assert status == 201
    if reply["state"] != "succeeded":
        reply = wait_for(
            lambda: call(npu_agent, "GET", "/v1/jobs/3")[1],
            until=lambda job: job["state"] == "succeeded",
            message="job 3 to succeed",
        )
    assert reply["output_tail"] == ["6,4"]
    assert reply["accelerator_memory"] is None  # this npu-smi prints no process table: not checked
    npu_smi.serve("fail")
    status, body = call(npu_agent, "GET", "/v1/devices")
    assert status == 200  # a broken tool is a reading, not an agent failure
    assert {d["health"] for d in body["devices"]} == {"UNKNOWN"}
    assert "exited with status 1" in body["error"]
