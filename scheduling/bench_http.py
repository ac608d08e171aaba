"""``python -m scheduling.bench_http``: how many job submissions a second does the web server take?

Builds a scratch database (``<name>_bench_http`` on PostgreSQL — the default,
next to ``DATABASE_URL`` or ``postgres://postgres@127.0.0.1:5432/npuportal`` —
or ``var/bench_http.sqlite3`` when ``--database-url`` is SQLite) with the demo
cluster, teams and users and ``--jobs-in-db`` jobs of history, starts gunicorn
on it on a free port of 127.0.0.1, waits for ``/healthz``, then drives it from
a second process over keep-alive connections and prints JSON:

- ``single``: ``POST /api/v1/jobs/`` of one job from ``--clients`` connections
  in a closed loop for ``--seconds``: submissions/s and p50/p95/p99 latency;
- ``arrays``: the same with ``array: --array-size``: requests and jobs/s;
- ``lists``: latency of job list pages with the history in the database (timed
  first, before the submissions add to it) —
  the first page, a page deep in the list reached by its cursor (and the same
  depth by ``offset``, for comparison), filtered lists, a member's view (their
  teams only) and the console's ``/jobs/`` page.

The server keeps its throttling; the benchmark only raises the rates of its
own server (``NPUPORTAL_THROTTLE_USER``) and keeps its cache keys apart
(``NPUPORTAL_CACHE_PREFIX``) so a shared Redis's real counters are not touched.
Targets (README): ≥ 300 single submissions/s with p99 < 50 ms and ≥ 5,000
jobs/s through arrays on a 2-core machine, on PostgreSQL.
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from scheduling.bench import scratch_database_url, setup_django

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_POSTGRES = "postgres://postgres@127.0.0.1:5432/npuportal"
HOST = "127.0.0.1"
#: The body of every benchmark submission: a small job any demo team may queue.
JOB = {
    "name": "bench",
    "command": "python train.py --epochs 1",
    "team": "training",
    "num_devices": 1,
    "chip_model": "910B4",
    "estimated_duration_s": 600,
}
#: Mix of states of the history jobs (most of a busy cluster's jobs have ended).
STATES = [("completed", 0.75), ("failed", 0.1), ("cancelled", 0.08), ("pending", 0.05), ("running", 0.02)]


# -- the scratch site -------------------------------------------------------------------


def _site() -> dict[str, Any]:
    """The demo site plus a bench member of ``training``; API keys for it and the admin, a console session."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY, get_user_model
    from django.contrib.sessions.backends.db import SessionStore

    from quotas.access.tokens import issue_token
    from quotas.models import Membership, Team
    from scheduling.demo import seed

    seed(with_agents=False)
    User = get_user_model()
    member = User.objects.create_user("bench-member")
    Membership.objects.create(user=member, team=Team.objects.get(name="training"))
    admin = User.objects.get(username="admin")
    session = SessionStore()
    session[SESSION_KEY] = str(member.pk)
    # The backend that loads users (the first one is the sign-in lockout's, which loads nobody).
    session[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    session[HASH_SESSION_KEY] = member.get_session_auth_hash()
    session.create()
    return {
        "member_key": issue_token(member, "bench")[1],
        "admin_key": issue_token(admin, "bench")[1],
        "session_cookie": f"{settings.SESSION_COOKIE_NAME}={session.session_key}",
    }


def _history(count: int, seed: int) -> None:
    """``count`` jobs over the last 60 days across the demo teams, written in bulk (COPY on PostgreSQL)."""
    from django.db import connection, transaction

    from quotas.models import Membership
    from scheduling.models import Job

    if count <= 0:
        return
    rng = random.Random(seed)
    owners = list(Membership.objects.values_list("team_id", "user_id"))
    now = datetime.now(tz=UTC)
    states = [s for s, _ in STATES]
    weights = [w for _, w in STATES]
    classes = ["high", "normal", "normal", "normal", "low"]
    chips = ["910B4", "910B4", "910A", "310P3"]
    # Every concrete column is written: the ones a job's history varies are set below, the rest take the
    # model's own default, so a column added to Job later cannot make this bulk load fail (COPY and the
    # raw INSERT skip Django's defaults).
    fields = [f for f in Job._meta.concrete_fields if not f.primary_key]
    cols = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    span = 60 * 86400.0
    offsets = sorted((rng.random() * span for _ in range(count)), reverse=True)

    def row(i: int, ago: float) -> tuple:
        team_id, user_id = owners[i % len(owners)]
        state = rng.choices(states, weights)[0]
        submitted = now - timedelta(seconds=ago)
        started = submitted + timedelta(seconds=rng.expovariate(1 / 600.0)) if state != "pending" else None
        ended = started + timedelta(hours=rng.expovariate(1 / 3.0)) if started and state != "running" else None
        varied = {
            "team_id": team_id, "submitter_id": user_id, "name": f"hist-{i}", "command": "python train.py",
            "priority_class": rng.choice(classes), "num_devices": rng.choice((1, 1, 2, 4, 8)),
            "chip_model": rng.choice(chips), "estimated_duration_s": 3600, "state": state,
            "submitted_at": submitted, "started_at": started, "ended_at": ended,
            "pending_reason": "Resources" if state == "pending" else "", "launched": state == "running",
        }  # fmt: skip
        return tuple(
            f.get_db_prep_save(varied[f.attname] if f.attname in varied else f.get_default(), connection)
            for f in fields
        )

    table = connection.ops.quote_name(Job._meta.db_table)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            with cursor.cursor.copy(f"COPY {table} ({cols}) FROM STDIN") as copy:
                for i, ago in enumerate(offsets):
                    copy.write_row(row(i, ago))
            cursor.execute("ANALYZE")
        return
    marks = ", ".join(["%s"] * len(fields))
    with transaction.atomic(), connection.cursor() as cursor:
        rows = [row(i, a) for i, a in enumerate(offsets)]
        for start in range(0, len(rows), 20000):
            cursor.executemany(f"INSERT INTO {table} ({cols}) VALUES ({marks})", rows[start : start + 20000])
        cursor.execute("ANALYZE")


# -- the server -------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _start_server(
    env: dict[str, str], port: int, workers: int, threads: int, worker_class: str, log: Path
) -> subprocess.Popen:
    """gunicorn on a port of its own, with ``make run``'s threaded workers by default.

    ``gthread`` keeps connections alive and lets a thread waiting on the database
    leave the CPU to another; ``sync`` answers one request per connection and
    process, with less bookkeeping per request.
    """
    command = [
        sys.executable, "-m", "gunicorn", "npuportal.wsgi:application",
        "--bind", f"{HOST}:{port}", "--workers", str(workers), "--worker-class", worker_class,
        "--keep-alive", "30", "--timeout", "60", "--graceful-timeout", "5", "--log-level", "warning", "--preload",
    ]  # fmt: skip
    if worker_class == "gthread":
        command += ["--threads", str(threads)]
    if Path("/dev/shm").is_dir():
        command += ["--worker-tmp-dir", "/dev/shm"]  # gunicorn's heartbeat files, off the disk
    with log.open("w") as out:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_healthy(port: int, server: subprocess.Popen, timeout_s: float = 60.0) -> dict[str, Any]:
    """``/healthz`` once the database answers (a tick need not have run: the benchmark runs none)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"gunicorn exited with {server.returncode}")
        try:
            conn = http.client.HTTPConnection(HOST, port, timeout=5)
            conn.request("GET", "/healthz")
            body = json.loads(conn.getresponse().read())
            conn.close()
            if body.get("database", {}).get("ok"):
                return body
        except (OSError, http.client.HTTPException, ValueError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"/healthz did not answer within {timeout_s:.0f} s")


def _stop_server(server: subprocess.Popen) -> None:
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


# -- the load (runs in a second process) ---------------------------------------------------


def _percentile(sorted_ms: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an ascending list."""
    if not sorted_ms:
        return None
    rank = max(1, min(len(sorted_ms), round(q / 100 * len(sorted_ms) + 0.5)))
    return round(sorted_ms[rank - 1], 2)


def _summary(latencies_s: list[float]) -> dict[str, Any]:
    ms = sorted(x * 1000 for x in latencies_s)
    return {
        "p50_ms": _percentile(ms, 50),
        "p95_ms": _percentile(ms, 95),
        "p99_ms": _percentile(ms, 99),
        "max_ms": round(ms[-1], 2) if ms else None,
    }


def _cpu_ticks(server_pid: int, database: str) -> dict[str, int]:
    """CPU time (clock ticks) used so far by the web workers, the database's backends of the scratch
    database, and the whole machine: the machine is shared, so the figures say who used what."""
    ticks = {"web": 0, "database": 0}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        used = int(fields[11]) + int(fields[12])  # utime + stime
        if int(fields[1]) == server_pid or int(entry.name) == server_pid:
            ticks["web"] += used
        elif cmdline.startswith(b"postgres: ") and f" {database} ".encode() in cmdline:
            ticks["database"] += used
    cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    ticks["machine_busy"] = sum(int(x) for x in cpu) - int(cpu[3]) - int(cpu[4])  # all but idle and iowait
    return ticks


def _cpu_report(
    before: dict[str, int], after: dict[str, int], client_s: float, requests: int, seconds: float
) -> dict[str, float]:
    """CPU milliseconds per request by party, and how many cores everything else on the machine used."""
    hz = os.sysconf("SC_CLK_TCK")
    used = {k: (after[k] - before[k]) * 1000 / hz for k in before}
    ours = used["web"] + used["database"] + client_s * 1000
    per = max(requests, 1)
    return {
        "web_ms_per_request": round(used["web"] / per, 2),
        "database_ms_per_request": round(used["database"] / per, 2),
        "client_ms_per_request": round(client_s * 1000 / per, 2),
        "other_processes_cores": round(max(0.0, used["machine_busy"] - ours) / 1000 / seconds, 2),
    }


def _closed_loop(
    cfg: dict[str, Any], seconds: float, method: str, path: str, body: bytes | None, headers: dict[str, str]
) -> dict[str, Any]:
    """``clients`` connections each sending the same request back to back until ``seconds`` are up."""
    port, clients = cfg["port"], cfg["clients"]
    start = threading.Barrier(clients + 1)
    results: list[tuple[list[float], int, str]] = []
    lock = threading.Lock()
    deadline = 0.0

    def client() -> None:
        conn = http.client.HTTPConnection(HOST, port, timeout=60)
        latencies: list[float] = []
        errors, first_error = 0, ""
        start.wait()
        while time.perf_counter() < deadline:
            t0 = time.perf_counter()
            try:
                conn.request(method, path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as exc:
                errors += 1
                first_error = first_error or repr(exc)
                conn.close()
                conn = http.client.HTTPConnection(HOST, port, timeout=60)
                continue
            latencies.append(time.perf_counter() - t0)
            if response.status >= 300:
                errors += 1
                first_error = first_error or f"{response.status} {data[:200]!r}"
        conn.close()
        with lock:
            results.append((latencies, errors, first_error))

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for thread in threads:
        thread.start()
    cpu_before, client_before = _cpu_ticks(cfg["server_pid"], cfg["database"]), time.process_time()
    began = time.perf_counter()
    deadline = began + seconds
    start.wait()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu_after, client_s = _cpu_ticks(cfg["server_pid"], cfg["database"]), time.process_time() - client_before
    latencies = [x for lat, _, _ in results for x in lat]
    errors = sum(e for _, e, _ in results)
    return {
        "requests": len(latencies),
        "errors": errors,
        "first_error": next((f for _, _, f in results if f), None),
        "seconds": round(elapsed, 2),
        "per_s": round((len(latencies) - errors) / elapsed, 1) if elapsed else 0.0,
        **_summary(latencies),
        "cpu": _cpu_report(cpu_before, cpu_after, client_s, len(latencies), elapsed),
    }


def _get(conn: http.client.HTTPConnection, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    conn.request("GET", path, headers=headers)
    response = conn.getresponse()
    return response.status, response.read()


def _path_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def _time_gets(port: int, path: str, headers: dict[str, str], repeat: int) -> dict[str, Any]:
    """One connection, ``repeat`` sequential GETs of ``path``: latency with nothing else in flight."""
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    status, _ = _get(conn, path, headers)  # warm this worker's connection and caches
    latencies, errors = [], 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        status, _ = _get(conn, path, headers)
        latencies.append(time.perf_counter() - t0)
        errors += status != 200
    conn.close()
    return {"path": path, "errors": errors, **_summary(latencies)}


def drive_submissions(cfg: dict[str, Any]) -> dict[str, Any]:
    """The load of single and array submissions; runs in its own process, away from the server's."""
    headers = {"Authorization": f"Token {cfg['member_key']}", "Content-Type": "application/json"}
    single = json.dumps(JOB).encode()
    array = json.dumps({**JOB, "name": "sweep", "array": cfg["array_size"]}).encode()
    if cfg["warmup"]:
        _closed_loop(cfg, cfg["warmup"], "POST", "/api/v1/jobs/", single, headers)
    out: dict[str, Any] = {}
    result = _closed_loop(cfg, cfg["seconds"], "POST", "/api/v1/jobs/", single, headers)
    per_s = result.pop("per_s")
    out["single"] = {"clients": cfg["clients"], **result, "submissions_per_s": per_s}
    if cfg["array_size"]:
        result = _closed_loop(cfg, cfg["seconds"], "POST", "/api/v1/jobs/", array, headers)
        per_s = result.pop("per_s")
        out["arrays"] = {
            "clients": cfg["clients"],
            "array_size": cfg["array_size"],
            **result,
            "requests_per_s": per_s,
            "jobs_per_s": round(per_s * cfg["array_size"], 1),
        }
    return out


def drive_lists(cfg: dict[str, Any]) -> dict[str, Any]:
    """Latency of the job list pages, one request at a time; runs in its own process."""
    port, repeat = cfg["port"], cfg["list_requests"]
    admin = {"Authorization": f"Token {cfg['admin_key']}", "Accept": "application/json"}
    member = {"Authorization": f"Token {cfg['member_key']}", "Accept": "application/json"}
    conn = http.client.HTTPConnection(HOST, port, timeout=60)
    depth = cfg["deep_offset"]
    status, body = _get(conn, f"/api/v1/jobs/?offset={depth}&limit=50", admin)
    if status != 200:
        raise RuntimeError(f"GET /api/v1/jobs/?offset={depth}: {status} {body[:200]!r}")
    deep_next = json.loads(body)["next"]
    conn.close()
    out = {
        "first_page": _time_gets(port, "/api/v1/jobs/", admin, repeat),
        "deep_page_by_cursor": _time_gets(port, _path_of(deep_next), admin, repeat) if deep_next else None,
        "deep_page_by_offset": _time_gets(port, f"/api/v1/jobs/?offset={depth + 50}&limit=50", admin, repeat),
        "filtered_team_state": _time_gets(port, "/api/v1/jobs/?team=training&state=completed", admin, repeat),
        "filtered_pending": _time_gets(port, "/api/v1/jobs/?state=pending&limit=200", admin, repeat),
        "member_first_page": _time_gets(port, "/api/v1/jobs/", member, repeat),
        "member_running": _time_gets(port, "/api/v1/jobs/?state=running", member, repeat),
        "console_jobs_page": _time_gets(port, "/jobs/", {"Cookie": cfg["session_cookie"]}, repeat),
    }
    if deep_next:
        out["deep_page_by_cursor"]["path"] = "/api/v1/jobs/?cursor=…&limit=50"
        out["deep_page_by_cursor"]["depth"] = depth + 50
    return out


# -- main ---------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.bench_http", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each load phase (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="untimed single submissions first (default 2 s)")
    parser.add_argument("--clients", type=int, default=6, help="concurrent keep-alive connections (default 6)")
    parser.add_argument("--jobs-in-db", type=int, default=100_000, help="history jobs written first (default 1e5)")
    parser.add_argument("--array-size", type=int, default=100, help="jobs per array submission; 0 skips arrays")
    parser.add_argument("--workers", type=int, default=max(2, os.cpu_count() or 2), help="gunicorn processes")
    parser.add_argument("--threads", type=int, default=3, help="threads per gunicorn process (default 3)")
    parser.add_argument("--worker-class", choices=("gthread", "sync"), default="gthread", help="gunicorn workers")
    parser.add_argument("--list-requests", type=int, default=50, help="timed requests per list page (default 50)")
    parser.add_argument("--database-url", help=f"where the scratch database goes (default: DATABASE_URL if it is "
                        f"PostgreSQL, else {DEFAULT_POSTGRES})")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="only the JSON on stdout")
    args = parser.parse_args(argv)
    for name in ("clients", "workers", "threads", "list_requests"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.jobs_in_db < 0 or not 0 <= args.array_size <= 1000:
        parser.error("--seconds > 0, --warmup >= 0, --jobs-in-db >= 0 and 0 <= --array-size <= 1000")

    def say(text: str) -> None:
        if not args.quiet:
            print(text, file=sys.stderr, flush=True)

    load_before = [round(x, 2) for x in os.getloadavg()]
    env_url = os.environ.get("DATABASE_URL", "")
    os.environ["DATABASE_URL"] = args.database_url or (
        env_url if env_url.startswith(("postgres://", "postgresql://")) else DEFAULT_POSTGRES
    )
    url = scratch_database_url("bench_http")
    var = Path(tempfile.mkdtemp(prefix="npuportal-bench-http-"))
    # The server and this process share a var dir (secret key, broker folders) apart from the user's own.
    os.environ["NPUPORTAL_VAR_DIR"] = str(var)
    os.environ["SECRET_KEY"] = secrets.token_urlsafe(40)
    os.environ["NPUPORTAL_CACHE_PREFIX"] = f"bench-http-{secrets.token_hex(4)}"
    os.environ["NPUPORTAL_PDF_WARMUP"] = "false"  # its CPU would land in a measured phase
    sys.path.insert(0, str(ROOT))
    server = None
    try:
        say(f"migrating {url.rsplit('/', 1)[-1]} …")
        setup_django(url)
        import logging

        logging.disable(logging.WARNING)
        from django.db import connection

        from scheduling.models import Job

        site = _site()
        say(f"writing {args.jobs_in_db} jobs of history …")
        t0 = time.perf_counter()
        _history(args.jobs_in_db, args.seed)
        history_s = time.perf_counter() - t0
        vendor = connection.vendor
        connection.close()

        port = _free_port()
        env = {
            **os.environ,
            "DATABASE_URL": url,
            # Throttling stays on; only this server's rates are out of the benchmark's way.
            "NPUPORTAL_THROTTLE_USER": "1000000/s",
            "NPUPORTAL_THROTTLE_ANON": "1000000/s",
            "LOG_LEVEL": "WARNING",
            "DEBUG": "false",
        }
        say(f"starting gunicorn on {HOST}:{port} ({args.workers} workers × {args.threads} threads) …")
        server = _start_server(env, port, args.workers, args.threads, args.worker_class, var / "gunicorn.log")
        health = _wait_healthy(port, server)
        cfg = {
            "port": port,
            "server_pid": server.pid,
            "database": connection.settings_dict["NAME"],
            "clients": args.clients,
            "seconds": args.seconds,
            "warmup": args.warmup,
            "array_size": args.array_size,
            "list_requests": args.list_requests,
            "deep_offset": max(0, min(args.jobs_in_db // 2, 50_000)),
            **site,
        }
        jobs_now = Job.objects.count()
        connection.close()
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            # Lists first, on the history alone: the submissions below add tens of thousands of
            # pending jobs that no tick ever starts, a queue no real cluster keeps.
            say(f"timing list pages with {jobs_now} jobs …")
            lists = pool.apply(drive_lists, (cfg,))
            say(f"driving submissions for {args.seconds:g} s per phase from {args.clients} connections …")
            load = pool.apply(drive_submissions, (cfg,))
    except BaseException:
        if server is not None and (var / "gunicorn.log").exists():
            print((var / "gunicorn.log").read_text()[-3000:], file=sys.stderr)
        raise
    finally:
        if server is not None:
            _stop_server(server)
        shutil.rmtree(var, ignore_errors=True)
    out = {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "load_avg_before": load_before},
        "database": vendor,
        "cache": "redis" if os.environ.get("REDIS_URL") else "filesystem",
        "server": {
            "workers": args.workers,
            "threads": args.threads if args.worker_class == "gthread" else 1,
            "worker_class": args.worker_class,
        },
        "healthz_database": health["database"],
        "history_jobs_written": args.jobs_in_db,
        "history_write_s": round(history_s, 1),
        **load,
        "lists": {"jobs_in_db": jobs_now, "requests_each": args.list_requests, **lists},
    }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
