"""``manage.py policy ...``: the admin's commands and their exit codes."""

from __future__ import annotations

import getpass
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from quotas.models import AuditEvent, Policy
from scheduling.models import Job, TickRecord
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parent.parent
DEMO = (ROOT / "examples" / "policies" / "demo.yaml").read_text()


def run(*args: str) -> tuple[int, str, str]:
    out, err = StringIO(), StringIO()
    try:
        call_command("policy", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_validate_ok_invalid_and_usage_exit_codes(demo, tmp_path) -> None:
    assert run("validate", write(tmp_path, DEMO))[0] == 0
    bad = DEMO.replace(
        "max: {devices: 12}\n        maxConcurrentJobs: 10", "max: {devices: 2}\n        maxConcurrentJobs: 10"
    )
    bad = bad.replace("shares: 50", "shares: lots").replace("chipModels: [910B4]", "chipModels: [H100]")
    code, out, _ = run("validate", write(tmp_path, bad))
    assert code == 1
    assert "spec.teams[2].quota.max.devices: must be >= guaranteed.devices (4)" in out
    assert "spec.teams[1].shares" in out
    assert "H100" in out  # chip models are checked against the cluster
    assert run("validate", str(tmp_path / "missing.yaml"))[0] == 2
    code, out, _ = run("validate", write(tmp_path, bad), "--json")
    body = json.loads(out)
    assert body["valid"] is False and len([i for i in body["issues"] if i["severity"] == "error"]) >= 3


def test_apply_stores_a_new_active_version_and_audits_it(demo, tmp_path, user_factory) -> None:
    user_factory("ops", staff=True)
    changed = DEMO.replace("shares: 20", "shares: 25")
    code, out, _ = run("apply", write(tmp_path, changed), "--comment", "more for research", "--author", "ops")
    assert code == 0, out
    assert "applied as v2" in out and "team research: shares 20 → 25" in out
    active = Policy.objects.get(is_active=True)
    assert active.version == 2 and active.comment == "more for research" and active.author.username == "ops"
    event = AuditEvent.objects.filter(action="policy.activate").first()
    assert event.target == "policy v2" and "replaces v1" in event.detail and event.actor.username == "ops"


def test_apply_of_an_invalid_file_changes_nothing(demo, tmp_path) -> None:
    bad = write(tmp_path, DEMO.replace("ratio: 0.25", "ratio: 1.5"))
    code, out, _ = run("apply", bad, "--comment", "tighter", "--author", "admin")
    assert code == 1 and "ratio" in out
    assert Policy.objects.count() == 1 and Policy.objects.get(is_active=True).version == 1


def test_apply_needs_a_comment_and_an_admin_as_author(demo, tmp_path, user_factory) -> None:
    """As through the API and the console: a version says why, and which admin applied it."""
    changed = write(tmp_path, DEMO.replace("shares: 20", "shares: 30"))
    user_factory("lead-x", team="research", role="lead")
    for args, says in [
        ((), "--comment: say why"),
        (("--comment", "   "), "--comment: say why"),
        (("--comment", "x" * 501), "--comment: at most 500 characters (this one has 501)"),
        (("-m", "why", "--author", "nobody"), "--author: no portal user 'nobody'"),
        (("-m", "why", "--author", "lead-x"), "--author: 'lead-x' is not an active admin (staff) of the portal"),
    ]:
        code, _, err = run("apply", changed, *args)
        assert code == 2 and err.strip().startswith(says), (args, err)
    assert Policy.objects.count() == 1
    login = getpass.getuser()
    code, _, err = run("apply", changed, "-m", "why")  # no --author, and no portal user named as the login
    assert code == 2 and f"no portal user is named {login!r}, your login" in err and Policy.objects.count() == 1
    user_factory(login, staff=True)  # now there is: the version is theirs
    code, out, _ = run("apply", changed, "-m", " research to 30 ")
    assert code == 0, out
    active = Policy.objects.get(is_active=True)
    assert (active.version, active.author.username, active.comment) == (2, login, "research to 30")


def test_history_export_diff_and_rollback(demo, tmp_path) -> None:
    run("apply", write(tmp_path, DEMO.replace("gracePeriod: 30s", "gracePeriod: 90s")), "--comment", "longer grace",
        "--author", "admin")  # fmt: skip
    code, out, _ = run("history")
    assert code == 0 and "longer grace" in out and "demo policy" in out
    code, out, _ = run("export", "--version", "1")
    assert out == DEMO
    code, out, _ = run("diff", "1", "2")
    assert code == 0 and "preemption.gracePeriod: 30s → 90s" in out and "-  preemption: {gracePeriod: 30s" in out
    code, out, _ = run("rollback", "1")
    assert code == 0 and Policy.objects.get(is_active=True).version == 1
    assert AuditEvent.objects.filter(action="policy.activate", target="policy v1", detail__contains="rollback").exists()
    assert run("rollback", "42")[0] == 2


def test_effective_json_names_the_schedule_in_force(demo, tmp_path) -> None:
    code, out, _ = run("effective", "--at", "2026-11-27T23:30", "--json")
    assert code == 0
    body = json.loads(out)
    assert body["at"].startswith("2026-11-27T23:30")
    inference = body["teams"]["inference"]
    assert inference["schedule"] == "night"
    assert inference["max"] == {"devices": 6, "devices/910B4": 10}
    assert body["teams"]["training"]["schedule"] is None
    code, out, _ = run("effective", "--at", "2026-11-27T10:00", "--json")
    assert json.loads(out)["teams"]["inference"]["schedule"] == "business-hours"
    assert run("effective", "--at", "yesterday")[0] == 2


def test_a_changed_policy_takes_effect_at_the_next_tick(demo, tmp_path, api, user_factory) -> None:
    lead = user_factory("rick", team="research", role="lead")
    for i in range(2):
        resp = api(lead).post(
            "/api/v1/jobs/",
            {"name": f"j{i}", "command": "true", "num_devices": 2, "chip_model": "910A", "estimated_duration_s": 600},
            format="json",
        )
        assert resp.status_code == 201
    tight = DEMO.replace(
        "guaranteed: {devices: 4}\n        max: {devices: 12}", "guaranteed: {devices: 2}\n        max: {devices: 2}"
    )
    assert tight != DEMO
    assert run("apply", write(tmp_path, tight), "-m", "research at 2", "--author", "admin")[0] == 0
    run_tick()
    assert TickRecord.objects.first().policy_version == 2
    waiting = Job.objects.get(name="j1", team__name="research")
    assert waiting.state == "pending" and waiting.pending_reason == "QuotaMaxDevices"
    assert run("rollback", "1")[0] == 0
    run_tick()
    assert TickRecord.objects.first().policy_version == 1
    waiting.refresh_from_db()
    assert waiting.state == "running"
