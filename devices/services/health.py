"""The device health state machine: one reading in, one health state out (docs/health.md).

Pure functions over plain values, so the rules can be read and tested without a database or an
agent. :mod:`devices.services.polling` applies them to each poll and records every transition as a
:class:`devices.models.HealthEvent`.

* ``classify`` turns one device entry of ``GET /v1/devices`` into the health it *shows* now;
* ``step`` decides the health the device *has* after this poll: getting worse is immediate, getting
  better out of ``degraded``/``failed`` (or ``unknown``) needs ``HEALTH_REJOIN_POLLS`` polls in a
  row that look better (flap damping); ``warning`` → ``healthy`` is immediate (both take work).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings

from devices.models import Device

HEALTHY = Device.Health.HEALTHY.value
WARNING = Device.Health.WARNING.value
DEGRADED = Device.Health.DEGRADED.value
FAILED = Device.Health.FAILED.value
UNKNOWN = Device.Health.UNKNOWN.value

#: npu-smi / agent health words → health states.
AGENT_HEALTH: dict[str, str] = {
    "OK": HEALTHY,
    "Warning": WARNING,
    "Alarm": DEGRADED,
    "Critical": FAILED,
    "UNKNOWN": FAILED,
    "lost": FAILED,
}
#: How bad a state is. ``unknown`` (never set by a poll) counts as bad as failed.
SEVERITY: dict[str, int] = {HEALTHY: 0, WARNING: 1, DEGRADED: 2, FAILED: 3, UNKNOWN: 3}
#: States that take new work; leaving one of the others needs the rejoin streak.
USABLE = frozenset({HEALTHY, WARNING})


@dataclass(frozen=True)
class Thresholds:
    warning_temp_c: float = 85.0
    degraded_temp_c: float = 95.0
    missed_polls: int = 3
    rejoin_polls: int = 3
    node_rejoin_polls: int = 3

    @classmethod
    def from_settings(cls) -> Thresholds:
        return cls(
            warning_temp_c=float(getattr(settings, "HEALTH_TEMP_WARNING_C", 85)),
            degraded_temp_c=float(getattr(settings, "HEALTH_TEMP_DEGRADED_C", 95)),
            missed_polls=max(1, int(getattr(settings, "AGENT_MISSED_POLLS", 3))),
            rejoin_polls=max(1, int(getattr(settings, "HEALTH_REJOIN_POLLS", 3))),
            node_rejoin_polls=max(1, int(getattr(settings, "AGENT_REJOIN_POLLS", 3))),
        )


@dataclass(frozen=True)
class Verdict:
    """What one reading shows, and why in words."""

    health: str
    reason: str


def classify(report: dict[str, Any] | None, *, known_ecc: int, first_reading: bool, t: Thresholds) -> Verdict:
    """The health one device entry shows.

    ``known_ecc`` is the ECC count of the previous reading; a count that rose means a new uncorrectable
    error (failed). On a device's first reading the count is only a baseline. Several findings make
    the worst one win, all of them named in the reason.
    """
    if report is None:
        return Verdict(FAILED, "missing from the agent's device list")
    word = report.get("health")
    findings: list[tuple[str, str]] = []
    if word in AGENT_HEALTH:
        findings.append((AGENT_HEALTH[word], f"npu-smi health {word}"))
    else:
        findings.append((FAILED, f"unrecognised health {word!r}"))
    ecc = report.get("ecc_errors")
    if isinstance(ecc, int) and not isinstance(ecc, bool) and not first_reading and ecc > known_ecc:
        findings.append((FAILED, f"uncorrectable ECC errors rose from {known_ecc} to {ecc}"))
    temp = report.get("temp_c")
    if isinstance(temp, int | float) and not isinstance(temp, bool):
        if temp > t.degraded_temp_c:
            findings.append((DEGRADED, f"temperature {temp:g} °C above {t.degraded_temp_c:g} °C"))
        elif temp > t.warning_temp_c:
            findings.append((WARNING, f"temperature {temp:g} °C above {t.warning_temp_c:g} °C"))
    worst = max(SEVERITY[h] for h, _ in findings)
    health = next(h for h, _ in findings if SEVERITY[h] == worst)
    reasons = [why for h, why in findings if SEVERITY[h] > 0] or [why for _, why in findings]
    return Verdict(health, "; ".join(reasons))


@dataclass(frozen=True)
class Step:
    health: str
    streak: int
    changed: bool
    #: Text for ``Device.health_detail`` and, when ``changed``, the health event.
    detail: str


def step(current: str, streak: int, verdict: Verdict, rejoin_polls: int) -> Step:
    """The health after one more reading (see the module docstring for the rules)."""
    cur = SEVERITY.get(current, SEVERITY[UNKNOWN])
    new = SEVERITY[verdict.health]
    if new > cur or (new == cur and verdict.health != current):
        return Step(verdict.health, 0, True, verdict.reason)
    if new == cur:
        return Step(current, 0, False, verdict.reason)
    # Better than now.
    if current in USABLE:
        return Step(verdict.health, 0, True, verdict.reason)
    streak += 1
    if streak >= rejoin_polls:
        return Step(verdict.health, 0, True, f"rejoined after {streak} good polls in a row: {verdict.reason}")
    return Step(current, streak, False, f"recovering ({streak}/{rejoin_polls} good polls): {verdict.reason}")
