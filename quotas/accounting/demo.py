"""The demo's chargeback: a default rate card, last month's usage history, and last month closed.

Called at the end of :func:`scheduling.demo.seed`; idempotent (a closed last
month means there is nothing to do).
"""

from __future__ import annotations

import logging
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.utils import timezone

from devices.models import Device, VnpuTemplate
from quotas.accounting.records import record_closed_allocations
from quotas.accounting.statements import ChargebackError, close_month, is_closed, previous_month
from quotas.models import ClassMultiplier, Membership, Rate, RateCard, Team
from quotas.policies.versions import active_policy
from scheduling.models import Allocation, Job, JobEvent
from scheduling.services.usage import month_of

log = logging.getLogger(__name__)

#: The demo's prices per card-equivalent hour (a vNPU slice pays its share of the card's price).
DEMO_RATES = {"910B4": "12.00", "910A": "9.00", "310P3": "3.00"}
COMPLETED = (Job.State.COMPLETED, 0, "Completed")
DEMO_MULTIPLIERS = {"critical": "1.5", "high": "1.2", "normal": "1.0", "low": "0.5"}


def default_rate_card(effective_from: object) -> RateCard:
    card = RateCard.objects.create(
        effective_from=effective_from,
        currency="CNY",
        idle_mode=RateCard.IdleMode.SEPARATE,
        reserved_mode=RateCard.ReservedMode.HIDE,
        comment="demo rates",
    )
    Rate.objects.bulk_create(
        Rate(rate_card=card, chip_model=chip, price_per_device_hour=Decimal(price))
        for chip, price in DEMO_RATES.items()
    )
    ClassMultiplier.objects.bulk_create(
        ClassMultiplier(rate_card=card, priority_class=cls, multiplier=Decimal(m))
        for cls, m in DEMO_MULTIPLIERS.items()
    )
    return card


def seed_chargeback(now: datetime | None = None) -> None:
    """Rate card, last month's history and its closed statements, unless already there."""
    now = now or timezone.now()
    policy = active_policy().policy
    label = previous_month(now)
    last = month_of(policy, now, label)
    if not RateCard.objects.exists():
        default_rate_card(last.start.date())
    if is_closed(label):
        return
    last_month_history(now)
    record_closed_allocations(policy=policy)
    try:
        close_month(label, now=now)
    except ChargebackError as exc:  # e.g. an admin's rate card lacks a chip: the demo goes on without it
        log.warning("demo: could not close %s: %s", label, exc)


def last_month_history(now: datetime) -> None:
    """Last month's jobs, unless that month already has some (a site seeded earlier has its own past)."""
    policy = active_policy().policy
    last = month_of(policy, now, previous_month(now))
    if not Job.objects.filter(started_at__gte=last.start, started_at__lt=last.end).exists():
        _last_month_history(last.start, last.end, now)


def _last_month_history(start: datetime, end: datetime, now: datetime) -> None:
    """About thirty finished jobs of the three teams, every few days of last month, on fixed devices."""
    teams = {t.name: t for t in Team.objects.filter(name__in=["inference", "training", "research"])}
    if len(teams) < 3:
        return
    leads = {
        m.team.name: m.user for m in Membership.objects.filter(role=Membership.Role.LEAD).select_related("team", "user")
    }
    b4 = list(Device.objects.filter(chip_model="910B4").order_by("node__name", "index"))
    a = list(Device.objects.filter(chip_model="910A").order_by("node__name", "index"))
    p3 = list(Device.objects.filter(chip_model="310P3").order_by("node__name", "index"))
    vir02 = VnpuTemplate.objects.filter(chip_model="310P3", name="vir02").first()
    if len(b4) < 16 or len(a) < 8 or not p3 or vir02 is None:
        return
    share = vir02.ai_cores / max(1, p3[0].ai_cores)
    # Arithmetic in UTC: hours added to a time on a zone's clock skip or repeat across a DST change.
    start, end = start.astimezone(UTC), end.astimezone(UTC)
    rng = random.Random(start.strftime("%Y-%m"))
    # team, job name, devices, classes to pick from, vNPU template
    plans = [
        ("inference", "qwen-serving", b4[0:2], ["critical", "high", "normal"], None),
        ("inference", "embedding-batch", p3[0:1], ["normal", "high"], vir02),
        ("training", "llama-finetune", b4[4:12], ["normal", "high", "low"], None),
        ("training", "resnet-sweep", a[0:4], ["low", "normal"], None),
        ("research", "graph-ablation", b4[12:14], ["normal", "low"], None),
        ("research", "moe-probe", a[4:6], ["low", "normal"], None),
    ]
    day = timedelta(days=1)
    jobs = []
    for i, (team, name, devices, classes, template) in enumerate(plans):
        at = start + timedelta(hours=9 + 2 * i)
        n = 0
        while at < end - day:
            hours = rng.choice([2, 4, 6, 10, 20, 30])
            stop = at + timedelta(hours=hours)
            state, code, reason = COMPLETED
            if rng.random() < 0.1:
                state, code, reason = Job.State.FAILED, 1, "NonZeroExit"
            elif team == "research" and rng.random() < 0.15:
                state, code, reason = Job.State.PREEMPTED, None, "Preempted"
            jobs.append((team, f"{name}-{n}", devices, rng.choice(classes), template, at, stop, state, code, reason))
            n += 1
            at = stop + timedelta(hours=rng.choice([20, 40, 60]))
    # One job runs across midnight of the 1st: it is charged to both months.
    long_start, long_end = end - timedelta(hours=10), end + timedelta(hours=6)
    jobs.append(("training", "llama-pretrain-long", b4[14:16], "normal", None, long_start, long_end, *COMPLETED))
    latest = now - timedelta(minutes=1)
    for team, name, devices, pclass, template, begin, planned, state, code, reason in jobs:
        stop = min(planned, latest)
        if stop <= begin:
            continue
        lead = leads[team]
        submitted = begin - timedelta(minutes=rng.choice([1, 3, 10, 30, 90]))
        job = Job.objects.create(
            team=teams[team],
            submitter=lead,
            name=name,
            command="python train.py",
            priority_class=pclass,
            num_devices=1 if template else len(devices),
            vnpu_template=template,
            chip_model=devices[0].chip_model,
            estimated_duration_s=int((stop - begin).total_seconds()),
            state=state,
            submitted_at=submitted,
            started_at=begin,
            ended_at=stop,
            exit_code=code,
        )
        JobEvent.objects.bulk_create(
            [
                JobEvent(
                    job=job,
                    at=submitted,
                    recorded_at=submitted,
                    to_state=Job.State.PENDING,
                    reason="Submitted",
                    actor=lead,
                ),
                JobEvent(
                    job=job,
                    at=begin,
                    recorded_at=begin,
                    from_state=Job.State.PENDING,
                    to_state=Job.State.RUNNING,
                    reason="Scheduled",
                ),
                JobEvent(
                    job=job, at=stop, recorded_at=stop, from_state=Job.State.RUNNING, to_state=state, reason=reason
                ),
            ]
        )
        Allocation.objects.bulk_create(
            Allocation(
                job=job,
                device=d,
                vnpu_template=template,
                device_share=share if template else 1.0,
                start=begin,
                end=stop,
            )
            for d in devices
        )
