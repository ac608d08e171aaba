"""``manage.py sshare`` and ``sprio``: the fair-share tree and one job's priority breakdown."""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from django.core.management import call_command

from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def _out(*args: str) -> str:
    buf = StringIO()
    call_command(*args, stdout=buf)
    return buf.getvalue()


def _submit_910a(client, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    """``count`` jobs of 4 × 910A, 10 minutes each, through the API; their ids."""
    ids = []
    for i in range(count):
        resp = client.post(
            "/api/v1/jobs/",
            {"name": f"s{i}", "command": "true", "num_devices": 4, "chip_model": "910A", "estimated_duration_s": 600},
            format="json",
        )
        ids.append(resp.json()["id"])
    return ids


def test_sshare_lists_the_tree_with_the_heaviest_user_lowest(demo) -> None:
    rows = {r["name"]: r for r in json.loads(_out("sshare", "--json"))}
    assert rows["training"]["parent"] == "ai-lab"
    assert rows["training"]["norm_shares"] == pytest.approx(0.5)
    # The demo's history gives training by far the most usage: its factor is the lowest.
    assert rows["training"]["fair_share"] < rows["research"]["fair_share"]
    assert rows["training"]["fair_share"] < rows["inference"]["fair_share"]
    table = _out("sshare")
    assert "FairShare" in table.splitlines()[0] and " training" in table


def test_sprio_explains_a_waiting_job(demo, api, user_factory) -> None:
    lead = user_factory("sp", team="research", role="lead")
    ids = _submit_910a(api(lead), 5)
    run_tick()
    info = json.loads(_out("sprio", str(ids[-1]), "--json"))
    assert info["state"] == "pending" and info["decision"] == "wait"
    assert set(info["factors"]) >= {"priority_class", "fair_share", "age"}
    total = sum(f["weighted"] for f in info["factors"].values())
    assert info["priority"] == pytest.approx(total)
    assert info["reason"] in {"Resources", "Priority", "QuotaMaxDevices"}
    text = _out("sprio", str(ids[-1]))
    assert "fair_share" in text and "decision: wait" in text


def test_sprio_and_the_job_page_say_a_starving_job_goes_first(demo, api, user_factory, tmp_path) -> None:
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from scheduling.models import Job
    from tests.test_policy_commands import DEMO, run, write

    guarded = DEMO.replace("  backfill: true\n", "  backfill: true\n  starvation: {after: 1h}\n")
    code, out, err = run("apply", write(tmp_path, guarded), "--comment", "starvation guard", "--author", "admin")
    assert code == 0, (out, err)
    assert "starvation guard: jobs waiting more than 1h go first" in _out("policy", "effective")
    lead = user_factory("starving-lead", team="research", role="lead")
    ids = _submit_910a(api(lead), 4)  # of the 8 × 910A: two run, two wait
    run_tick()
    waiting = [j for j in Job.objects.filter(pk__in=ids) if j.state == Job.State.PENDING]
    assert waiting, "the 910A pool was expected to be full"
    starving = waiting[-1]
    Job.objects.filter(pk=starving.pk).update(submitted_at=timezone.now() - timedelta(hours=2))
    run_tick()
    starving.refresh_from_db()
    assert starving.pending_detail.startswith("waiting more than 1h: cards on "), starving.pending_detail
    assert "held for it from" in starving.pending_detail and starving.estimated_start is not None
    text = _out("sprio", str(starving.pk))
    assert "starving: waited 2h" in text and "> 1h: served before the factors above apply" in text
    assert "(waiting more than 1h: cards on " in text  # the detail
    assert re.search(r"\(estimated start \d{4}-\d\d-\d\d \d\d:\d\d \S+\)", text), text  # a time with its zone
    client = Client()
    client.force_login(lead)
    page = client.get(f"/jobs/{starving.pk}/").content.decode()
    assert (
        'id="starvation"' in page and "served before every job that has not waited as long, and cards are held" in page
    )
