"""npuctl without a server: durations, tables, argument errors, unreachable and failing servers."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from npuctl.durations import format_duration, parse_duration
from npuctl.main import main
from npuctl.tables import table
from tests.conftest import free_port
from tests.waiting import ceiling


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("2h", 7200),
        ("1d", 86400),
        ("1h30m", 5400),
        ("1h 30m", 5400),
        ("3600", 3600),
        ("1.5h", 5400),
        ("1W", 604800),
        # Slurm's time formats, as sbatch --time takes them
        ("30:00", 1800),
        ("00:10:00", 600),
        ("2:00:00", 7200),
        ("1-0", 86400),
        ("1-12", 129600),
        ("1-12:30", 131400),
        ("1-12:30:15", 131415),
        ("90:00", 5400),
    ],
)
def test_durations_people_type(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize(
    "text", ["", "2x", "h", "30m1h", "-5m", "0s", "400d", "1h30", "00:90:00", "1-24:00", "1:2:3:4", "1-", ":30"]
)
def test_bad_durations_say_what_is_accepted(text) -> None:
    with pytest.raises(ValueError, match=r"duration like|shorter|longer|not below"):
        parse_duration(text)


def test_a_bare_number_is_seconds_except_in_slurms_own_text() -> None:
    """``--time 30`` is 30 seconds (npuctl's rule); ``#SBATCH --time=30`` is 30 minutes, as sbatch reads it."""
    assert parse_duration("30") == 30
    assert parse_duration("30", bare="minutes") == 1800
    assert parse_duration("30:00", bare="minutes") == 1800  # the other forms mean the same either way


def test_format_duration() -> None:
    assert format_duration(5400) == "1h30m" and format_duration(None) == "-" and format_duration(0) == "0s"


def test_table_aligns_columns_and_marks_empty_cells() -> None:
    text = table(("ID", "NAME"), [(7, "a"), (123, None)], right=("ID",))
    assert text.splitlines() == [" ID  NAME", "  7  a", "123  -"]


@pytest.mark.parametrize(
    "argv",
    [
        ["submit", "--devices", "0", "--", "python", "x.py"],
        ["submit", "--time", "2x", "--", "python", "x.py"],
        ["submit", "--checkpoint-interval", "often", "--", "python", "x.py"],
        ["submit", "--devices", "many", "--", "python", "x.py"],
        ["cancel", "abc"],
        ["usage", "--month", "2026-13"],
        ["history", "--since", "yesterday"],
        ["history", "--until", "2026-13-01"],
        ["frobnicate"],
        [],
    ],
)
def test_usage_errors_exit_2_before_calling_anything(argv, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{free_port()}")
    assert main(argv) == 2
    assert "npuctl" in capsys.readouterr().err


def test_submit_without_a_command_is_a_usage_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{free_port()}")
    assert main(["submit", "--devices", "2"]) == 2
    assert "--command" in capsys.readouterr().err


def test_time_error_names_the_accepted_forms(capsys) -> None:
    main(["submit", "--time", "soon", "--", "x"])
    assert "90s, 15m, 2h, 1h30m, 1d, 30:00, 2:00:00 or 1-12:00" in capsys.readouterr().err


def test_unreachable_server_exits_3(capsys, monkeypatch) -> None:
    monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
    assert main(["queue"]) == 3
    assert "cannot reach" in capsys.readouterr().err


class _Failing(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(500)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(b"<h1>Server Error (500)</h1>")

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """A local HTTP server answering with ``handler``, as the ``NPUPORTAL_URL`` to use."""
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_server_errors_exit_3(capsys, monkeypatch) -> None:
    with _serving(_Failing) as url:
        monkeypatch.setenv("NPUPORTAL_URL", url)
        assert main(["nodes"]) == 3
        assert "server error 500" in capsys.readouterr().err


class _EndlessQueue(BaseHTTPRequestHandler):
    """A jobs list that always has a next page (a queue longer than npuctl reads)."""

    pages = 0

    def do_GET(self) -> None:
        type(self).pages += 1
        n = type(self).pages
        job = {"id": n, "name": f"j{n}", "team": "t", "submitter": "u", "priority_class": "normal",
               "num_devices": 1, "chip_model": "910B4", "state": "pending", "pending_reason": "Resources",
               "estimated_start": None}  # fmt: skip
        port = self.server.server_address[1]
        body = {"next": f"http://127.0.0.1:{port}/api/v1/jobs/?cursor=c{n}", "previous": None, "results": [job]}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_a_queue_longer_than_npuctl_reads_says_it_is_cut(capsys, monkeypatch) -> None:
    from npuctl.client import MAX_PAGES

    with _serving(_EndlessQueue) as url:
        monkeypatch.setenv("NPUPORTAL_URL", url)
        monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
        assert main(["queue"]) == 0
        out = capsys.readouterr()
        assert f"showing the first {MAX_PAGES + 1} jobs only" in out.err
        assert len([line for line in out.out.splitlines() if "Resources" in line]) == MAX_PAGES + 1


def test_a_running_jobs_reason_says_when_its_preemption_stops_it() -> None:
    from zoneinfo import ZoneInfo

    from npuctl.main import _preempted
    from npuctl.tables import Clock

    shanghai = Clock(lambda: ZoneInfo("Asia/Shanghai"))
    running = {"state": "running", "preempt_deadline": "2026-11-30T10:05:00+00:00"}
    assert _preempted(running, shanghai) == "preempted, stops 11-30 18:05 CST"
    assert _preempted({"state": "running", "preempt_deadline": None}, shanghai) == ""
    assert _preempted({"state": "pending"}, shanghai) == ""


# -- queue's NODELIST, history, usage's cost ------------------------------------------------


@pytest.mark.parametrize(
    ("names", "text"),
    [
        ([], ""),
        (["ascend-b4-01"], "ascend-b4-01"),
        (["ascend-b4-02", "ascend-b4-01", "ascend-b4-03"], "ascend-b4-[01-03]"),
        (["ascend-b4-01", "ascend-b4-02", "ascend-b4-05", "ascend-a-01"], "ascend-a-01,ascend-b4-[01-02,05]"),
        (["gpu9", "gpu10", "gpu11"], "gpu9,gpu[10-11]"),  # another width is another group, as in Slurm
        (["login", "n1", "n1"], "login,n1"),
    ],
)
def test_node_lists_are_compressed_like_slurms(names, text) -> None:
    from npuctl.hostlist import compress

    assert compress(names) == text


@pytest.mark.parametrize(
    ("start", "end", "text"),
    [
        ("2026-11-01T08:00:00Z", "2026-11-01T09:02:03Z", "1:02:03"),
        ("2026-11-01T08:00:00Z", "2026-11-01T08:00:09Z", "0:00:09"),
        ("2026-11-01T08:00:00+00:00", "2026-11-03T11:04:05+00:00", "2-03:04:05"),
        (None, "2026-11-01T08:00:00Z", "0:00:00"),  # cancelled before it started
    ],
)
def test_elapsed_reads_like_sacct(start, end, text) -> None:
    from npuctl.main import elapsed

    assert elapsed({"started_at": start, "ended_at": end}) == text


def test_times_people_type_for_since_and_until() -> None:
    from datetime import UTC, datetime, timedelta

    from npuctl.durations import parse_moment

    now = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
    assert parse_moment("7d", now) == now - timedelta(days=7)
    assert parse_moment("12h", now) == now - timedelta(hours=12)
    assert parse_moment("now", now) == now
    assert parse_moment("2026-11-01T08:00Z") == datetime(2026, 11, 1, 8, tzinfo=UTC)
    local = parse_moment("2026-11-01")
    assert local.tzinfo is not None and (local.year, local.month, local.day, local.hour) == (2026, 11, 1, 0)
    for bad in ("yesterday", "", "5", "2026-11-32"):
        with pytest.raises(ValueError, match="not a time like 2026-11-01"):
            parse_moment(bad, now)


@pytest.mark.parametrize("argv", [["history", "--state", "running"], ["history", "--state", "completed,done"]])
def test_a_bad_history_state_is_a_usage_error_naming_state(argv, capsys, monkeypatch) -> None:
    monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{free_port()}")  # nobody there: nothing is asked
    monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("npuctl: --state ")
    assert "completed, failed, timeout, out_of_memory, node_fail, cancelled, preempted" in err
    assert len(err.strip().splitlines()) == 1


def test_until_before_since_is_a_usage_error(capsys, monkeypatch) -> None:
    monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{free_port()}")
    assert main(["history", "--since", "2026-11-02", "--until", "2026-11-01"]) == 2
    assert "--until" in capsys.readouterr().err


class _History(BaseHTTPRequestHandler):
    """Enough ended jobs that ``head`` is gone before npuctl has written them all; records the queries."""

    queries: list[str] = []

    def do_GET(self) -> None:
        type(self).queries.append(self.path)
        jobs = [
            {"id": i, "name": f"job-{i}", "team": "training", "state": "completed", "exit_code": 0,
             "started_at": "2026-11-01T08:00:00Z", "ended_at": "2026-11-01T09:02:03Z", "device_hours": 8.27}
            for i in range(1, 5001)
        ]  # fmt: skip
        data = json.dumps({"next": None, "previous": None, "results": jobs}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_history_asks_for_ended_jobs_in_the_window_and_prints_sacct_columns(capsys, monkeypatch) -> None:
    import urllib.parse

    _History.queries = []
    with _serving(_History) as url:
        monkeypatch.setenv("NPUPORTAL_URL", url)
        monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
        code = main(
            ["history", "--since", "2026-11-01T00:00Z", "--until", "2026-11-02T00:00Z", "--state", "completed",
             "--state", "failed,cancelled"]
        )  # fmt: skip
    assert code == 0
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(_History.queries[0]).query)
    assert query["state"] == ["completed", "failed", "cancelled"]
    assert query["ended_after"] == ["2026-11-01T00:00:00Z"] and query["ended_before"] == ["2026-11-02T00:00:01Z"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["JOBID", "NAME", "TEAM", "STATE", "ELAPSED", "EXIT", "DEV_HOURS", "END"]
    assert lines[1].split()[:7] == ["1", "job-1", "training", "completed", "1:02:03", "0", "8.27"]


def test_history_piped_into_head_prints_no_traceback(tmp_path) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    with _serving(_History) as url:
        env = {**os.environ, "NPUPORTAL_URL": url, "NPUPORTAL_TOKEN": "whatever", "PYTHONPATH": str(root)}
        line = f'{sys.executable} -m npuctl history --since 30d | head -2; echo "exit ${{PIPESTATUS[0]}}" >&2'
        piped = subprocess.run(
            ["bash", "-c", line],
            cwd=root, env=env, capture_output=True, text=True, timeout=ceiling(120),
        )  # fmt: skip
    assert len(piped.stdout.splitlines()) == 2 and piped.stdout.split()[0] == "JOBID"
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    assert piped.stderr.strip().splitlines() == ["exit 141"]


def test_until_alone_shows_the_day_before_it(capsys, monkeypatch) -> None:
    import urllib.parse

    _History.queries = []
    with _serving(_History) as url:
        monkeypatch.setenv("NPUPORTAL_URL", url)
        monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
        assert main(["--json", "history", "--until", "2026-11-10T00:00Z"]) == 0
    query = urllib.parse.parse_qs(urllib.parse.urlsplit(_History.queries[0]).query)
    assert query["ended_after"] == ["2026-11-09T00:00:00Z"] and query["state"] == [
        "completed",
        "failed",
        "timeout",
        "out_of_memory",
        "node_fail",
        "cancelled",
        "preempted",
    ]
