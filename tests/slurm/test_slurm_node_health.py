"""A node's service state both ways between the portal and the real test cluster (``devices.slurm.health``).

Each check reads Slurm itself: ``scontrol show node`` for the state and reason, ``sinfo`` for the
word an administrator sees. The portal's side changes at the executor's observation
(``get_executor().observe()``, what the worker's poll calls). Each test starts with every Slurm
node in service (the ``slurm_site`` fixture).
"""

from __future__ import annotations

from io import StringIO
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command

from devices.executors import get_executor
from devices.models import HealthEvent, InventoryEvent, Node
from devices.services.operations import cordon_node, uncordon_node
from devices.slurm.commands import run
from quotas.models import AuditEvent
from scheduling.models import Job
from tests.slurm.test_slurm_journey import _reload, _started
from tests.test_lifecycle_harness import node_of
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE = "ascend-b4-02"


def scontrol_node(name: str) -> tuple[str, str]:
    """``(State, Reason)`` of ``scontrol show node``; the reason without its ``[user@time]``."""
    text = run(["scontrol", "show", "node", name])
    state = text.split("State=", 1)[1].split()[0]
    reason = text.split("Reason=", 1)[1].split(" [", 1)[0].strip() if "Reason=" in text else ""
    return state, reason


def sinfo_state(name: str) -> str:
    return run(["sinfo", "-h", "-N", "-n", name, "-o", "%T"]).split()[0]


def back_in_service(name: str) -> None:
    """Wait for ``sinfo`` to say ``idle``: just resumed, Slurm shows ``idle*`` until the node answers its ping."""
    wait_for(lambda: sinfo_state(name), until=lambda s: s == "idle", interval=0.2, message=f"{name} idle in sinfo")


def observed_node(name: str) -> Node:
    get_executor().observe()
    return Node.objects.get(name=name)


def test_cordon_in_the_portal_drains_the_node_in_slurm_and_uncordon_resumes_it(slurm_site, api) -> None:
    cordon_node(NODE, actor=None, reason="replace fan")
    assert scontrol_node(NODE) == ("IDLE+DRAIN", "npuportal: cordon: replace fan")
    assert sinfo_state(NODE) == "drained"
    node = observed_node(NODE)
    assert (node.state, node.state_from_executor) == (Node.State.CORDONED, False), "the portal's own drain stays"

    uncordon_node(NODE, actor=None)
    assert "DRAIN" not in scontrol_node(NODE)[0]
    back_in_service(NODE)
    assert scontrol_node(NODE) == ("IDLE", "")

    admin = get_user_model().objects.get(username="admin")
    resp = api(admin).post(f"/api/v1/nodes/{NODE}/drain/", {"reason": "firmware"}, format="json")
    assert resp.status_code == 200, resp.content
    assert scontrol_node(NODE) == ("IDLE+DRAIN", "npuportal: drain: firmware")
    out = StringIO()
    call_command("nodes", "uncordon", NODE, stdout=out)
    assert out.getvalue() == f"node {NODE}: drained → ready\n"
    back_in_service(NODE)


def test_a_lost_call_to_slurm_is_repeated_by_the_next_observation(slurm_site) -> None:
    Node.objects.filter(name=NODE).update(state=Node.State.CORDONED)  # as if the controller had been down then
    assert sinfo_state(NODE) == "idle"
    observed_node(NODE)
    assert scontrol_node(NODE) == ("IDLE+DRAIN", "npuportal: cordoned in the portal")
    Node.objects.filter(name=NODE).update(state=Node.State.READY)
    observed_node(NODE)
    back_in_service(NODE)


def test_a_node_slurm_drains_is_drained_in_the_portal_until_slurm_resumes_it(slurm_site) -> None:
    run(["scontrol", "update", f"NodeName={NODE}", "State=DRAIN", "Reason=bad fan"])
    node = observed_node(NODE)
    assert (node.state, node.state_from_executor) == (Node.State.DRAINED, True)
    assert scontrol_node(NODE) == ("IDLE+DRAIN", "bad fan"), "Slurm's reason is left as it was"
    audit = AuditEvent.objects.filter(action="node.drain", target=NODE).last()
    assert (
        audit.actor is None and audit.detail == "ready → draining; 0 running job(s) on it: Slurm: bad fan (IDLE+DRAIN)"
    )
    event = InventoryEvent.objects.filter(node_name=NODE).order_by("-id").first()
    assert (event.status, event.cause) == ("drained", "node drained; drained: nothing runs on it any more")

    run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])
    node = observed_node(NODE)
    assert (node.state, node.state_from_executor) == (Node.State.READY, False)
    assert ": Slurm: resumed (IDLE" in AuditEvent.objects.filter(action="node.uncordon", target=NODE).last().detail
    back_in_service(NODE)


def test_a_node_slurm_downs_is_unreachable_and_its_job_requeued_then_back(slurm_site, submit_slurm: Any) -> None:
    Node.objects.exclude(name=NODE).update(state=Node.State.CORDONED)
    Node.objects.filter(name=NODE).update(state=Node.State.READY)
    job = _started(submit_slurm("sleep 300"))
    assert node_of(job) == NODE
    run(["scontrol", "update", f"NodeName={NODE}", "State=DOWN", "Reason=dead psu"])
    assert sinfo_state(NODE) == "down"

    summary = get_executor().observe()
    node = Node.objects.get(name=NODE)
    assert not node.reachable, (summary, run(["scontrol", "show", "node", "-o", NODE]))
    last = HealthEvent.objects.filter(node=node).last()
    assert (last.from_health, last.to_health, last.reason) == (
        "reachable",
        "unreachable",
        "Slurm has it down (DOWN: dead psu)",
    )
    job = _reload(job)
    assert job.pk in summary.requeued
    # Requeued in its place, no retry counted: "NodeFail" when Slurm had already ended the run
    # NODE_FAIL by this observation (its end is read first), "NodeUnreachable" when it still listed it.
    assert (job.state, job.retries) == (Job.State.PENDING, 0)
    assert job.pending_reason in ("NodeFail", "NodeUnreachable")
    wait_for(lambda: job.agent_job_id not in run(["squeue", "-h", "-o", "%i"]).split(), message="the stale run gone")

    run(["scontrol", "update", f"NodeName={NODE}", "State=RESUME"])
    node = wait_for(lambda: observed_node(NODE), until=lambda n: n.reachable, interval=0.5, message=f"{NODE} back")
    last = HealthEvent.objects.filter(node=node).last()
    assert (last.from_health, last.to_health) == ("unreachable", "reachable")


def test_a_cordon_slurm_refuses_is_a_warning_naming_the_node_and_slurms_words(slurm_site) -> None:
    # ascend-a-01 is a node of the portal's demo that the test cluster does not have.
    out, err = StringIO(), StringIO()
    call_command("nodes", "cordon", "ascend-a-01", "--reason", "fan", stdout=out, stderr=err)
    assert out.getvalue() == "node ascend-a-01: ready → cordoned\n"
    warning = err.getvalue()
    assert warning.startswith("warning: could not drain node ascend-a-01 in Slurm: "), warning
    assert "Invalid node name specified" in warning, "Slurm's own message"
    assert warning.endswith("; the node is cordoned in the portal all the same\n")
    assert Node.objects.get(name="ascend-a-01").state == Node.State.CORDONED
