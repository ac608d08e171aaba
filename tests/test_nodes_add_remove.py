"""Nodes added from their agent and removed as a site does it (issue 19, item 1).

``manage.py nodes add|remove|list`` and ``POST``/``DELETE /api/v1/nodes/`` against a real simulated
agent (a subprocess, as in the lifecycle harness): the node comes with the devices the agent
serves; an unreachable agent, a refused token or a duplicate name is refused with one line, and
changes nothing; a node with running jobs is not removed unless drained.
"""

from __future__ import annotations

from collections.abc import Iterator
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from devices.models import Device, InventoryEvent, Node
from quotas.models import AuditEvent
from tests.conftest import free_port
from tests.test_lifecycle_harness import Agent
from tests.test_node_drained import _running_job

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def agent(tmp_path_factory) -> Iterator[Agent]:
    """One simulated 4-card 910B4 agent for the module."""
    running = Agent(tmp_path_factory.mktemp("agents"), "node-new", devices=4).start()
    yield running
    running.kill()


def nodes(*argv: str) -> tuple[int, str, str]:
    """``manage.py nodes ...``: exit code, stdout, stderr."""
    out, err = StringIO(), StringIO()
    try:
        call_command("nodes", *argv, stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, out.getvalue(), err.getvalue()


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


def _wrong_token(tmp_path: Path) -> str:
    path = tmp_path / "wrong.token"
    path.write_text("not-the-agents-token-at-all")
    return str(path)


# -- manage.py nodes -------------------------------------------------------------------------------


def test_add_registers_the_node_with_the_devices_its_agent_serves(agent) -> None:
    code, out, err = nodes("add", "node-new", "--agent-url", agent.url, "--token-file", str(agent.token_file))
    assert code == 0, err
    assert out.strip() == f"node node-new added: 4 device(s) (910B4) from {agent.url}"
    node = Node.objects.get(name="node-new")
    assert node.agent_token == agent.token and node.removed_at is None
    cards = list(node.devices.order_by("index").values_list("index", "chip_model", "hbm_mb", "ai_cores", "ai_cpus"))
    assert cards == [(i, "910B4", 32768, 20, 7) for i in range(4)]
    events = InventoryEvent.objects.filter(node_name="node-new")
    assert events.count() == 4 and {e.status for e in events} == {InventoryEvent.Status.USABLE}
    assert {e.cause for e in events} == {f"joined: registered from {agent.url}"}
    assert AuditEvent.objects.filter(action="node.add", target="node-new").count() == 1

    code, out, _ = nodes("list")
    assert code == 0 and any(line.split()[:4] == ["node-new", "ready", "yes", "4"] for line in out.splitlines())

    code, _, err = nodes("add", "node-new", "--agent-url", agent.url, "--token-file", str(agent.token_file))
    assert code == 1
    assert _one_line(err) == "a node named node-new is already in the inventory"
    assert Device.objects.filter(node__name="node-new").count() == 4


@pytest.mark.parametrize(
    ("case", "code", "says"),
    [
        ("bad token", 1, "the agent at {url} refused the token (HTTP 401); give the token in the agent's --token-file"),
        ("unreachable", 1, "cannot read the devices of the agent at http://127.0.0.1:{port}: GET /v1/devices:"),
        ("no token file", 2, "--token-file: cannot read token file {missing}:"),
        ("duplicate of the demo", 1, "a node named ascend-b4-01 is already in the inventory"),
        ("bad URL", 1, "'ftp://host' is not an agent URL (http or https, and a host: http://10.0.0.5:8471)"),
    ],
)
def test_add_refuses_with_one_line_and_changes_nothing(demo, agent, tmp_path, case, code, says) -> None:
    port = free_port()
    missing = tmp_path / "missing.token"
    name, url, token = "node-x", agent.url, str(agent.token_file)
    if case == "bad token":
        token = _wrong_token(tmp_path)
    elif case == "unreachable":
        url = f"http://127.0.0.1:{port}"
    elif case == "no token file":
        token = str(missing)
    elif case == "duplicate of the demo":
        name = "ascend-b4-01"
    elif case == "bad URL":
        url = "ftp://host"
    before = (Node.objects.count(), Device.objects.count(), InventoryEvent.objects.count())
    done, out, err = nodes("add", name, "--agent-url", url, "--token-file", token)
    assert done == code
    assert _one_line(err).startswith(says.format(url=agent.url, port=port, missing=missing))
    assert out == ""
    assert (Node.objects.count(), Device.objects.count(), InventoryEvent.objects.count()) == before


def test_remove_is_refused_while_jobs_run_and_drain_then_remove_takes_the_node_out(demo, user_factory) -> None:
    from scheduling.services import jobs as job_service

    lead = user_factory("lead-n", team="training", role="lead")
    job = _running_job(lead)
    name = Node.objects.filter(devices__allocations__job=job, devices__allocations__end__isnull=True).distinct()
    name = name.get().name

    code, _, err = nodes("remove", name)
    assert code == 1
    assert _one_line(err).startswith(f"node {name} runs 1 job(s): {job.pk} (drain-me); drain it first")
    assert Node.objects.get(name=name).removed_at is None

    code, out, _ = nodes("remove", name, "--drain", "--reason", "end of lease")
    assert code == 0
    assert out.strip() == (
        f"node {name} is draining: 1 job(s) still run there ({job.pk} (drain-me)); "
        f"run `manage.py nodes remove {name}` again once it is drained"
    )
    job_service.finish_job(job.pk, exit_code=0)
    code, out, _ = nodes("remove", name, "--reason", "end of lease")
    assert code == 0 and out.strip().startswith(f"node {name} removed")
    assert Node.objects.get(name=name).removed_at is not None

    code, out, _ = nodes("list")
    assert name not in out
    code, out, _ = nodes("list", "--removed")
    assert any(line.split()[:2] == [name, "removed"] for line in out.splitlines())

    code, _, err = nodes("remove", name)
    assert code == 1 and _one_line(err).startswith(f"no node named {name!r} in the inventory (removed ")


# -- the API ---------------------------------------------------------------------------------------


def test_only_admins_add_or_remove_nodes(demo, api, user_factory, client) -> None:
    lead = user_factory("lead-p", team="training", role="lead")
    body = {"name": "node-y", "agent_url": "http://127.0.0.1:9", "token": "x" * 20}
    for resp in (api(lead).post("/api/v1/nodes/", body, format="json"), api(lead).delete("/api/v1/nodes/ascend-a-01/")):
        assert resp.status_code == 403 and resp.json()["error"] == "admins only"
    assert client.post("/api/v1/nodes/", body, content_type="application/json").status_code == 401
    assert not Node.objects.filter(name="node-y").exists()
    assert Node.objects.get(name="ascend-a-01").removed_at is None


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"agent_url": "http://10.0.0.5:8471", "token": "x" * 20}, "name"),
        ({"name": "bad name!", "agent_url": "http://10.0.0.5:8471", "token": "x" * 20}, "name"),
        ({"name": "n1", "agent_url": "10.0.0.5:8471", "token": "x" * 20}, "agent_url"),
        ({"name": "n1", "agent_url": "http://10.0.0.5:8471", "token": ""}, "token"),
        ({"name": "n1", "agent_url": "http://10.0.0.5:8471", "token": 12}, "token"),
        ({"name": "n1", "agent_url": "http://10.0.0.5:8471", "token": "x" * 20, "labels": {}}, "labels"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(demo, api, user_factory, body, field) -> None:
    root = user_factory("root-a", staff=True)
    resp = api(root).post("/api/v1/nodes/", body, format="json")
    assert resp.status_code == 400, resp.content
    assert resp.json()["field"] == field and resp.json()["error"].startswith(f"{field}: ")
    assert Node.objects.count() == 4


def test_post_adds_the_node_and_refuses_a_duplicate_a_bad_token_and_an_unreachable_agent(
    demo, agent, api, user_factory
) -> None:
    root = user_factory("root-b", staff=True)
    client = api(root)
    resp = client.post("/api/v1/nodes/", {"name": "node-new", "agent_url": agent.url, "token": "x" * 20}, format="json")
    assert resp.status_code == 400 and resp.json()["field"] == "token"
    assert "refused the token (HTTP 401)" in resp.json()["error"]

    port = free_port()
    resp = client.post(
        "/api/v1/nodes/", {"name": "node-new", "agent_url": f"http://127.0.0.1:{port}", "token": agent.token}
    )
    assert resp.status_code == 502 and resp.json()["field"] == "agent_url"
    assert resp.json()["error"].startswith(
        f"agent_url: cannot read the devices of the agent at http://127.0.0.1:{port}"
    )
    assert not Node.objects.filter(name="node-new").exists()

    resp = client.post("/api/v1/nodes/", {"name": "node-new", "agent_url": agent.url, "token": agent.token})
    assert resp.status_code == 201, resp.content
    node = resp.json()
    assert node["name"] == "node-new" and node["state"] == "ready" and node["devices_total"] == 4
    assert [d["index"] for d in node["devices"]] == [0, 1, 2, 3] and node["chip_models"] == ["910B4"]
    assert "token" not in node and "agent_token" not in node

    resp = client.post("/api/v1/nodes/", {"name": "node-new", "agent_url": agent.url, "token": agent.token})
    assert resp.status_code == 409
    assert resp.json() == {"error": "name: a node named node-new is already in the inventory", "field": "name"}
    assert Node.objects.filter(name="node-new").count() == 1


def test_delete_removes_an_idle_node_and_refuses_one_with_running_jobs_unless_drain(demo, api, user_factory) -> None:
    from scheduling.services import jobs as job_service

    root = user_factory("root-c", staff=True)
    lead = user_factory("lead-c", team="training", role="lead")
    job = _running_job(lead)
    busy = Node.objects.filter(devices__allocations__job=job, devices__allocations__end__isnull=True).distinct()
    name = busy.get().name
    client = api(root)

    resp = client.delete(f"/api/v1/nodes/{name}/")
    assert resp.status_code == 409
    assert resp.json()["error"].startswith(f"node {name} runs 1 job(s): {job.pk} (drain-me)")
    assert client.delete(f"/api/v1/nodes/{name}/?drain=maybe").json()["field"] == "drain"

    resp = client.delete(f"/api/v1/nodes/{name}/?drain=true&reason=lease%20ends")
    assert resp.status_code == 202 and resp.json()["state"] == "draining"
    job_service.finish_job(job.pk, exit_code=0)
    assert client.delete(f"/api/v1/nodes/{name}/").status_code == 204
    assert name not in {n["name"] for n in client.get("/api/v1/nodes/").json()["results"]}
    assert client.get(f"/api/v1/nodes/{name}/").json()["removed_at"]
    assert client.delete(f"/api/v1/nodes/{name}/").status_code == 404
    assert client.delete("/api/v1/nodes/no-such-node/").status_code == 404


def test_cordon_drain_and_uncordon_from_the_shell_say_what_changed(demo) -> None:
    assert nodes("cordon", "ascend-b4-01", "--reason", "replace fan") == (
        0,
        "node ascend-b4-01: ready → cordoned\n",
        "",
    )
    assert nodes("cordon", "ascend-b4-01")[1] == "node ascend-b4-01 is already cordoned: nothing changed\n"
    assert (
        AuditEvent.objects.filter(action="node.cordon", target="ascend-b4-01").last().detail.endswith(": replace fan")
    )
    assert nodes("uncordon", "ascend-b4-01")[1] == "node ascend-b4-01: cordoned → ready\n"
    code, out, err = nodes("drain", "no-such-node")
    assert (code, out, _one_line(err)) == (1, "", "no node named 'no-such-node' in the inventory")
