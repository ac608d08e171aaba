"""An unreachable node takes work again only after answering several polls in a row (flap damping)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from devices.executors.agents import apply_poll
from devices.models import HealthEvent, Node
from devices.services.polling import PollResult
from quotas.policies.versions import active_policy
from scheduling.services.snapshot import load_snapshot

pytestmark = pytest.mark.django_db

NODE = "ascend-b4-01"


def _missed(node: Node) -> PollResult:
    return PollResult(node.pk, timezone.now(), error="connection refused")


def _answered(node: Node) -> PollResult:
    devices = [{"index": i, "chip_model": "910B4", "health": "OK", "temp_c": 40} for i in range(8)]
    body = {"node": node.name, "backend": "simulated", "devices": devices}
    return PollResult(node.pk, timezone.now(), devices=body, jobs=[])


def _schedulable_in_the_tick() -> bool:
    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    return next(n for n in snapshot.nodes if n.name == NODE).schedulable


def test_a_node_back_from_unreachable_rejoins_after_k_answers_in_a_row(demo, settings) -> None:
    settings.AGENT_MISSED_POLLS = 2
    settings.AGENT_REJOIN_POLLS = 3
    node = Node.objects.get(name=NODE)
    for _ in range(2):
        apply_poll(_missed(node))
    node.refresh_from_db()
    assert not node.reachable and not _schedulable_in_the_tick()

    # It answers, drops out again, then answers: each miss starts the streak over.
    apply_poll(_answered(node))
    node.refresh_from_db()
    assert not node.reachable and node.answered_polls == 1 and node.missed_polls == 0
    assert node.last_heartbeat is not None, "its answer is recorded even before it rejoins"
    apply_poll(_missed(node))
    node.refresh_from_db()
    assert not node.reachable and node.answered_polls == 0
    for expected in (1, 2):
        apply_poll(_answered(node))
        node.refresh_from_db()
        assert not node.reachable and node.answered_polls == expected
        assert not _schedulable_in_the_tick(), "no work before the streak is complete"
    assert not HealthEvent.objects.filter(node=node, to_health="reachable").exists()

    apply_poll(_answered(node))
    node.refresh_from_db()
    assert node.reachable and node.answered_polls == 3 and _schedulable_in_the_tick()
    event = HealthEvent.objects.get(node=node, to_health="reachable")
    assert "3 polls in a row" in event.reason


def test_one_answer_is_enough_when_the_setting_says_so(demo, settings) -> None:
    settings.AGENT_MISSED_POLLS = 1
    settings.AGENT_REJOIN_POLLS = 1
    node = Node.objects.get(name=NODE)
    apply_poll(_missed(node))
    node.refresh_from_db()
    assert not node.reachable
    apply_poll(_answered(node))
    node.refresh_from_db()
    assert node.reachable


def test_the_console_and_the_api_show_the_rejoin_streak(demo, settings, client, api, user_factory) -> None:
    settings.AGENT_MISSED_POLLS = 1
    settings.AGENT_REJOIN_POLLS = 3
    node = Node.objects.get(name=NODE)
    apply_poll(_missed(node))
    apply_poll(_answered(node))
    admin = user_factory("ops", staff=True)
    client.force_login(admin)
    page = client.get(f"/nodes/{NODE}/").content.decode()
    assert "unreachable" in page and "answering again: 1 poll in a row; it takes work after 3" in page
    body = api(admin).get(f"/api/v1/nodes/{NODE}/").json()
    assert body["reachable"] is False and body["answered_polls"] == 1
