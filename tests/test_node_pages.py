"""What the cluster and node pages say is so: a removed node is read-only and says when it left,
busy cards on a cordoned node count as both, utilisation leaves drained cards out, readings carry
their units, and the health history is there even when it is empty."""

from __future__ import annotations

import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from devices.models import Device, HealthEvent, InventoryEvent, Node
from devices.services import operations, registration
from quotas.models import AuditEvent, Team
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(demo, user_factory):
    return {
        "admin": user_factory("root", staff=True),
        "lead": user_factory("lena", team="training", role="lead"),
    }


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _counts(html: str) -> dict[str, int]:
    return {s: int(n) for s, n in re.findall(r'id="cards-(\w+)"><strong>(\d+)</strong>', html)}


# -- a removed node ---------------------------------------------------------------------------------


@pytest.fixture
def removed(people) -> Node:
    registration.remove_node("ascend-a-01", actor=people["admin"], reason="sent back")
    return Node.objects.get(name="ascend-a-01")


def test_a_removed_node_refuses_every_operation_and_says_when_it_left(removed) -> None:
    audits, history = AuditEvent.objects.count(), InventoryEvent.objects.count()
    for use in (operations.cordon_node, operations.drain_node, operations.uncordon_node):
        with pytest.raises(operations.NodeRemoved, match=r"node ascend-a-01 was removed from the inventory on 20"):
            use("ascend-a-01", actor=None)
    removed.refresh_from_db()
    assert removed.state == Node.State.READY and removed.removed_at is not None
    assert (AuditEvent.objects.count(), InventoryEvent.objects.count()) == (audits, history), "nothing written"


@pytest.mark.parametrize("action", ["cordon", "drain", "uncordon"])
def test_the_api_refuses_a_removed_node_with_409(removed, people, api, action: str) -> None:
    resp = api(people["admin"]).post(f"/api/v1/nodes/ascend-a-01/{action}/", {"reason": "x"}, format="json")
    assert resp.status_code == 409, resp.content
    body = resp.json()
    assert body["field"] == "name" and "was removed from the inventory on" in body["error"]
    assert Node.objects.get(name="ascend-a-01").state == Node.State.READY


def test_the_removed_nodes_page_is_read_only(removed, people) -> None:
    admin = _client(people["admin"])
    html = admin.get("/nodes/ascend-a-01/").content.decode()
    assert 'id="node-removed"' in html and "Removed from the inventory on" in html
    assert "Cordon</button>" not in html and "Uncordon</button>" not in html and "Drain</button>" not in html
    assert 'hx-get="/live/nodes/ascend-a-01/"' not in html, "a removed node's page does not poll"
    assert 'class="node-badge node-removed">Removed' in html
    assert "card-free" not in html and html.count('class="card-removed"') == 8, "its cards are removed, not free"


@pytest.mark.parametrize("action", ["cordon", "drain", "uncordon"])
def test_a_post_to_a_removed_nodes_button_changes_nothing_and_says_why(removed, people, action: str) -> None:
    admin = _client(people["admin"])
    resp = admin.post(f"/nodes/ascend-a-01/{action}/", {"reason": "x", "confirm": "yes"}, follow=True)
    html = resp.content.decode()
    assert resp.status_code == 200 and "was removed from the inventory on" in html
    assert Node.objects.get(name="ascend-a-01").state == Node.State.READY


def test_removing_it_again_says_it_was_removed(removed) -> None:
    err = StringIO()
    with pytest.raises(SystemExit):
        call_command("nodes", "remove", "ascend-a-01", stdout=StringIO(), stderr=err)
    assert "removed" in err.getvalue() and "ascend-a-01" in err.getvalue()


# -- the cluster summary ----------------------------------------------------------------------------


def _fill(user: object, node: str, cards: int, chip: str) -> Job:
    spec = job_service.JobSpec(name=f"fill-{node}", command="sleep 600", num_devices=cards, chip_model=chip)
    job = job_service.submit_job(team=Team.objects.get(name="training"), user=user, spec=spec)
    run_tick()
    job.refresh_from_db()
    assert job.state == Job.State.RUNNING, job.pending_detail
    return job


def test_busy_cards_on_a_cordoned_node_count_as_busy_and_cordoned(people) -> None:
    job = _fill(people["lead"], "ascend-a-01", 8, "910A")
    node = Node.objects.filter(devices__allocations__job=job).distinct().get().name
    operations.cordon_node(node, actor=None)
    html = _client(people["lead"]).get("/live/cluster/").content.decode()
    counts = _counts(html)
    assert counts["busy"] == 8 and counts["cordoned"] == 8, counts
    assert 'id="cards-counted-twice"' in html and "8 busy cards are also counted as cordoned" in html
    assert html.count("busy · cordoned") == 8, "each such card says both"
    total = Device.objects.filter(node__removed_at__isnull=True).count()
    assert f"{round(100 * 8 / total)}%" in html and f"(8 of {total} cards busy)" in html


def test_utilisation_leaves_drained_cards_out(people) -> None:
    _fill(people["lead"], "ascend-a-01", 8, "910A")
    operations.drain_node("ascend-b4-02", actor=None)  # nothing runs there: drained at once
    assert Node.objects.get(name="ascend-b4-02").state == Node.State.DRAINED
    html = _client(people["lead"]).get("/live/cluster/").content.decode()
    total = Device.objects.filter(node__removed_at__isnull=True).count()
    in_service = total - 8
    assert _counts(html)["drained"] == 8
    assert f"{round(100 * 8 / in_service)}%" in html
    assert f"(8 of {in_service} cards busy; the 8 drained cards not counted)" in html


def test_a_removed_node_is_in_no_count(removed, people) -> None:
    html = _client(people["lead"]).get("/live/cluster/").content.decode()
    assert "ascend-a-01" not in html
    assert sum(_counts(html).values()) == Device.objects.filter(node__removed_at__isnull=True).count()


# -- the node page ----------------------------------------------------------------------------------


def test_the_node_page_shows_readings_with_their_units(people) -> None:
    Device.objects.filter(node__name="ascend-b4-01", index=0).update(
        temp_c=46.4, power_w=88.6, aicore_pct=37.0, hbm_used_mb=5120, hbm_mb=32768
    )
    html = _client(people["lead"]).get("/nodes/ascend-b4-01/").content.decode()
    row = re.search(r"<tr><td>0</td>.*?</tr>", html, re.S)
    assert row is not None
    cells = row.group(0)
    for text in ("46 °C", "89 W", "37 %", "5.0 / 32.0 GB"):
        assert text in cells, (text, cells)
    assert ">Temperature<" in html and ">HBM used<" in html


def test_the_node_page_always_has_its_health_history(people) -> None:
    client = _client(people["lead"])
    html = client.get("/nodes/ascend-b4-01/").content.decode()
    assert "<h2>Health history</h2>" in html and 'id="health-history-empty"' in html
    device = Device.objects.get(node__name="ascend-b4-01", index=3)
    now = timezone.now()
    HealthEvent.objects.create(
        node=device.node, device=device, at=now - timedelta(minutes=5), from_health="healthy", to_health="degraded",
        reason="temperature 97 °C above 95 °C",
    )  # fmt: skip
    HealthEvent.objects.create(node=device.node, at=now, from_health="reachable", to_health="unreachable", reason="x")
    html = client.get("/nodes/ascend-b4-01/").content.decode()
    table = html.split('id="health-history"', 1)[1]
    assert "device 3" in table and "healthy → degraded" in table and "temperature 97 °C" in table
    assert table.index("unreachable") < table.index("degraded"), "newest first"
