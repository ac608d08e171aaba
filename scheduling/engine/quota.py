"""Admission: may this team start this job now, by its own limits?

Checked in this order, first failure wins (the reason names the first limit a
user would have to change):

1. the priority class is in ``allowed_priority_classes`` → ``QuotaClassNotAllowed``
   (the DB layer refuses such submissions; a job can still slip in when a new
   policy version narrows the list);
2. the job's run-time limit (:func:`run_time.limit`: its ``max_duration_s``,
   else its estimate) is within
   ``max_job_duration_s`` → ``QuotaMaxDuration``;
3. the month's device-hours so far plus this job's (units x estimated hours)
   stay within ``device_hours_per_month`` → ``MonthlyBudgetExhausted``;
4. running jobs + jobs started this tick < ``max_concurrent_jobs`` → ``QuotaMaxJobs``;
5. usage + the job's units <= ``max`` for ``devices`` and, per chip model the
   job could run on, for ``devices/<chip>`` → ``QuotaMaxDevices`` when no chip
   model is left. ``max`` is the cap *including* borrowed capacity.

:func:`admit` is the one path through these steps: the tick calls it for every
job, so does a job's turn with a promise and a shape no chip model fits. It
splits them where the answer stops depending on the job: steps 1-3
(:func:`admit_job`) read the job, steps 4-5 (:func:`admit_devices`) only the
team's holdings and the job's shape, so the tick remembers them per shape
(``TeamLedger.adm``). :mod:`feasibility` asks another question of the same
limits (does any schedule ever admit the job?) and :mod:`estimate` asks when a
team's jobs will have room again; neither admits.

Guarantees are not an admission limit: a team may borrow idle capacity up to
its ``max``; :mod:`preemption` takes it back when the owner asks.

The quota in force is the policy's time-of-day quota at the tick's ``now``
(:func:`quota_in_force`; the tick reads the policy's wall clock once and asks
``policy.quota_for_team`` once per team).
"""

from __future__ import annotations

import math
from datetime import datetime

from scheduling.engine import reasons, run_time
from scheduling.engine.capacity import EPS
from scheduling.engine.placement import Need
from scheduling.engine.policy import DEVICES, Policy, Quota, chip_resource, quota_at
from scheduling.engine.snapshot import JobState
from scheduling.engine.words import a_run, count, duration_words

#: ``chip model -> "devices/<chip>"`` (the hot path asks for the same few keys). Keyed by the
#: chip model's name, so it holds for the life of the process; bounded all the same.
_KEYS: dict[str, str] = {}


def resource_key(chip: str) -> str:
    """:func:`policy.chip_resource`, cached."""
    key = _KEYS.get(chip)
    if key is None:
        if len(_KEYS) > 10_000:
            _KEYS.clear()
        key = _KEYS[chip] = chip_resource(chip)
    return key


def quota_in_force(policy: Policy, team: str, at: datetime) -> tuple[Quota, str | None]:
    """The team's quota at ``at`` and the schedule that produced it (``None``: base quota)."""
    return quota_at(policy, team, at)


def _max_by_chip(quota: Quota) -> dict[str, float]:
    """``max`` per chip model of ``quota`` (the ``devices/<chip>`` keys; a few per team, worked out per ledger)."""
    return {key[len(DEVICES) + 1 :]: value for key, value in quota.max.items() if key != DEVICES}


#: What admission answers: ``(reason, detail, chips)``, ``reason`` ``None`` and the chip models
#: within quota, or the refusal (no chip models).
Admission = tuple[str | None, str, tuple[str, ...]]


class TeamLedger:
    """One team's quota in force and what it holds during the tick."""

    __slots__ = (
        "adm",
        "allowed",
        "big",
        "budget",
        "guaranteed",
        "jobs",
        "max_by_chip",
        "max_duration",
        "max_jobs",
        "max_total",
        "month_hours",
        "name",
        "quota",
        "schedule",
        "usage",
    )

    def __init__(self, name: str, quota: Quota, schedule: str | None, month_hours: float) -> None:
        self.name = name
        self.quota = quota
        self.schedule = schedule
        #: Device units held per resource key (``devices``, ``devices/<chip>``).
        self.usage: dict[str, float] = {DEVICES: 0.0}
        self.jobs = 0
        self.month_hours = month_hours
        self.allowed = quota.allowed_priority_classes
        self.max_duration = quota.max_job_duration_s
        self.budget = quota.device_hours_per_month
        self.max_jobs = quota.max_concurrent_jobs
        self.max_total = quota.max.get(DEVICES)
        self.max_by_chip = _max_by_chip(quota)
        self.guaranteed = quota.guaranteed
        #: The tick's memo of :func:`admit_devices` per request shape (see :meth:`add`).
        self.adm: dict[Need, Admission] = {}
        #: The most device units any request of the tick asks for (set by the tick; ``inf``: unknown).
        self.big = math.inf

    def add(self, chip: str, units: float, jobs: int = 0) -> None:
        """Count ``units`` on ``chip`` (and ``jobs`` more jobs) against the team: a started job.

        Usage and jobs only grow during a tick, so a memoised refusal stays right;
        an admission stays right while every limit keeps room for the largest
        request (``big``). Only when one no longer does is the memo cleared.
        """
        usage = self.usage
        total = usage[DEVICES] = usage[DEVICES] + units
        key = _KEYS.get(chip) or resource_key(chip)
        used = usage[key] = usage.get(key, 0.0) + units
        self.jobs += jobs
        if self.adm:
            big = self.big
            cap = self.max_by_chip.get(chip)
            if (
                (self.max_jobs is not None and self.jobs >= self.max_jobs)
                or (self.max_total is not None and self.max_total - total < big)
                or (cap is not None and cap - used < big)
            ):
                self.adm.clear()

    def used(self, chip: str) -> float:
        return self.usage.get(_KEYS.get(chip) or resource_key(chip), 0.0)

    # -- guarantees: used by ordering exemptions and preemption ------------------

    def within_guarantee(self, chip: str, units: float) -> bool:
        """Whether adding ``units`` on ``chip`` keeps the team within its guarantee.

        The guarantee that applies to a chip is ``devices/<chip>`` and/or
        ``devices``; every one the quota names must hold, and at least one must
        be named (no guarantee means nothing to reclaim).
        """
        g = self.guaranteed
        if not g:
            return False
        named = False
        per_chip = g.get(_KEYS.get(chip) or resource_key(chip))
        if per_chip is not None:
            named = True
            if self.used(chip) + units > per_chip + EPS:
                return False
        overall = g.get(DEVICES)
        if overall is not None:
            named = True
            if self.usage[DEVICES] + units > overall + EPS:
                return False
        return named

    def borrowing(self, chip: str, released: float = 0.0) -> bool:
        """Whether the team holds more than its guarantee on ``chip`` (after ``released`` leaves).

        A team with no guarantee for the chip is borrowing whatever it holds there.
        """
        g = self.guaranteed
        per_chip = g.get(_KEYS.get(chip) or resource_key(chip))
        overall = g.get(DEVICES)
        if per_chip is None and overall is None:
            return self.used(chip) - released > EPS
        if per_chip is not None and self.used(chip) - released > per_chip + EPS:
            return True
        return overall is not None and self.usage[DEVICES] - released > overall + EPS


# -- the details of a refusal, in words (one place, for admit and the tick's fast path) ----------


def jobs_detail(running: int, limit: int) -> str:
    """``the team runs 3 jobs; its limit is 3 at once``."""
    return f"the team runs {count(running, 'job')}; its limit is {limit} at once"


def devices_detail(held: float, more: float, limit: float, chip: str = "", jobs: int | None = None) -> str:
    """``your team is at its maximum of 24 devices: it holds 20 in 3 running jobs; this job needs 8 more``.

    ``910B4 devices`` per chip model. Said this way because a long wait at a team's own ``max``
    is the team's own limit, not the cluster being busy: the lead can see that the wait ends
    when one of the team's own jobs does (or the admins raise the max), and the starvation
    guard does not count it (:mod:`starvation`).
    """
    kind = f"{chip} devices" if chip else "devices"
    holds = f"it holds {held:g}" if jobs is None else f"it holds {held:g} in {count(jobs, 'running job')}"
    return f"your team is at its maximum of {limit:g} {kind}: {holds}; this job needs {more:g} more"


def duration_detail(duration: float, limit: float) -> str:
    """``a 30 h run is more than the team's 24 h limit on run time``."""
    return f"{a_run(duration)} is more than the team's {duration_words(limit)} limit on run time"


def budget_detail(used: float, need: float, budget: float) -> str:
    """``the team has used 4,990.0 of its 5,000 device-hours this month; this job needs 16.0``."""
    return (
        f"the team has used {used:,.1f} of its {round(budget, 3):,g} device-hours this month; "
        f"this job needs {need:,.1f}"
    )


def admit(ledger: TeamLedger, job: JobState, need: Need, memo: bool = True) -> Admission:
    """Steps 1-5 (see the module's docstring): the one admission path, first failure wins.

    Steps 1-3 (:func:`admit_job`) depend on the job itself; steps 4-5 (:func:`admit_devices`)
    on the team's holdings and the job's shape only, so their answer is remembered per shape
    in ``ledger.adm`` for the tick (see :meth:`TeamLedger.add`, which forgets it when it may no
    longer hold). ``memo=False`` for a caller whose team count is out for a moment.
    """
    first_units = need.first_units if need.chips else float(job.num_devices)
    refused = admit_job(ledger, job, first_units)
    if refused is not None:
        return refused
    if not memo or not need.chips:  # (no chip model: the units are the job's own)
        return admit_devices(ledger, need, first_units)
    adm = ledger.adm.get(need)
    if adm is None:
        adm = ledger.adm[need] = admit_devices(ledger, need, first_units)
    return adm


def admit_job(ledger: TeamLedger, job: JobState, first_units: float) -> Admission | None:
    """Steps 1-3 of :func:`admit` (class, run-time limit, monthly device-hours): the refusal, or ``None``.

    ``first_units``: the device units the job takes on its first chip model (the budget counts those).
    """
    allowed = ledger.allowed
    if allowed is not None and job.priority_class not in allowed:
        return reasons.QUOTA_CLASS_NOT_ALLOWED, f"class {job.priority_class} is not allowed", ()
    most = ledger.max_duration
    if most is not None:
        duration = run_time.limit(job)
        if duration > most + EPS:
            return reasons.QUOTA_MAX_DURATION, duration_detail(duration, most), ()
    budget = ledger.budget
    if budget is not None:
        hours = first_units * job.estimated_duration_s / 3600.0
        if ledger.month_hours + hours > budget + EPS:
            return reasons.MONTHLY_BUDGET_EXHAUSTED, budget_detail(ledger.month_hours, hours, budget), ()
    return None


def admit_devices(ledger: TeamLedger, need: Need, first_units: float) -> Admission:
    """Steps 4-5 of :func:`admit` (max concurrent jobs, ``max`` devices overall and per chip model).

    They depend on the team's holdings and the shape only (see :func:`admit`'s memo).
    """
    if ledger.max_jobs is not None and ledger.jobs >= ledger.max_jobs:
        return reasons.QUOTA_MAX_JOBS, jobs_detail(ledger.jobs, ledger.max_jobs), ()
    chips = need.chips
    cap = ledger.max_total
    if cap is not None and ledger.usage[DEVICES] + first_units > cap + EPS:
        return reasons.QUOTA_MAX_DEVICES, devices_detail(ledger.usage[DEVICES], first_units, cap, jobs=ledger.jobs), ()
    by_chip = ledger.max_by_chip
    if not by_chip:
        return None, "", chips
    units = need.units
    usage = ledger.usage
    ok: list[str] | None = None
    detail = ""
    for k, chip in enumerate(chips):
        cap = by_chip.get(chip)
        if cap is None:
            if ok is not None:
                ok.append(chip)
            continue
        used = usage.get(_KEYS.get(chip) or resource_key(chip), 0.0)
        if used + units[chip] <= cap + EPS:
            if ok is not None:
                ok.append(chip)
            continue
        if ok is None:
            ok = list(chips[:k])
            detail = devices_detail(used, units[chip], cap, chip)
    if ok is None:
        return None, "", chips
    if not ok and chips:
        return reasons.QUOTA_MAX_DEVICES, detail, ()
    return None, "", tuple(ok)
