"""``npuctl nodes`` shows a draining node as drained once its last job ends (issue 18, item 4)."""

from __future__ import annotations

import pytest

from devices.models import Node
from devices.services.operations import drain_node, uncordon_node
from quotas.models import Team
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick
from tests.test_cli_live import _rows, cli

pytestmark = pytest.mark.django_db(transaction=True)
__all__ = ["cli"]  # a fixture, imported for pytest


def test_npuctl_nodes_prints_draining_then_drained_then_ready(cli) -> None:
    lead = Team.objects.get(name="training").memberships.get(user__username="cli-lead").user
    spec = job_service.JobSpec(name="last", command="sleep 60", num_devices=2, chip_model="910A")
    job = job_service.submit_job(team=Team.objects.get(name="training"), user=lead, spec=spec)
    run_tick()
    name = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    drain_node(name, actor=None)

    def state() -> str:
        code, out, _ = cli("member", "nodes")
        assert code == 0
        return {r[0]: r[1] for r in _rows(out)[1:]}[name]

    assert state() == "draining"
    job_service.finish_job(job.pk, exit_code=0)
    assert state() == "drained"
    uncordon_node(name, actor=None)
    assert state() == "ready"
