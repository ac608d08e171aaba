"""``python -m scheduling.bench_http`` runs end to end: scratch database, gunicorn, a second process driving it.

Tiny sizes and no figures asserted: the figures belong in its output (README).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from django.conf import settings

from tests.conftest import requires_postgres

pytestmark = [requires_postgres, pytest.mark.slow]


def test_the_http_benchmark_prints_submissions_arrays_and_lists(tmp_path) -> None:
    env = {
        **os.environ,
        # The benchmark makes `<name>_bench_http` next to the configured database, never the test one.
        "DATABASE_URL": os.environ.get("DATABASE_URL", ""),
        "NPUPORTAL_VAR_DIR": str(tmp_path),
    }
    argv = [
        sys.executable, "-m", "scheduling.bench_http", "--seconds", "1", "--warmup", "0.3", "--clients", "2",
        "--jobs-in-db", "300", "--array-size", "5", "--workers", "1", "--threads", "2", "--list-requests", "2",
        "--quiet",
    ]  # fmt: skip
    done = subprocess.run(argv, cwd=settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout)
    assert out["database"] == "postgresql" and out["server"]["workers"] == 1
    for phase in ("single", "arrays"):
        assert out[phase]["requests"] > 0 and out[phase]["errors"] == 0, out[phase]
        assert {"p50_ms", "p95_ms", "p99_ms", "cpu"} <= set(out[phase])
    assert out["single"]["submissions_per_s"] > 0 and out["arrays"]["jobs_per_s"] > 0
    lists = out["lists"]
    assert lists["jobs_in_db"] >= 300
    for name in ("first_page", "deep_page_by_cursor", "deep_page_by_offset", "filtered_team_state",
                 "member_first_page", "console_jobs_page"):  # fmt: skip
        assert lists[name]["errors"] == 0 and lists[name]["p50_ms"] is not None, name
