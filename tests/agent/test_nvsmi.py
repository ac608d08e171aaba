"""nvidia-smi parser: the three real outputs in the fixtures, field by field, and the agent's own CSV query."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devices.agent.nvsmi import (
    AGENT_QUERY_FIELDS,
    GPU_KEYS,
    detect_kind,
    parse_nvidia_smi,
    parse_query_apps_csv,
    parse_query_csv,
    parse_query_q,
    parse_table,
)
from tests.waiting import ceiling

ROOT = Path(__file__).resolve().parents[2]
NVIDIA = ROOT / "tests" / "fixtures" / "npu-smi" / "nvidia"
TABLE = (NVIDIA / "01_nvidia-smi_A10_table_550.127.05.txt").read_text()
QUERY_Q = (NVIDIA / "02_nvidia-smi-q_A10_550.127.05.txt").read_text()
CSV = (NVIDIA / "04_nvidia-smi_query-gpu_csv_nvidia_gpu_exporter_testdata.txt").read_text()


def test_kinds_are_detected() -> None:
    assert (detect_kind(TABLE), detect_kind(QUERY_Q), detect_kind(CSV)) == ("table", "q", "csv")


def test_01_plain_table_a10() -> None:
    result = parse_table(TABLE)
    assert result.errors == []
    assert result.driver_version == "550.127.05"
    (gpu,) = result.gpus
    assert tuple(gpu) == GPU_KEYS
    assert gpu == {
        "index": 0,
        "name": "NVIDIA A10",
        "uuid": None,
        "bus_id": "00000000:06:00.0",
        "health": "OK",
        "temp_c": 32,
        "power_w": 21,
        "util_pct": 0,
        "memory_used_mb": 1,
        "memory_total_mb": 23028,
        "ecc_errors": 0,
        "processes": [],
        "extra": {},
    }


def test_02_query_q_a10() -> None:
    result = parse_query_q(QUERY_Q)
    assert result.errors == []
    assert result.driver_version == "550.127.05"
    (gpu,) = result.gpus
    assert gpu == {
        "index": 0,
        "name": "NVIDIA A10",
        "uuid": "GPU-51ae0086-e1ac-4a20-f062-9caa44e4df6d",
        "bus_id": "00000000:06:00.0",
        "health": "OK",
        "temp_c": 33,
        "power_w": 21.3,
        "util_pct": 0,
        "memory_used_mb": 1,
        "memory_total_mb": 23028,
        "ecc_errors": 0,
        "processes": [],
        "extra": {},
    }


def test_04_query_csv_with_header_and_units() -> None:
    result = parse_query_csv(CSV)
    assert result.errors == []
    first, second = result.gpus
    assert first["index"] == 0 and second["index"] == 1
    assert first["name"] == "NVIDIA GeForce RTX 2080 SUPER"
    assert first["uuid"] == "GPU-df6e7a7c-7314-46f8-abc4-b88b36dcf3aa"
    assert first["bus_id"] == "00000000:01:00.0"
    assert first["memory_used_mb"] == 575
    assert first["health"] == "OK"
    assert first["temp_c"] is None and first["ecc_errors"] is None  # not queried
    assert first["extra"]["driver_version"] == "466.63"  # versions stay strings
    assert first["extra"]["fan.speed"] == "38 %"
    assert first["extra"]["serial"] is None  # [N/A]
    assert second["name"] == "Some Other GPU"
    assert second["memory_used_mb"] == 1234
    assert second["bus_id"] == "00000000:02:00.0"


AGENT_CSV = (
    "0, NVIDIA A100-SXM4-80GB, GPU-aaa, 00000000:07:00.0, 34, 61.25, 0, 4, 81920, 0\n"
    "1, NVIDIA A100-SXM4-80GB, GPU-bbb, 00000000:0B:00.0, 71, 398.10, 100, 80000, 81920, 2\n"
    "2, NVIDIA A100-SXM4-80GB, GPU-ccc, 00000000:48:00.0, [N/A], [N/A], [N/A], [N/A], [N/A], [N/A]\n"
    "3, [GPU is lost], GPU-ddd, 00000000:4C:00.0, [GPU is lost], [GPU is lost], [GPU is lost], "
    "[GPU is lost], [GPU is lost], [GPU is lost]\n"
    "4, NVIDIA A100-SXM4-80GB, GPU-eee, 00000000:88:00.0, 40, [Unknown Error], 0, 4, 81920, 0\n"
)


def test_agent_query_noheader_nounits_health_derivation() -> None:
    result = parse_query_csv(AGENT_CSV, AGENT_QUERY_FIELDS)
    gpus = {g["index"]: g for g in result.gpus}
    assert gpus[0]["health"] == "OK"
    assert (gpus[0]["temp_c"], gpus[0]["power_w"], gpus[0]["memory_total_mb"]) == (34, 61.25, 81920)
    assert gpus[1]["health"] == "Critical"  # uncorrectable volatile ECC errors
    assert (gpus[1]["ecc_errors"], gpus[1]["util_pct"]) == (2, 100)
    assert gpus[2]["health"] == "OK" and gpus[2]["temp_c"] is None  # N/A is "not supported", not a fault
    assert gpus[3]["health"] == "lost"
    assert gpus[4]["health"] == "UNKNOWN"
    assert any("Unknown Error" in e for e in result.errors)


def test_csv_without_header_or_fields_is_an_error() -> None:
    result = parse_query_csv("0, 34, 61.25\n")
    assert result.gpus == []
    assert result.errors


def test_csv_cut_inside_last_row_is_unknown() -> None:
    cut = AGENT_CSV.splitlines()[0] + "\n" + AGENT_CSV.splitlines()[1][:-3]
    result = parse_query_csv(cut, AGENT_QUERY_FIELDS)
    assert [g["health"] for g in result.gpus] == ["OK", "UNKNOWN"]


def test_table_cut_after_first_gpu_row_is_unknown() -> None:
    cut = TABLE[: TABLE.index("|  0%   32C")]
    (gpu,) = parse_table(cut).gpus
    assert gpu["health"] == "UNKNOWN"
    assert gpu["name"] == "NVIDIA A10"


def test_table_with_processes_and_ecc() -> None:
    text = TABLE.replace("|                    0 |", "|                    3 |").replace(
        "|  No running processes found                                                             |",
        "|    0   N/A  N/A      4242      C   python3                                     1500MiB |",
    )
    (gpu,) = parse_table(text).gpus
    assert gpu["ecc_errors"] == 3 and gpu["health"] == "Critical"
    assert gpu["processes"] == [{"pid": 4242, "name": "python3", "memory_mb": 1500}]


def test_query_q_cut_before_processes_is_unknown() -> None:
    (gpu,) = parse_query_q(QUERY_Q[: QUERY_Q.index("    Temperature")]).gpus
    assert gpu["health"] == "UNKNOWN"
    assert gpu["name"] == "NVIDIA A10"


def test_query_q_remapping_failure_is_critical() -> None:
    text = QUERY_Q.replace("Remapping Failure Occurred        : No", "Remapping Failure Occurred        : Yes")
    assert parse_query_q(text).gpus[0]["health"] == "Critical"


def test_query_apps_csv_by_bus_id() -> None:
    procs, errors = parse_query_apps_csv("00000000:07:00.0, 1234, python, 500\n00000000:07:00.0, 1240, [N/A], 12\n")
    assert errors == []
    assert procs == {
        "00000000:07:00.0": [
            {"pid": 1234, "name": "python", "memory_mb": 500},
            {"pid": 1240, "name": None, "memory_mb": 12},
        ]
    }


def test_parse_nvidia_smi_never_raises_on_junk() -> None:
    for junk in ("", "\x00\x01", "|||", "GPU 0000:00:00.0\n    Processes\n", '"unterminated'):
        for kind in ("auto", "csv", "q", "table"):
            result = parse_nvidia_smi(junk, kind)
            assert all(g["health"] != "OK" or g["name"] for g in result.gpus)


@pytest.mark.parametrize("path", sorted(NVIDIA.glob("*.txt")), ids=lambda p: p.name)
def test_cli_parses_every_nvidia_fixture(path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devices.agent.nvsmi", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=ceiling(60),
        check=False,
    )
    assert done.returncode == 0, done.stderr
    gpus = json.loads(done.stdout)
    assert gpus == parse_nvidia_smi(path.read_text()).gpus
    assert all(g["health"] == "OK" for g in gpus)


def test_cli_nothing_parsed_exits_1_without_traceback() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devices.agent.nvsmi", "-"],
        cwd=ROOT,
        input="hello\n",
        capture_output=True,
        text=True,
        timeout=ceiling(60),
        check=False,
    )
    assert done.returncode == 1
    assert "nothing could be parsed" in done.stderr and "Traceback" not in done.stderr
