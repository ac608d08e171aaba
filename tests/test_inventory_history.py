"""The inventory history is written on every path that changes a card's status (issue 19, item 1).

Each writer (cordon, drain, uncordon, a health transition, a node unreachable and back, an admin
edit, a node removed or re-added) appends an ``InventoryEvent`` in its transaction; the tick's sweep
catches a path that did not, in one query when nothing changed; a removed node leaves the snapshot,
the polls, /cluster/ and the API's lists while its rows stay.
"""

from __future__ import annotations

import pytest
from django.contrib.admin.sites import site
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from devices.executors.agents import apply_poll, poll_all
from devices.models import Device, InventoryEvent, Node
from devices.services import inventory, operations, registration
from devices.services.overview import cluster_overview
from devices.services.polling import PollResult
from quotas.policies.versions import active_policy
from scheduling.services.feasibility import inventory as feasibility_inventory
from scheduling.services.snapshot import load_snapshot
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

NODE = "ascend-b4-01"
Status = InventoryEvent.Status


def _last(device: Device) -> InventoryEvent:
    return InventoryEvent.objects.filter(device=device).order_by("-at", "-id").first()


def _statuses(node: str = NODE) -> set[str]:
    return {_last(d).status for d in Device.objects.filter(node__name=node)}


def _answer(node: Node, health: dict[int, str] | None = None) -> PollResult:
    health = health or {}
    devices = [
        {"index": i, "chip_model": "910B4", "health": health.get(i, "OK"), "temp_c": 40, "ecc_errors": 0}
        for i in range(8)
    ]
    return PollResult(node.pk, timezone.now(), devices={"node": node.name, "devices": devices}, jobs=[])


def test_the_demo_starts_with_one_usable_event_per_card(demo) -> None:
    assert InventoryEvent.objects.count() == Device.objects.count() == 28
    assert set(InventoryEvent.objects.values_list("status", flat=True)) == {Status.USABLE}
    assert inventory.sweep() == 0, "nothing changed since the seed"


def test_cordon_records_the_operators_reason_and_uncordon_makes_the_cards_usable(demo) -> None:
    operations.cordon_node(NODE, actor=None, reason="replace fan")
    events = InventoryEvent.objects.filter(node_name=NODE, status=Status.CORDONED)
    assert events.count() == 8
    assert {e.cause for e in events} == {"node cordoned; cordon: replace fan"}

    operations.cordon_node(NODE, actor=None, reason="again")  # no change: no event
    assert InventoryEvent.objects.filter(node_name=NODE, status=Status.CORDONED).count() == 8

    operations.uncordon_node(NODE, actor=None)
    assert _statuses() == {Status.USABLE}
    assert InventoryEvent.objects.filter(node_name=NODE, cause="uncordon").count() == 8


def test_drain_of_an_idle_node_records_draining_then_drained(demo) -> None:
    operations.drain_node(NODE, actor=None, reason="firmware")
    events = InventoryEvent.objects.filter(node_name=NODE, device__index=0).order_by("at", "id")
    seen = list(events.values_list("status", "cause"))
    assert seen[-2:] == [
        (Status.DRAINING, "node draining; drain: firmware"),
        (Status.DRAINED, "node drained; drained: nothing runs on it any more"),
    ]


def test_a_failed_card_is_unhealthy_with_the_tools_words_and_usable_again_after_the_rejoin_streak(
    demo, settings
) -> None:
    settings.HEALTH_REJOIN_POLLS = 2
    node = Node.objects.get(name=NODE)
    apply_poll(_answer(node))  # a first reading: ECC baseline
    apply_poll(_answer(node, {3: "Critical"}))
    card = Device.objects.get(node=node, index=3)
    event = _last(card)
    assert event.status == Status.UNHEALTHY and "npu-smi health Critical" in event.cause
    assert {_last(d).status for d in Device.objects.filter(node=node).exclude(index=3)} == {Status.USABLE}

    apply_poll(_answer(node))
    assert _last(card).status == Status.UNHEALTHY, "one good poll is not enough"
    apply_poll(_answer(node))
    assert _last(card).status == Status.USABLE


def test_an_unreachable_node_is_down_and_usable_again_when_it_rejoins(demo, settings) -> None:
    settings.AGENT_MISSED_POLLS = 1
    settings.AGENT_REJOIN_POLLS = 1
    node = Node.objects.get(name=NODE)
    apply_poll(PollResult(node.pk, timezone.now(), error="connection refused"))
    assert _statuses() == {Status.DOWN}
    assert "node unreachable; missed 1 polls in a row" in _last(Device.objects.get(node=node, index=0)).cause

    apply_poll(_answer(node))
    assert _statuses() == {Status.USABLE}


def test_an_admin_marking_a_card_unschedulable_disables_it(demo, user_factory) -> None:
    admin_user = user_factory("root", staff=True)
    card = Device.objects.get(node__name=NODE, index=5)
    card.schedulable = False
    request = RequestFactory().post("/admin/")
    request.user = admin_user
    site._registry[Device].save_model(request, card, form=None, change=True)
    event = _last(card)
    assert event.status == Status.DISABLED and event.cause == "card marked unschedulable; admin: changed by root"


def test_the_sweep_catches_an_unrecorded_change_and_costs_one_query_when_nothing_changed(demo) -> None:
    Node.objects.filter(name=NODE).update(state=Node.State.CORDONED)  # a path that forgot the history
    assert inventory.sweep() == 8
    assert _statuses() == {Status.CORDONED}
    with CaptureQueriesContext(connection) as queries:
        assert inventory.sweep() == 0
    assert len(queries) == 1, [q["sql"] for q in queries]


def test_the_tick_runs_the_sweep(demo) -> None:
    Node.objects.filter(name=NODE).update(reachable=False)
    run_tick()
    assert _statuses() == {Status.DOWN}


def test_a_removed_node_leaves_the_inventory_and_keeps_its_rows(demo, api, user_factory) -> None:
    done = registration.remove_node(NODE, actor=None, reason="decommissioned")
    assert done.removed
    node = Node.objects.get(name=NODE)
    assert node.removed_at is not None and node.devices.count() == 8
    assert _statuses() == {Status.REMOVED}
    assert _last(node.devices.first()).cause == "node removed; removed: decommissioned"

    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    assert NODE not in {n.name for n in snapshot.nodes}
    nodes, _ = feasibility_inventory()
    assert NODE not in {n.name for n in nodes}
    assert NODE not in {n.node.name for n in cluster_overview(None).nodes}
    assert cluster_overview(None).total == 20

    lead = user_factory("lead-r", team="training", role="lead")
    listed = api(lead).get("/api/v1/nodes/").json()
    assert NODE not in {n["name"] for n in listed["results"]}
    removed = api(lead).get("/api/v1/nodes/?removed=true").json()["results"]
    assert [n["name"] for n in removed] == [NODE] and removed[0]["removed_at"]
    devices = api(lead).get("/api/v1/devices/?node=" + NODE).json()["results"]
    assert devices == []

    Node.objects.filter(name=NODE).update(agent_url="http://127.0.0.1:9")  # an agent that would not answer
    assert poll_all().polled == 0, "a removed node is not polled"
    assert inventory.sweep() == 0


def test_removing_a_node_with_running_jobs_is_refused_unless_drained(demo, user_factory) -> None:
    from tests.test_node_drained import _running_job

    lead = user_factory("lead-d", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job, devices__allocations__end__isnull=True).distinct()
    name = name.get().name
    with pytest.raises(registration.RegistrationError, match=rf"runs 1 job\(s\): {job.pk} \(drain-me\)") as refused:
        registration.remove_node(name, actor=None)
    assert refused.value.kind == "busy"
    assert Node.objects.get(name=name).removed_at is None

    drained = registration.remove_node(name, actor=None, drain=True)
    assert not drained.removed and drained.node.state == Node.State.DRAINING
    from scheduling.services import jobs as job_service

    job_service.finish_job(job.pk, exit_code=0)
    assert Node.objects.get(name=name).state == Node.State.DRAINED
    assert registration.remove_node(name, actor=None).removed


def test_the_name_of_a_removed_node_reactivates_it_with_new_events(demo, monkeypatch) -> None:
    registration.remove_node(NODE, actor=None)
    reported = [registration.ReportedDevice(i, "910B4", 32768, 20, 7, "hccs0") for i in range(8)]
    monkeypatch.setattr(registration, "ask_agent", lambda *args: (reported, []))
    with pytest.raises(registration.RegistrationError, match="already in the inventory"):
        registration.register_node("ascend-b4-02", "http://10.0.0.9:8471", "t" * 20, actor=None)

    done = registration.register_node(NODE, "http://10.0.0.5:8471", "t" * 20, actor=None)
    assert done.reactivated and done.devices == 8
    node = Node.objects.get(name=NODE)
    assert node.removed_at is None and node.agent_url == "http://10.0.0.5:8471" and node.devices.count() == 8
    events = InventoryEvent.objects.filter(device__node=node, device__index=0).order_by("at", "id")
    first = list(events.values_list("status", flat=True))
    assert first == [Status.USABLE, Status.REMOVED, Status.USABLE]
    assert _last(node.devices.first()).cause == "rejoined: registered from http://10.0.0.5:8471"
    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    assert NODE in {n.name for n in snapshot.nodes}


def test_a_node_added_in_the_django_admin_joins_with_its_cards(db, client, user_factory) -> None:
    admin_user = user_factory("root-admin", staff=True)
    admin_user.is_superuser = True
    admin_user.save()
    client.force_login(admin_user)
    form = {
        "name": "admin-node",
        "agent_url": "",
        "agent_token": "",
        "labels": "{}",
        "state": "ready",
        "reachable": "on",
        "missed_polls": "0",
        "answered_polls": "0",
        "last_poll_error": "",
        "devices-TOTAL_FORMS": "2",
        "devices-INITIAL_FORMS": "0",
        "devices-MIN_NUM_FORMS": "0",
        "devices-MAX_NUM_FORMS": "1000",
    }
    for i in range(2):
        form |= {
            f"devices-{i}-index": str(i),
            f"devices-{i}-chip_model": "910A",
            f"devices-{i}-topology_group": "ring0",
            f"devices-{i}-health": "healthy",
            f"devices-{i}-schedulable": "on",
        }
    resp = client.post("/admin/devices/node/add/", form)
    assert resp.status_code == 302, resp.content.decode()[:3000]
    events = InventoryEvent.objects.filter(node_name="admin-node")
    assert sorted(events.values_list("device__index", "status")) == [(0, Status.USABLE), (1, Status.USABLE)]
    assert {e.cause for e in events} == {"joined: added in the admin by root-admin"}


def test_a_removed_nodes_cards_are_not_offered_to_a_submission(demo, user_factory) -> None:
    from quotas.models import Team
    from scheduling.services import jobs as job_service

    registration.remove_node("ascend-310p-01", actor=None)
    lead = user_factory("lead-s", team="inference", role="lead")
    spec = job_service.JobSpec(name="p3", command="true", num_devices=1, chip_model="310P3")
    with pytest.raises(
        job_service.SubmissionError, match="no device of model '310P3' in the cluster; known: 910A, 910B4"
    ):
        job_service.submit_job(team=Team.objects.get(name="inference"), user=lead, spec=spec)


def test_cards_in_use_outside_npuportal_are_unusable_and_counted_apart_in_capacity(demo) -> None:
    """A job submitted to Slurm directly holds two cards (``devices.slurm.foreign``): never given, charged apart."""
    from datetime import timedelta

    from devices.slurm.foreign import HeldCards, record_outside_use
    from quotas.accounting.statements import provisioned_capacity

    before = timezone.now()
    changed = record_outside_use([HeldCards("42", "alice", {NODE: (3, 5)})])
    assert len(changed) == 2
    held = Device.objects.filter(node__name=NODE, index__in=[3, 5])
    assert {_last(d).status for d in held} == {Status.OUTSIDE}
    assert _last(held[0]).cause.startswith("in use outside npuportal: Slurm job 42 of alice")
    assert inventory.sweep() == 0, "the sweep derives the same status"
    snapshot, _ = load_snapshot(timezone.now(), active_policy().policy)
    usable = {(d.node, d.index): d.usable for n in snapshot.nodes for d in n.devices}
    assert (usable[(NODE, 3)], usable[(NODE, 4)], usable[(NODE, 5)]) == (False, True, False)
    assert record_outside_use([HeldCards("42", "alice", {NODE: (3, 5)})]) == [], "nothing changed: nothing written"

    later = timezone.now() + timedelta(hours=1)
    capacity = provisioned_capacity(before, later)["910B4"]
    assert set(capacity.unavailable_by_status) == {Status.OUTSIDE}
    outside_s = float(capacity.unavailable_by_status[Status.OUTSIDE])
    assert 2 * 3600 <= outside_s <= 2 * 3600 + 60, "two cards for the hour, apart from the idle ones"

    assert len(record_outside_use([])) == 2, "the job ended: both cards are usable again"
    assert {_last(d).status for d in held} == {Status.USABLE}
