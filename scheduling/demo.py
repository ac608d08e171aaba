"""The demo site: its cluster, teams, users, policy and a few jobs with a past.

Kept apart from the command so tests can build the same site.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from devices.models import Device, Node, VnpuTemplate
from quotas.models import Department, Membership, Policy, Team
from quotas.policies.versions import create_version
from quotas.tenancy.roles import FINANCE_GROUP
from scheduling.models import Allocation, Job, JobEvent

DEMO_POLICY = settings.BASE_DIR / "examples" / "policies" / "demo.yaml"


def agent_base_port() -> int:
    """First port of the demo agents (one per node, counting up)."""
    import os

    return int(os.environ.get("NPUPORTAL_AGENT_BASE_PORT", "8471"))


@dataclass(frozen=True)
class NodeSpec:
    name: str
    chip: str
    devices: int
    hbm_mb: int
    ai_cores: int
    ai_cpus: int
    ring_size: int  # devices per topology group


NODES = [
    NodeSpec("ascend-b4-01", "910B4", 8, 32768, 20, 7, 8),
    NodeSpec("ascend-b4-02", "910B4", 8, 32768, 20, 7, 8),
    NodeSpec("ascend-a-01", "910A", 8, 32768, 32, 14, 4),
    NodeSpec("ascend-310p-01", "310P3", 4, 24576, 8, 8, 4),
]
TEMPLATES = [
    # chip, name, memory MB, AI cores, AI CPUs (Ascend's published vNPU templates)
    ("310P3", "vir01", 3072, 1, 1),
    ("310P3", "vir02", 6144, 2, 2),
    ("310P3", "vir04", 12288, 4, 4),
    ("910B4", "vir05_1c_8g", 8192, 5, 1),
    ("910B4", "vir10_3c_16g", 16384, 10, 3),
]
TEAMS = ["inference", "training", "research"]


def agents_file() -> Path:
    return settings.VAR_DIR / "demo_agents.json"


def logins_file() -> Path:
    return settings.VAR_DIR / "demo_logins.txt"


def _ring(spec: NodeSpec, index: int) -> str:
    if spec.ring_size >= spec.devices:
        return "hccs0"
    return f"ring{index // spec.ring_size}"


@transaction.atomic
def seed(*, with_agents: bool = True, policy_text: str | None = None) -> dict[str, str]:
    """Create whatever of the demo is missing; returns new passwords (empty if none were made).

    ``policy_text`` replaces the demo policy's YAML (the tests seed it on other clocks).
    """
    agent_dir = settings.VAR_DIR / "agents"
    agent_dir.mkdir(parents=True, exist_ok=True)
    agents = []
    joined: list[str] = []  # nodes this run registers: their history starts below, once the policy's clock is known
    for i, spec in enumerate(NODES):
        port = agent_base_port() + i
        token_file = agent_dir / f"{spec.name}.token"
        if not token_file.exists():
            token_file.write_text(secrets.token_urlsafe(24))
            token_file.chmod(0o600)
        node, created = Node.objects.get_or_create(name=spec.name, defaults={"labels": {"demo": True, "rack": "r1"}})
        if created:
            joined.append(node.name)
        if with_agents:
            node.agent_url = f"http://127.0.0.1:{port}"
            node.agent_token = token_file.read_text().strip()
            node.save(update_fields=["agent_url", "agent_token"])
        for index in range(spec.devices):
            Device.objects.get_or_create(
                node=node,
                index=index,
                defaults={
                    "chip_model": spec.chip,
                    "hbm_mb": spec.hbm_mb,
                    "ai_cores": spec.ai_cores,
                    "ai_cpus": spec.ai_cpus,
                    "topology_group": _ring(spec, index),
                },
            )
        agents.append(
            {
                "name": spec.name,
                "port": port,
                "token_file": str(token_file),
                "chip": spec.chip,
                "devices": spec.devices,
                "state_dir": str(agent_dir / spec.name),
            }
        )
    agents_file().write_text(json.dumps(agents, indent=2))
    for chip, name, mem, cores, cpus in TEMPLATES:
        VnpuTemplate.objects.get_or_create(
            chip_model=chip, name=name, defaults={"memory_mb": mem, "ai_cores": cores, "ai_cpus": cpus}
        )

    dept, _ = Department.objects.get_or_create(name="ai-lab", defaults={"description": "AI lab"})
    teams = {}
    for name in TEAMS:
        teams[name], _ = Team.objects.get_or_create(name=name, defaults={"department": dept})

    User = get_user_model()
    passwords: dict[str, str] = {}
    if not User.objects.filter(username="admin").exists():
        passwords["admin"] = secrets.token_urlsafe(9)
        User.objects.create_superuser("admin", "admin@example.com", passwords["admin"])
    for name in TEAMS:
        username = f"lead-{name}"
        user = User.objects.filter(username=username).first()
        if user is None:
            passwords[username] = secrets.token_urlsafe(9)
            user = User.objects.create_user(username, f"{username}@example.com", passwords[username])
        Membership.objects.get_or_create(user=user, team=teams[name], defaults={"role": Membership.Role.LEAD})
    if not User.objects.filter(username="finance").exists():
        # Reports, statements and rate cards of every team; no team, so no jobs (quotas/tenancy/roles.py).
        passwords["finance"] = secrets.token_urlsafe(9)
        finance = User.objects.create_user("finance", "finance@example.com", passwords["finance"])
        finance.groups.add(Group.objects.get_or_create(name=FINANCE_GROUP)[0])
    if passwords:
        lines = [f"{u}\t{p}" for u, p in passwords.items()]
        path = logins_file()
        existing = path.read_text() if path.exists() else ""
        path.write_text(existing + "\n".join(lines) + "\n")
        path.chmod(0o600)

    if not Policy.objects.exists():
        create_version(
            policy_text or DEMO_POLICY.read_text(),
            author=User.objects.get(username="admin"),
            comment="demo policy",
            activate=True,
        )
    from quotas.accounting.demo import last_month_history, seed_chargeback

    if joined:
        _register(joined, timezone.now())
    if not Job.objects.exists():
        now = timezone.now()
        # Last month first, then the recent jobs on cards that last month's left free: on the
        # 1st of a month "30 hours ago" is last month, and a card holds one job at a time.
        last_month_history(now)
        _history(teams, now)
    seed_chargeback()  # a rate card, last month's usage, and last month's closed statements
    return passwords


def registration_time(now: datetime) -> datetime:
    """When the demo's nodes joined: the start of last month on the policy's clock.

    The demo's past jobs run from last month on (``quotas.accounting.demo``), so a card that joined
    then was in the inventory before any job ran on it, and chargeback counts it from then.
    """
    from quotas.accounting.statements import previous_month
    from quotas.policies.versions import active_policy
    from scheduling.services.usage import month_of

    return month_of(active_policy().policy, now, previous_month(now)).start


def _register(names: list[str], now: datetime) -> None:
    """The demo nodes' registration: ``Node.created`` and one ``usable`` inventory event per card, then."""
    from devices.services import inventory

    at = registration_time(now)
    Node.objects.filter(name__in=names).update(created=at)
    inventory.record_nodes(names, at=at, cause="joined: demo node")


def _free_from(devices: list[Device]) -> datetime | None:
    """When the last allocation already on ``devices`` ends (None: they never ran anything)."""
    return Allocation.objects.filter(device__in=devices).aggregate(latest=Max("end"))["latest"]


def _history(teams: dict[str, Team], now: datetime) -> None:
    """A few finished jobs of the last hours, so usage, fair share and the job list have something to show.

    Each starts ``hours_ago`` before now, or later when its cards were still busy with last
    month's history then; a job with no room left before now is left out.
    """
    b4 = list(Device.objects.filter(chip_model="910B4").order_by("node__name", "index"))
    a = list(Device.objects.filter(chip_model="910A").order_by("index"))
    past = [
        ("training", "llama-7b-pretrain", b4[:8], 30, 20, Job.State.COMPLETED, 0, "normal"),
        ("training", "resnet50-sweep", a[:4], 26, 3, Job.State.FAILED, 137, "low"),
        ("inference", "qwen-serving-canary", b4[8:10], 20, 6, Job.State.COMPLETED, 0, "high"),
        ("research", "graph-nn-ablation", a[4:6], 12, 4, Job.State.COMPLETED, 0, "normal"),
        ("research", "tokenizer-bench", [], 5, 0, Job.State.CANCELLED, None, "low"),
    ]
    for team, name, devices, hours_ago, hours, state, code, pclass in past:
        lead = Membership.objects.get(team=teams[team], role=Membership.Role.LEAD).user
        start = now - timedelta(hours=hours_ago)
        busy_until = _free_from(devices) if devices else None
        if busy_until is not None and busy_until + timedelta(minutes=5) > start:
            start = busy_until + timedelta(minutes=5)
        submitted = start - timedelta(minutes=5)
        end = (
            min(start + timedelta(hours=hours), now - timedelta(minutes=1)) if devices else start + timedelta(minutes=5)
        )
        if devices and end - start < timedelta(minutes=10):
            continue
        job = Job.objects.create(
            team=teams[team],
            submitter=lead,
            name=name,
            command="python train.py",
            priority_class=pclass,
            num_devices=max(1, len(devices)),
            chip_model=devices[0].chip_model if devices else "",
            estimated_duration_s=hours * 3600 or 600,
            state=state,
            submitted_at=submitted,
            started_at=start if devices else None,
            ended_at=end,
            exit_code=code,
        )
        JobEvent.objects.create(
            job=job, at=submitted, recorded_at=submitted, to_state=Job.State.PENDING, reason="Submitted", actor=lead
        )
        if devices:
            JobEvent.objects.create(
                job=job,
                at=start,
                recorded_at=start,
                from_state=Job.State.PENDING,
                to_state=Job.State.RUNNING,
                reason="Scheduled",
            )
            Allocation.objects.bulk_create(Allocation(job=job, device=d, start=start, end=end) for d in devices)
            JobEvent.objects.create(
                job=job,
                at=end,
                recorded_at=end,
                from_state=Job.State.RUNNING,
                to_state=state,
                reason="Completed" if code == 0 else "NonZeroExit",
            )
        else:
            JobEvent.objects.create(
                job=job,
                at=end,
                recorded_at=end,
                from_state=Job.State.PENDING,
                to_state=state,
                reason="Cancelled",
                actor=lead,
            )
