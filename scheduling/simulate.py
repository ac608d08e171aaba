"""Replay a job trace through the scheduling core: ``python -m scheduling.simulate``.

    python -m scheduling.simulate --trace T.csv --cluster C.yaml --policy P.yaml \\
        [--baseline fifo,easy] [--start 2021-03-04T00:00:00+00:00] [--quiet] --out metrics.json

Exit codes: 0 done, 2 unusable input (the message names the file and field),
1 the core returned a decision the cluster cannot carry out. See ``docs/simulator.md``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TextIO

from npuctl.durations import parse_seconds
from npuportal import csv_export
from scheduling.engine.policy import DEVICES, Policy, chip_resource, parse_policy
from scheduling.sim import BASELINES, DEFAULT_START, SimulationError, parse_baselines, run_simulation
from scheduling.sim.traces import ClusterSpec, InputError, load_cluster, load_trace


def load_policy(path: str | Path, cluster: ClusterSpec | None = None) -> Policy:
    """Parse a policy file with the engine's own parser, checked against the cluster's chip models."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{path}: cannot read policy: {exc.strerror}") from None
    chips = capacity = None
    if cluster is not None:
        by_chip = cluster.devices_by_chip()
        chips = list(by_chip)
        capacity = {DEVICES: float(cluster.total_devices), **{chip_resource(c): float(n) for c, n in by_chip.items()}}
    try:
        return parse_policy(text, chip_models=chips, capacity=capacity)
    except ValueError as exc:  # PolicyError lists every issue with its path in the document
        raise InputError(f"{path}: {exc}") from None


class ProgressBar:
    """A one-line ``\\r`` progress bar on a terminal; silent elsewhere."""

    def __init__(self, stream: TextIO, label: str, enabled: bool) -> None:
        self.stream = stream
        self.label = label
        self.enabled = enabled
        self.started = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < total and now - self.last < 0.2:
            return
        self.last = now
        frac = done / total if total else 1.0
        width = 30
        filled = int(frac * width)
        bar = "#" * filled + "-" * (width - filled)
        self.stream.write(f"\r{self.label:<9} [{bar}] {frac:6.1%} {done}/{total} jobs {now - self.started:6.1f}s")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def _parse_start(text: str) -> datetime:
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--start {text!r} is not an ISO 8601 date-time") from None
    if value.tzinfo is None:
        raise argparse.ArgumentTypeError(f"--start {text!r} needs a UTC offset, e.g. 2021-03-04T00:00:00+00:00")
    return value


def _parse_seconds(text: str) -> float:
    """Seconds in any duration form (``3600``, ``15m``, ``2:00:00``: ``npuctl.durations``); 0 turns it off."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a duration of 0 or more")
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _write_csv(path: Path, rows: list[dict[str, object]]) -> None:
    """The job records, through the portal's CSV writer: a trace's names never run as spreadsheet formulas."""
    columns = list(rows[0]) if rows else ["job_id"]
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv_export.writer(handle, lineterminator="\r\n")
        writer.writerow(columns)
        writer.writerows([row.get(column, "") for column in columns] for row in rows)


def _parse_baselines(text: str) -> list[str]:
    try:
        names = parse_baselines(text)
    except ValueError:
        bad = next(n.strip() for n in text.split(",") if n.strip() not in BASELINES)
        raise argparse.ArgumentTypeError(f"invalid choice: {bad!r} (choose from {', '.join(BASELINES)})") from None
    return names


def _parse_class_map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        tenant, sep, cls = item.partition("=")
        if not sep or not tenant.strip() or not cls.strip():
            raise argparse.ArgumentTypeError(f"--class-map item {item!r} is not TENANT=CLASS")
        out[tenant.strip()] = cls.strip()
    return out


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m scheduling.simulate",
        description="Replay a job trace through the scheduling core in simulated time and write metrics.",
    )
    parser.add_argument("--trace", required=True, help="trace CSV (job_id,submit_time_s,duration_s,num_devices,...)")
    parser.add_argument("--cluster", required=True, help="cluster YAML (nodeGroups, vnpuTemplates)")
    parser.add_argument("--policy", required=True, help="SchedulingPolicy YAML")
    parser.add_argument(
        "--baseline",
        type=_parse_baselines,
        metavar="NAME[,NAME]",
        help="also replay under these fixed references and compare: fifo (strict first-come first-served), "
        "easy (EASY backfill); e.g. fifo,easy",
    )
    parser.add_argument("--out", required=True, help="where to write metrics JSON ('-' for stdout)")
    parser.add_argument(
        "--start",
        type=_parse_start,
        default=DEFAULT_START,
        help=f"wall-clock time of trace second 0 (default {DEFAULT_START.isoformat()})",
    )
    parser.add_argument(
        "--class-map",
        type=_parse_class_map,
        default={},
        metavar="TENANT=CLASS,...",
        help="priority class of each tenant's jobs when the trace has no priority_class column",
    )
    parser.add_argument(
        "--jobs-out",
        help="also write one CSV row per job (wait, start, end, preemptions); the baseline's in NAME-baseline.csv",
    )
    parser.add_argument(
        "--estimates-every",
        type=_parse_seconds,
        default=0.0,
        metavar="SECONDS",
        help="also run the planning pass of estimated starts this often (simulated time) and report how far "
        "each job's first estimate was from its start (metrics 'estimates')",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    err = sys.stderr
    try:
        rows = load_trace(args.trace)
        cluster = load_cluster(args.cluster)
        policy = load_policy(args.policy, cluster)
    except InputError as exc:
        err.write(f"error: {exc}\n")
        return 2
    unknown = sorted({c for c in args.class_map.values() if policy.class_by_name(c) is None})
    if unknown:
        err.write(f"error: --class-map: policy {policy.name!r} has no priority class {unknown[0]!r}\n")
        return 2
    show = not args.quiet and err.isatty()
    bars = iter([ProgressBar(err, "policy", show), *(ProgressBar(err, name, show) for name in args.baseline or [])])
    current = [next(bars)]

    def progress(done: int, total: int) -> None:
        current[0](done, total)
        if done >= total:
            current[0] = next(bars, current[0])

    wall0 = time.perf_counter()
    try:
        result = run_simulation(
            rows,
            cluster,
            policy,
            baseline=args.baseline,
            progress=progress,
            start=args.start,
            class_map=args.class_map,
            job_records=bool(args.jobs_out),
            estimates_every=args.estimates_every,
        )
    except SimulationError as exc:
        err.write(f"error: the scheduling core made an impossible decision: {exc}\n")
        return 1
    result["input"].update(
        trace=str(args.trace),
        cluster=str(args.cluster),
        policy_file=str(args.policy),
        wall_s=round(time.perf_counter() - wall0, 3),
    )
    records = result.pop("job_records", {})
    text = json.dumps(result, indent=2, sort_keys=False) + "\n"
    if args.out == "-":
        sys.stdout.write(text)
    else:
        try:
            Path(args.out).write_text(text, encoding="utf-8")
        except OSError as exc:
            err.write(f"error: {args.out}: cannot write metrics: {exc.strerror}\n")
            return 2
    for run, rows_out in records.items():
        path = Path(args.jobs_out)
        if run != "policy":
            path = path.with_name(f"{path.stem}-{run}{path.suffix}")
        try:
            _write_csv(path, rows_out)
        except OSError as exc:
            err.write(f"error: {path}: cannot write job records: {exc.strerror}\n")
            return 2
    if not args.quiet:
        m = result["policy"]
        line = (
            f"{m['jobs']['started']}/{m['jobs']['total']} jobs started, "
            f"{m['jobs']['never_runnable']} never runnable (skipped), "
            f"utilisation {m['devices']['utilisation']:.1%}, wait p50/p95 "
            f"{m['wait_s']['overall']['p50']}/{m['wait_s']['overall']['p95']} s, "
            f"{result['input']['wall_s']} s wall -> {args.out}\n"
        )
        err.write(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
