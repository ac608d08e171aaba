"""The simulator's table of measured figures: traces × policies × {policy, FIFO, EASY}, in one run.

    python -m scheduling.sim.table [--alibaba-trace alibaba_openb_v2023.csv] [--only itp]
        [--json figures.json]

For each trace it replays the example policy as shipped and the *capped* one (each team's max twice
its guarantee, the starvation guard at a day, classic ordering; written by a rule, not tuned:
``examples/policies/*_capped.yaml``), each with FIFO and EASY beside it, and each policy once more
with its starvation guard taken out, so the guard's cost in wall time is measured in the same run.
It prints one Markdown table (docs/simulator.md, "Measured figures") and, with ``--json``, every
run's metrics. Waits in seconds; wall time is the replay's own (``wall_s``), machine-dependent:
compare figures of one run.

The Alibaba sample has no licence file and is not shipped (tests/fixtures/traces/README.md): give
its path, or its rows are left out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from scheduling.engine.policy import Policy
from scheduling.sim.replay import run_simulation
from scheduling.sim.traces import load_cluster, load_trace
from scheduling.simulate import load_policy

ROOT = Path(__file__).resolve().parents[2]

#: (name, trace, cluster, example policy, capped policy, class map)
TRACES: dict[str, tuple[str, str, str, str, dict[str, str]]] = {
    "itp": (
        "examples/traces/ms_itp_elasticflow.csv.gz",
        "examples/clusters/ms_itp_elasticflow.yaml",
        "examples/policies/ms_itp_elasticflow.yaml",
        "examples/policies/ms_itp_elasticflow_capped.yaml",
        {},
    ),
    "alibaba": (
        "",  # not shipped: --alibaba-trace
        "examples/clusters/alibaba_openb_v2023.yaml",
        "examples/policies/alibaba_openb_v2023.yaml",
        "examples/policies/alibaba_openb_v2023_capped.yaml",
        {"qos-Guaranteed": "critical", "qos-LS": "high", "qos-Burstable": "normal", "qos-BE": "low"},
    ),
}


def without_guard(policy: Policy) -> Policy:
    """``policy`` with the starvation guard off (the policy's threshold and every class's)."""
    classes = tuple(replace(pc, starvation_after_s=None) for pc in policy.priority_classes)
    return replace(policy, starvation_after_s=None, priority_classes=classes)


def _row(label: str, m: dict[str, Any], guard_ratio: float | None = None) -> list[str]:
    w = m["wait_s"]["overall"]
    b = m["wait_s"]["beyond_own_limits"]
    p = m.get("preemption", {})
    bound = m["wait_s"].get("guard_bound")
    lost = p.get("device_hours_lost", 0.0)
    busy = m["devices"]["busy_device_hours"]
    share = lost / busy * 100 if busy else 0.0

    def trio(s: dict[str, Any]) -> str:
        if not s.get("count"):
            return "-"
        return f"{s['mean']:,.0f} / {s['p95']:,.0f} / {s['max']:,.0f}"

    return [
        label,
        f"{m['jobs']['started']:,}",
        trio(w),
        trio(b),
        "-" if not bound else f"{bound['starved']:,}; {bound['over_bound']}",
        "-" if m["fairness"]["backlogged"] is None else f"{m['fairness']['backlogged']:.3f}",
        f"{p.get('preemptions', 0):,}; {lost:,.0f} ({share:.3f}%)",
        f"{m['devices']['utilisation'] * 100:.1f}%",
        f"{m['wall_s']:.1f} s" + (f" ({guard_ratio:.2f}× without the guard)" if guard_ratio else ""),
    ]


HEADER = [
    "trace · policy · scheduler",
    "jobs started",
    "wait: mean / p95 / max",
    "beyond own limits: mean / p95 / max",
    "starved; over the guard's bound",
    "backlogged fairness",
    "preemptions; device-hours lost (of busy)",
    "utilisation",
    "wall time",
]


def run(names: Sequence[str], alibaba: str | None, out: Any = sys.stdout) -> dict[str, Any]:
    """Replay every (trace, policy) of ``names``; print the table to ``out``; return every run's metrics."""
    rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    for name in names:
        trace, cluster_path, example, capped, class_map = TRACES[name]
        if name == "alibaba":
            if not alibaba:
                out.write("(the Alibaba rows need --alibaba-trace: the sample is not shipped)\n")
                continue
            trace = alibaba
        rows_in = load_trace(trace if Path(trace).is_absolute() or Path(trace).exists() else ROOT / trace)
        cluster = load_cluster(ROOT / cluster_path)
        for kind, path in (("example", example), ("capped", capped)):
            policy = load_policy(ROOT / path, cluster)
            t0 = time.perf_counter()
            result = run_simulation(rows_in, cluster, policy, baseline=["fifo", "easy"], class_map=class_map)
            plain = run_simulation(rows_in, cluster, without_guard(policy), class_map=class_map)["policy"]
            sys.stderr.write(f"{name} {kind}: {time.perf_counter() - t0:.0f} s\n")
            m = result["policy"]
            ratio = m["wall_s"] / plain["wall_s"] if plain["wall_s"] else None
            key = f"{name}/{kind}"
            figures[key] = {
                "policy": m,
                "without_guard": plain,
                "fifo": result["baselines"]["fifo"],
                "easy": result["baselines"]["easy"],
            }
            rows.append(_row(f"{name} · {kind} · policy", m, ratio))
            rows.append(_row(f"{name} · {kind} · without the guard", plain))
            rows.append(_row(f"{name} · {kind} · FIFO", result["baselines"]["fifo"]))
            rows.append(_row(f"{name} · {kind} · EASY", result["baselines"]["easy"]))
    out.write("| " + " | ".join(HEADER) + " |\n")
    out.write("|" + "---|" * len(HEADER) + "\n")
    for r in rows:
        out.write("| " + " | ".join(r) + " |\n")
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduling.sim.table", description=__doc__.splitlines()[0])
    parser.add_argument("--alibaba-trace", help="the Alibaba GPU-sharing sample as CSV (not shipped)")
    parser.add_argument("--only", choices=sorted(TRACES), action="append", help="one trace (repeatable)")
    parser.add_argument("--json", help="also write every run's metrics here")
    args = parser.parse_args(argv)
    figures = run(args.only or ["itp", "alibaba"], args.alibaba_trace)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
