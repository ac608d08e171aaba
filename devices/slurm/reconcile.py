"""Does npuportal's accounting agree with Slurm's? A month's device-hours, job by job, from both sides.

A site running jobs through Slurm (``NPUPORTAL_EXECUTOR=slurm``) has two records of what its cards
did: the portal's allocations (what chargeback prices) and Slurm's accounting (what ``sacct``
shows the people who run the cluster). When the two disagree, one of them is wrong about a job,
and the statement is worth questioning before it is closed. ``manage.py slurm reconcile --month
YYYY-MM`` (:func:`reconcile`) puts them side by side:

- **npuportal's side** is chargeback's own per-job usage
  (:func:`quotas.accounting.breakdown.usage_by_job`: usage records plus what is not recorded yet,
  each allocation clipped to the month on the policy's clock, times its card share), so the
  figures are those a statement is made of;
- **Slurm's side** is ``sacct -X -n -P -a -o JobID,Comment,State,AllocTRES,Elapsed,Start,End``
  over the same window (the text output: ``--json`` is unreliable in Debian's Slurm 22.05): the
  ``gres/npu`` count of ``AllocTRES`` × ``Elapsed``, clipped to the window. Jobs are matched by
  the ``--comment=npuportal:<job id>:<attempt>`` the executor gives every run, so a job queued
  again and run twice sums its attempts on both sides.

The verdict is on the month's totals, "agree within 1%": the two clocks differ by the time an
``sbatch`` takes (the portal holds the cards from its tick, Slurm counts from its own start, and
Slurm's times are whole seconds), which is noise on a month and not on one short job. Every job
whose figures differ is still listed, as are jobs on one side only; jobs submitted to Slurm
directly (no portal comment) are totalled apart, as they are not the portal's to charge.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from devices.executors.slurm import COMMENT_RE, squeue
from devices.slurm.commands import run
from quotas.accounting.breakdown import usage_by_job
from quotas.accounting.rates import HOURS_PLACES
from quotas.accounting.statements import parse_month
from quotas.policies.versions import active_policy
from scheduling.engine.policy import zone

#: The months' totals agree when they differ by at most this share of the larger one.
TOLERANCE = Decimal("0.01")
#: What ``sacct`` is asked for, in this order (``-P``: fields split by ``|``).
SACCT_FIELDS = "JobID,Comment,State,AllocTRES,Elapsed,Start,End"
ZERO = Decimal(0)


def parse_elapsed(text: str) -> int:
    """Seconds of Slurm's ``Elapsed``: ``[D-]HH:MM:SS`` or ``MM:SS`` (``1-02:03:04`` → 93784); 0 if unreadable."""
    days, _, clock = text.strip().rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 or (days and not days.isdigit()):
        return 0
    seconds = 0
    for part in parts:
        seconds = seconds * 60 + int(part)
    return seconds + int(days or 0) * 86400


def npu_count(alloc_tres: str) -> int:
    """The ``gres/npu`` count of ``AllocTRES``: ``billing=1,cpu=1,gres/npu=2,node=1`` → 2."""
    found = re.search(r"(?:^|,)gres/npu=([0-9]+)", alloc_tres)
    return int(found.group(1)) if found else 0


def _slurm_time(text: str) -> datetime | None:
    """A time ``sacct`` prints (the host's local time, ``Unknown`` while running) as an aware datetime."""
    try:
        return datetime.fromisoformat(text.strip()).astimezone()
    except ValueError:
        return None


@dataclass(frozen=True)
class SlurmUsage:
    """One Slurm job's cards and time in the window: device-seconds, and whose run it was."""

    slurm_id: str
    comment: str
    state: str
    cards: int
    seconds: int  # of the job's Elapsed inside the window

    @property
    def portal_job(self) -> int | None:
        found = COMMENT_RE.fullmatch(self.comment)
        return int(found.group(1)) if found else None

    @property
    def device_seconds(self) -> int:
        return self.cards * self.seconds


def parse_usage(text: str, start: datetime, end: datetime) -> list[SlurmUsage]:
    """``sacct -X -n -P -o`` :data:`SACCT_FIELDS` lines as each job's usage inside ``[start, end)``.

    ``Elapsed`` is the job's run so far; the part before ``start`` or after ``end`` is cut off
    (a job that spans the month's edge counts in each month for its own part).
    """
    found: list[SlurmUsage] = []
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 7:
            continue
        slurm_id, comment, state, tres, elapsed_text, start_text, _end_text = (p.strip() for p in parts[:7])
        elapsed = parse_elapsed(elapsed_text)
        began = _slurm_time(start_text)
        if began is not None and elapsed:
            ran_until = began + timedelta(seconds=elapsed)
            inside = min(ran_until, end) - max(began, start)
            elapsed = max(int(inside.total_seconds()), 0)
        found.append(SlurmUsage(slurm_id, "" if comment == "(null)" else comment, state, npu_count(tres), elapsed))
    return found


def slurm_usage(start: datetime, end: datetime) -> list[SlurmUsage]:
    """Every Slurm job's usage in ``[start, end)``, from ``sacct`` (all users' jobs: ``-a``)."""
    local = "%Y-%m-%dT%H:%M:%S"
    text = run(
        [
            "sacct",
            "-X",
            "-n",
            "-P",
            "-a",
            "-S",
            start.astimezone().strftime(local),
            "-E",
            end.astimezone().strftime(local),
            "-o",
            SACCT_FIELDS,
        ]
    )
    return with_live_comments(parse_usage(text, start, end))


def with_live_comments(usage: list[SlurmUsage]) -> list[SlurmUsage]:
    """``usage`` with the comments ``sacct`` does not have yet taken from the controller.

    Slurm's accounting stores a job's comment (``AccountingStoreFlags=job_comment``) when the
    job ends: while it runs, ``sacct`` says ``(null)``, and a month reconciled mid-run would take
    the portal's running jobs for jobs submitted to Slurm directly. The controller knows their
    comments (``squeue``): they fill the gap.
    """
    if all(u.comment for u in usage):
        return usage
    queued = squeue(every_state=True)
    return [
        replace(u, comment=queued[u.slurm_id].comment) if not u.comment and u.slurm_id in queued else u for u in usage
    ]


def portal_usage(label: str, start: datetime, end: datetime) -> dict[int, Decimal]:
    """Device-seconds of each portal job in ``[start, end)``, as chargeback counts them (``usage_by_job``).

    Usage whose job was deleted is under job 0.
    """
    found: dict[int, Decimal] = defaultdict(lambda: ZERO)
    for key, seconds in usage_by_job(label, start, end, live=True, team_ids=None).items():
        found[key.job_id or 0] += seconds * key.device_share
    return dict(found)


def hours(device_seconds: Decimal | int) -> Decimal:
    return (Decimal(device_seconds) / Decimal(3600)).quantize(HOURS_PLACES)


@dataclass(frozen=True)
class JobLine:
    """One portal job's device-hours on each side (``None``: that side has no such job)."""

    job_id: int
    portal: Decimal | None
    slurm: Decimal | None
    slurm_ids: tuple[str, ...] = ()

    @property
    def difference(self) -> Decimal:
        return (self.slurm or ZERO) - (self.portal or ZERO)


@dataclass
class Reconciliation:
    """A month's two accounts of device-hours, job by job, and whether they agree."""

    month: str
    timezone: str
    start: datetime
    end: datetime
    jobs: list[JobLine] = field(default_factory=list)
    #: Slurm jobs with no portal comment: submitted to Slurm directly, not the portal's to charge.
    outside_jobs: int = 0
    outside_hours: Decimal = ZERO
    #: Usage records whose job was deleted (a bill outlives its job): charged, but nothing to match.
    unmatched_hours: Decimal = ZERO

    @property
    def portal_total(self) -> Decimal:
        return sum((j.portal or ZERO for j in self.jobs), ZERO)

    @property
    def slurm_total(self) -> Decimal:
        return sum((j.slurm or ZERO for j in self.jobs), ZERO)

    @property
    def share(self) -> Decimal:
        """How far apart the totals are, as a share of the larger (0 when both are 0)."""
        larger = max(self.portal_total, self.slurm_total)
        return abs(self.slurm_total - self.portal_total) / larger if larger else ZERO

    @property
    def agree(self) -> bool:
        return self.share <= TOLERANCE

    def differing(self) -> list[JobLine]:
        """Jobs whose two figures are not equal to the hours' last place, or that only one side has."""
        return [j for j in self.jobs if j.portal is None or j.slurm is None or j.difference != 0]

    def lines(self) -> list[str]:
        """The report, as ``manage.py slurm reconcile`` prints it."""
        tz = zone(self.timezone)
        out = [
            f"npuportal and Slurm, {self.month} ({self.timezone}, "
            f"{self.start.astimezone(tz):%Y-%m-%d %H:%M} to {self.end.astimezone(tz):%Y-%m-%d %H:%M}): "
            f"{len(self.jobs)} job(s)",
            f"{'job':>8}  {'npuportal h':>12}  {'Slurm h':>12}  {'difference':>12}  Slurm job(s)",
        ]
        for j in self.differing():
            portal = "-" if j.portal is None else str(j.portal)
            slurm = "-" if j.slurm is None else str(j.slurm)
            note = ", ".join(j.slurm_ids) or "none"
            if j.portal is None:
                note += " (only in Slurm)"
            elif j.slurm is None:
                note += " (only in npuportal)"
            out.append(f"{j.job_id:>8}  {portal:>12}  {slurm:>12}  {j.difference:>+12}  {note}")
        same = len(self.jobs) - len(self.differing())
        if same:
            out.append(f"{same} job(s) equal on both sides")
        out.append(
            f"{'total':>8}  {self.portal_total:>12}  {self.slurm_total:>12}  "
            f"{self.slurm_total - self.portal_total:>+12}  ({self.share * 100:.2f}%)"
        )
        if self.outside_jobs:
            out.append(
                f"not npuportal's: {self.outside_jobs} Slurm job(s) submitted directly, "
                f"{self.outside_hours} device-hours"
            )
        if self.unmatched_hours:
            out.append(f"not compared: {self.unmatched_hours} device-hours of usage whose job was deleted")
        out.append("agree within 1%" if self.agree else f"do not agree within 1% ({self.share * 100:.2f}% apart)")
        return out


def reconcile(label: str, *, now: datetime | None = None) -> Reconciliation:
    """Compare the month ``label`` (``YYYY-MM`` on the policy's clock) up to ``now`` or its end.

    :class:`quotas.accounting.statements.ChargebackUsageError` for a bad month;
    :class:`devices.executors.slurm.SlurmError` when ``sacct`` does not answer.
    """
    now = now or timezone.now()
    month, _policy = parse_month(label, now)
    end = max(min(month.end, now), month.start)
    portal = portal_usage(month.label, month.start, end)
    slurm: dict[int, list[SlurmUsage]] = defaultdict(list)
    result = Reconciliation(month.label, active_policy().policy.timezone, month.start, end)
    outside = 0
    for usage in slurm_usage(month.start, end) if end > month.start else []:
        job_id = usage.portal_job
        if job_id is None:
            if usage.device_seconds:
                result.outside_jobs += 1
                outside += usage.device_seconds
            continue
        slurm[job_id].append(usage)
    result.outside_hours = hours(outside)
    result.unmatched_hours = hours(portal.pop(0, ZERO))
    for job_id in sorted(set(portal) | {j for j, runs in slurm.items() if any(r.device_seconds for r in runs)}):
        runs = slurm.get(job_id, [])
        result.jobs.append(
            JobLine(
                job_id,
                hours(portal[job_id]) if job_id in portal else None,
                hours(sum(r.device_seconds for r in runs)) if runs else None,
                tuple(r.slurm_id for r in runs),
            )
        )
    return result
