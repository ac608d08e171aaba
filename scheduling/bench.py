"""``python -m scheduling.bench``: how fast is a scheduling tick, core and end to end?

Prints JSON with three parts:

- ``core``: ``decide()`` alone on a synthetic snapshot (median/max over several
  ticks), and how it grows from 1k to 100k pending jobs;
- ``db``: the whole tick — load the snapshot from the configured database,
  decide, persist — on the same synthetic cluster written to a scratch
  database (``<name>_bench`` on PostgreSQL, ``var/bench.sqlite3`` on SQLite),
  with a few running jobs finishing between ticks so every tick has work;
  ``db.with_estimates`` times ticks that also run the planning pass of
  estimated starts (the others run between two passes);
- the sizes measured.

The user's own database is never touched.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def scratch_database_url(suffix: str = "bench") -> str:
    """A database URL for a benchmark, created empty; never the configured one itself."""
    import dj_database_url

    url = os.environ.get("DATABASE_URL", "")
    if url.startswith(("postgres://", "postgresql://")):
        import psycopg

        cfg = dj_database_url.parse(url)
        name = f"{cfg['NAME']}_{suffix}"
        conninfo = {
            "host": cfg.get("HOST") or "127.0.0.1",
            "port": cfg.get("PORT") or 5432,
            "user": cfg.get("USER") or None,
            "password": cfg.get("PASSWORD") or None,
            "dbname": cfg["NAME"],
        }
        params = {k: v for k, v in conninfo.items() if v is not None}
        try:
            conn = psycopg.connect(**params, autocommit=True)
        except psycopg.OperationalError:
            # The configured database need not exist yet (a fresh machine, a test run's base
            # name): the server's maintenance database can create the scratch one just as well.
            conn = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)
        with conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        base = url.rsplit("/", 1)[0]
        return f"{base}/{name}"
    var = Path(os.environ.get("NPUPORTAL_VAR_DIR", ROOT / "var"))
    var.mkdir(parents=True, exist_ok=True)
    path = var / f"{suffix}.sqlite3"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    return f"sqlite:///{path}"


def setup_django(url: str) -> None:
    """Point Django at ``url`` and migrate it (call once, before anything imports models)."""
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "npuportal.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)


def _populate(snapshot: Any) -> None:
    """Write a synthetic snapshot into the (empty) scratch database, with bulk inserts."""
    from django.contrib.auth import get_user_model
    from django.db import transaction

    from devices.models import Device, Node, VnpuTemplate
    from quotas.models import Department, Policy, Team
    from scheduling.engine.policy import dump_policy
    from scheduling.models import Allocation, Job

    shift = datetime.now(tz=UTC).timestamp() - snapshot.now.timestamp()

    def dt(ts: float) -> datetime:
        return datetime.fromtimestamp(ts + shift, tz=UTC)

    with transaction.atomic():
        policy = snapshot.policy
        Policy.objects.create(
            version=1,
            yaml_text=dump_policy(policy),
            is_active=True,
            comment="benchmark",
            activated_at=datetime.now(tz=UTC),
        )
        departments = {name: Department.objects.create(name=name) for name in policy.departments}
        teams = {name: Team(name=name, department=departments.get(tp.department)) for name, tp in policy.teams.items()}
        for job in (*snapshot.pending, *snapshot.running):
            teams.setdefault(job.team, Team(name=job.team))
        Team.objects.bulk_create(teams.values())
        teams = {t.name: t for t in Team.objects.all()}
        User = get_user_model()
        users = {(j.user) for j in (*snapshot.pending, *snapshot.running)}
        User.objects.bulk_create(User(username=u) for u in users)
        user_ids = dict(User.objects.values_list("username", "id"))
        nodes = [Node(name=n.name, state="ready" if n.schedulable else "cordoned") for n in snapshot.nodes]
        Node.objects.bulk_create(nodes)
        node_ids = dict(Node.objects.values_list("name", "id"))
        Device.objects.bulk_create(
            Device(
                id=d.id,
                node_id=node_ids[d.node],
                index=d.index,
                chip_model=d.chip_model,
                hbm_mb=d.hbm_mb,
                ai_cores=d.ai_cores,
                ai_cpus=d.ai_cpus,
                topology_group=d.topology_group,
                health="healthy" if d.usable else "failed",
            )
            for n in snapshot.nodes
            for d in n.devices
        )
        from devices.services import inventory

        inventory.sweep()  # each card's join event, so the first tick's backstop finds nothing to write
        VnpuTemplate.objects.bulk_create(
            VnpuTemplate(
                chip_model=t.chip_model, name=t.name, memory_mb=t.memory_mb, ai_cores=t.ai_cores, ai_cpus=t.ai_cpus
            )
            for t in snapshot.templates.values()
        )
        template_ids = {(c, n): i for i, c, n in VnpuTemplate.objects.values_list("id", "chip_model", "name")}
        chip_of = {d.id: d.chip_model for n in snapshot.nodes for d in n.devices}
        cores_of = {d.id: d.ai_cores for n in snapshot.nodes for d in n.devices}
        jobs, allocations = [], []
        for j in snapshot.running:
            chip = chip_of[j.slots[0].device_id]
            jobs.append(
                Job(
                    id=j.id,
                    team=teams[j.team],
                    submitter_id=user_ids[j.user],
                    name=f"run-{j.id}",
                    command="true",
                    priority_class=j.priority_class,
                    num_devices=j.num_devices,
                    vnpu_template_id=template_ids.get((chip, j.vnpu_template)) if j.vnpu_template else None,
                    chip_model=j.chip_model or "",
                    estimated_duration_s=int(j.estimated_duration_s),
                    max_duration_s=int(j.max_duration_s) if j.max_duration_s else None,
                    state="running",
                    submitted_at=dt(j.submitted_at),
                    started_at=dt(j.started_at or j.submitted_at),
                    launched=True,
                )
            )
            for s in j.slots:
                tid = template_ids.get((chip, s.vnpu_template)) if s.vnpu_template else None
                share = snapshot.templates[(chip, s.vnpu_template)].ai_cores / cores_of[s.device_id] if tid else 1.0
                allocations.append(
                    Allocation(
                        job_id=j.id,
                        device_id=s.device_id,
                        vnpu_template_id=tid,
                        device_share=share,
                        start=dt(j.started_at or j.submitted_at),
                    )
                )
        for j in snapshot.pending:
            jobs.append(
                Job(
                    id=j.id,
                    team=teams[j.team],
                    submitter_id=user_ids[j.user],
                    name=f"job-{j.id}",
                    command="true",
                    priority_class=j.priority_class,
                    num_devices=j.num_devices,
                    vnpu_template_id=template_ids.get((j.chip_model, j.vnpu_template)) if j.vnpu_template else None,
                    chip_model=j.chip_model or "",
                    estimated_duration_s=int(j.estimated_duration_s),
                    max_duration_s=int(j.max_duration_s) if j.max_duration_s else None,
                    state="pending",
                    submitted_at=dt(j.submitted_at),
                )
            )
        Job.objects.bulk_create(jobs, batch_size=2000)
        Allocation.objects.bulk_create(allocations, batch_size=2000)
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
            cursor.execute(
                "SELECT setval(pg_get_serial_sequence('scheduling_job', 'id'), (SELECT max(id) FROM scheduling_job))"
            )


def _finish_some(rng: random.Random, count: int) -> int:
    """Let ``count`` running jobs end (untimed), so the next tick has devices to hand out."""
    from scheduling.models import Job
    from scheduling.services.jobs import finish_job

    ids = list(Job.objects.filter(state="running").values_list("id", flat=True))
    for job_id in rng.sample(ids, min(count, len(ids))):
        finish_job(job_id, exit_code=0)
    return len(ids)


def bench_db(args: argparse.Namespace) -> dict[str, Any]:
    """The database tick, median of ``args.ticks``; ``with_estimates``: ticks that run the planning pass."""
    from django.conf import settings
    from django.db import connection

    from scheduling.engine.bench_core import make_synthetic_snapshot
    from scheduling.services.tick import run_tick

    snapshot = make_synthetic_snapshot(args.pending, args.nodes, 8, args.busy, args.teams, args.seed)
    _populate(snapshot)
    rng = random.Random(args.seed)

    def run(count: int, first: bool) -> list[dict[str, Any]]:
        ticks = []
        for i in range(count):
            if i or not first:
                _finish_some(rng, args.finish_per_tick)
            r = run_tick()
            ticks.append(
                {
                    "total_ms": r.duration_ms,
                    "load_ms": r.load_ms,
                    "decide_ms": r.decide_ms,
                    "estimate_ms": r.estimate_ms,
                    "persist_ms": r.persist_ms,
                    "starts": len(r.started),
                    "waiting": r.waiting,
                }
            )
        return ticks

    # The ticks between two planning passes (one every ESTIMATE_INTERVAL_S, 30 s by
    # default; these ticks come seconds apart), then ticks that each run the pass.
    ticks = run(args.ticks + 1, True)
    first, steady = ticks[0], ticks[1:]
    interval = settings.ESTIMATE_INTERVAL_S
    settings.ESTIMATE_INTERVAL_S = 0
    try:
        planning = run(args.ticks, False) if settings.ESTIMATE_MAX_JOBS > 0 else []
    finally:
        settings.ESTIMATE_INTERVAL_S = interval

    def med(key: str, rows: list[dict[str, Any]] = steady) -> float:
        return round(statistics.median(t[key] for t in rows), 1)

    out = {
        "database": connection.vendor,
        "pending": args.pending,
        "devices": args.nodes * 8,
        "running": len(snapshot.running),
        "first_tick_ms": round(first["total_ms"], 1),
        "first_tick_starts": first["starts"],
        "median_ms": med("total_ms"),
        "max_ms": round(max(t["total_ms"] for t in steady), 1),
        "median_load_ms": med("load_ms"),
        "median_decide_ms": med("decide_ms"),
        "median_persist_ms": med("persist_ms"),
        "ticks": len(steady),
        "starts_per_tick": [t["starts"] for t in steady],
    }
    if planning:
        out["with_estimates"] = {
            "max_jobs": settings.ESTIMATE_MAX_JOBS,
            "median_ms": med("total_ms", planning),
            "max_ms": round(max(t["total_ms"] for t in planning), 1),
            "median_estimate_ms": med("estimate_ms", planning),
            "median_persist_ms": med("persist_ms", planning),
            "ticks": len(planning),
        }
    return out


def _rounded(value: Any) -> Any:
    """``value`` with every float rounded to 2 places, in nested dicts and lists too."""
    if isinstance(value, float):
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--teams", type=int, default=8)
    parser.add_argument("--busy", type=float, default=0.7)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument("--finish-per-tick", type=int, default=50, help="running jobs that end between ticks")
    parser.add_argument("--growth", default="1000,10000,100000", help="pending counts for the core growth table")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-db", action="store_true", help="time the pure core only")
    parser.add_argument("--skip-core", action="store_true", help="time the database tick only")
    args = parser.parse_args(argv)
    for name in ("pending", "nodes", "teams", "ticks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1")
    if not 0 <= args.busy < 1:
        parser.error("--busy must be in [0, 1)")
    sys.path.insert(0, str(ROOT))
    from scheduling import engine

    # Which build of the decision core ran (see scheduling/engine/__init__.py): NPUPORTAL_ENGINE=python
    # times the plain Python one.
    out: dict[str, Any] = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
        "engine_build": engine.BUILD,
    }
    if not args.skip_core:
        from scheduling.engine.bench_core import bench_decide

        growth = tuple(int(x) for x in args.growth.split(",") if x.strip())
        core = bench_decide(args.pending, args.nodes, 8, args.busy, args.teams, args.seed, growth=growth)
        out["core"] = _rounded(core)
    if not args.skip_db:
        setup_django(scratch_database_url())
        out["db"] = bench_db(args)
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
