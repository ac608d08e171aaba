"""How a job ended, in words: the API's ``exit_reason`` and the job page."""

from __future__ import annotations

import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from django.utils import timezone

from devices.executors.agents import outcome
from npuctl.main import main as npuctl_main
from quotas.models import Team
from scheduling.models import Job, JobEvent
from scheduling.reason_text import exit_reason

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("state", "code", "event", "words"),
    [
        ("completed", 0, None, "exit code 0"),
        ("failed", 3, None, "exit code 3"),
        ("failed", -9, None, "killed by signal SIGKILL"),
        ("failed", -11, None, "killed by signal SIGSEGV"),
        ("failed", -15, "Walltime", "time limit reached"),  # a row the migration did not move
        ("timeout", -15, "Walltime", "time limit reached"),
        ("timeout", None, None, "time limit reached"),  # the API's rows: by the state alone
        ("failed", -9, "OutOfMemory", "out of memory"),
        ("out_of_memory", -9, None, "out of memory"),
        ("node_fail", None, "LostOnAgent", "node lost"),
        ("node_fail", None, "DeviceFailed", "device failed"),
        ("node_fail", None, None, "node failure"),
        ("preempted", None, None, "preempted"),  # onPreempt: cancel
        ("failed", -15, "Preempted", "preempted"),
        ("failed", None, "LostOnAgent", "node lost"),
        ("failed", -9, "NodeUnreachable", "node lost"),
        ("failed", None, None, "no exit status"),
        ("cancelled", None, None, "cancelled"),
        ("running", None, None, None),
    ],
)
def test_exit_reason_words(state, code, event, words) -> None:
    assert exit_reason(state, code, event) == words


def test_an_agent_reporting_out_of_memory_fails_the_job_with_that_reason() -> None:
    record = {"state": "failed", "exit_code": -9, "exit_reason": "out of memory (1 process(es) killed)"}
    assert outcome(record)[1] == "OutOfMemory"


@pytest.fixture
def member(demo, user_factory, isolated_api_state):
    return user_factory("exit-member", team="training")


def _ended(user, code: int) -> Job:
    now = timezone.now()
    return Job.objects.create(
        team=Team.objects.get(name="training"),
        submitter=user,
        name=f"ends-{code}",
        command="python train.py",
        priority_class="normal",
        num_devices=1,
        state=Job.State.FAILED,
        submitted_at=now - timedelta(hours=2),
        started_at=now - timedelta(hours=1),
        ended_at=now,
        exit_code=code,
    )


def test_the_api_says_how_a_job_ended(member, api) -> None:
    killed, three = _ended(member, -9), _ended(member, 3)
    body = api(member).get(f"/api/v1/jobs/{killed.pk}/").json()
    assert body["exit_reason"] == "killed by signal SIGKILL" and body["exit_code"] == -9
    assert api(member).get(f"/api/v1/jobs/{three.pk}/").json()["exit_reason"] == "exit code 3"
    listed = {j["id"]: j for j in api(member).get("/api/v1/jobs/?state=failed").json()["results"]}
    assert listed[three.pk]["exit_reason"] == "exit code 3"


def test_the_job_page_says_how_it_ended(member, client) -> None:
    client.force_login(member)
    killed, three = _ended(member, -9), _ended(member, 3)
    assert "(killed by signal SIGKILL)" in client.get(f"/live/jobs/{killed.pk}/").content.decode()
    plain = client.get(f"/live/jobs/{three.pk}/").content.decode()
    assert '<td id="job-exit">3</td>' in plain and "(exit code 3)" not in plain, "a plain exit code reads once"
    JobEvent.objects.create(job=three, from_state="running", to_state="failed", reason="Walltime", at=timezone.now())
    assert "(time limit reached)" in client.get(f"/live/jobs/{three.pk}/").content.decode()


class _OneJob(BaseHTTPRequestHandler):
    job = {
        "id": 7, "name": "seg", "team": "training", "submitter": "exit-member", "priority_class": "normal",
        "num_devices": 1, "vnpu_template": None, "chip_model": None, "command": "./a.out",
        "estimated_duration_s": 60, "max_duration_s": 120, "state": "failed", "submitted_at": None,
        "started_at": None, "ended_at": None, "exit_code": -11, "exit_reason": "killed by signal SIGSEGV",
        "events": [], "allocations": [],
    }  # fmt: skip

    def do_GET(self) -> None:
        body = json.dumps(self.job).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_npuctl_show_says_how_a_job_ended(capsys, monkeypatch) -> None:
    server = HTTPServer(("127.0.0.1", 0), _OneJob)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("NPUPORTAL_URL", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("NPUPORTAL_TOKEN", "whatever")
        assert npuctl_main(["show", "7"]) == 0
    finally:
        server.shutdown()
        server.server_close()
    assert "failed (killed by signal SIGSEGV)" in capsys.readouterr().out
