"""A real Celery worker on the configured broker runs the tick task."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scheduling.models import Job, TickRecord
from tests.conftest import db_url_for_subprocess

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent


def test_worker_runs_the_tick_from_the_broker(demo, api, user_factory, tmp_path) -> None:
    from scheduling import tasks

    lead = user_factory("w", team="research", role="lead")
    job = (
        api(lead)
        .post(
            "/api/v1/jobs/",
            {
                "name": "via-worker",
                "command": "true",
                "num_devices": 1,
                "chip_model": "910A",
                "estimated_duration_s": 60,
            },
            format="json",
        )
        .json()
    )
    env = {
        **os.environ,
        "DATABASE_URL": db_url_for_subprocess(),
        "DJANGO_SETTINGS_MODULE": "npuportal.settings",
        "NPUPORTAL_VAR_DIR": os.environ.get("NPUPORTAL_VAR_DIR", str(ROOT / "var" / "test")),
    }
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "npuportal",
            "worker",
            "-l",
            "warning",
            "-c",
            "1",
            "-P",
            "solo",
            "--without-gossip",
            "--without-mingle",
            "-n",
            f"test-{os.getpid()}@%h",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        tasks.tick.apply_async(expires=60)
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:
            if Job.objects.get(pk=job["id"]).state == "running":
                break
            time.sleep(0.3)
        assert Job.objects.get(pk=job["id"]).state == "running", "the worker never ran the tick"
        assert TickRecord.objects.exists()
    finally:
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
        if worker.returncode not in (0, -15):
            print(out.decode(errors="replace")[-3000:])
