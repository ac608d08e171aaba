"""Loading traces and clusters: what is accepted, and errors that name the field."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from sim_support import ALIBABA_300, EXAMPLES, ITP_300

from scheduling.sim.traces import InputError, TraceRow, load_cluster, load_trace, parse_cluster, trace_rows


def test_fixture_traces_load_in_submission_order() -> None:
    itp = load_trace(ITP_300)
    assert len(itp) == 300
    assert [r.submit_time_s for r in itp] == sorted(r.submit_time_s for r in itp)
    assert itp[0].job_id == "3c13abd0-6b8f-0ed9-c7e0-09ec3958c967"
    assert itp[0].gpu_milli is None and itp[0].priority_class is None

    ali = load_trace(ALIBABA_300)
    fractional = [r for r in ali if r.gpu_milli is not None and 0 < r.gpu_milli < 1000]
    assert fractional and all(r.num_devices == 1 for r in fractional)


def test_missing_column_is_named(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time_s,duration_s,tenant,user,status\nj1,0,10,a,a,ok\n")
    with pytest.raises(InputError, match="missing column 'num_devices'"):
        load_trace(path)


def test_bad_number_names_field_and_line(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(
        "job_id,submit_time_s,duration_s,num_devices,tenant,user,status\nj1,0,10,1,a,a,ok\nj2,5,ten,1,a,a,ok\n"
    )
    with pytest.raises(InputError, match=r"t\.csv:3: duration_s 'ten' is not a number"):
        load_trace(path)


def test_checkpoint_interval_is_an_optional_positive_column(tmp_path: Path) -> None:
    head = "job_id,submit_time_s,duration_s,num_devices,tenant,user,status,checkpoint_interval_s\n"
    path = tmp_path / "t.csv"
    path.write_text(head + "j1,0,10,1,a,a,ok,600\nj2,5,10,1,a,a,ok,\n")
    assert [r.checkpoint_interval_s for r in load_trace(path)] == [600.0, None]
    path.write_text(head + "j1,0,10,1,a,a,ok,600\nj2,5,10,1,a,a,ok,0\n")
    with pytest.raises(InputError, match=r"t\.csv:3: checkpoint_interval_s '0' must be a positive number of seconds"):
        load_trace(path)


def test_fractional_devices_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("job_id,submit_time_s,duration_s,num_devices,tenant,user,status\nj1,0,10,1.5,a,a,ok\n")
    with pytest.raises(InputError, match=r"num_devices .1\.5. is not a whole number"):
        load_trace(path)


def test_gzip_trace_reads_like_the_plain_one(tmp_path: Path) -> None:
    packed = tmp_path / "itp.csv.gz"
    packed.write_bytes(gzip.compress(ITP_300.read_bytes()))
    assert load_trace(packed) == load_trace(ITP_300)


def test_corrupt_gzip_trace_is_an_input_error(tmp_path: Path) -> None:
    broken = tmp_path / "t.csv.gz"
    broken.write_bytes(gzip.compress(ITP_300.read_bytes())[:200])  # cut short
    with pytest.raises(InputError, match=r"t\.csv\.gz: cannot read trace"):
        load_trace(broken)
    not_gzip = tmp_path / "u.csv.gz"
    not_gzip.write_text("job_id,submit_time_s\n")
    with pytest.raises(InputError, match=r"u\.csv\.gz: cannot read trace"):
        load_trace(not_gzip)


def test_the_shipped_itp_trace_is_the_whole_trace() -> None:
    rows = load_trace(EXAMPLES / "traces" / "ms_itp_elasticflow.csv.gz")
    assert len(rows) == 69_351
    assert {r.tenant for r in rows} == {f"cluster{i:02d}" for i in range(1, 11)}
    assert round(sum(r.num_devices * r.duration_s for r in rows) / 3600, 1) == 1_632_719.7  # its notes' GPU-hours


def test_rows_from_mappings_for_the_dry_run() -> None:
    rows = trace_rows(
        [
            {
                "job_id": 2,
                "submit_time_s": 10,
                "duration_s": 5,
                "num_devices": 1,
                "tenant": "t",
                "user": "",
                "status": "",
            },
            TraceRow("1", 0.0, 5.0, 2, "t", "u"),
        ]
    )
    assert [r.job_id for r in rows] == ["1", "2"]
    assert rows[1].user == "t"  # an empty user falls back to the tenant
    with pytest.raises(InputError, match="row 1: missing column 'tenant'"):
        trace_rows([{"job_id": 1, "submit_time_s": 0, "duration_s": 1, "num_devices": 1, "user": "u", "status": ""}])


def test_example_clusters_load() -> None:
    itp = load_cluster(EXAMPLES / "clusters" / "ms_itp_elasticflow.yaml")
    assert itp.total_devices == 1408
    ali = load_cluster(EXAMPLES / "clusters" / "alibaba_openb_v2023.yaml")
    assert ali.total_devices == 56
    assert {t.name for t in ali.vnpu_templates} == {"vir05_1c_8g", "vir10_3c_16g"}


def test_nodes_devices_and_topology_groups() -> None:
    spec = parse_cluster(
        {
            "nodeGroups": [
                {
                    "name": "a",
                    "count": 2,
                    "chipModel": "910A",
                    "devicesPerNode": 8,
                    "hbmMb": 32768,
                    "aiCores": 32,
                    "aiCpus": 14,
                    "topology": {"groupSize": 4},
                },
                {
                    "name": "p",
                    "count": 1,
                    "chipModel": "310P3",
                    "devicesPerNode": 4,
                    "hbmMb": 24576,
                    "aiCores": 8,
                    "aiCpus": 7,
                },
            ]
        }
    )
    nodes = spec.build_nodes()
    assert [n.name for n in nodes] == ["a-000", "a-001", "p-000"]
    ids = [d.id for n in nodes for d in n.devices]
    assert ids == list(range(1, 21))
    assert {d.topology_group for d in nodes[0].devices} == {"a-000/g0", "a-000/g1"}
    assert {d.topology_group for d in nodes[2].devices} == {"p-000/g0"}  # no topology: one group per node
    assert spec.devices_by_chip() == {"910A": 16, "310P3": 4}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({}, "'nodeGroups' must be a non-empty list"),
        ([], "expected a mapping with 'nodeGroups'"),
        (
            {"nodeGroups": [{"name": "a", "count": 1, "chipModel": "x", "hbmMb": 1, "aiCores": 1, "aiCpus": 1}]},
            r"nodeGroups\[0\]\.devicesPerNode: required",
        ),
        (
            {
                "nodeGroups": [
                    {
                        "name": "a",
                        "count": "two",
                        "chipModel": "x",
                        "devicesPerNode": 8,
                        "hbmMb": 1,
                        "aiCores": 1,
                        "aiCpus": 1,
                    }
                ]
            },
            r"nodeGroups\[0\]\.count: expected a whole number",
        ),
        (
            {
                "nodeGroups": [
                    {
                        "name": "a",
                        "count": 1,
                        "chipModel": "x",
                        "devicesPerNode": 8,
                        "hbmMb": 1,
                        "aiCores": 1,
                        "aiCpus": 1,
                        "topology": {"groupSize": 3},
                    }
                ]
            },
            r"topology\.groupSize: 3 does not divide devicesPerNode 8",
        ),
        (
            {
                "nodeGroups": [
                    {
                        "name": "a",
                        "count": 1,
                        "chipModel": "x",
                        "devicesPerNode": 8,
                        "hbmMb": 1,
                        "aiCores": 1,
                        "aiCpus": 1,
                        "gpus": 8,
                    }
                ]
            },
            r"nodeGroups\[0\]: unknown key 'gpus'",
        ),
        (
            {
                "nodeGroups": [
                    {
                        "name": "a",
                        "count": 1,
                        "chipModel": "x",
                        "devicesPerNode": 1,
                        "hbmMb": 100,
                        "aiCores": 4,
                        "aiCpus": 1,
                    }
                ],
                "vnpuTemplates": [{"chipModel": "y", "name": "v", "memoryMb": 10, "aiCores": 1, "aiCpus": 0}],
            },
            r"vnpuTemplates\[0\]\.chipModel: 'y' is not the chip of any node group",
        ),
        (
            {
                "nodeGroups": [
                    {
                        "name": "a",
                        "count": 1,
                        "chipModel": "x",
                        "devicesPerNode": 1,
                        "hbmMb": 100,
                        "aiCores": 4,
                        "aiCpus": 1,
                    }
                ],
                "vnpuTemplates": [{"chipModel": "x", "name": "v", "memoryMb": 10, "aiCores": 8, "aiCpus": 0}],
            },
            "larger than one x device",
        ),
    ],
)
def test_bad_cluster_names_the_field(doc: object, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_cluster(doc)


def test_cluster_file_that_is_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("nodeGroups: [ {name: a\n")
    with pytest.raises(InputError, match="not valid YAML"):
        load_cluster(path)
