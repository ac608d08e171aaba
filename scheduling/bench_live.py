"""``python -m scheduling.bench_live``: what does one open live page cost the server?

Each live console page polls one fragment (``/live/...``, htmx, every ``--interval`` seconds,
none while its tab is hidden). This builds a scratch database (``var/bench_live.sqlite3``, or
``<name>_bench_live`` next to a PostgreSQL ``DATABASE_URL``) with the demo cluster and a busy
queue (``--jobs`` submitted, one tick run so some run and some wait), then requests each page's
fragment ``--polls`` times as the browser would (signed in as the training lead, through the
whole middleware stack with Django's test client, in this process) and prints JSON per page:

- ``requests_per_min``: polls a minute of one open page (60 / interval);
- ``cpu_ms_per_request``: this process's CPU time (``time.process_time``) per poll, which on
  SQLite includes the database's own work; on PostgreSQL the database server's CPU is not in it;
- ``cpu_ms_per_min``: what one open page costs the server a minute (the two above multiplied);
- ``full_page_cpu_ms``: one render of the whole page, for comparison (what a page reloading
  itself would pay each time).

A job page that runs also fetches its output (``static/js/job-output.js``, every 2 s, from the
node's agent) until the run's output is complete; that request is not counted here.
The figures and the machine they were taken on: docs/console.md.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from scheduling.bench import scratch_database_url, setup_django

ROOT = Path(__file__).resolve().parent.parent
#: The backend that loads users (the first one is the sign-in lockout's, which loads nobody).
MODEL_BACKEND = "django.contrib.auth.backends.ModelBackend"


def _busy_site(jobs: int) -> dict[str, Any]:
    """The demo site, ``jobs`` jobs submitted across the teams, one tick: some run, the rest wait."""
    from django.contrib.auth import get_user_model

    from devices.models import Node
    from quotas.models import Membership, Team
    from scheduling.demo import seed
    from scheduling.models import Job
    from scheduling.services import jobs as job_service
    from scheduling.services.tick import run_tick

    seed(with_agents=False)
    shapes = [(1, "910B4"), (2, "910B4"), (4, "910A"), (1, "310P3"), (8, "910B4")]
    teams = list(Team.objects.order_by("name"))
    for i in range(jobs):
        team = teams[i % len(teams)]
        lead = Membership.objects.filter(team=team, role=Membership.Role.LEAD).select_related("user").first()
        assert lead is not None
        devices, chip = shapes[i % len(shapes)]
        spec = job_service.JobSpec(name=f"live-{i}", command="sleep 600", num_devices=devices, chip_model=chip)
        job_service.submit_job(team=team, user=lead.user, spec=spec)
    run_tick()
    lead = get_user_model().objects.get(username="lead-training")
    watched = Job.objects.filter(team__name="training", state=Job.State.RUNNING).order_by("pk").first()
    watched = watched or Job.objects.filter(team__name="training").order_by("pk").first()
    assert watched is not None
    node = Node.objects.order_by("name").first()
    assert node is not None
    return {
        "lead": lead,
        "job": watched.pk,
        "node": node.name,
        "running": Job.objects.filter(state=Job.State.RUNNING).count(),
        "pending": Job.objects.filter(state=Job.State.PENDING).count(),
    }


def pages(job: int, node: str) -> dict[str, tuple[str, str]]:
    """Each live page: (its own URL, the fragment it polls); the job list unfiltered, its largest page."""
    return {
        "dashboard": ("/", "/live/dashboard/"),
        "job_list": ("/jobs/", "/live/jobs/"),
        "job": (f"/jobs/{job}/", f"/live/jobs/{job}/"),
        "cluster": ("/cluster/", "/live/cluster/"),
        "node": (f"/nodes/{node}/", f"/live/nodes/{node}/"),
    }


def _cpu_ms(client: Any, url: str, repeat: int, headers: dict[str, str]) -> tuple[float, float, int]:
    """CPU ms and wall ms per request of ``repeat`` GETs of ``url``, and the last body's size."""
    size = 0
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        resp = client.get(url, headers=headers)
        if resp.status_code not in (200, 286):
            raise RuntimeError(f"{url} answered {resp.status_code}")
        size = len(resp.content)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return 1000 * cpu / repeat, 1000 * wall / repeat, size


def measure(polls: int, interval: float, job: int, node: str, user: object) -> dict[str, Any]:
    from django.test import Client

    client = Client(HTTP_HOST="127.0.0.1")
    client.force_login(user, backend=MODEL_BACKEND)
    htmx = {"HX-Request": "true"}
    out: dict[str, Any] = {}
    for name, (page, fragment) in pages(job, node).items():
        _cpu_ms(client, fragment, 3, htmx)  # warm: templates compiled, policy parsed
        cpu, wall, size = _cpu_ms(client, fragment, polls, htmx)
        full_cpu, _, full_size = _cpu_ms(client, page, max(3, polls // 10), {})
        per_min = 60.0 / interval
        out[name] = {
            "fragment": fragment,
            "requests_per_min": round(per_min, 1),
            "cpu_ms_per_request": round(cpu, 2),
            "wall_ms_per_request": round(wall, 2),
            "cpu_ms_per_min": round(cpu * per_min, 1),
            "fragment_bytes": size,
            "full_page_cpu_ms": round(full_cpu, 2),
            "full_page_bytes": full_size,
        }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench_live", description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=200, help="timed polls of each fragment (default 200)")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between polls, as the pages poll (3)")
    parser.add_argument("--jobs", type=int, default=60, help="jobs submitted before measuring (default 60)")
    parser.add_argument("--quiet", action="store_true", help="only the JSON on stdout")
    args = parser.parse_args(argv)
    if args.polls < 1 or args.interval <= 0 or args.jobs < 0:
        parser.error("--polls >= 1, --interval > 0 and --jobs >= 0")

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    load_before = [round(x, 2) for x in os.getloadavg()]
    var = Path(tempfile.mkdtemp(prefix="npuportal-bench-live-"))
    # Secret key, broker folders and the scratch SQLite file apart from the user's own var/.
    os.environ["NPUPORTAL_VAR_DIR"] = str(var)
    os.environ["SECRET_KEY"] = secrets.token_urlsafe(40)
    os.environ["NPUPORTAL_CACHE_PREFIX"] = f"bench-live-{secrets.token_hex(4)}"
    os.environ.setdefault("DEBUG", "false")
    sys.path.insert(0, str(ROOT))
    try:
        url = scratch_database_url("bench_live")
        say(f"migrating {url.rsplit('/', 1)[-1]} …")
        setup_django(url)
        import logging

        logging.disable(logging.WARNING)
        from django.db import connection

        say(f"seeding the demo and submitting {args.jobs} jobs …")
        site = _busy_site(args.jobs)
        say(f"polling each page's fragment {args.polls} times …")
        figures = measure(args.polls, args.interval, site["job"], site["node"], site["lead"])
        vendor = connection.vendor
    finally:
        shutil.rmtree(var, ignore_errors=True)
    out = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_avg_before": load_before},
        "database": vendor,
        "viewer": "lead-training",
        "queue": {"running": site["running"], "pending": site["pending"]},
        "polls_each": args.polls,
        "interval_s": args.interval,
        "pages": figures,
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
