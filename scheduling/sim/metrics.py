"""What a replay measures: usage meters, fairness, percentiles, and the comparison of two runs."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from scheduling.engine.policy import Policy
from scheduling.sim.jobs import EPS as _EPS

# --- usage meters -----------------------------------------------------------------------------


class Meter:
    """Integral of a piecewise-constant rate per key (device-seconds), updated on rate changes."""

    __slots__ = ("cum", "rate", "since")

    def __init__(self) -> None:
        self.cum: dict[Any, float] = defaultdict(float)
        self.rate: dict[Any, float] = defaultdict(float)
        self.since: dict[Any, float] = {}

    def add(self, key: Any, delta: float, t: float) -> None:
        last = self.since.get(key, t)
        self.cum[key] += self.rate[key] * (t - last)
        self.rate[key] += delta
        if abs(self.rate[key]) < _EPS:
            self.rate[key] = 0.0
        self.since[key] = t

    def value(self, key: Any, t: float) -> float:
        return self.cum.get(key, 0.0) + self.rate.get(key, 0.0) * (t - self.since.get(key, t))


class DecayedMeter:
    """Usage with exponential decay (half-life ``h``), integrated exactly, in device-hours.

    Matches the database tick's ``_usage``: each device-second counts
    ``2^(-(now - t)/h)``. (The tick also ignores allocations that ended more
    than four half-lives ago; the difference is under 1/16 of that old usage.)
    """

    __slots__ = ("k", "rate", "since", "value_at")

    def __init__(self, half_life_s: float) -> None:
        self.k = math.log(2) / half_life_s if half_life_s > 0 else 0.0
        self.value_at: dict[Any, float] = {}
        self.rate: dict[Any, float] = {}
        self.since: dict[Any, float] = {}

    def _at(self, key: Any, t: float) -> float:
        v = self.value_at.get(key, 0.0)
        dt = t - self.since.get(key, t)
        r = self.rate.get(key, 0.0)
        if not self.k:
            return v + r * dt / 3600.0
        d = math.exp(-self.k * dt)
        return v * d + r * (1.0 - d) / self.k / 3600.0

    def add(self, key: Any, delta: float, t: float) -> None:
        self.value_at[key] = self._at(key, t)
        self.rate[key] = self.rate.get(key, 0.0) + delta
        self.since[key] = t

    def snapshot(self, t: float) -> dict[Any, float]:
        return {key: self._at(key, t) for key in self.value_at}


def entitlements(policy: Policy, teams: list[str]) -> dict[str, float]:
    """Each team's entitled fraction of the cluster among ``teams``, from shares.

    Teams with a department share their department's part of the cluster in
    proportion to their own shares; departments and teams without one split the
    cluster in proportion to their shares.
    """
    top: dict[str, float] = {}
    within: dict[str, dict[str, float]] = defaultdict(dict)
    for team in teams:
        tp = policy.team(team)
        dept = tp.department if tp.department and tp.department in policy.departments else None
        if dept is None:
            top["team:" + team] = max(tp.shares, 0.0)
            within["team:" + team][team] = 1.0
        else:
            top["dept:" + dept] = max(policy.departments[dept], 0.0)
            within["dept:" + dept][team] = max(tp.shares, 0.0)
    total = sum(top.values())
    out: dict[str, float] = {}
    for key, members in within.items():
        part = top[key] / total if total > 0 else 0.0
        inner = sum(members.values())
        for team, shares in members.items():
            out[team] = part * shares / inner if inner > 0 else 0.0
    return out


def jain_index(xs: list[float]) -> float | None:
    """Jain's fairness index ``(sum x)^2 / (n * sum x^2)``: 1 when all equal, 1/n when one has all.

    ``None`` for no values or all zero (nobody used anything: fairness is undefined).
    """
    squares = sum(x * x for x in xs)
    if not xs or squares <= 0:
        return None
    total = sum(xs)
    return total * total / (len(xs) * squares)


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) on sorted ``values``."""
    if not values:
        return 0.0
    pos = (len(values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0, "mean": None, "p50": None, "p95": None, "p99": None, "max": None}
    s = sorted(values)
    return {
        "count": len(s),
        "mean": round(sum(s) / len(s), 3),
        "p50": round(percentile(s, 50), 3),
        "p95": round(percentile(s, 95), 3),
        "p99": round(percentile(s, 99), 3),
        "max": round(s[-1], 3),
    }


def with_input(metrics: dict[str, Any], info: Mapping[str, Any]) -> dict[str, Any]:
    metrics["jobs"] = {
        "total": info["jobs_total"],
        "skipped": info["skipped"],
        "skipped_by_reason": info["skipped_by_reason"],
        "never_runnable": info["never_runnable"],
        **metrics["jobs"],
    }
    return metrics


def _not_started(team: Mapping[str, Any]) -> int | None:
    """A team's jobs that never started in the replay (``None`` when the metrics do not say)."""
    jobs, started = team.get("jobs"), team.get("started")
    return None if jobs is None or started is None else int(jobs) - int(started)


def compare(metrics_a: Mapping[str, Any], metrics_b: Mapping[str, Any]) -> dict[str, Any]:
    """Per-team differences ``b - a`` (device-hours, wait p50/p95/max, jobs not started, preemptions), overall ones.

    ``a`` is the reference (current policy, or FIFO), ``b`` the candidate. The waits are those of the
    jobs that started; ``not_started`` counts the rest, so a policy that keeps a team's jobs from ever
    starting does not read as one that shortened their waits.
    """
    teams_a = metrics_a.get("teams", {})
    teams_b = metrics_b.get("teams", {})
    out_teams: dict[str, Any] = {}
    for team in sorted(set(teams_a) | set(teams_b)):
        ta, tb = teams_a.get(team, {}), teams_b.get(team, {})
        out_teams[team] = {
            "device_hours": _diff(ta.get("device_hours"), tb.get("device_hours")),
            "wait_p50_s": _diff(ta.get("wait_s", {}).get("p50"), tb.get("wait_s", {}).get("p50")),
            "wait_p95_s": _diff(ta.get("wait_s", {}).get("p95"), tb.get("wait_s", {}).get("p95")),
            "wait_max_s": _diff(ta.get("wait_s", {}).get("max"), tb.get("wait_s", {}).get("max")),
            "not_started": _diff(_not_started(ta), _not_started(tb)),
            "preemptions": _diff(ta.get("preemptions"), tb.get("preemptions")),
            "usage_over_entitlement": _diff(ta.get("usage_over_entitlement"), tb.get("usage_over_entitlement")),
        }
    wa, wb = metrics_a.get("wait_s", {}).get("overall", {}), metrics_b.get("wait_s", {}).get("overall", {})
    overall = {
        "utilisation": _diff(
            metrics_a.get("devices", {}).get("utilisation"), metrics_b.get("devices", {}).get("utilisation")
        ),
        "wait_p50_s": _diff(wa.get("p50"), wb.get("p50")),
        "wait_p95_s": _diff(wa.get("p95"), wb.get("p95")),
        "wait_p99_s": _diff(wa.get("p99"), wb.get("p99")),
        "wait_max_s": _diff(wa.get("max"), wb.get("max")),
        "jain_mean": _diff(
            metrics_a.get("fairness", {}).get("jain_mean"), metrics_b.get("fairness", {}).get("jain_mean")
        ),
        "preemptions": _diff(
            metrics_a.get("preemption", {}).get("preemptions"), metrics_b.get("preemption", {}).get("preemptions")
        ),
        "span_s": _diff(metrics_a.get("span_s"), metrics_b.get("span_s")),
    }
    return {"overall": overall, "teams": out_teams}


def _diff(a: Any, b: Any) -> dict[str, Any]:
    delta = round(b - a, 6) if isinstance(a, int | float) and isinstance(b, int | float) else None
    return {"a": a, "b": b, "delta": delta}
