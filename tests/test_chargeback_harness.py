"""A small, fully known cluster for the chargeback tests: no tests here, only the harness.

Four 910B4 cards and two 310P3 cards (vNPU template ``vir02`` = 2 of 8 AI cores, a
quarter card), teams ``alpha`` (guarantee 3 devices) and ``beta`` (guarantee 1),
the policy clock on Asia/Shanghai (UTC+8, no DST), and a rate card from
2025-01-01 in CNY: 910B4 ¥12/device-hour, 310P3 ¥3; multipliers critical ×1.5,
high ×1.2, normal ×1.0, low ×0.5.

The months the tests bill are in 2025, long over, so they can be closed; every card
joined the inventory on 2025-01-01 (its first ``InventoryEvent``); March 2025 has
31 days = 744 hours, so the cluster's capacity that month is
4 × 744 = 2976 device-hours of 910B4 and 2 × 744 = 1488 of 310P3.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

TZ = ZoneInfo("Asia/Shanghai")

POLICY = """\
apiVersion: npuportal/v1
kind: SchedulingPolicy
metadata: {name: chargeback-test}
spec:
  timezone: Asia/Shanghai
  priorityClasses:
    - {name: critical, preempts: [normal, low], preemptible: false}
    - {name: high, preempts: [low]}
    - {name: normal, default: true}
    - {name: low}
  preemption: {gracePeriod: 30s, onPreempt: requeue}
  RESERVATIONS
  teams:
    - {name: alpha, quota: {guaranteed: {devices: 3}, max: {devices: 6}}}
    - {name: beta, quota: {guaranteed: {devices: 1}, max: {devices: 6}}}
  defaults:
    quota: {guaranteed: {devices: 0}, max: {devices: 4}}
"""
RESERVATION = "reservations:\n    - {name: online, ratio: 0.25, chipModels: [910B4], forPriorityClasses: [critical]}"


def at(text: str) -> datetime:
    """A wall-clock time on the policy clock: ``at("2025-03-31 20:00")``."""
    return datetime.fromisoformat(text).replace(tzinfo=TZ)


JOINED = at("2025-01-01 00:00")  # when the harness's cards joined the inventory


@dataclass
class World:
    b4: list
    p3: list
    vir02: object
    alpha: object
    beta: object
    lead_alpha: object
    lead_beta: object
    member_alpha: object
    card: object

    def team(self, name: str) -> object:
        return {"alpha": self.alpha, "beta": self.beta}[name]

    def job(
        self,
        team: str,
        pclass: str,
        devices: list,
        start: datetime,
        end: datetime | None,
        *,
        template: object | None = None,
        state: str | None = None,
        submitted: datetime | None = None,
    ) -> object:
        """A job holding ``devices`` from ``start`` to ``end`` (``None``: still running)."""
        from scheduling.models import Allocation, Job

        team_obj = self.team(team)
        lead = self.lead_alpha if team == "alpha" else self.lead_beta
        job = Job.objects.create(
            team=team_obj,
            submitter=lead,
            name=f"{team}-{pclass}-{start:%m%d%H%M}",
            command="true",
            priority_class=pclass,
            num_devices=1 if template else len(devices),
            vnpu_template=template,
            chip_model=devices[0].chip_model,
            state=state or (Job.State.RUNNING if end is None else Job.State.COMPLETED),
            submitted_at=submitted or start,
            started_at=start,
            ended_at=end,
        )
        share = template.ai_cores / devices[0].ai_cores if template else 1.0
        Allocation.objects.bulk_create(
            Allocation(job=job, device=d, vnpu_template=template, device_share=share, start=start, end=end)
            for d in devices
        )
        return job


def make_card(effective: str, *, idle_mode: str = "hide", reserved_mode: str = "hide", b4: str = "12.00") -> object:
    from quotas.models import ClassMultiplier, Rate, RateCard

    card = RateCard.objects.create(
        effective_from=effective, currency="CNY", idle_mode=idle_mode, reserved_mode=reserved_mode
    )
    Rate.objects.create(rate_card=card, chip_model="910B4", price_per_device_hour=Decimal(b4))
    Rate.objects.create(rate_card=card, chip_model="310P3", price_per_device_hour=Decimal("3.00"))
    for cls, factor in {"critical": "1.5", "high": "1.2", "normal": "1.0", "low": "0.5"}.items():
        ClassMultiplier.objects.create(rate_card=card, priority_class=cls, multiplier=Decimal(factor))
    return card


def build_world(*, idle_mode: str = "hide", reserved_mode: str = "hide", reservation: bool = False) -> World:
    from django.contrib.auth import get_user_model

    from devices.models import Device, Node, VnpuTemplate
    from devices.services import inventory
    from quotas.models import Membership, Team
    from quotas.policies.versions import create_version

    b4_node = Node.objects.create(name="b4-node")
    p3_node = Node.objects.create(name="p3-node")
    b4 = [Device.objects.create(node=b4_node, index=i, chip_model="910B4", ai_cores=20) for i in range(4)]
    p3 = [Device.objects.create(node=p3_node, index=i, chip_model="310P3", ai_cores=8) for i in range(2)]
    vir02 = VnpuTemplate.objects.create(chip_model="310P3", name="vir02", memory_mb=6144, ai_cores=2, ai_cpus=2)
    # Every card joined the inventory long before the months the tests bill: a full month each.
    inventory.record(Device.objects.select_related("node"), at=JOINED)
    alpha = Team.objects.create(name="alpha")
    beta = Team.objects.create(name="beta")
    User = get_user_model()

    def user(name: str, team: Team, role: str) -> object:
        u = User.objects.create_user(name, email=f"{name}@example.com", password="pw-" + name)
        Membership.objects.create(user=u, team=team, role=role)
        return u

    lead_alpha = user("lead-alpha", alpha, "lead")
    lead_beta = user("lead-beta", beta, "lead")
    member_alpha = user("member-alpha", alpha, "member")
    create_version(POLICY.replace("RESERVATIONS", RESERVATION if reservation else ""), author=None, comment="test")
    card = make_card("2025-01-01", idle_mode=idle_mode, reserved_mode=reserved_mode)
    return World(b4, p3, vir02, alpha, beta, lead_alpha, lead_beta, member_alpha, card)


@pytest.fixture
def world(db) -> World:
    return build_world()


def lines_of(team: str | None, month: str) -> list[tuple[str, str, str, str, str, str, str, str]]:
    """A closed statement's lines as strings: (kind, chip, template, class, hours, rate, multiplier, amount)."""
    from quotas.models import Statement

    statement = (
        Statement.objects.get(team__isnull=True, month=month)
        if team is None
        else Statement.objects.get(team__name=team, month=month)
    )
    return [
        (
            ln.kind,
            ln.chip_model,
            ln.vnpu_template,
            ln.priority_class,
            str(ln.device_hours),
            str(ln.rate),
            str(ln.multiplier),
            str(ln.amount),
        )
        for ln in statement.lines.order_by("id")
    ]


def total_of(team: str | None, month: str) -> str:
    from quotas.models import Statement

    if team is None:
        return str(Statement.objects.get(team__isnull=True, month=month).total)
    return str(Statement.objects.get(team__name=team, month=month).total)
