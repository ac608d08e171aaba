"""``manage.py sshare`` and ``sprio``: the fair-share tree and one job's priority breakdown."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command

from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db


def _out(*args: str) -> str:
    buf = StringIO()
    call_command(*args, stdout=buf)
    return buf.getvalue()


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
    ids = []
    for i in range(5):
        resp = api(lead).post(
            "/api/v1/jobs/",
            {"name": f"s{i}", "command": "true", "num_devices": 4, "chip_model": "910A", "estimated_duration_s": 600},
            format="json",
        )
        ids.append(resp.json()["id"])
    run_tick()
    info = json.loads(_out("sprio", str(ids[-1]), "--json"))
    assert info["state"] == "pending" and info["decision"] == "wait"
    assert set(info["factors"]) >= {"priority_class", "fair_share", "age"}
    total = sum(f["weighted"] for f in info["factors"].values())
    assert info["priority"] == pytest.approx(total)
    assert info["reason"] in {"Resources", "Priority", "QuotaMaxDevices"}
    text = _out("sprio", str(ids[-1]))
    assert "fair_share" in text and "decision: wait" in text
