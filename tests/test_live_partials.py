"""The live regions of the console (``/live/...``, polled by htmx): what they show, to whom, at what cost."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from devices.models import Device, Node
from devices.services import operations
from quotas.models import Team
from scheduling.models import Job
from scheduling.services import jobs as job_service
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


@pytest.fixture
def people(demo, user_factory):
    return {
        "admin": user_factory("root", staff=True),
        "lead": user_factory("lena", team="training", role="lead"),
        "other": user_factory("olga", team="research", role="lead"),
    }


def _client(user: object) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _submit(user: object, team: str, name: str, devices: int = 2, chip: str = "910A") -> Job:
    spec = job_service.JobSpec(name=name, command="sleep 60", num_devices=devices, chip_model=chip)
    return job_service.submit_job(team=Team.objects.get(name=team), user=user, spec=spec)


def _job_ids(html: str) -> set[int]:
    return {int(i) for i in re.findall(r'href="/jobs/(\d+)/"', html)}


def test_htmx_is_served_from_our_own_static_files_with_its_licence() -> None:
    folder = Path(settings.BASE_DIR) / "static" / "vendor" / "htmx"
    assert (folder / "htmx.min.js").stat().st_size > 10_000
    note = (folder / "README.md").read_text()
    assert "2.0.11" in note and "BSD" in note and "htmx.org" in note
    base = (Path(settings.BASE_DIR) / "templates" / "base.html").read_text()
    assert "{% static 'vendor/htmx/htmx.min.js' %}" in base and "//" not in base.split("htmx.min.js")[0][-80:]


@pytest.mark.parametrize(
    ("page", "live"),
    [
        ("/", "/live/dashboard/"),
        ("/jobs/?state=pending", "/live/jobs/?state=pending"),
        ("/cluster/", "/live/cluster/"),
        ("/nodes/ascend-a-01/", "/live/nodes/ascend-a-01/"),
    ],
)
def test_each_live_page_polls_its_one_region(people, page: str, live: str) -> None:
    html = _client(people["lead"]).get(page).content.decode()
    assert html.count("hx-get=") == 1
    assert f'hx-get="{live}"' in html.replace("&amp;", "&")
    assert 'hx-trigger="every 3s' in html and "visibilityState" in html
    assert 'http-equiv="refresh"' not in html


def test_the_job_page_polls_while_the_job_lives_and_the_region_stops_when_it_ended(people) -> None:
    job = _submit(people["lead"], "training", "watched")
    client = _client(people["lead"])
    assert f'hx-get="/live/jobs/{job.pk}/"' in client.get(f"/jobs/{job.pk}/").content.decode()
    live = client.get(f"/live/jobs/{job.pk}/")
    assert live.status_code == 200
    body = live.content.decode()
    assert 'id="job-state"' in body and "Pending" in body and "<html" not in body
    assert "sleep 60" not in body, "the command never changes and is not sent with each poll"

    run_tick()
    body = client.get(f"/live/jobs/{job.pk}/").content.decode()
    assert "Running" in body and "ascend-a-0" in body and 'data-started="yes"' in body

    job_service.finish_job(job.pk, exit_code=0)
    done = client.get(f"/live/jobs/{job.pk}/")
    assert done.status_code == 286, "htmx stops polling a job that has ended"
    assert "Completed" in done.content.decode()
    assert "hx-get=" not in client.get(f"/jobs/{job.pk}/").content.decode()


def test_a_lead_never_sees_another_teams_jobs_in_a_region(people) -> None:
    mine = _submit(people["lead"], "training", "mine-job")
    theirs = _submit(people["other"], "research", "their-secret")
    run_tick()
    client = _client(people["lead"])
    for url in ("/live/dashboard/", "/live/jobs/", "/live/jobs/?state=running"):
        html = client.get(url).content.decode()
        assert mine.pk in _job_ids(html) and theirs.pk not in _job_ids(html), url
        assert "their-secret" not in html
    assert client.get(f"/live/jobs/{theirs.pk}/").status_code == 404
    for url in ("/live/cluster/", f"/live/nodes/{_node_of(theirs)}/"):
        html = client.get(url).content.decode()
        assert theirs.pk not in _job_ids(html) and "their-secret" not in html, url
        assert "in use" in html, "another team's card is busy without naming its job"
    admin = _client(people["admin"]).get("/live/cluster/").content.decode()
    assert {mine.pk, theirs.pk} <= _job_ids(admin)


def _node_of(job: Job) -> str:
    return Node.objects.filter(devices__allocations__job=job).distinct().get().name


def test_the_job_list_region_keeps_the_filter(people) -> None:
    pending = _submit(people["lead"], "training", "waits", devices=8, chip="910A")
    blocker = _submit(people["lead"], "training", "runs", devices=8, chip="910A")
    run_tick()
    states = {j.pk: j.state for j in Job.objects.filter(pk__in=[pending.pk, blocker.pk])}
    waiting = next(pk for pk, s in states.items() if s == Job.State.PENDING)
    running = next(pk for pk, s in states.items() if s == Job.State.RUNNING)
    client = _client(people["lead"])
    html = client.get("/live/jobs/?state=pending").content.decode()
    assert waiting in _job_ids(html) and running not in _job_ids(html)
    assert client.get("/live/jobs/?state=nonsense").status_code == 200  # an unknown filter shows every job


def test_signed_out_polls_reload_the_page_rather_than_swap_in_a_login_form(people) -> None:
    anonymous = Client()
    resp = anonymous.get("/live/cluster/", HTTP_HX_REQUEST="true")
    assert resp.status_code == 200 and resp.headers.get("HX-Refresh") == "true" and not resp.content
    assert anonymous.get("/live/cluster/").status_code == 302


def test_the_cluster_summary_counts_cards_by_state_and_team(people) -> None:
    job = _submit(people["lead"], "training", "big", devices=4, chip="910A")
    run_tick()
    node = _node_of(job)
    operations.cordon_node("ascend-b4-02", actor=None)
    Device.objects.filter(node__name="ascend-b4-01", index=7).update(health=Device.Health.FAILED)
    html = _client(people["lead"]).get("/live/cluster/").content.decode()
    total = Device.objects.count()
    counts = {s: int(n) for s, n in re.findall(r'id="cards-(\w+)"><strong>(\d+)</strong>', html)}
    assert counts["busy"] == 4 and counts["cordoned"] == 8 and counts["unhealthy"] == 1
    assert sum(counts.values()) == total
    assert counts["free"] == total - 4 - 8 - 1
    assert f"{round(100 * 4 / total)}%" in html
    assert re.search(r"training <strong>4</strong>", html)
    assert html.count('data-state="cordoned"') >= 9  # the node's badge and its eight cards
    assert f'href="/jobs/{job.pk}/"' in html and node in html


def test_the_node_region_shows_draining_then_drained(people) -> None:
    job = _submit(people["lead"], "training", "last-one", devices=2, chip="910A")
    run_tick()
    node = _node_of(job)
    operations.drain_node(node, actor=None)
    client = _client(people["admin"])
    html = client.get(f"/live/nodes/{node}/").content.decode()
    assert 'id="node-state" class="node-badge node-draining">Draining' in html
    job_service.finish_job(job.pk, exit_code=0)
    html = client.get(f"/live/nodes/{node}/").content.decode()
    assert 'node-drained">Drained' in html and "card-drained" in html
    assert 'data-state="drained"' in client.get("/live/cluster/").content.decode()


# Session, user and the display clock (the active policy's zone, npuportal/display_time.py) are three of
# them; the rest is the region's own (devices/services/overview.py says which).
@pytest.mark.parametrize(
    ("url", "queries"),
    [("/live/dashboard/", 5), ("/live/jobs/", 5), ("/live/cluster/", 7), ("/live/nodes/ascend-b4-01/", 8)],
)
def test_region_query_counts_do_not_grow_with_jobs(
    people, django_assert_max_num_queries, url: str, queries: int
) -> None:
    client = _client(people["lead"])
    for i in range(3):
        _submit(people["lead"], "training", f"few-{i}", devices=1, chip="910B4")
    run_tick()
    with django_assert_max_num_queries(queries) as few:
        assert client.get(url).status_code == 200
    for i in range(12):
        _submit(people["lead"], "training", f"many-{i}", devices=1, chip="910B4")
    run_tick()
    with django_assert_max_num_queries(len(few.captured_queries)):
        assert client.get(url).status_code == 200


def test_job_region_query_count_is_bounded(people, django_assert_max_num_queries) -> None:
    job = _submit(people["lead"], "training", "counted", devices=4, chip="910A")
    run_tick()
    client = _client(people["lead"])
    with django_assert_max_num_queries(8):
        assert client.get(f"/live/jobs/{job.pk}/").status_code == 200
    for _ in range(3):
        job_service.requeue_job(job.pk, reason="NodeUnreachable", count_retry=False)
        run_tick()
    with django_assert_max_num_queries(8):  # more devices and events: the same queries
        assert client.get(f"/live/jobs/{job.pk}/").status_code == 200
