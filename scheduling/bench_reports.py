"""``python -m scheduling.bench_reports``: how fast are the reports page and the monthly close at scale?

Writes ``--records`` usage records (default 1,000,000) for one month, with a
quarter as many jobs (for the wait-time chart), into a scratch database —
``<name>_bench_reports`` on PostgreSQL (with ``COPY``), ``var/bench_reports.sqlite3``
on SQLite (bulk inserts) — then times:

- ``reports_s``: every aggregate of every chart of ``/reports/`` for finance
  (all teams) on the month before it is closed (usage priced live);
- ``reports_lead_s``: the same for one team lead;
- ``close_s``: the monthly close (sweep, pricing, statements frozen);
- ``reports_closed_s``: the reports page data once the month is closed.

Prints JSON. The user's own database is never touched. Target (docs/chargeback.md):
``reports_s`` ≤ 5 s on PostgreSQL for a million records.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from scheduling.bench import scratch_database_url, setup_django

ROOT = Path(__file__).resolve().parent.parent
MONTH = "2025-03"
TEAMS = ["inference", "training", "research", "vision", "speech", "search", "ads", "robotics"]
CLASSES = [("critical", 0.05), ("high", 0.2), ("normal", 0.5), ("low", 0.25)]


def _cluster() -> dict[str, Any]:
    """Nodes, devices, teams, users, the demo policy and the demo rate card; returns ids for the records."""
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from devices.models import Device, Node
    from quotas.accounting.demo import default_rate_card
    from quotas.models import Department, Membership, Team
    from quotas.policies.versions import create_version

    dept = Department.objects.create(name="ai-lab")
    # A million allocations a month of ~3 h each is ~3 million device-hours: a cluster of ~4800 cards.
    layout = [("910B4", 400, 8, 20), ("910A", 160, 8, 32), ("310P3", 80, 4, 8)]
    Node.objects.bulk_create(Node(name=f"{chip.lower()}-{n:03d}") for chip, nodes, _, _ in layout for n in range(nodes))
    node_ids = dict(Node.objects.values_list("name", "id"))
    Device.objects.bulk_create(
        Device(node_id=node_ids[f"{chip.lower()}-{n:03d}"], index=i, chip_model=chip, ai_cores=cores)
        for chip, nodes, per_node, cores in layout
        for n in range(nodes)
        for i in range(per_node)
    )
    from devices.services import inventory

    # The cards joined well before the month measured, as a site's have (chargeback counts them from then).
    inventory.sweep(at=datetime(2025, 1, 1, tzinfo=UTC))
    User = get_user_model()
    teams, users = {}, {}
    for name in TEAMS:
        teams[name] = Team.objects.create(name=name, department=dept)
        users[name] = User.objects.create_user(f"lead-{name}")
        Membership.objects.create(user=users[name], team=teams[name], role=Membership.Role.LEAD)
    policy = (Path(settings.BASE_DIR) / "examples" / "policies" / "demo.yaml").read_text()
    create_version(policy, author=None, comment="bench")
    default_rate_card("2025-01-01")
    return {
        "chips": {c: list(Device.objects.filter(chip_model=c).values_list("id", flat=True)) for c, *_ in layout},
        "teams": {name: t.pk for name, t in teams.items()},
        "users": {name: u.pk for name, u in users.items()},
    }


def _rows(n: int, ids: dict[str, Any], month_start: datetime, month_end: datetime, seed: int) -> tuple[list, list]:
    """``n`` usage records and ``n // 4`` jobs, deterministic for a seed."""
    rng = random.Random(seed)
    span = (month_end - month_start).total_seconds()
    classes = [c for c, _ in CLASSES]
    weights = [w for _, w in CLASSES]
    chips = [("910B4", 0.6), ("910A", 0.3), ("310P3", 0.1)]
    jobs = []
    n_jobs = max(1, n // 4)
    for j in range(n_jobs):
        team = rng.choice(TEAMS)
        started = month_start + timedelta(seconds=rng.random() * span)
        submitted = started - timedelta(seconds=rng.expovariate(1 / 900.0))
        jobs.append((j + 1, team, rng.choices(classes, weights)[0], submitted, started))
    records = []
    for i in range(n):
        job_id, team, pclass, _, started = jobs[i % n_jobs]
        chip = rng.choices([c for c, _ in chips], [w for _, w in chips])[0]
        share = (
            "1.000000" if chip != "310P3" or rng.random() < 0.5 else rng.choice(["0.125000", "0.250000", "0.500000"])
        )
        start = min(started + timedelta(seconds=rng.random() * 600), month_end - timedelta(seconds=1))
        end = min(start + timedelta(seconds=rng.expovariate(1 / 10800.0) + 60), month_end)
        records.append((i + 1, job_id, team, chip, share, pclass, start, end))
    return jobs, records


def _insert(jobs: list, records: list, ids: dict[str, Any]) -> None:
    from django.db import connection, transaction

    from scheduling.models import Job

    now = datetime.now(tz=UTC)
    job_cols = (
        "id, team_id, submitter_id, name, command, priority_class, num_devices, chip_model, estimated_duration_s, "
        "state, submitted_at, started_at, ended_at, pending_reason, pending_detail, retries, launched, agent_job_id, "
        "array_id, env, cwd, output"
    )
    rec_cols = (
        "allocation_id, month, team_id, user_id, job_id, chip_model, vnpu_template, device_share, priority_class, "
        '"start", "end", recorded_at'
    )

    def job_row(j: tuple) -> tuple:
        job_id, team, pclass, submitted, started = j
        return (
            job_id, ids["teams"][team], ids["users"][team], f"bench-{job_id}", "true", pclass, 1, "", 3600,
            "completed", submitted, started, started + timedelta(hours=1), "", "", 0, True, "", "", "{}", "", "",
        )  # fmt: skip

    def rec_row(r: tuple) -> tuple:
        allocation_id, job_id, team, chip, share, pclass, start, end = r
        template = "vir02" if share != "1.000000" else ""
        return (
            allocation_id, MONTH, ids["teams"][team], ids["users"][team], job_id, chip, template, share, pclass,
            start, end, now,
        )  # fmt: skip

    job_table = Job._meta.db_table
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            raw = cursor.cursor
            with raw.copy(f"COPY {job_table} ({job_cols}) FROM STDIN") as copy:
                for j in jobs:
                    copy.write_row(job_row(j))
            with raw.copy(f"COPY quotas_usagerecord ({rec_cols}) FROM STDIN") as copy:
                for r in records:
                    copy.write_row(rec_row(r))
            cursor.execute(f"SELECT setval(pg_get_serial_sequence('{job_table}', 'id'), {len(jobs) + 1})")
            cursor.execute("ANALYZE")
        return
    # SQLite keeps datetimes as UTC text in Django's format: adapt them as the ORM would.
    adapt = connection.ops.adapt_datetimefield_value

    def sqlite_row(row: tuple) -> tuple:
        return tuple(adapt(v) if isinstance(v, datetime) else v for v in row)

    with transaction.atomic(), connection.cursor() as cursor:
        marks = ", ".join(["%s"] * 22)
        for i in range(0, len(jobs), 20000):
            cursor.executemany(
                f"INSERT INTO {job_table} ({job_cols}) VALUES ({marks})",
                [sqlite_row(job_row(j)) for j in jobs[i : i + 20000]],
            )
        marks = ", ".join(["%s"] * 12)
        for i in range(0, len(records), 20000):
            cursor.executemany(
                f"INSERT INTO quotas_usagerecord ({rec_cols}) VALUES ({marks})",
                [sqlite_row(rec_row(r)) for r in records[i : i + 20000]],
            )
        cursor.execute("ANALYZE")


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - t0, result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench_reports", description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="usage records in the month (default 1e6)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--quiet", action="store_true", help="only the JSON on stdout")
    args = parser.parse_args(argv)
    if args.records < 1:
        parser.error("--records must be >= 1")
    sys.path.insert(0, str(ROOT))
    setup_django(scratch_database_url("bench_reports"))
    import logging

    logging.getLogger("quotas").setLevel(logging.WARNING)
    from django.db import connection

    from quotas.accounting.reports import report_data
    from quotas.accounting.statements import close_month
    from quotas.models import Statement, Team
    from quotas.policies.versions import active_policy
    from scheduling.services.usage import month_of

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    ids = _cluster()
    month = month_of(active_policy().policy, datetime.now(tz=UTC), MONTH)
    say(f"generating {args.records} records for {MONTH} …")
    jobs, records = _rows(args.records, ids, month.start, month.end, args.seed)
    insert_s, _ = _timed(_insert, jobs, records, ids)
    del jobs, records
    say(f"inserted in {insert_s:.1f} s; timing the reports and the close …")
    reports_s, data = _timed(report_data, MONTH)
    lead_team = list(Team.objects.filter(name="training"))
    reports_lead_s, _ = _timed(report_data, MONTH, teams=lead_team)
    close_s, closed = _timed(close_month, MONTH)
    reports_closed_s, _ = _timed(report_data, MONTH)
    totals = {s.team.name if s.team_id else "@cluster": str(s.total) for s in Statement.objects.filter(month=MONTH)}
    result = {
        "database": connection.vendor,
        "records": args.records,
        "jobs": max(1, args.records // 4),
        "month": MONTH,
        "insert_s": round(insert_s, 2),
        "reports_s": round(reports_s, 3),
        "reports_lead_s": round(reports_lead_s, 3),
        "close_s": round(close_s, 3),
        "reports_closed_s": round(reports_closed_s, 3),
        "statements": len(closed.statements),
        "device_hours_used": round(sum(data["utilisation"]["used"]), 1),
        "totals": totals,
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
