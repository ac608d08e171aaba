"""npuctl against a real server (pytest-django's live_server): tables, --json, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from npuctl.main import main
from quotas.access.tokens import issue_token
from quotas.models import AuditEvent, Policy
from scheduling.models import Job
from tests.waiting import ceiling


@pytest.fixture
def cli(live_server, demo, user_factory, monkeypatch, capsys, request):
    """``run(user, *argv) -> (exit code, stdout, stderr)`` with that user's token against the live server."""
    from rest_framework.throttling import SimpleRateThrottle

    from quotas.policies import versions

    monkeypatch.setattr(SimpleRateThrottle, "cache_format", f"throttle-{uuid.uuid4().hex}-%(scope)s-%(ident)s")
    versions._cache.clear()
    request.addfinalizer(versions._cache.clear)
    users = {
        "lead": user_factory("cli-lead", team="training", role="lead"),
        "member": user_factory("cli-member", team="training"),
        "other": user_factory("cli-other", team="research"),
        "admin": user_factory("cli-admin", staff=True),
    }
    keys = {role: issue_token(user, "cli")[1] for role, user in users.items()}
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)

    def run(role: str | None, *argv: str) -> tuple[int, str, str]:
        if role is None:
            monkeypatch.delenv("NPUPORTAL_TOKEN", raising=False)
        else:
            monkeypatch.setenv("NPUPORTAL_TOKEN", keys.get(role, role))
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    run.keys = keys  # type: ignore[attr-defined]
    return run


def _rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.strip().splitlines()]


def test_submit_queue_show_cancel(cli) -> None:
    code, out, _ = cli("member", "submit", "--name", "bert", "--devices", "2", "--chip", "910B4", "--time", "2h",
                       "--team", "training", "--", "python", "train.py", "--lr", "3e-4")  # fmt: skip
    assert code == 0, out
    job_id = int(out.split()[2])
    job = Job.objects.get(pk=job_id)
    assert job.command == "python train.py --lr 3e-4" and job.estimated_duration_s == 7200 and job.num_devices == 2

    code, out, _ = cli("lead", "queue")
    assert code == 0
    header, *rows = _rows(out)
    assert header == ["JOBID", "NAME", "TEAM", "USER", "CLASS", "DEV", "STATE", "REASON", "EST_START", "NODELIST"]
    mine = [r for r in rows if r[0] == str(job_id)]
    assert mine and mine[0][1:7] == ["bert", "training", "cli-member", "normal", "2x910B4", "pending"]
    assert all(r[6] in ("pending", "running") for r in rows)

    code, out, _ = cli("other", "queue", "--state", "all")
    assert code == 0 and str(job_id) not in [r[0] for r in _rows(out)[1:]]

    code, out, _ = cli("member", "queue", "--json", "--user", "cli-member")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [job_id]

    code, out, _ = cli("member", "show", str(job_id))
    assert code == 0 and "python train.py --lr 3e-4" in out and "events:" in out and "Submitted" in out

    code, _, err = cli("other", "show", str(job_id))
    assert code == 1 and "not found" in err.lower()

    code, out, _ = cli("member", "cancel", str(job_id), "999999")
    assert code == 1 and f"cancelled job {job_id}" in out
    assert Job.objects.get(pk=job_id).state == "cancelled"
    code, _, err = cli("member", "cancel", str(job_id))
    assert code == 1 and "already cancelled" in err


def test_submit_with_a_checkpoint_interval(cli) -> None:
    code, out, _ = cli("member", "submit", "--checkpoint-interval", "30m", "--", "python", "train.py")
    assert code == 0, out
    job_id = int(out.split()[2])
    assert Job.objects.get(pk=job_id).checkpoint_interval_s == 1800
    code, out, _ = cli("member", "show", str(job_id))
    assert code == 0 and "checkpoints every 30m" in out


def test_submit_array_and_json(cli) -> None:
    code, out, _ = cli("member", "--json", "submit", "--array", "3", "--command", "sleep 5", "--vnpu", "vir02")
    assert code == 0
    jobs = json.loads(out)
    assert [j["array_index"] for j in jobs] == [0, 1, 2] and {j["vnpu_template"] for j in jobs} == {"vir02"}
    assert jobs[0]["name"] == "sleep[0]"


def test_the_api_refusing_exits_1_with_its_sentence(cli) -> None:
    before = Job.objects.count()
    code, _, err = cli("member", "submit", "--vnpu", "vir99", "--", "x")
    assert code == 1 and "vnpu_template: unknown vNPU template 'vir99'" in err
    # 25 cards: more than training may hold (24) and than any chip pool (16); the engine's rule says so.
    code, out, err = cli("member", "submit", "--devices", "25", "--", "x")
    assert (code, out) == (1, "")
    assert err == (
        "npuctl: num_devices: this job can never run here: a 25-card job; "
        "no chip model has that many cards (910B4: 16, 910A: 8, 310P3: 4)\n"
    ), err
    code, _, err = cli("member", "submit", "--devices", "17", "--chip", "910B4", "--array", "3", "--", "x")
    assert code == 1 and err == (
        "npuctl: num_devices: this job can never run here: a 17-card job; the cluster has 16 cards of 910B4\n"
    ), err
    code, _, err = cli("member", "submit", "--team", "research", "--", "x")
    assert code == 1 and "team" in err
    assert Job.objects.count() == before


def test_limits_exit_1_with_the_field_and_the_limit_and_lists_show_a_preview(cli) -> None:
    from django.test import override_settings

    before = Job.objects.count()
    code, _, err = cli("member", "submit", "--command", "x" * 70000)
    assert code == 1 and "command: is 70,000 bytes (68.4 KiB); at most 65,536 bytes (64 KiB)" in err, err
    code, _, err = cli("member", "submit", "--array", "2000", "--", "x")
    assert code == 1 and "array: asks for 2,000 copies; at most 1,000 in one array" in err, err
    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=10000):
        code, _, err = cli("member", "submit", "--command", "x" * 20000)
    assert code == 1 and "body: the request body is" in err and "at most 10,000 bytes (9.8 KiB)" in err, err
    assert Job.objects.count() == before
    command = "python train.py " + "--lr 3e-4 " * 30
    code, out, _ = cli("member", "--json", "submit", "--command", command.strip())
    job_id = json.loads(out)["id"]
    code, out, _ = cli("member", "--json", "queue")
    row = next(j for j in json.loads(out) if j["id"] == job_id)
    assert row["command_preview"] == command[:199] + "…" and "command" not in row
    code, out, _ = cli("member", "show", str(job_id))
    assert code == 0 and command.strip() in out, "show prints the whole command"


def test_auth_failures_exit_4(cli) -> None:
    code, _, err = cli("npu_not-a-real-token", "queue")
    assert code == 4 and "Invalid token" in err
    code, _, err = cli(None, "nodes")
    assert code == 4 and "NPUPORTAL_TOKEN" in err
    code, _, err = cli("member", "usage")
    assert code == 4 and "leads" in err
    code, _, err = cli("lead", "policy", "validate", str(settings.BASE_DIR / "examples/policies/demo.yaml"))
    assert code == 4 and "admins only" in err


def test_quota_nodes_usage_tables(cli) -> None:
    code, out, _ = cli("member", "quota")
    assert code == 0 and out.startswith("team training: schedule (base)")
    rows = {r[0]: r[1:] for r in _rows(out)[1:-1]}
    assert rows["devices"] == ["10", "24", "0"]

    code, out, _ = cli("member", "nodes")
    assert code == 0
    rows = {r[0]: r[1:] for r in _rows(out)[1:]}
    assert rows["ascend-b4-01"] == ["ready", "910B4", "8", "8", "0", "0"]
    assert rows["ascend-310p-01"][1:3] == ["310P3", "4"]

    code, out, _ = cli("lead", "usage", "--month", "2020-01")
    assert code == 0 and ["training", "2020-01", "total", "0.0", "0.00"] in _rows(out)
    assert "warning: no rate card is in force from 2020-01-01" in out  # no price then: said, not hidden
    code, out, _ = cli("admin", "--json", "usage")
    assert code == 0 and {u["team"] for u in json.loads(out)} == {"inference", "training", "research"}
    code, out, _ = cli("admin", "quota")
    assert code == 2  # several teams: say which


def test_policy_validate_apply_diff(cli, tmp_path: Path) -> None:
    active = Policy.objects.get(is_active=True).yaml_text
    good = tmp_path / "good.yaml"
    good.write_text(active.replace("guaranteed: {devices: 4}", "guaranteed: {devices: 5}"))
    bad = tmp_path / "bad.yaml"
    bad.write_text(active.replace("devices/910B4: 10", "devices/H100: 10"))

    code, out, _ = cli("admin", "policy", "validate", str(good))
    assert code == 0 and "valid" in out
    code, out, _ = cli("admin", "policy", "validate", str(bad))
    assert code == 1 and "error:" in out and "H100" in out
    code, _, err = cli("admin", "policy", "validate", str(tmp_path / "missing.yaml"))
    assert code == 2 and "cannot read" in err

    code, out, _ = cli("admin", "policy", "apply", str(good), "--dry-run", "--days", "2")
    assert code == 0 and "nothing was stored" in out and "research" in out
    assert Policy.objects.count() == 1
    code, _, err = cli("admin", "policy", "apply", str(good))
    assert code == 2 and "--comment" in err
    code, out, err = cli("admin", "policy", "apply", str(bad), "--comment", "oops")
    assert code == 1 and "H100" in out + err and Policy.objects.count() == 1
    code, out, _ = cli("admin", "policy", "apply", str(good), "-m", "research +1")
    assert code == 0 and "applied as v2" in out
    assert AuditEvent.objects.filter(action="policy.activate", target="policy v2").exists()

    code, out, _ = cli("admin", "policy", "diff", "1", "active")
    assert code == 0 and out.startswith("v1 → v2: 1 change(s)") and "research" in out
    code, out, _ = cli("admin", "policy", "diff", "active", str(good))
    assert code == 0 and "no change in meaning" in out
    code, out, _ = cli("admin", "--json", "policy", "diff", "1", "2")
    assert code == 0 and json.loads(out)["changes"]
    code, _, err = cli("admin", "policy", "diff", "1", "42")
    assert code == 1 and "no policy version" in err


def test_installed_npuctl_runs_as_a_subprocess(cli, live_server) -> None:
    installed = Path(sys.executable).parent / "npuctl"
    command = [str(installed)] if installed.exists() else [sys.executable, "-m", "npuctl"]
    env = {
        **os.environ,
        "NPUPORTAL_URL": live_server.url,
        "NPUPORTAL_TOKEN": cli.keys["lead"],
        "PYTHONPATH": str(settings.BASE_DIR),
    }
    done = subprocess.run([*command, "nodes", "--json"], env=env, capture_output=True, text=True, timeout=ceiling(120))
    assert done.returncode == 0, done.stderr
    assert {n["name"] for n in json.loads(done.stdout)} >= {"ascend-b4-01", "ascend-a-01"}
    refused = subprocess.run(
        [*command, "show", "999999"], env=env, capture_output=True, text=True, timeout=ceiling(120)
    )
    assert refused.returncode == 1 and "npuctl:" in refused.stderr
    by_module = subprocess.run(
        [sys.executable, "-m", "npuctl", "--token", "wrong", "queue"],
        env=env,
        capture_output=True,
        text=True,
        timeout=ceiling(120),
        cwd=settings.BASE_DIR,
    )
    assert by_module.returncode == 4


def test_a_preempted_running_job_says_when_it_stops(cli) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from quotas.policies.versions import active_policy
    from scheduling.engine.policy import zone
    from scheduling.services.tick import run_tick

    code, out, _ = cli("member", "submit", "--devices", "1", "--chip", "910B4", "--", "sleep", "600")
    job_id = int(out.split()[2])
    assert job_id in run_tick().started
    deadline = timezone.now() + timedelta(minutes=5)  # as the tick writes a preemption
    Job.objects.filter(pk=job_id).update(preempt_deadline=deadline, preempted_for=job_id + 1)
    code, out, _ = cli("member", "show", str(job_id))
    assert code == 0 and "must be off its devices by" in out and "called off if no waiting job" in out
    code, out, _ = cli("member", "queue", "--user", "cli-member")
    local = deadline.astimezone(zone(active_policy().policy.timezone))  # npuctl: the policy's clock, labelled
    assert code == 0 and f"preempted, stops {local:%m-%d %H:%M} {local.tzname()}" in out, out


def _ended(user_name: str, state: str, *, ended_ago_h: float, ran_s: int, exit_code: int | None, nodes=()):
    """A job of ``user_name`` that ended ``ended_ago_h`` hours ago after ``ran_s`` seconds on ``nodes``' card 0."""
    from datetime import timedelta

    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from devices.models import Device
    from quotas.models import Team
    from scheduling.models import Allocation

    ended = timezone.now() - timedelta(hours=ended_ago_h)
    started = ended - timedelta(seconds=ran_s)
    job = Job.objects.create(
        team=Team.objects.get(name="training"), submitter=get_user_model().objects.get(username=user_name),
        name=f"{state}-job", command="python x.py", priority_class="normal", num_devices=len(nodes) or 1,
        state=state, submitted_at=started - timedelta(minutes=1), started_at=started, ended_at=ended,
        exit_code=exit_code,
    )  # fmt: skip
    for node in nodes:
        Allocation.objects.create(
            job=job, device=Device.objects.get(node__name=node, index=0), start=started, end=ended
        )
    return job


def test_queue_shows_the_nodes_of_a_running_job(cli) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from devices.models import Device
    from scheduling.models import Allocation

    job = _ended("cli-member", "running", ended_ago_h=0, ran_s=600, exit_code=None)
    Job.objects.filter(pk=job.pk).update(ended_at=None, num_devices=3)
    for node, index in (("ascend-b4-01", 0), ("ascend-b4-01", 1), ("ascend-b4-02", 0)):
        device = Device.objects.get(node__name=node, index=index)
        Allocation.objects.create(job=job, device=device, start=timezone.now() - timedelta(minutes=10))
    code, out, _ = cli("member", "queue", "--user", "cli-member")
    assert code == 0
    (row,) = [r for r in _rows(out)[1:] if r[0] == str(job.pk)]
    assert row[6] == "running" and row[-1] == "ascend-b4-[01-02]"
    code, out, _ = cli("member", "--json", "queue", "--user", "cli-member")
    assert [j["nodes"] for j in json.loads(out)] == [["ascend-b4-01", "ascend-b4-02"]]


def test_history_lists_ended_jobs_with_elapsed_exit_and_device_hours(cli) -> None:
    done = _ended("cli-member", "completed", ended_ago_h=2, ran_s=3723, exit_code=0, nodes=["ascend-b4-01"])
    failed = _ended(
        "cli-member", "failed", ended_ago_h=30, ran_s=1800, exit_code=3, nodes=["ascend-b4-01", "ascend-b4-02"]
    )
    cancelled = _ended("cli-member", "cancelled", ended_ago_h=1, ran_s=60, exit_code=None)
    _ended("cli-other", "completed", ended_ago_h=1, ran_s=60, exit_code=0)  # another team's: never shown

    code, out, _ = cli("member", "history")  # the last day
    assert code == 0
    header, *rows = _rows(out)
    assert header == ["JOBID", "NAME", "TEAM", "STATE", "ELAPSED", "EXIT", "DEV_HOURS", "END"]
    by_id = {int(r[0]): r for r in rows}
    assert set(by_id) >= {done.pk, cancelled.pk} and failed.pk not in by_id
    assert by_id[done.pk][1:7] == ["completed-job", "training", "completed", "1:02:03", "0", "1.03"]
    assert by_id[cancelled.pk][3:6] == ["cancelled", "0:01:00", "-"]
    assert all(r[2] == "training" for r in rows)

    code, out, _ = cli("member", "history", "--since", "2d", "--until", "1d", "--user", "cli-member")
    assert code == 0 and [int(r[0]) for r in _rows(out)[1:]] == [failed.pk]
    assert _rows(out)[1][4:7] == ["0:30:00", "3", "1.00"]  # 2 cards × 30 min

    code, out, _ = cli("member", "history", "--since", "7d", "--state", "failed,cancelled", "--user", "cli-member")
    assert code == 0 and sorted(int(r[0]) for r in _rows(out)[1:]) == sorted([failed.pk, cancelled.pk])
    code, out, _ = cli("member", "--json", "history", "--since", "7d", "--state", "completed", "--user", "cli-member")
    assert code == 0 and [j["id"] for j in json.loads(out)] == [done.pk]

    code, out, err = cli("member", "history", "--state", "finished")
    assert code == 2 and out == "" and err.startswith("npuctl: --state 'finished'")
    code, _, err = cli("member", "history", "--since", "last week")
    assert code == 2 and "--since" in err


def test_usage_shows_the_months_cost(cli) -> None:
    from quotas.accounting.statements import previous_month

    _ended("cli-lead", "completed", ended_ago_h=0, ran_s=900, exit_code=0, nodes=["ascend-b4-02"])
    code, out, _ = cli("lead", "usage")
    assert code == 0
    header = _rows(out)[0]
    assert header == ["TEAM", "MONTH", "CHIP", "DEVICE-HOURS", "COST"]
    total = next(r for r in _rows(out) if r[2] == "total")
    assert total[-1] == "CNY" and float(total[-2]) > 0
    assert "usage so far" in out
    label = previous_month()
    code, out, _ = cli("lead", "usage", "--month", label)
    assert code == 0 and "its closed statement" in out


def test_resubmit_and_my_own_jobs(cli) -> None:
    code, out, _ = cli("member", "submit", "--name", "again", "--chip", "910B4", "--", "python", "eval.py")
    assert code == 0, out
    first = int(out.split()[2])
    code, out, _ = cli("lead", "submit", "--name", "leads", "--", "true")
    assert code == 0, out

    code, out, _ = cli("member", "resubmit", str(first))
    assert code == 0, out
    copy = int(out.split()[2])
    assert out.strip() == f"submitted job {copy} (pending), a copy of job {first}"
    assert Job.objects.get(pk=copy).command == "python eval.py" and copy != first
    code, _, err = cli("other", "resubmit", str(first))
    assert code == 1 and "not found" in err

    code, out, _ = cli("member", "queue", "--me")
    assert code == 0
    assert {row[0] for row in _rows(out)[1:]} == {str(first), str(copy)}, "only the token's user's jobs"
    code, out, _ = cli("lead", "queue", "-u", "cli-member", "--json")
    assert code == 0 and {j["id"] for j in json.loads(out)} == {first, copy}
    code, _, err = cli("member", "queue", "--me", "--user", "cli-lead")
    assert code == 2 and "--user or --me" in err
