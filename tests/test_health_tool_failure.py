"""A vendor tool that fails is no reading: health stays, the poll counts as missed."""

from __future__ import annotations

import pytest
from django.utils import timezone

from devices.executors.agents import apply_poll
from devices.models import Device, Node
from devices.services.polling import PollResult

pytestmark = pytest.mark.django_db


def _tool_failed(node: Node) -> PollResult:
    devices = [{"index": i, "chip_model": "910B4", "health": "UNKNOWN"} for i in range(8)]
    body = {"node": node.name, "backend": "npu-smi", "devices": devices, "error": "npu-smi timed out after 10 s"}
    return PollResult(node.pk, timezone.now(), devices=body, jobs=[])


def test_tool_failure_keeps_health_and_ends_unreachable_after_n_misses(demo, settings) -> None:
    settings.AGENT_MISSED_POLLS = 3
    node = Node.objects.get(name="ascend-b4-01")
    apply_poll(_tool_failed(node))
    node.refresh_from_db()
    assert set(Device.objects.filter(node=node).values_list("health", flat=True)) == {"healthy"}
    assert node.missed_polls == 1 and node.reachable
    assert "npu-smi timed out" in node.last_poll_error
    apply_poll(_tool_failed(node))
    apply_poll(_tool_failed(node))
    node.refresh_from_db()
    assert not node.reachable and node.missed_polls == 3
    assert set(Device.objects.filter(node=node).values_list("health", flat=True)) == {"healthy"}
