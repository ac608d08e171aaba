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


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("3600", 3600), ("1.5h", 5400)],
)
def test_durations_people_type(text, seconds) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "2x", "h", "1h 30m", "-5m", "0s", "400d", "1h30"])
def test_bad_durations_say_what_is_accepted(text) -> None:
    with pytest.raises(ValueError, match=r"duration like|shorter|longer"):
        parse_duration(text)


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
        ["submit", "--devices", "many", "--", "python", "x.py"],
        ["cancel", "abc"],
        ["usage", "--month", "2026-13"],
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
    assert "90s, 15m, 2h, 1d" in capsys.readouterr().err


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
    from npuctl.main import _preempted
    from npuctl.tables import when

    running = {"state": "running", "preempt_deadline": "2026-11-30T10:05:00+00:00"}
    assert _preempted(running) == f"preempted, stops {when('2026-11-30T10:05:00+00:00')}"
    assert _preempted({"state": "running", "preempt_deadline": None}) == ""
    assert _preempted({"state": "pending"}) == ""
