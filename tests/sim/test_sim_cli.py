"""``python -m scheduling.simulate`` end to end, in a subprocess."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from sim_support import ALIBABA_300, EXAMPLES, ITP_300, ROOT

from scheduling.simulate import ProgressBar

ITP_CLUSTER = """\
nodeGroups:
  - {name: b3, count: 16, chipModel: 910B3, devicesPerNode: 8, hbmMb: 65536, aiCores: 20, aiCpus: 7,
     topology: {groupSize: 8}}
"""


def simulate(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scheduling.simulate", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_end_to_end_writes_metrics_with_baseline(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(ITP_CLUSTER)
    out = tmp_path / "metrics.json"
    done = simulate(
        "--trace",
        ITP_300,
        "--cluster",
        cluster,
        "--policy",
        EXAMPLES / "policies" / "ms_itp_elasticflow.yaml",
        "--baseline",
        "fifo",
        "--out",
        out,
        "--jobs-out",
        tmp_path / "jobs.csv",
    )
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr  # stderr is not a terminal: no progress bar
    data = json.loads(out.read_text())
    assert set(data) == {"input", "policy", "baseline", "comparison"}
    assert data["input"]["jobs_total"] == 300
    assert data["input"]["trace"].endswith("ms_itp_elasticflow_300.csv")
    for run in ("policy", "baseline"):
        m = data[run]
        for key in ("jobs", "devices", "wait_s", "teams", "fairness", "quota", "preemption", "span_s", "wall_s"):
            assert key in m
        assert m["jobs"]["completed"] == 300
        for key in ("p50", "p95", "p99"):
            assert key in m["wait_s"]["overall"]
    assert data["policy"]["quota"]["overrun_device_s"] == 0
    assert data["baseline"]["scheduler"] == "fifo"
    assert set(data["comparison"]["teams"]) == set(data["policy"]["teams"])
    with (tmp_path / "jobs.csv").open() as handle:
        jobs = list(csv.DictReader(handle))
    assert len(jobs) == 300 and {"job_id", "team", "wait_s", "end_s", "status", "preemptions"} <= set(jobs[0])
    assert all(j["status"] == "completed" for j in jobs)
    assert (tmp_path / "jobs-baseline.csv").exists()


def test_class_map_and_quiet(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    done = simulate(
        "--trace",
        ALIBABA_300,
        "--cluster",
        EXAMPLES / "clusters" / "alibaba_openb_v2023.yaml",
        "--policy",
        EXAMPLES / "policies" / "alibaba_openb_v2023.yaml",
        "--class-map",
        "qos-LS=high,qos-BE=low",
        "--quiet",
        "--out",
        out,
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    data = json.loads(out.read_text())
    assert data["input"]["class_map"] == {"qos-LS": "high", "qos-BE": "low"}
    assert {"high", "low"} <= set(data["policy"]["wait_s"]["by_class"])


def _bad(
    tmp_path: Path,
    *,
    trace: str | None = None,
    cluster: str | None = None,
    policy: str | None = None,
    extra: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    t = tmp_path / "t.csv"
    t.write_text(
        trace
        if trace is not None
        else "job_id,submit_time_s,duration_s,num_devices,tenant,user,status\nj1,0,10,1,a,a,ok\n"
    )
    c = tmp_path / "c.yaml"
    c.write_text(cluster if cluster is not None else ITP_CLUSTER)
    p = tmp_path / "p.yaml"
    p.write_text(policy if policy is not None else (EXAMPLES / "policies" / "ms_itp_elasticflow.yaml").read_text())
    return simulate("--trace", t, "--cluster", c, "--policy", p, "--out", tmp_path / "m.json", *extra)


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (
            "trace",
            "job_id,submit_time_s,duration_s,tenant,user,status\nj1,0,10,a,a,ok\n",
            "missing column 'num_devices'",
        ),
        (
            "trace",
            "job_id,submit_time_s,duration_s,num_devices,tenant,user,status\nj1,soon,10,1,a,a,ok\n",
            "t.csv:2: submit_time_s 'soon' is not a number",
        ),
        (
            "cluster",
            "nodeGroups:\n  - {name: a, count: 1, chipModel: x, hbmMb: 1, aiCores: 1, aiCpus: 1}\n",
            "nodeGroups[0].devicesPerNode: required",
        ),
        ("cluster", "nodeGroups: [ {name: a\n", "not valid YAML"),
        ("policy", "apiVersion: npuportal/v1\nkind: SchedulingPolicy\nspec:\n  backfill: maybe\n", "spec.backfill"),
    ],
)
def test_bad_input_exits_2_naming_the_field(tmp_path: Path, kind: str, text: str, message: str) -> None:
    done = _bad(tmp_path, **{kind: text})
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "m.json").exists()


def test_missing_file_and_unknown_class(tmp_path: Path) -> None:
    done = simulate("--trace", tmp_path / "nope.csv", "--cluster", "x", "--policy", "y", "--out", tmp_path / "m")
    assert done.returncode == 2 and "cannot read trace" in done.stderr and "Traceback" not in done.stderr
    done = _bad(tmp_path, extra=("--class-map", "a=platinum"))
    assert done.returncode == 2 and "no priority class 'platinum'" in done.stderr


def test_usage_errors_exit_2() -> None:
    done = simulate("--trace", "t.csv")
    assert done.returncode == 2 and "required" in done.stderr
    done = simulate("--trace", "t", "--cluster", "c", "--policy", "p", "--out", "o", "--baseline", "sjf")
    assert done.returncode == 2 and "invalid choice" in done.stderr


def test_progress_bar_draws_on_one_line() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, "policy", enabled=True)
    bar(0, 10)
    bar(5, 10)  # throttled: within 0.2 s of the last draw
    bar(10, 10)
    text = stream.getvalue()
    assert text.count("\r") == 2 and text.endswith("\n")
    assert "100.0% 10/10 jobs" in text
    quiet = io.StringIO()
    ProgressBar(quiet, "policy", enabled=False)(10, 10)
    assert quiet.getvalue() == ""


def test_estimates_every_takes_a_duration_and_adds_the_estimate_metrics(tmp_path: Path) -> None:
    done = _bad(tmp_path, extra=("--estimates-every", "soon"))
    assert done.returncode == 2 and "--estimates-every" in done.stderr and "not a duration" in done.stderr
    done = _bad(tmp_path, extra=("--estimates-every=-5m",))
    assert done.returncode == 2 and "0 or more" in done.stderr
    done = _bad(tmp_path, extra=("--estimates-every", "15m", "--quiet"))
    assert done.returncode == 0, done.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())["policy"]
    assert metrics["estimates"]["every_s"] == 900.0
