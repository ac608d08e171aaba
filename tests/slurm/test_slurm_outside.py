"""Living with jobs npuportal did not submit: their cards are never given, a run that lost its cards is withdrawn.

Jobs "outside" are submitted with ``sbatch`` straight to the test cluster (no portal comment), as a
person with a shell on it would. Only the first node takes work here (the others are cordoned), so
the portal's choices and the outside job's meet on the same cards.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from django.contrib.auth import get_user_model

from devices.executors import get_executor
from devices.executors.slurm import run, squeue
from devices.models import Device, InventoryEvent, Node
from scheduling.models import Job
from scheduling.services.jobs import cancel_job
from tests.slurm.conftest import outside_job
from tests.test_lifecycle_harness import open_devices, tick
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

NODE = "ascend-b4-01"


def _outside_job(cards: list[int]) -> str:
    return outside_job(NODE, cards)


def _gone(slurm_id: str) -> None:
    run(["scancel", slurm_id])
    wait_for(lambda: slurm_id not in squeue(), message=f"Slurm job {slurm_id} to be gone")


def _only_first_node() -> None:
    Node.objects.exclude(name=NODE).update(state=Node.State.CORDONED)


def _reload(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def test_cards_held_outside_npuportal_are_shown_and_never_given(slurm_site, submit_slurm, api, client) -> None:
    _only_first_node()
    outside = _outside_job([0, 1, 2, 3, 4, 5])
    try:
        summary = get_executor().observe()
        assert summary.outside_cards == 6
        words = f"Slurm job {outside} of {'nobody' if os.geteuid() == 0 else ''}".strip().removesuffix(" of")
        held = dict(Device.objects.filter(node__name=NODE).values_list("index", "outside_use"))
        assert held == {i: (words if i < 6 else "") for i in range(8)}

        admin = get_user_model().objects.filter(is_staff=True).first()
        rows = api(admin).get("/api/v1/devices/", {"node": NODE}).json()["results"]
        assert [(d["index"], d["usable"], d["outside_use"]) for d in rows][:7] == [
            *((i, False, words) for i in range(6)),
            (6, True, ""),
        ]
        client.force_login(admin)
        page = client.get(f"/nodes/{NODE}/").content.decode()
        print("\n" + str(rows[0]))
        assert page.count("in use outside npuportal") == 6
        statuses = InventoryEvent.objects.filter(node_name=NODE).order_by("-at", "-id").values_list("status", flat=True)
        assert list(statuses)[:6] == ["outside"] * 6, "chargeback counts the stretch apart"

        big = submit_slurm("sleep 60", devices=4, name="four")
        small = submit_slurm("sleep 60", devices=2, name="two")
        tick()
        assert _reload(big).state == Job.State.PENDING, "only 2 cards are free in the portal's eyes"
        assert _reload(small).state == Job.State.RUNNING
        assert sorted(d.index for d in open_devices(small)) == [6, 7]
        wait_for(lambda: squeue().get(_reload(small).agent_job_id), until=lambda q: q and q.state == "RUNNING")
    finally:
        _gone(outside)
    assert get_executor().observe().outside_cards == 0
    assert not Device.objects.exclude(outside_use="").exists()
    tick()
    assert _reload(big).state == Job.State.RUNNING, "the cards are the portal's again"
    cancel_job(big.pk, actor=None)
    cancel_job(small.pk, actor=None)


def test_a_run_slurm_keeps_pending_is_withdrawn_and_queued_again_in_its_place(
    slurm_site, submit_slurm, settings: Any
) -> None:
    settings.NPUPORTAL_SLURM_PENDING_S = 3
    _only_first_node()
    job = submit_slurm("sleep 60", devices=6, name="six")  # the node's 8 less the 2 reserved for critical
    submitted = job.submitted_at
    # Taken between the portal's last look and its decision: the portal does not know of it yet.
    outside = _outside_job([0, 1, 2, 3, 4, 5])  # any 6 cards the portal picks meet these
    try:
        tick()
        job = _reload(job)
        assert job.state == Job.State.RUNNING, (job.pending_reason, job.pending_detail)
        lost = job.agent_job_id
        assert squeue()[lost].state == "PENDING", "Slurm keeps the portal's run waiting for its cards"

        def observed() -> Job:
            get_executor().observe()
            return _reload(job)

        job = wait_for(observed, until=lambda j: j.state == Job.State.PENDING, interval=1.0, timeout=120)
        assert (job.pending_reason, job.retries, job.submitted_at) == ("HeldInSlurm", 0, submitted)
        event = job.events.last()
        print(f"\n{event.reason}: {event.detail}")
        assert event.reason == "HeldInSlurm" and f"Slurm kept job {lost} pending" in event.detail
        assert "(Resources)" in event.detail
        wait_for(lambda: lost not in squeue(), message=f"the withdrawn run {lost} to be cancelled")
        assert job.allocations.filter(end__isnull=True).count() == 0
        tick()
        assert _reload(job).state == Job.State.PENDING, "its cards are in use outside npuportal now"
    finally:
        _gone(outside)
    get_executor().observe()
    tick()
    job = _reload(job)
    assert job.state == Job.State.RUNNING
    ours = [q for q in squeue(every_state=True).values() if q.portal_run and q.portal_run[0] == job.pk]
    assert len([q for q in ours if q.state in {"RUNNING", "PENDING"}]) == 1, "one live run, never two"
    cancel_job(job.pk, actor=None)
