"""npu-smi parser against every real output in tests/fixtures/npu-smi, checked field by field.

Expected values were read off the fixture files by hand; a parser change that shifts one column shows
up here as a wrong number, not just as "still parses".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from devices.agent.npusmi import (
    CHIP_KEYS,
    detect_kind,
    parse_any,
    parse_npu_smi_detail,
    parse_npu_smi_info,
    parse_npu_smi_info_vnpu,
    split_command_outputs,
)
from tests.waiting import ceiling

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "npu-smi"

# Every fixture file and the parser it belongs to; the completeness test below fails if a file is added
# without being listed (and so without expectations).
FIXTURE_KINDS = {
    "02_910A_x8_OK_npusmi-22.0.3.1.txt": "info",
    "03_310_x4_oldformat_npusmi-20.2.0.txt": "info",
    "04_310_x4_npusmi-21.0.4.txt": "info",
    "05_910B1_x8_with_processes_npusmi-23.0.rc2.2.txt": "info",
    "06_910PremiumA_x8_with_processes_npusmi-23.0.rc2.txt": "info",
    "09_910B4_npusmi-24.1.1_highHBM_EXCERPT.txt": "info",
    "11_310B1_npusmi-23.0.rc3_VENDOR-DOC-EXAMPLE.txt": "info",
    "12_info-t-common_910B_npusmi.txt": "common",
    "13_info-t-board_VENDOR-DOC-EXAMPLE_Atlas200IDKA2.txt": "board",
    "16_info-t-health_VENDOR-DOC-EXAMPLES.txt": "health",
    "17_info-t-usages_VENDOR-DOC-EXAMPLE_Atlas200IA2.txt": "usages",
    "20_310P3_vNPU_vir01_npusmi-24.1.rc2.txt": "info",
    "21_910B4_vNPU_vir05_1c_8g_npusmi-25.2.0.txt": "info",
    "22_info-t-info-vnpu_310P3.txt": "info-vnpu",
    "23_info-t-info-vnpu_910B4.txt": "info-vnpu",
    "nvidia/01_nvidia-smi_A10_table_550.127.05.txt": "nvidia",
    "nvidia/02_nvidia-smi-q_A10_550.127.05.txt": "nvidia",
    "nvidia/04_nvidia-smi_query-gpu_csv_nvidia_gpu_exporter_testdata.txt": "nvidia",
}


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def info(name: str) -> Any:
    return parse_npu_smi_info(read(name))


def chip(chips: list[dict[str, Any]], npu_id: int, chip_id: int = 0) -> dict[str, Any]:
    found = [c for c in chips if c["npu_id"] == npu_id and c["chip_id"] == chip_id]
    assert len(found) == 1, f"expected one chip NPU {npu_id} chip {chip_id}, got {found}"
    return found[0]


def expect(actual: dict[str, Any], **expected: Any) -> None:
    """Compare the named fields; report every mismatch at once."""
    wrong = {
        k: (actual.get(k), v) for k, v in expected.items() if actual.get(k) != v or type(actual.get(k)) is not type(v)
    }
    assert not wrong, f"field: (got, expected) -> {wrong}"


def test_every_fixture_file_has_expectations() -> None:
    on_disk = {str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("*.txt")}
    assert on_disk == set(FIXTURE_KINDS)


@pytest.mark.parametrize("name", [n for n, k in FIXTURE_KINDS.items() if k != "nvidia"])
def test_kind_is_detected(name: str) -> None:
    assert detect_kind(read(name)) == FIXTURE_KINDS[name]


@pytest.mark.parametrize("name", [n for n, k in FIXTURE_KINDS.items() if k == "info"])
def test_every_chip_has_every_key(name: str) -> None:
    result = info(name)
    assert result.chips
    for c in result.chips:
        assert tuple(c) == CHIP_KEYS


# --------------------------------------------------------------------------------------------------
# npu-smi info tables


def test_02_910a_eight_chips_no_process_table() -> None:
    result = info("02_910A_x8_OK_npusmi-22.0.3.1.txt")
    assert result.errors == []
    assert result.version == "22.0.3.1"
    assert [c["npu_id"] for c in result.chips] == list(range(8))
    assert all(c["health"] == "OK" and c["name"] == "910A" for c in result.chips)
    assert [c["bus_id"] for c in result.chips] == [
        "0000:61:00.0",
        "0000:DB:00.0",
        "0000:B2:00.0",
        "0000:3E:00.0",
        "0000:60:00.0",
        "0000:DA:00.0",
        "0000:B1:00.0",
        "0000:3D:00.0",
    ]
    assert [c["temp_c"] for c in result.chips] == [43, 38, 34, 42, 44, 33, 35, 40]
    expect(
        chip(result.chips, 0),
        chip_id=0,
        device_id=None,
        power_w=67.2,
        temp_c=43,
        hugepages_used=15,
        hugepages_total=15,
        aicore_pct=0,
        memory_used_mb=1867,
        memory_total_mb=15077,
        hbm_used_mb=0,
        hbm_total_mb=32768,
        processes=None,
        vnpu_template=None,
    )
    expect(chip(result.chips, 3), power_w=191.7, temp_c=42, memory_used_mb=1866, hbm_total_mb=32768)
    expect(chip(result.chips, 2), memory_used_mb=1868, bus_id="0000:B2:00.0")
    expect(chip(result.chips, 7), power_w=191.4, temp_c=40, bus_id="0000:3D:00.0", memory_used_mb=1866)
    assert result.processes is None  # this layout prints no process table: unknown, not "none"


def test_03_old_310_layout_without_hugepages() -> None:
    result = info("03_310_x4_oldformat_npusmi-20.2.0.txt")
    assert result.errors == []
    assert result.version == "20.2.0"
    assert [(c["npu_id"], c["chip_id"], c["device_id"]) for c in result.chips] == [(215, i, i) for i in range(4)]
    assert [c["temp_c"] for c in result.chips] == [56, 57, 57, 55]
    for c in result.chips:
        expect(
            c,
            name="310",
            health="OK",
            power_w=12.8,
            hugepages_used=None,
            hugepages_total=None,
            aicore_pct=0,
            memory_used_mb=2703,
            memory_total_mb=8192,
            hbm_used_mb=None,
            hbm_total_mb=None,
        )
    assert [c["bus_id"] for c in result.chips] == ["0000:DA:00.0", "0000:DC:00.0", "0000:DD:00.0", "0000:DB:00.0"]


def test_04_310_card_with_device_ids() -> None:
    result = info("04_310_x4_npusmi-21.0.4.txt")
    assert result.errors == []
    assert [(c["npu_id"], c["chip_id"], c["device_id"]) for c in result.chips] == [
        (6, 0, 3),
        (6, 1, 4),
        (6, 2, 5),
        (6, 3, 6),
    ]
    assert [c["temp_c"] for c in result.chips] == [73, 74, 70, 65]
    assert [c["memory_used_mb"] for c in result.chips] == [2703, 2867, 2867, 2867]
    assert [c["bus_id"] for c in result.chips] == ["0000:89:00.0", "0000:8A:00.0", "0000:8B:00.0", "0000:8C:00.0"]
    for c in result.chips:
        expect(
            c, health="OK", power_w=12.8, hugepages_used=0, hugepages_total=970, memory_total_mb=8192, hbm_total_mb=None
        )


def test_05_910b1_with_one_process_per_npu() -> None:
    result = info("05_910B1_x8_with_processes_npusmi-23.0.rc2.2.txt")
    assert result.errors == []
    assert result.version == "23.0.rc2.2"
    assert [c["aicore_pct"] for c in result.chips] == [55, 66, 96, 94, 96, 62, 55, 85]
    assert [c["power_w"] for c in result.chips] == [271.1, 275.0, 176.6, 153.2, 139.0, 171.1, 196.6, 210.4]
    expect(
        chip(result.chips, 0),
        name="910B1",
        health="OK",
        temp_c=41,
        hugepages_used=0,
        hugepages_total=0,
        bus_id="0000:C1:00.0",
        memory_used_mb=0,
        memory_total_mb=0,
        hbm_used_mb=65099,
        hbm_total_mb=65536,
        processes=[{"pid": 576489, "name": "python", "memory_mb": 60703}],
    )
    expect(
        chip(result.chips, 7),
        temp_c=38,
        bus_id="0000:42:00.0",
        hbm_used_mb=65096,
        processes=[{"pid": 576503, "name": "python", "memory_mb": 60704}],
    )
    expect(chip(result.chips, 3), hbm_used_mb=65097, bus_id="0000:02:00.0")
    assert [p["pid"] for c in result.chips for p in c["processes"]] == list(range(576489, 576504, 2))


def test_06_910premiuma_ddr_column_and_processes() -> None:
    result = info("06_910PremiumA_x8_with_processes_npusmi-23.0.rc2.txt")
    assert result.errors == []
    assert [c["memory_used_mb"] for c in result.chips] == [1413, 1612, 3161, 2436, 1537, 1940, 2946, 2197]
    assert [c["memory_total_mb"] for c in result.chips] == [15137, 15137, 15137, 15039, 15137, 15137, 15137, 15039]
    expect(
        chip(result.chips, 0),
        name="910PremiumA",
        power_w=143.7,
        temp_c=39,
        hugepages_used=34,
        hugepages_total=34,
        bus_id="0000:C1:00.0",
        aicore_pct=11,
        hbm_used_mb=31842,
        hbm_total_mb=32768,
        processes=[{"pid": 5139, "name": "python", "memory_mb": 31913}],
    )
    expect(chip(result.chips, 4), power_w=93.3, processes=[{"pid": 5147, "name": "python", "memory_mb": 31912}])
    expect(chip(result.chips, 7), power_w=189.2, temp_c=41, bus_id="0000:02:00.0", aicore_pct=71)


def test_09_cut_off_excerpt_keeps_complete_chips_and_says_so() -> None:
    result = info("09_910B4_npusmi-24.1.1_highHBM_EXCERPT.txt")
    assert len(result.chips) == 2
    assert any("truncated" in e for e in result.errors)
    expect(
        chip(result.chips, 0), name="910B4", health="OK", power_w=88.2, temp_c=30, hbm_used_mb=26838, hbm_total_mb=32768
    )
    expect(chip(result.chips, 1), power_w=87.0, temp_c=30, bus_id="0000:C2:00.0", aicore_pct=0, hbm_used_mb=29356)


def test_11_310b1_bus_id_na() -> None:
    result = info("11_310B1_npusmi-23.0.rc3_VENDOR-DOC-EXAMPLE.txt")
    assert result.errors == []
    (c,) = result.chips
    expect(
        c,
        npu_id=0,
        chip_id=0,
        device_id=0,
        name="310B1",
        health="OK",
        power_w=10.4,
        temp_c=66,
        hugepages_used=15,
        hugepages_total=15,
        bus_id=None,
        aicore_pct=0,
        memory_used_mb=957,
        memory_total_mb=10810,
        hbm_used_mb=None,
    )


def test_20_310p3_vnpu_collapsed_whitespace() -> None:
    result = info("20_310P3_vNPU_vir01_npusmi-24.1.rc2.txt")
    assert result.errors == []
    (c,) = result.chips
    expect(
        c,
        npu_id=32768,
        chip_id=0,
        device_id=0,
        name="310Pvir01",
        vnpu_template="vir01",
        health="OK",
        power_w=None,  # printed as NA
        temp_c=41,
        hugepages_used=0,
        hugepages_total=0,
        bus_id="0000:81:00.0",
        aicore_pct=0,
        memory_used_mb=225,
        memory_total_mb=2690,
        hbm_used_mb=None,
        processes=[],
    )


def test_21_910b4_vnpu_collapsed_whitespace() -> None:
    result = info("21_910B4_vNPU_vir05_1c_8g_npusmi-25.2.0.txt")
    assert result.errors == []
    assert result.version == "25.2.0"
    (c,) = result.chips
    expect(
        c,
        npu_id=6,
        chip_id=0,
        device_id=None,
        name="910B4vir05_1c_8g",
        vnpu_template="vir05_1c_8g",
        health="OK",
        power_w=83.2,
        temp_c=39,
        bus_id="0000:41:00.4",
        aicore_pct=0,
        memory_used_mb=0,
        memory_total_mb=0,
        hbm_used_mb=1111,
        hbm_total_mb=8192,
        processes=[],
    )


# --------------------------------------------------------------------------------------------------
# npu-smi info -t ...


def test_12_common() -> None:
    data = parse_npu_smi_detail(read("12_info-t-common_910B_npusmi.txt"))
    assert data["errors"] == []
    expect(data, kind="common", npu_id=1, chip_count=1)
    assert data["command"].endswith("npu-smi info -t common -i 1")
    assert data["chips"] == [
        {
            "chip_id": 0,
            "memory_usage_rate_pct": 0,
            "hbm_usage_rate_pct": 5,
            "aicore_usage_rate_pct": 0,
            "aicore_freq_mhz": 1850,
            "aicore_curfreq_mhz": 800,
            "aicore_count": 25,
            "temperature_c": 33,
            "npu_real_time_power_w": 101.8,
        }
    ]
    assert data["components"] == [{"chip_name": "mcu", "temperature_c": 38}]


def test_13_board_keeps_identifiers_as_strings() -> None:
    data = parse_npu_smi_detail(read("13_info-t-board_VENDOR-DOC-EXAMPLE_Atlas200IDKA2.txt"))
    assert data["errors"] == []
    expect(
        data,
        kind="board",
        npu_id=0,
        product_name="IT22DMDB02",
        model=None,
        manufacturer="Huawei",
        serial_number="025VLB10K7000275",
        software_version="23.0.rc3",
        firmware_version="6.2.1.0",
        board_id="0x45",
        pcb_id="B",
        bom_id=1,
        chip_count=1,
        faulty_chip_count=0,
    )


def test_16_health_two_pasted_commands() -> None:
    text = read("16_info-t-health_VENDOR-DOC-EXAMPLES.txt")
    pieces = split_command_outputs(text)
    assert [cmd for cmd, _ in pieces] == ["npu-smi info -t health -i 0", "npu-smi info -t health -i 0 -c 0"]
    data, errors, anything = parse_any(text)
    assert anything and errors == []
    first, second = data
    expect(first, kind="health", npu_id=0, chip_count=1, overall_health="OK")
    assert first["chips"] == [{"chip_id": 0, "health": "OK"}]
    assert first["components"] == [{"health": "OK", "chip_name": "MCU"}]
    expect(second, kind="health", health_status="OK", error_code=None, error_information=None, overall_health="OK")


def test_health_detail_most_severe_wins() -> None:
    text = "NPU ID : 3\nChip Count : 1\n\nChip ID : 0\nHealth : Critical\n\nHealth : OK\nChip Name : MCU\n"
    data = parse_npu_smi_detail(text, "health")
    assert data["overall_health"] == "Critical"
    weird = parse_npu_smi_detail("Health Status : Smoking\nError Code : 0x80CB8009\n", "health")
    assert weird["overall_health"] == "UNKNOWN"
    assert weird["error_code"] == "0x80CB8009"
    assert any("Smoking" in e for e in weird["errors"])


def test_17_usages() -> None:
    data = parse_npu_smi_detail(read("17_info-t-usages_VENDOR-DOC-EXAMPLE_Atlas200IA2.txt"))
    assert data["errors"] == []
    expect(data, kind="usages", npu_id=0, chip_count=1)
    assert data["chips"] == [
        {
            "chip_id": 0,
            "memory_capacity_mb": 10810,
            "memory_usage_rate_pct": 35,
            "hugepages_total_page": 1304,
            "hugepages_usage_rate_pct": 0,
            "aicore_usage_rate_pct": 0,
            "aicpu_usage_rate_pct": 0,
            "ctrlcpu_usage_rate_pct": 1,
            "memory_bandwidth_usage_rate_pct": 0,
        }
    ]


def test_22_info_vnpu_310p3() -> None:
    data = parse_npu_smi_info_vnpu(read("22_info-t-info-vnpu_310P3.txt"))
    assert data["errors"] == []
    expect(
        data,
        aicore_free=7,
        aicore_total=8,
        memory_free_gb=18,
        memory_total_gb=21,
        aicpu_free=6,
        aicpu_total=7,
        vnpu_count=1,
        memory_unit="GB",
    )
    assert data["resources"]["jpegd"] == {"free": 14, "total": 16}
    assert data["resources"]["pngd"] == {"free": None, "total": None}
    assert data["vnpus"] == [
        {"vnpu_id": 100, "vgroup_id": 0, "container_id": "ffffffffffff", "status": 1, "template": "vir01"}
    ]


def test_23_info_vnpu_910b4() -> None:
    data = parse_npu_smi_info_vnpu(read("23_info-t-info-vnpu_910B4.txt"))
    assert data["errors"] == []
    expect(data, aicore_free=15, aicore_total=20, memory_free_gb=21, memory_total_gb=32, aicpu_free=6, aicpu_total=7)
    assert data["resources"]["venc"] == {"free": 0, "total": 0}
    assert data["vnpus"] == [
        {"vnpu_id": 212, "vgroup_id": 0, "container_id": "ffffffffffff", "status": 1, "template": "vir05_1c_8g"}
    ]


def test_info_vnpu_missing_rows_is_reported() -> None:
    text = read("23_info-t-info-vnpu_910B4.txt")
    cut = text[: text.index("| 212")]
    data = parse_npu_smi_info_vnpu(cut)
    assert data["vnpus"] == []
    assert any("1 vNPU(s)" in e for e in data["errors"])


# --------------------------------------------------------------------------------------------------
# layouts not in the fixtures


A3_DUAL_DIE_SHARED_ROW = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 24.1.rc3                 Version: 24.1.rc3                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip  Phy-ID              | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     Ascend910           | Alarm         | 178.2       37                0    / 0             |
| 0     0                   | 0000:9D:00.0  | 12          0    / 0          3403 / 65536         |
| 1     1                   | 0000:9F:00.0  | 0           0    / 0          3162 / 65536         |
+===========================+===============+====================================================+
| 1     Ascend910           | OK            | -           36                0    / 0             |
| 0     2                   | 0000:99:00.0  | 0           0    / 0          3400 / 65536         |
| 1     3                   | 0000:9B:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
"""


def test_dual_die_npu_rows_share_the_npu_reading() -> None:
    result = parse_npu_smi_info(A3_DUAL_DIE_SHARED_ROW)
    assert result.errors == []
    assert [(c["npu_id"], c["chip_id"], c["device_id"]) for c in result.chips] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
    ]
    expect(
        chip(result.chips, 0, 1), name="Ascend910", health="Alarm", temp_c=37, hbm_used_mb=3162, bus_id="0000:9F:00.0"
    )
    expect(chip(result.chips, 0, 0), aicore_pct=12, hbm_used_mb=3403)
    expect(chip(result.chips, 1, 1), health="OK", power_w=None, hbm_used_mb=3161)


WIDE_26X = """\
+--------------------------------------------------------------------------------------------------------------------+
| npu-smi 26.0.rc1                          Version: 26.0.rc1                                                        |
+----------------------------------+--------------------+------------------------------------------------------------+
| NPU     Name                     | Health             | Power(W)       Temp(C)            Hugepages-Usage(page)    |
| Chip    Phy-ID                   | Bus-Id             | AICore(%)      Memory-Usage(MB)   HBM-Usage(MB)            |
+==================================+====================+============================================================+
| 0       Ascend910                | Critical           | 301.5          71                 0       / 0              |
| 0       0                        | 0000:9D:00.0       | 100            0       / 0        60000   / 65536          |
+----------------------------------+--------------------+------------------------------------------------------------+
| 0       Ascend910                | Warning            | -              69                 0       / 0              |
| 1       1                        | 0000:9F:00.0       | 98             0       / 0        59000   / 65536          |
+==================================+====================+============================================================+
+----------------------------------+--------------------+------------------------------------------------------------+
| NPU     Chip                     | Process id         | Process name             | Process memory(MB)              |
+==================================+====================+============================================================+
| 0       0                        | 4242               | python3.11               | 58000                           |
| 0       1                        | 4243               |                          | 57000                           |
+==================================+====================+============================================================+
"""


def test_wider_columns_repeated_npu_row_per_die_and_blank_process_name() -> None:
    result = parse_npu_smi_info(WIDE_26X)
    assert result.errors == []
    assert len(result.chips) == 2
    expect(chip(result.chips, 0, 0), health="Critical", power_w=301.5, temp_c=71, aicore_pct=100, hbm_used_mb=60000)
    expect(
        chip(result.chips, 0, 1),
        health="Warning",
        power_w=None,
        device_id=1,
        processes=[{"pid": 4243, "name": None, "memory_mb": 57000}],
    )
    assert chip(result.chips, 0, 0)["processes"] == [{"pid": 4242, "name": "python3.11", "memory_mb": 58000}]


def test_unknown_health_word_is_unknown_and_reported() -> None:
    text = read("02_910A_x8_OK_npusmi-22.0.3.1.txt").replace(
        "| 3     910A           | OK            |", "| 3     910A           | Smoking       |"
    )
    result = parse_npu_smi_info(text)
    assert chip(result.chips, 3)["health"] == "UNKNOWN"
    assert chip(result.chips, 2)["health"] == "OK"
    assert any("Smoking" in e for e in result.errors)


def test_garbage_gives_no_chips_and_an_error() -> None:
    result = parse_npu_smi_info("Error: npu-smi: dcmi module initialize failed. ret is -8005\n")
    assert result.chips == []
    assert result.errors


# --------------------------------------------------------------------------------------------------
# command line


def run_cli(module: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=ceiling(60),
        check=False,
    )


@pytest.mark.parametrize("name", [n for n, k in FIXTURE_KINDS.items() if k != "nvidia"])
def test_cli_parses_every_fixture(name: str) -> None:
    done = run_cli("devices.agent.npusmi", str(FIXTURES / name))
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    data = json.loads(done.stdout)
    if FIXTURE_KINDS[name] == "info":
        assert isinstance(data, list)
        assert data == parse_npu_smi_info(read(name)).chips
        assert ("truncated" in done.stderr) == name.startswith("09_")
    else:
        assert data  # a dict, or a list of dicts for the pasted health example


def test_cli_kind_flag_and_stdin() -> None:
    done = run_cli("devices.agent.npusmi", "--kind", "info-vnpu", "-", stdin=read("22_info-t-info-vnpu_310P3.txt"))
    assert done.returncode == 0
    assert json.loads(done.stdout)["aicore_total"] == 8


@pytest.mark.parametrize(
    ("args", "stdin", "status", "message"),
    [
        (["-"], "this is not npu-smi output\n", 1, "nothing could be parsed"),
        (["-"], "", 1, "nothing could be parsed"),
        (["/nonexistent/npu-smi.txt"], None, 1, "cannot read"),
        (["--kind", "bogus", "-"], "", 2, "invalid choice"),
        ([], None, 2, "required"),
    ],
)
def test_cli_failures_are_clear(args: list[str], stdin: str | None, status: int, message: str) -> None:
    done = run_cli("devices.agent.npusmi", *args, stdin=stdin)
    assert done.returncode == status
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""
