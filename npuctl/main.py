"""``npuctl``: submit and watch jobs, see ended ones, quotas, nodes, usage and cost, manage the policy.

Exit codes (a contract with scripts):
  0 ok · 1 the API refused (bad input, not found) · 2 usage error (a bad option, ``--url``, ``--timeout``
  or ``$NPUPORTAL_URL``, a file that cannot be read or is not UTF-8) · 3 cannot reach the server, or a
  server error · 4 not signed in / not allowed · 5 ``logs`` printed less than the whole output (stderr
  says what it left out) · 130 interrupted (Ctrl-C) · 141 the reader of stdout
  went away (``npuctl queue | head``), as for a program stopped by SIGPIPE.

Human tables by default; ``--json`` prints the API's JSON as it came.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from npuctl import __version__
from npuctl.batch import ScriptError, read_script
from npuctl.client import ApiError, AuthFailed, Client, Refused, Unreachable
from npuctl.durations import format_duration, parse_duration, parse_moment
from npuctl.hostlist import compress
from npuctl.tables import Clock, table

#: Seconds between two asks of ``logs --follow`` when nothing new came.
FOLLOW_INTERVAL_S = 1.0
#: The server's bound of ``--tail`` (scheduling.services.output.MAX_TAIL_LINES).
MAX_TAIL_LINES = 10000

OK, REFUSED, USAGE, UNREACHABLE, AUTH, INCOMPLETE = 0, 1, 2, 3, 4, 5
INTERRUPTED, BROKEN_PIPE = 130, 141
#: The longest ``--timeout`` taken: a socket cannot wait for ever (``inf`` overflows the OS's clock).
MAX_TIMEOUT_S = 86400.0
ACTIVE_STATES = ["pending", "running"]
#: The states a job ends in (``npuctl history``), as the portal's Job.FINAL_STATES (Slurm's, in lower case).
ENDED_STATES = ["completed", "failed", "timeout", "out_of_memory", "node_fail", "cancelled", "preempted"]
STATES = [*ACTIVE_STATES, *ENDED_STATES]
#: ``npuctl history`` without ``--since``: the last day.
HISTORY_DEFAULT_SINCE = "1d"
_VERSION_REF = re.compile(r"^(v?\d+|active)$")


def _out(text: str = "") -> None:
    print(text, file=sys.stdout)


def _err(text: str) -> None:
    print(f"npuctl: {text}", file=sys.stderr)


def _json(data: Any) -> None:
    _out(json.dumps(data, indent=2, sort_keys=False))


def _duration(text: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be 1 or more")
    return value


def _array(text: str) -> int | str:
    """``--array``: a count (sent as a number), or Slurm's index list, which the server reads."""
    return _positive(text) if text.strip().isdigit() else text.strip()


def _tail_lines(text: str) -> int:
    if not text.isdigit() or int(text) > MAX_TAIL_LINES:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number from 0 to {MAX_TAIL_LINES}")
    return int(text)


def _job_id(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a job id (a number, as `npuctl queue` shows)")
    return int(text)


def check_url(text: str) -> str:
    """``text`` if it is an http(s) URL with a host (and a valid port), else ``ValueError`` saying why.

    Checked before any request, so ``--url not-a-url`` is a usage error and not urllib's traceback.
    """
    shape = f"{text!r} is not a server URL like http://127.0.0.1:8000 (http or https, and a host)"
    try:
        parts = urllib.parse.urlsplit(text.strip())
    except ValueError:
        raise ValueError(shape) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(shape)
    try:
        port = parts.port  # raises ValueError when not a number or out of range
    except ValueError:
        port = 0
    if port == 0:
        raise ValueError(f"{text!r}: the port must be a number from 1 to 65535")
    return text.strip()


def _url(text: str) -> str:
    try:
        return check_url(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 < value <= MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"{text!r} must be more than 0 and at most {MAX_TIMEOUT_S:g} seconds")
    return value


def _moment(text: str) -> str:
    """``--since``/``--until`` as typed, once it reads as a time (it is read on the policy's clock later)."""
    try:
        parse_moment(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc
    return text


def policy_zone(api: Client) -> tzinfo | None:
    """The policy's time zone, from ``GET /api/v1/clock/``; ``None`` (this computer's) when the server has none.

    Without a time zone database here (``zoneinfo`` finds no ``Asia/Shanghai``), the offset the
    server gives for now stands in, under the zone's short name.
    """
    try:
        clock = api.get("clock/")
        name = clock["timezone"]
        return ZoneInfo(name)
    except (ApiError, KeyError, TypeError):
        return None  # a server from before /clock/: times on this computer's clock, labelled with its zone
    except (ZoneInfoNotFoundError, ValueError):
        offset = str(clock.get("utc_offset") or "+00:00")
        sign = -1 if offset.startswith("-") else 1
        hours, _, minutes = offset.lstrip("+-").partition(":")
        delta = timedelta(hours=int(hours or 0), minutes=int(minutes or 0)) * sign
        return timezone(delta, str(clock.get("abbreviation") or name))


def _states(given: list[str] | None, allowed: list[str], default: list[str], extra: Sequence[str] = ()) -> list[str]:
    """``--state`` values, comma-separated or repeated; a usage error naming ``--state`` for one not allowed."""
    states = [s.strip() for group in (given or []) for s in group.split(",") if s.strip()] or default
    unknown = [s for s in states if s not in [*allowed, *extra]]
    if unknown:
        raise _UsageError(f"--state {unknown[0]!r}: one of {', '.join([*allowed, *extra])}")
    return states


def _month(text: str) -> str:
    if not re.fullmatch(r"\d{4}-\d{2}", text) or not 1 <= int(text[5:]) <= 12:
        raise argparse.ArgumentTypeError(f"{text!r} is not a month like 2026-11")
    return text


# -- commands ------------------------------------------------------------------


def _assignment(text: str) -> tuple[str, str]:
    """``--env NAME=VALUE``: split at the first ``=``; the server checks the name and the sizes."""
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return name, value


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The request fields the submit options on the command line set (those not given are left out)."""
    given: dict[str, Any] = {
        key: value
        for key, value in (
            ("name", args.name),
            ("num_devices", args.devices),
            ("team", args.team),
            ("chip_model", args.chip),
            ("vnpu_template", args.vnpu),
            ("priority_class", args.pclass),
            ("estimated_duration_s", args.time),
            ("max_duration_s", args.max_time),
            ("checkpoint_interval_s", args.checkpoint_interval),
            ("array", args.array),
            ("depends_on", args.dependency),
            ("cwd", args.chdir),
            ("output", args.output),
        )
        if value is not None
    }
    if args.env:
        given["env"] = dict(args.env)
    return given


def shell_command(argv: Sequence[str]) -> str:
    """The command line that runs ``argv`` exactly: each argument quoted as the shell needs (``shlex.join``).

    One argument alone is a command line already (``npuctl submit -- "python a.py > out.log"``) and is
    kept as it is; two or more are a program and its arguments, each kept whole, as ``srun`` keeps them.
    """
    if len(argv) == 1:
        return argv[0]
    return shlex.join(argv)


def cmd_submit(api: Client, args: argparse.Namespace) -> int:
    argv = list(args.argv or [])
    after_dashes = bool(argv) and argv[0] == "--"
    if after_dashes:
        argv = argv[1:]
    if argv and not args.command_text and not after_dashes and os.path.isfile(argv[0]):
        return _submit_script(api, args, argv[0], argv[1:])  # `npuctl submit job.sh`: a batch script
    command = args.command_text or shell_command(argv).strip()
    if not command:
        raise _UsageError("give the command with --command CMD or after `--`, e.g. npuctl submit -- python train.py")
    program = argv[0] if len(argv) > 1 and not args.command_text else command.split()[0]
    body: dict[str, Any] = {"name": os.path.basename(program)[:200] or "job", **_given(args)}
    body["command"] = command
    return _post_job(api, args, body)


def cmd_batch(api: Client, args: argparse.Namespace) -> int:
    """``npuctl batch job.sh [args]``: submit a batch script, its ``#NPU``/``#SBATCH`` directives read."""
    return _submit_script(api, args, args.script, args.script_args)


def _submit_script(api: Client, args: argparse.Namespace, path: str, script_args: Sequence[str]) -> int:
    try:
        text = read_text_file(path, "script")
        batch = read_script(text, script_args, name=os.path.basename(path), environ=os.environ)
    except ValueError as exc:  # unreadable, not UTF-8, or a directive that cannot be read (ScriptError)
        raise _UsageError(f"{path}: {exc}" if isinstance(exc, ScriptError) else str(exc)) from exc
    warning = batch.warning()
    if warning:
        _err(f"warning: {path}: {warning}")
    return _post_job(api, args, batch.request(_given(args)))


def _post_job(api: Client, args: argparse.Namespace, body: dict[str, Any]) -> int:
    created = api.post("jobs/", body)
    if args.json:
        _json(created)
        return OK
    jobs = created if isinstance(created, list) else [created]
    if body.get("array"):
        _out(f"submitted job array {jobs[0]['array_id']}: " + " ".join(str(j["id"]) for j in jobs))
    else:
        _out(f"submitted job {jobs[0]['id']} ({jobs[0]['state']})")
    return OK


def _dev(job: dict[str, Any]) -> str:
    if job.get("vnpu_template"):
        return f"{job['vnpu_template']}@{job.get('chip_model') or '?'}"
    chip = job.get("chip_model")
    return f"{job['num_devices']}x{chip}" if chip else str(job["num_devices"])


def _preempted(job: dict[str, Any], clock: Clock) -> str:
    """A running job's REASON: when it must be off its devices, if a preemption was decided."""
    deadline = job.get("preempt_deadline")
    return f"preempted, stops {clock.when(deadline)}" if job["state"] == "running" and deadline else ""


def _user(api: Client, args: argparse.Namespace) -> str | None:
    """``--user NAME``, or with ``--me`` the name the token is signed in as (``squeue --me``)."""
    if args.me:
        if args.user:
            raise _UsageError("give --user or --me, not both")
        return str(api.get("me/")["username"])
    return args.user


def cmd_queue(api: Client, args: argparse.Namespace) -> int:
    states = _states(args.state, STATES, ACTIVE_STATES, extra=["all"])
    params: dict[str, Any] = {"state": None if "all" in states else states, "team": args.team, "user": _user(api, args)}
    jobs = api.get_all("jobs/", limit=1000, **params)
    if api.truncated:  # a queue this long is read in part; say so rather than look complete
        _err(f"showing the first {len(jobs)} jobs only; narrow the list with --state, --team or --user")
    if args.json:
        _json(jobs)
        return OK
    rows = [
        (
            j["id"],
            j["name"][:24],
            j["team"],
            j["submitter"],
            j["priority_class"],
            _dev(j),
            j["state"],
            j["pending_reason"] if j["state"] == "pending" else _preempted(j, args.clock),
            args.clock.when(j.get("estimated_start")) if j["state"] == "pending" else "",
            compress(j.get("nodes") or []),
        )
        for j in sorted(jobs, key=lambda j: (j["state"] != "running", j["id"]))
    ]
    headers = ("JOBID", "NAME", "TEAM", "USER", "CLASS", "DEV", "STATE", "REASON", "EST_START", "NODELIST")
    _out(table(headers, rows, right=("JOBID",)))
    return OK


def elapsed(job: dict[str, Any]) -> str:
    """A job's last run, start to end, as sacct's Elapsed: ``1:02:03``, ``2-03:04:05`` past a day; ``0:00:00`` unrun."""
    start, end = job.get("started_at"), job.get("ended_at")
    seconds = 0
    if start and end:
        try:
            seconds = max(0, int((datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()))
        except ValueError:
            seconds = 0
    days, left = divmod(seconds, 86400)
    text = f"{left // 3600}:{left % 3600 // 60:02d}:{left % 60:02d}"
    return f"{days}-{left // 3600:02d}:{left % 3600 // 60:02d}:{left % 60:02d}" if days else text


def _without_zone(text: str) -> bool:
    """Whether ``text`` is a date or time with no offset (``2026-11-01``, ``...T08:00``), not ``now`` or ``7d``."""
    try:
        return datetime.fromisoformat(text.strip()).tzinfo is None
    except ValueError:
        return False


def _utc(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def cmd_history(api: Client, args: argparse.Namespace) -> int:
    """Ended jobs, like sacct: what ran, how long, how it ended, what it used."""
    if args.job is not None:
        return _job_runs(api, args)
    states = _states(args.state, ENDED_STATES, ENDED_STATES)
    clock: Clock = args.clock
    # Without --since: the day before --until (or before now), so `--until 3d` alone still shows a day.
    # Ordered on this computer's clock first (one zone for both: the same order), so a usage error asks nothing.
    until = parse_moment(args.until) if args.until is not None else None
    since = parse_moment(args.since) if args.since is not None else parse_moment(HISTORY_DEFAULT_SINCE, until)
    if until is not None and until <= since:
        raise _UsageError(f"--until ({args.until}) must be after --since ({args.since or HISTORY_DEFAULT_SINCE})")
    # A date or time without a zone is read on the clock times are printed on: the policy's (--utc: UTC).
    if args.until is not None and _without_zone(args.until):
        until = parse_moment(args.until, zone=clock.zone)
    if args.since is not None and _without_zone(args.since):
        since = parse_moment(args.since, zone=clock.zone)
    elif args.since is None:
        since = parse_moment(HISTORY_DEFAULT_SINCE, until)
    params: dict[str, Any] = {
        "state": states,
        "team": args.team,
        "user": _user(api, args),
        "ended_after": _utc(since),
        # The API's bound is exclusive; a whole second later keeps a job ending at --until itself.
        "ended_before": _utc(until + timedelta(seconds=1)) if until is not None else None,
    }
    jobs = api.get_all("jobs/", limit=1000, **params)
    if api.truncated:
        _err(f"showing the first {len(jobs)} jobs only; narrow the list with --since, --until, --state or --user")
    jobs.sort(key=lambda j: (j.get("ended_at") or "", j["id"]))
    if args.json:
        _json(jobs)
        return OK
    rows = [
        (
            j["id"],
            j["name"][:24],
            j["team"],
            j["state"],
            elapsed(j),
            j.get("exit_code"),
            f"{j['device_hours']:.2f}" if j.get("device_hours") is not None else None,
            clock.when(j.get("ended_at")),
        )
        for j in jobs
    ]
    headers = ("JOBID", "NAME", "TEAM", "STATE", "ELAPSED", "EXIT", "DEV_HOURS", "END")
    _out(table(headers, rows, right=("JOBID", "ELAPSED", "EXIT", "DEV_HOURS")))
    return OK


def _job_runs(api: Client, args: argparse.Namespace) -> int:
    """``history -j ID``: one job, a line per run, as ``sacct -j ID --duplicates``: a requeued run says
    how the system ended it (``node_fail``, ``preempted``), the last how the job ended."""
    if args.state or args.since or args.until or args.team or args.user or args.me:
        raise _UsageError("-j/--job shows one job's runs; it takes no --state, --since, --until, --team or --user")
    try:
        job = api.get(f"jobs/{args.job}/")
    except Refused as exc:
        if exc.status == 404:
            raise _Refusal(f"job {args.job}: not found (or not your team's)") from exc
        raise
    if args.json:
        _json(job.get("runs", []))
        return OK
    clock: Clock = args.clock
    rows = [
        (
            job["id"],
            run["attempt"],
            job["name"][:24],
            run["state"],
            elapsed(run),
            run["exit_code"],
            compress(run.get("nodes") or []),
            clock.when(run["started_at"]),
            clock.when(run["ended_at"]),
            run.get("exit_reason") or "",
        )
        for run in job.get("runs", [])
    ]
    if not rows:
        rows = [(job["id"], "", job["name"][:24], job["state"], "", None, "", "", clock.when(job["ended_at"]), "")]
    headers = ("JOBID", "RUN", "NAME", "STATE", "ELAPSED", "EXIT", "NODELIST", "START", "END", "HOW")
    _out(table(headers, rows, right=("JOBID", "RUN", "ELAPSED", "EXIT")))
    return OK


def cmd_resubmit(api: Client, args: argparse.Namespace) -> int:
    """A new job with the same spec as an earlier one, queued now (the API's ``{id}/resubmit/``)."""
    try:
        copy = api.post(f"jobs/{args.job}/resubmit/")
    except Refused as exc:
        if exc.status == 404:
            raise _Refusal(f"job {args.job}: not found (or not your team's)") from exc
        raise
    if args.json:
        _json(copy)
        return OK
    _out(f"submitted job {copy['id']} ({copy['state']}), a copy of job {args.job}")
    return OK


def cmd_cancel(api: Client, args: argparse.Namespace) -> int:
    worst = OK
    results = []
    for job_id in args.jobs:
        try:
            job = api.post(f"jobs/{job_id}/cancel/")
        except (Refused, AuthFailed) as exc:
            _err(f"job {job_id}: " + ("not found (or not your team's)" if exc.status == 404 else str(exc)))
            worst = max(worst, AUTH if isinstance(exc, AuthFailed) else REFUSED)
            continue
        results.append(job)
        if not args.json:
            _out(f"cancelled job {job_id}")
    if args.json:
        _json(results)
    return worst


def runs_as(job: dict[str, Any]) -> str:
    """The account as the node agents reported it (``ran_as``), and the one asked for when they differ."""
    asked = job.get("posix_user") or ""
    ran = job.get("ran_as") or ""
    if not ran:
        return f"{asked} (asked for; not reported by the cluster yet)" if asked else ""
    return ran if not asked or ran == asked else f"{ran} (as the cluster reported; asked for {asked})"


def cmd_show(api: Client, args: argparse.Namespace) -> int:
    try:
        job = api.get(f"jobs/{args.job}/")
    except Refused as exc:
        if exc.status == 404:
            raise Refused(f"job {args.job}: not found (or not your team's)", 404) from exc
        raise
    if args.json:
        _json(job)
        return OK
    clock: Clock = args.clock
    fields = [
        ("job", f"{job['id']} {job['name']}"),
        (
            "state",
            job["state"]
            + (f" ({job['exit_reason']})" if job.get("exit_reason") else "")
            + (
                f" (exit {job['exit_code']})" if job.get("exit_code") is not None and not job.get("exit_reason") else ""
            ),
        ),
        ("team / user", f"{job['team']} / {job['submitter']}"),
        ("class", job["priority_class"]),
        ("devices", _dev(job)),
        ("command", job["command"]),
        (
            "time",
            f"estimated {format_duration(job['estimated_duration_s'])}, max {format_duration(job['max_duration_s'])}"
            + (
                f", checkpoints every {format_duration(job['checkpoint_interval_s'])}"
                if job.get("checkpoint_interval_s")
                else ""
            ),
        ),
        ("submitted", clock.when(job["submitted_at"], seconds=True)),
        ("started", clock.when(job["started_at"], seconds=True)),
        ("ended", clock.when(job["ended_at"], seconds=True)),
    ]
    if job["state"] == "pending":
        reason = job["pending_reason"] + (f": {job['pending_reason_text']}" if job.get("pending_reason_text") else "")
        fields.append(("waiting", reason + (f" ({job['pending_detail']})" if job.get("pending_detail") else "")))
        fields.append(("est. start", clock.when(job.get("estimated_start"))))
    if job["state"] == "running" and job.get("preempt_deadline"):
        fields.append(
            (
                "preempted",
                f"must be off its devices by {clock.when(job['preempt_deadline'], seconds=True)} "
                "(called off if no waiting job needs them by then)",
            )
        )
    if job.get("array_id"):
        limit = f", at most {job['array_limit']} at once" if job.get("array_limit") else ""
        fields.append(("array", f"{job['array_id']}[{job['array_index']}]{limit}"))
    if job.get("depends_on"):
        fields.append(("depends on", job["depends_on"]))
    if job.get("ran_as") or job.get("posix_user"):
        fields.append(("runs as", runs_as(job)))
    if job.get("cwd"):
        fields.append(("chdir", job["cwd"]))
    if job.get("output"):
        fields.append(("output", job["output"]))
    for name, value in sorted((job.get("env") or {}).items()):
        fields.append(("env", f"{name}={value}"))
    width = max(len(k) for k, _ in fields)
    for key, value in fields:
        # A command of several lines (a batch script) is printed whole, each line under the first.
        _out(f"{key:<{width}}  " + str(value).rstrip("\n").replace("\n", "\n" + " " * (width + 2)))
    _out()
    _out("events:")
    _out(
        table(
            ("RECORDED", "FROM", "TO", "REASON", "DETAIL", "REPORTED"),
            [
                (
                    clock.when(e.get("recorded_at") or e["at"], seconds=True),
                    e["from_state"],
                    e["to_state"],
                    e["reason"],
                    e["detail"],
                    clock.when(e["reported_at"], seconds=True) if e.get("reported_at") else "",
                )
                for e in job["events"]  # in the order the portal recorded them
            ],
        )
    )
    if job["allocations"]:
        _out()
        _out("allocations:")
        _out(
            table(
                ("NODE", "DEVICE", "CHIP", "SLICE", "SHARE", "START", "END"),
                [
                    (
                        a["node"],
                        a["device_index"],
                        a["chip_model"],
                        a["vnpu_template"],
                        a["device_share"],
                        clock.when(a["start"], seconds=True),
                        clock.when(a["end"], seconds=True),
                    )
                    for a in job["allocations"]
                ],
            )
        )
    return OK


def _my_team(api: Client, team: str | None, *, leads_only: bool = False) -> list[str]:
    if team:
        return [team]
    teams = api.get_all("teams/")
    if leads_only:
        led = [t["name"] for t in teams if t.get("my_role") in ("lead", "admin")]
        if led:
            return led
    if len(teams) == 1 or (teams and leads_only):
        return [teams[0]["name"]]
    if not teams:
        raise _Refusal("you belong to no team")
    raise _UsageError("you are in several teams; name one with --team (" + ", ".join(t["name"] for t in teams) + ")")


def _number(value: Any) -> str:
    if value is None:
        return "-"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def cmd_logs(api: Client, args: argparse.Namespace) -> int:
    """Print a job's whole output, page after page; with ``--follow``, keep printing until the run ends.

    The output printed is all of it, or stderr says what was left out and the exit code is
    :data:`INCOMPLETE`: the start of a run whose node is gone (only its end is kept), a node that
    did not answer. A run still going has printed all it wrote so far (stderr says it goes on).
    """
    params: dict[str, object] = {}
    if args.attempt:
        params["attempt"] = args.attempt
    if args.node:
        params["node"] = args.node
    query = {**params, "tail": args.tail} if args.tail is not None else {**params, "offset": 0}
    pages: list[dict[str, Any]] = []
    left_out: list[str] = []
    told_nodes = False
    while True:
        try:
            chunk = api.get(f"jobs/{args.job}/log/", **query)
        except Refused as exc:
            if exc.status == 404:
                raise _Refusal(f"job {args.job}: not found (or not your team's)") from exc
            raise
        asked = query.get("offset")
        if isinstance(asked, int) and chunk["offset"] > asked:  # the answer starts later than asked: a gap
            left_out.append(_gap(args.job, chunk, asked))
        if chunk.get("source") == "none" and chunk.get("note"):
            left_out.append(f"job {args.job}: output from byte {chunk['offset']} on could not be read: {chunk['note']}")
        elif chunk.get("note") and not args.json:
            _err(f"job {args.job}: {chunk['note']}")
        if not told_nodes and not args.node and len(chunk.get("nodes") or []) > 1 and not args.json:
            others = ", ".join(n for n in chunk["nodes"] if n != chunk["node"])
            count = len(chunk["nodes"])
            _err(
                f"job {args.job}: run {chunk['attempt']} ran on {count} nodes; this is {chunk['node']}'s output "
                f"(--node for {others})"
            )
            told_nodes = True
        pages.append(chunk)
        if args.json and args.follow:
            _json(chunk)
        elif chunk["data"] and not args.json:
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
        if chunk["complete"]:
            break
        progressed = chunk["next_offset"] > chunk["offset"]
        if not args.follow:
            at_end = chunk.get("size") is not None and chunk["next_offset"] >= chunk["size"]
            if args.tail is not None or at_end or not progressed:
                if chunk.get("attempt") and not left_out and not args.json:
                    _err(
                        f"job {args.job}: run {chunk['attempt']} is still going; this is its output so far (-f follows)"
                    )
                break
        elif not progressed:
            time.sleep(FOLLOW_INTERVAL_S)  # nothing new yet
        # Keep to the run being read: a requeued job's next run is a new attempt.
        query = {**params, "attempt": chunk["attempt"] or "", "offset": chunk["next_offset"]}
        if not query["attempt"]:
            del query["attempt"]
    if args.json and not args.follow:
        _json({**pages[-1], "offset": pages[0]["offset"], "data": "".join(p["data"] for p in pages)})
    for line in left_out:
        _err(line)
    return INCOMPLETE if left_out else OK


def _gap(job: int, chunk: dict[str, Any], asked: int) -> str:
    """What a gap in a run's output was, in words: which bytes, and why when the answer says."""
    where = f"run {chunk.get('attempt')} on {chunk.get('node')}" if chunk.get("node") else "the run"
    why = (
        f" ({chunk['note']})"
        if chunk.get("note")
        else " (only the end of a run's output is kept once its node has it no more)"
    )
    return f"job {job}: bytes {asked} to {chunk['offset']} of {where}'s output were left out{why}"


def cmd_quota(api: Client, args: argparse.Namespace) -> int:
    action = getattr(args, "quota_cmd", None)
    if action == "request":
        return _quota_request(api, args)
    if action == "requests":
        return _quota_requests(api, args)
    (name,) = _my_team(api, args.team)
    team = api.get(f"teams/{name}/")
    if args.json:
        _json(team)
        return OK
    quota = team["quota"]
    version = quota.get("policy_version")
    at = args.clock.when(quota["at"])  # on the policy's clock, labelled, as every time npuctl prints
    _out(
        f"team {name}: schedule {quota['schedule'] or '(base)'} in force at {at}, "
        f"policy v{version if version is not None else '-'}"
    )
    keys = sorted({*quota["guaranteed"], *quota["max"], *quota["in_use"]}, key=lambda k: (k != "devices", k))
    rows = [
        (
            key,
            _number(quota["guaranteed"].get(key)),
            _number(quota["max"].get(key)) if key in quota["max"] else "no cap",
            _number(quota["in_use"].get(key, 0)),
        )
        for key in keys
    ]
    _out(table(("RESOURCE", "GUARANTEED", "MAX", "USED NOW"), rows, right=("GUARANTEED", "MAX", "USED NOW")))
    extra = []
    if quota.get("maxConcurrentJobs") is not None:
        extra.append(f"max concurrent jobs {quota['maxConcurrentJobs']}")
    if quota.get("maxJobDuration"):
        extra.append(f"max job duration {quota['maxJobDuration']}")
    if quota.get("deviceHoursPerMonth") is not None:
        extra.append(f"device-hours per month {_number(quota['deviceHoursPerMonth'])}")
    classes = quota.get("allowedPriorityClasses")
    extra.append("classes " + (", ".join(classes) if classes else "all"))
    _out("; ".join(extra))
    return OK


def _quota_request(api: Client, args: argparse.Namespace) -> int:
    field = "max" if args.max else "guaranteed"
    spec = args.max or args.guaranteed
    chip, sep, change = spec.partition("=")
    if not sep or not chip.strip() or not change.strip():
        raise _UsageError(f"--{field}: CHIP=CHANGE, e.g. 910B4=+16 or devices=-8; got {spec!r}")
    chip = chip.strip()
    resource = chip if chip == "devices" or chip.startswith("devices/") else f"devices/{chip}"
    team = _my_team(api, args.request_team or args.team, leads_only=True)[0]
    body = {
        "team": team,
        "field": field,
        "resource": resource,
        "change": change.strip(),
        "first_day": args.first_day,
        "last_day": args.last_day,
        "justification": args.reason,
    }
    filed = api.post("quota-requests/", body)
    if getattr(args, "json", False):
        _json(filed)
        return OK
    _out(f"quota request #{filed['id']} filed for {filed['team']}: {filed['summary']}; an admin decides on it")
    return OK


def _quota_requests(api: Client, args: argparse.Namespace) -> int:
    rows = api.get_all("quota-requests/")
    if getattr(args, "json", False):
        _json(rows)
        return OK
    _out(
        table(
            ("ID", "TEAM", "CHANGE", "BY", "STATE", "POLICY"),
            [
                (
                    str(r["id"]),
                    r["team"],
                    r["summary"],
                    r["requested_by"],
                    r["state"] + (f": {r['decision_note']}" if r["state"] == "refused" else ""),
                    f"v{r['policy_version']}" if r.get("policy_version") else "-",
                )
                for r in rows
            ],
        )
    )
    return OK


def cmd_team(api: Client, args: argparse.Namespace) -> int:
    """The team's members (leads and admins), and the lead's changes: add, set, remove."""
    action = getattr(args, "team_cmd", None)
    (name,) = _my_team(api, args.member_team or args.team, leads_only=True)
    path = f"teams/{urllib.parse.quote(name)}/members/"
    if action is None:
        members = api.get(path)
        if getattr(args, "json", False):
            _json(members)
            return OK
        rows = [(m["username"], m["full_name"] or "-", m["role"], m["limits"]) for m in members]
        _out(f"team {name}")
        _out(table(("USER", "NAME", "ROLE", "LIMITS"), rows))
        return OK
    if action == "add":
        done = api.post(path, {"who": args.who, "role": args.role})
    elif action == "remove":
        done = api.delete(f"{path}{urllib.parse.quote(args.user)}/")
    else:
        body: dict[str, Any] = {}
        if args.role:
            body["role"] = args.role
        for flag, key in ((args.max_devices, "max_devices"), (args.max_jobs, "max_jobs")):
            if flag is not None:
                body[key] = None if flag.strip().lower() in ("none", "") else flag.strip()
        if not body:
            raise _UsageError("team set: give --role, --max-devices or --max-jobs")
        done = api.patch(f"{path}{urllib.parse.quote(args.user)}/", body)
    if getattr(args, "json", False):
        _json(done)
        return OK
    _out(done["detail"])
    return OK


def cmd_nodes(api: Client, args: argparse.Namespace) -> int:
    nodes = api.get_all("nodes/")
    if args.json:
        _json(nodes)
        return OK
    rows = [
        (
            n["name"],
            n["state"] if n["reachable"] else f"{n['state']}*",
            ",".join(n["chip_models"]),
            n["devices_total"],
            n["devices_free"],
            n["devices_busy"],
            n["devices_unhealthy"],
        )
        for n in nodes
    ]
    _out(
        table(
            ("NODE", "STATE", "CHIP", "TOTAL", "FREE", "BUSY", "UNHEALTHY"),
            rows,
            right=("TOTAL", "FREE", "BUSY", "UNHEALTHY"),
        )
    )
    if any(not n["reachable"] for n in nodes):
        _out("* agent not answering")
    return OK


def cmd_usage(api: Client, args: argparse.Namespace) -> int:
    names = _my_team(api, args.team, leads_only=True)
    results = [api.get(f"teams/{name}/usage/", month=args.month) for name in names]
    if args.json:
        _json(results if len(results) > 1 or not args.team else results[0])
        return OK
    rows = []
    notes = []
    for usage in results:
        cost = usage.get("cost") or {}  # a server from before costs has none
        by_chip = cost.get("by_chip") or {}
        currency = cost.get("currency") or ""
        for chip in sorted({*usage["device_hours"], *by_chip}):
            hours = usage["device_hours"].get(chip)
            rows.append(
                (
                    usage["team"],
                    usage["month"],
                    chip,
                    f"{hours:.1f}" if hours is not None else None,
                    by_chip.get(chip) if cost else None,
                )
            )
        budget = usage.get("device_hours_per_month")
        total = f"{usage['total_device_hours']:.1f}" + (f" of {_number(budget)}" if budget is not None else "")
        amount = f"{cost['amount']} {currency}".strip() if cost else None
        rows.append((usage["team"], usage["month"], "total", total, amount))
        if cost:
            basis = (
                "its closed statement"
                if cost.get("basis") == "statement"
                else "usage so far, running jobs up to now; idle and reservation shares come at the monthly close"
            )
            notes.append(f"cost of {usage['team']} in {usage['month']}: {amount} ({basis})")
            notes.extend(f"warning: {w}" for w in cost.get("warnings") or [])
    _out(table(("TEAM", "MONTH", "CHIP", "DEVICE-HOURS", "COST"), rows, right=("DEVICE-HOURS", "COST")))
    if len(results) == 1:
        _out(f"running jobs {results[0]['running_jobs']}, pending jobs {results[0]['pending_jobs']}")
    for note in notes:
        _out(note)
    return OK


def read_text_file(path: str, what: str = "policy file") -> str:
    """The file's text; ``ValueError`` naming the file when it cannot be read or is not UTF-8.

    Read as bytes and decoded here, so the message can say which byte is wrong and where.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{what} {path} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        ) from None


def _read(path: str) -> str:
    try:
        return read_text_file(path)
    except ValueError as exc:
        raise _UsageError(str(exc)) from exc


def _print_issues(issues: list[dict[str, Any]]) -> None:
    for issue in issues:
        where = f" (line {issue['line']})" if issue.get("line") else ""
        path = f"{issue['path']}: " if issue.get("path") else ""
        _out(f"{issue['severity']}: {path}{issue['message']}{where}")


def cmd_policy_validate(api: Client, args: argparse.Namespace) -> int:
    result = api.post("policies/validate/", {"yaml": _read(args.file)})
    if args.json:
        _json(result)
    else:
        _print_issues(result["issues"])
        errors = sum(1 for i in result["issues"] if i["severity"] == "error")
        warnings = len(result["issues"]) - errors
        _out(f"invalid: {errors} error(s), {warnings} warning(s)" if errors else f"valid ({warnings} warning(s))")
    return OK if result["valid"] else REFUSED


def _invalid_policy(exc: Refused) -> int:
    issues = (exc.body or {}).get("details", {}).get("issues") if isinstance(exc.body, dict) else None
    if issues:
        _print_issues(issues)
    _err(str(exc))
    return REFUSED


def cmd_policy_apply(api: Client, args: argparse.Namespace) -> int:
    text = _read(args.file)
    if args.dry_run:
        try:
            result = api.post("policies/dry-run/", {"yaml": text, "days": args.days})
        except Refused as exc:
            return _invalid_policy(exc)
        if args.json:
            _json(result)
            return OK
        _print_issues(result["issues"])
        _out("changes:")
        for change in result["changes"] or ["(none)"]:
            _out(f"  {change}")
        _out(f"dry run over {result['source']}: {result['jobs']} job(s)")
        rows = []
        for team, d in result["comparison"]["teams"].items():
            keys = ("device_hours", "wait_p50_s", "wait_p95_s", "not_started", "preemptions")
            rows.append((team, *(_arrow(d[k]) if k in d else "-" for k in keys)))
        _out(table(("TEAM", "DEVICE-HOURS", "WAIT P50 (S)", "WAIT P95 (S)", "NOT STARTED", "PREEMPTIONS"), rows))
        _out("dry run: nothing was stored")
        return OK
    if not (args.comment or "").strip():
        raise _UsageError("apply needs --comment saying why (it is kept in the history); or use --dry-run")
    try:
        created = api.post("policies/", {"yaml": text, "comment": args.comment})
    except Refused as exc:
        return _invalid_policy(exc)
    if args.json:
        _json(created)
        return OK
    _print_issues(created["issues"])
    _out(f"applied as v{created['version']} (active from the next tick)")
    for change in created["changes"]:
        _out(f"  {change}")
    return OK


def _arrow(cell: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))

    delta = cell.get("delta")
    sign = "+" if isinstance(delta, int | float) and delta > 0 else ""
    return f"{fmt(cell.get('a'))} → {fmt(cell.get('b'))} ({sign}{fmt(delta)})"


def cmd_policy_diff(api: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    for side, ref in (("a", args.a), ("b", args.b)):
        if _VERSION_REF.match(ref) and not os.path.exists(ref):
            body[side] = ref
        else:
            body[f"{side}_yaml"] = _read(ref)
    try:
        result = api.post("policies/diff/", body)
    except Refused as exc:
        return _invalid_policy(exc)
    if args.json:
        _json(result)
        return OK
    lines = result["changes"]
    a = args.a if "a_yaml" in body else result["a"]
    b = args.b if "b_yaml" in body else result["b"]
    _out(f"{a} → {b}: " + (f"{len(lines)} change(s)" if lines else "no change in meaning"))
    for line in lines:
        _out(f"  {line}")
    if result["diff"]:
        _out(result["diff"].rstrip("\n"))
    return OK


# -- the parser ------------------------------------------------------------------


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """argparse, whose usage errors are one line (``npuctl submit: error: ...``) rather than the usage too.

    ``npuctl COMMAND --help`` still prints the usage; an error names the option and the reason only.
    """

    def error(self, message: str) -> Any:
        self.exit(USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Refusal(Exception):
    pass


def _submit_options(p: argparse.ArgumentParser) -> None:
    """The options of ``submit`` and ``batch``; ``batch`` takes them over the script's directives."""
    p.add_argument("--name", help="job name (default: the command's program name, or the script's file name)")
    p.add_argument("--devices", "-n", type=_positive, metavar="N", help="whole cards (default 1)")
    p.add_argument("--chip", metavar="MODEL", help="chip model, e.g. 910B4")
    p.add_argument("--vnpu", metavar="TEMPLATE", help="a vNPU slice instead of whole cards, e.g. vir02")
    p.add_argument("--class", dest="pclass", metavar="CLASS", help="priority class (default: the policy's default)")
    p.add_argument("--time", "-t", type=_duration, metavar="DURATION", help="estimated run time, e.g. 2h (default 1h)")
    p.add_argument("--max-time", type=_duration, metavar="DURATION", help="hard limit, e.g. 1d")
    p.add_argument(
        "--checkpoint-interval",
        type=_duration,
        metavar="DURATION",
        help="the job saves its state this often, e.g. 30m: preempted, it loses only the work since the last save",
    )
    p.add_argument("--team", help="team (needed when you are in several)")
    p.add_argument(
        "--array",
        "-a",
        type=_array,
        metavar="N|INDICES",
        help="a job array: N copies indexed 0..N-1, or Slurm's indices: 0-15, 1,3,5, 0-15%%4 (at most 4 at once)",
    )
    p.add_argument(
        "--dependency",
        "-d",
        metavar="TYPE:JOB[:JOB...]",
        help="wait for other jobs, as Slurm's: afterok:12, afterany:12:13, afternotok:A14 (an array), comma-joined",
    )
    p.add_argument(
        "--env",
        action="append",
        type=_assignment,
        metavar="NAME=VALUE",
        help="a variable for the job's environment (repeatable); the job starts with no other of yours",
    )
    p.add_argument("--chdir", "-D", metavar="DIR", help="absolute directory to start in on the nodes (default: home)")
    p.add_argument("--output", "-o", metavar="FILE", help="absolute path of a file the output is also appended to")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="npuctl",
        description="Command line of npuportal. Reads NPUPORTAL_URL (default http://127.0.0.1:8000) "
        "and NPUPORTAL_TOKEN (an API token: make one with POST /api/v1/tokens/ or in the console).",
        epilog="exit codes: 0 ok, 1 refused by the API, 2 usage error, 3 server unreachable or failing, "
        "4 not signed in or not allowed, 5 output incomplete (logs), 130 interrupted, "
        "141 stdout closed early (e.g. | head)",
    )
    parser.add_argument("--version", action="version", version=f"npuctl {__version__}")
    parser.add_argument("--url", type=_url, help="server URL (default $NPUPORTAL_URL or http://127.0.0.1:8000)")
    parser.add_argument("--token", help="API token (default $NPUPORTAL_TOKEN)")
    parser.add_argument(
        "--timeout", type=_timeout, default=30.0, help="seconds to wait for the server, more than 0 (default 30)"
    )
    parser.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    parser.add_argument(
        "--utc",
        action="store_true",
        help="print times as ISO 8601 in UTC (2026-12-03T01:15:00Z), and read dates without a zone in UTC; "
        "default: on the policy's clock, labelled (12-03 09:15 CST), as the console shows them",
    )
    parser.set_defaults(clock=Clock())  # main() gives the policy's; a handler called alone prints local times
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(
        name: str, handler: Callable[[Client, argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
        p.add_argument("--utc", action="store_true", default=argparse.SUPPRESS, help="times in UTC, ISO 8601")
        p.set_defaults(handler=handler)
        return p

    p = command("submit", cmd_submit, "submit a job (or an array of N jobs); a script file is submitted as by batch")
    p.add_argument("--command", dest="command_text", metavar="CMD", help="the command line to run")
    _submit_options(p)
    p.add_argument(
        "argv",
        nargs=argparse.REMAINDER,
        metavar="-- COMMAND",
        help="the program and its arguments after --, each kept exactly (one argument: a command line); "
        "or a script file and its arguments",
    )

    p = command("batch", cmd_batch, "submit a batch script: its #NPU and #SBATCH directives are read, like sbatch")
    _submit_options(p)
    p.add_argument("script", metavar="SCRIPT", help="the script file; it runs by its #! interpreter (default bash)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments")

    p = command("queue", cmd_queue, "pending and running jobs, like squeue")
    p.add_argument("--state", action="append", metavar="STATE", help="state(s), comma-separated or repeated; 'all'")
    p.add_argument("--team")
    p.add_argument("--user", "-u", metavar="USER", help="jobs this user submitted")
    p.add_argument("--me", action="store_true", help="your own jobs (the token's user)")

    p = command("history", cmd_history, "ended jobs: elapsed time, state, exit code, device-hours; like sacct")
    p.add_argument(
        "--since",
        type=_moment,
        metavar="WHEN",
        help="ended at or after WHEN: 2026-11-01, 2026-11-01T08:00, or a time ago like 7d, 12h "
        "(default: a day before --until)",
    )
    p.add_argument("--until", type=_moment, metavar="WHEN", help="ended at or before WHEN (same forms; default now)")
    p.add_argument(
        "--state", action="append", metavar="STATE", help=f"{', '.join(ENDED_STATES)}; comma-separated or repeated"
    )
    p.add_argument("--team")
    p.add_argument("--user", "-u", metavar="USER", help="jobs this user submitted")
    p.add_argument("--me", action="store_true", help="your own jobs (the token's user)")
    p.add_argument(
        "--job",
        "-j",
        type=_job_id,
        metavar="JOB",
        help="one job, a line per run (a requeued run says node_fail or preempted), like sacct -j --duplicates",
    )

    p = command("cancel", cmd_cancel, "cancel jobs")
    p.add_argument("jobs", nargs="+", type=_job_id, metavar="JOB")

    p = command("resubmit", cmd_resubmit, "submit a new job with the same spec as an earlier one")
    p.add_argument("job", type=_job_id, metavar="JOB")

    p = command("show", cmd_show, "one job: details, events and allocations")
    p.add_argument("job", type=_job_id, metavar="JOB")

    p = command("logs", cmd_logs, "a job's output; --follow prints more as it comes, like kubectl logs -f")
    p.add_argument("job", type=_job_id, metavar="JOB")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until the run ends")
    p.add_argument("--tail", type=_tail_lines, metavar="N", help="start with the last N lines")
    p.add_argument("--attempt", type=_positive, metavar="K", help="an earlier run (1: the first start)")
    p.add_argument("--node", metavar="NAME", help="one node of a multi-node run (default: its first)")

    p = command("quota", cmd_quota, "your team's quota in force now and what it uses; ask for a change")
    p.add_argument("--team")
    qsub = p.add_subparsers(dest="quota_cmd", required=False, metavar="ACTION")
    q = qsub.add_parser(
        "request",
        help="ask for more (or fewer) cards for a period (team leads)",
        description="Ask for a change of your team's guaranteed or maximum cards for a period; an admin decides. "
        'Example: npuctl quota request --max 910B4=+16 --from 2026-12-10 --until 2026-12-20 --reason "paper deadline"',
    )
    q.add_argument("--team", dest="request_team", help="default: the team you lead")
    which = q.add_mutually_exclusive_group(required=True)
    which.add_argument("--max", metavar="CHIP=CHANGE", help="maximum cards: 910B4=+16, devices=+8")
    which.add_argument("--guaranteed", metavar="CHIP=CHANGE", help="guaranteed cards: 910B4=+4, devices=-2")
    q.add_argument("--from", dest="first_day", required=True, metavar="YYYY-MM-DD", help="first day")
    q.add_argument("--until", dest="last_day", required=True, metavar="YYYY-MM-DD", help="last day, included")
    q.add_argument("--reason", required=True, help="why; the admin decides on it")
    q.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
    q = qsub.add_parser("requests", help="your teams' quota requests and what was decided")
    q.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")

    p = command("team", cmd_team, "your team's members, roles and limits; add, set or remove one (team leads)")
    p.add_argument("--team")
    tsub = p.add_subparsers(dest="team_cmd", required=False, metavar="ACTION")
    t = tsub.add_parser("add", help="add an account by username, or invite an e-mail address")
    t.add_argument("who", metavar="USER_OR_EMAIL")
    t.add_argument("--role", choices=("member", "lead"), default="member", help="default member")
    t = tsub.add_parser(
        "set",
        help="a member's role or limits",
        description="Change a member's role or limits; a limit left out stays, 'none' lifts it. "
        "Example: npuctl team set ann --max-devices 4 --max-jobs none",
    )
    t.add_argument("user", metavar="USER")
    t.add_argument("--role", choices=("member", "lead"))
    t.add_argument("--max-devices", metavar="N", help="cards at once, or none")
    t.add_argument("--max-jobs", metavar="N", help="jobs at once, or none")
    t = tsub.add_parser("remove", help="remove a member (their jobs and history stay the team's)")
    t.add_argument("user", metavar="USER")
    for t in tsub.choices.values():
        t.add_argument("--team", dest="member_team", default=None, help="default: the team you lead")
        t.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
    p.set_defaults(member_team=None)

    command("nodes", cmd_nodes, "nodes and their devices, like sinfo")

    p = command("usage", cmd_usage, "device-hours and cost per chip model in a month (team leads and admins)")
    p.add_argument("--month", type=_month, metavar="YYYY-MM", help="default: this month")
    p.add_argument("--team")

    policy = sub.add_parser("policy", help="validate, apply or diff the scheduling policy (admins)")
    psub = policy.add_subparsers(dest="policy_cmd", required=True, metavar="ACTION")

    def policy_command(
        name: str, handler: Callable[[Client, argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = psub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the API's JSON")
        p.add_argument("--utc", action="store_true", default=argparse.SUPPRESS, help="times in UTC, ISO 8601")
        p.set_defaults(handler=handler)
        return p

    p = policy_command("validate", cmd_policy_validate, "check a policy file against the cluster")
    p.add_argument("file")
    p = policy_command("apply", cmd_policy_apply, "store a policy file as the new active version")
    p.add_argument("file")
    p.add_argument("--comment", "-m", help="why (required unless --dry-run)")
    p.add_argument("--dry-run", action="store_true", help="replay recorded jobs under both policies; store nothing")
    p.add_argument("--days", type=_positive, default=7, help="dry run: days of jobs to replay (default 7)")
    p = policy_command("diff", cmd_policy_diff, "what changed between two versions (numbers, 'active') or files")
    p.add_argument("a")
    p.add_argument("b")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure is one line on stderr and an exit code (see the module's docstring)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a reader that went away shows here, not at exit
    except BrokenPipeError:
        _silence_stdout()
        return BROKEN_PIPE
    except KeyboardInterrupt:
        return INTERRUPTED
    return code


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so Python's flush at exit does not fail a second time (Python's recipe)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout without a file descriptor (e.g. captured)
        pass


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (argparse printed it)
        return exc.code if isinstance(exc.code, int) else USAGE
    if args.url is None and os.environ.get("NPUPORTAL_URL"):
        try:
            check_url(os.environ["NPUPORTAL_URL"])
        except ValueError as exc:
            _err(f"NPUPORTAL_URL: {exc}")
            return USAGE
    api = Client(args.url, args.token, timeout=args.timeout)
    args.clock = Clock(lambda: policy_zone(api), utc=args.utc)
    try:
        return args.handler(api, args)
    except _UsageError as exc:
        _err(str(exc))
        return USAGE
    except _Refusal as exc:
        _err(str(exc))
        return REFUSED
    except AuthFailed as exc:
        _err(f"{exc} (HTTP {exc.status})")
        return AUTH
    except Refused as exc:
        _err(str(exc))
        return REFUSED
    except Unreachable as exc:
        _err(str(exc))
        return UNREACHABLE


if __name__ == "__main__":
    sys.exit(main())
