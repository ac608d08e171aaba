"""A real Celery worker on the configured broker runs the tick task."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from scheduling.models import Job, TickRecord
from tests.conftest import db_url_for_subprocess
from tests.waiting import ceiling, wait_for

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
        tasks.tick.apply_async(expires=ceiling(300))  # a worker slow to start on a busy machine still takes it
        wait_for(
            lambda: Job.objects.get(pk=job["id"]).state,
            until=lambda state: state == "running",
            timeout=120,
            interval=0.3,
            message="the worker to run the tick (the job to start)",
        )
        assert TickRecord.objects.exists()
    finally:
        worker.terminate()
        try:
            out, _ = worker.communicate(timeout=ceiling(60))
        except subprocess.TimeoutExpired:
            worker.kill()
            out, _ = worker.communicate()
        if worker.returncode not in (0, -15):
            print(out.decode(errors="replace")[-3000:])
