"""``seed_demo`` builds the documented demo site, once."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core.management import call_command

from devices.models import Device, Node, VnpuTemplate
from quotas.models import Membership, Policy, Team
from scheduling.models import Job

pytestmark = [pytest.mark.django_db, pytest.mark.clock]


def test_seed_demo_builds_the_documented_cluster_and_is_idempotent() -> None:
    out = StringIO()
    call_command("seed_demo", "--no-agents", stdout=out)
    first = out.getvalue()
    assert "admin" in first and "lead-training" in first
    counts = (Node.objects.count(), Device.objects.count(), Job.objects.count(), Policy.objects.count())
    out2 = StringIO()
    call_command("seed_demo", "--no-agents", stdout=out2)
    assert "already present" in out2.getvalue()
    assert (Node.objects.count(), Device.objects.count(), Job.objects.count(), Policy.objects.count()) == counts

    b4 = Device.objects.filter(chip_model="910B4")
    assert b4.count() == 16
    assert set(b4.values_list("topology_group", flat=True)) == {"hccs0"}
    assert set(b4.values_list("hbm_mb", flat=True)) == {32768}
    assert set(b4.values_list("ai_cores", flat=True)) == {20}
    rings = Device.objects.filter(chip_model="910A").values_list("index", "topology_group")
    assert dict(rings) == {
        0: "ring0",
        1: "ring0",
        2: "ring0",
        3: "ring0",
        4: "ring1",
        5: "ring1",
        6: "ring1",
        7: "ring1",
    }
    assert Device.objects.filter(chip_model="310P3").count() == 4
    assert set(VnpuTemplate.objects.filter(chip_model="310P3").values_list("name", flat=True)) == {
        "vir01",
        "vir02",
        "vir04",
    }
    assert sorted(Team.objects.values_list("name", flat=True)) == ["inference", "research", "training"]
    assert {t.department.name for t in Team.objects.all()} == {"ai-lab"}
    assert Membership.objects.filter(role="lead").count() == 3
    assert Policy.objects.get(is_active=True).version == 1
    states = set(Job.objects.values_list("state", flat=True))
    assert {"completed", "failed", "cancelled"} <= states
