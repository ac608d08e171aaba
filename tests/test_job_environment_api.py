"""A job's ``env``, ``cwd`` and ``output`` and its owner's POSIX account, from submission to the agent's request.

The agent side (a clean environment, the account switch) is tested in tests/agent/test_job_accounts.py;
here: what the portal takes, refuses (400 naming the field, nothing stored), keeps, shows and sends.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from django.utils import timezone

from devices.agent.environment import MAX_ENV_BYTES, MAX_ENV_VARS
from devices.executors.agents import launch_payload
from devices.models import Device
from quotas.models import UserProfile, posix_account
from scheduling.models import Allocation, Job

GOOD_JOB = {"name": "ok", "command": "sleep 1", "num_devices": 1, "estimated_duration_s": 60}


@pytest.fixture(autouse=True)
def _isolated(isolated_api_state):
    """Own throttle counters and policy cache (see conftest)."""


@pytest.fixture
def member(demo, user_factory):
    return user_factory("max", team="training")


def submit(api, user, **fields):
    return api(user).post("/api/v1/jobs/", {**GOOD_JOB, **fields}, format="json")


def test_env_cwd_and_output_are_stored_and_shown_on_the_job(api, member) -> None:
    env = {"HCCL_CONNECT_TIMEOUT": "1200", "EMPTY": "", "SPACES": " a b "}
    resp = submit(api, member, env=env, cwd="/home/max/run", output="/home/max/run/train.out")
    assert resp.status_code == 201, resp.content
    job = Job.objects.get(pk=resp.json()["id"])
    assert (job.env, job.cwd, job.output) == (env, "/home/max/run", "/home/max/run/train.out")
    detail = api(member).get(f"/api/v1/jobs/{job.pk}/").json()
    assert (detail["env"], detail["cwd"], detail["output"], detail["posix_user"]) == (
        env,
        "/home/max/run",
        "/home/max/run/train.out",
        "max",
    )
    listed = api(member).get("/api/v1/jobs/").json()["results"][0]
    assert "env" not in listed  # lists carry what a list needs


def test_without_them_a_job_has_no_env_and_the_defaults(api, member) -> None:
    job = Job.objects.get(pk=submit(api, member).json()["id"])
    assert (job.env, job.cwd, job.output) == ({}, "", "")


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"env": ["A=1"]}, "env", ""),
        ({"env": "A=1"}, "env", ""),
        ({"env": {"A": 1}}, "env", ""),
        ({"env": {"1A": "x"}}, "env", "not a valid variable name"),
        ({"env": {"A B": "x"}}, "env", "not a valid variable name"),
        ({"env": {"PATH": "/tmp/evil"}}, "env", "PATH is set by the node agent"),
        ({"env": {"HOME": "/x"}}, "env", "HOME is set by the node agent"),
        ({"env": {"LD_PRELOAD": "/x.so"}}, "env", "LD_PRELOAD"),
        ({"env": {"ASCEND_RT_VISIBLE_DEVICES": "0-7"}}, "env", "ASCEND_RT_VISIBLE_DEVICES"),
        ({"env": {"NPUPORTAL_TEAM": "research"}}, "env", "NPUPORTAL_TEAM"),
        ({"env": {"MASTER_ADDR": "10.0.0.1"}}, "env", "MASTER_ADDR"),
        ({"env": {"A": "x\u0000y"}}, "env", ""),
        ({"env": {f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}}, "env", f"at most {MAX_ENV_VARS}"),
        ({"env": {"BIG": "x" * MAX_ENV_BYTES}}, "env", "bytes"),
        ({"cwd": "relative/dir"}, "cwd", "absolute"),
        ({"cwd": "/" + "d" * 1024}, "cwd", "at most 1024"),
        ({"cwd": 7}, "cwd", "string"),
        ({"output": "out.txt"}, "output", "absolute"),
        ({"output": "/home/max/out/"}, "output", "a file"),
        ({"output": "/home/max/a\nb"}, "output", "one line"),
    ],
)
def test_bad_env_cwd_or_output_is_a_400_naming_it_and_stores_nothing(api, member, fields, field, words) -> None:
    before = Job.objects.count()
    resp = submit(api, member, **fields)
    assert resp.status_code == 400, resp.content
    body = resp.json()
    assert body["field"] == field, body
    assert words in body["error"], body
    assert Job.objects.count() == before


def test_an_array_and_a_resubmit_keep_the_env(api, member) -> None:
    created = submit(api, member, env={"SEED": "7"}, cwd="/data/x", array=3).json()
    assert {Job.objects.get(pk=j["id"]).env["SEED"] for j in created} == {"7"}
    again = api(member).post(f"/api/v1/jobs/{created[0]['id']}/resubmit/", format="json").json()
    copy = Job.objects.get(pk=again["id"])
    assert (copy.env, copy.cwd) == ({"SEED": "7"}, "/data/x")


def test_posix_account_is_the_username_unless_an_admin_sets_one(member) -> None:
    assert posix_account(member) == "max"
    UserProfile.objects.create(user=member, posix_user="mx042")
    member.refresh_from_db()
    assert posix_account(member) == "mx042"


def test_the_launch_request_carries_team_user_env_cwd_and_output(api, member) -> None:
    UserProfile.objects.create(user=member, posix_user="mx042")
    job = Job.objects.get(pk=submit(api, member, env={"SEED": "7"}, cwd="/data/x", output="/data/x/o.log").json()["id"])
    device = Device.objects.filter(node__removed_at__isnull=True).select_related("node").first()
    alloc = Allocation(job=job, device=device, start=timezone.now())
    job = Job.objects.select_related("team", "submitter__profile").get(pk=job.pk)
    payload = launch_payload(job, f"{job.pk}.1", [alloc])
    assert payload["team"] == "training"
    assert payload["user"] == "mx042"
    assert payload["env"] == {"JOB_NAME": "ok", "JOB_TEAM": "training", "SEED": "7"}
    assert (payload["cwd"], payload["output"]) == ("/data/x", "/data/x/o.log")


def test_a_refusal_about_the_account_fails_the_job_at_once() -> None:
    from devices.services.agent_client import AgentError

    for field in ("user", "cwd", "output"):
        assert AgentError("no POSIX account 'max' on node n1", status=400, field=field).never_succeeds
    assert not AgentError("device 3 is in use", status=409, field="devices").never_succeeds


def test_the_job_page_shows_the_account_env_cwd_and_output(client, api, member) -> None:
    job_id = submit(api, member, env={"SEED": "7"}, cwd="/data/x", output="/data/x/o.log").json()["id"]
    client.force_login(member)
    page = client.get(f"/jobs/{job_id}/").content.decode()
    assert '<code id="job-posix-user">max</code>' in page
    assert "<code>SEED=7</code>" in page
    assert "<code>/data/x</code>" in page and "<code>/data/x/o.log</code>" in page


def test_npuctl_submit_sends_env_chdir_and_output() -> None:
    """The CLI's flags become the API's fields (parsed without a server)."""
    from npuctl import main as cli

    sent: dict = {}

    class FakeClient:
        def post(self, path, body):
            sent.update(body)
            return {"id": 1, "state": "pending"}

    args = cli.build_parser().parse_args(
        ["submit", "--env", "A=1", "--env", "B=x=y", "--chdir", "/data", "--output", "/data/o", "--", "python", "t.py"]
    )
    args.handler(FakeClient(), args)
    assert sent["env"] == {"A": "1", "B": "x=y"}
    assert (sent["cwd"], sent["output"]) == ("/data", "/data/o")
    bad = subprocess.run(
        [sys.executable, "-m", "npuctl", "submit", "--env", "NOEQUALS", "--", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert bad.returncode == 2 and "NAME=VALUE" in bad.stderr


def test_an_admin_sets_the_posix_account_on_the_user_page(client, user_factory, member) -> None:
    admin = user_factory("site-admin", staff=True)
    admin.is_superuser = True
    admin.save()
    client.force_login(admin)
    page = client.get(f"/admin/auth/user/{member.pk}/change/")
    assert page.status_code == 200 and 'name="profile-TOTAL_FORMS"' in page.content.decode()
    form = page.context["adminform"].form
    data = {
        key: value
        for key, value in form.initial.items()
        if key in ("username", "first_name", "last_name", "email", "is_active", "is_staff", "is_superuser")
        and value is not None
    }
    data.update(
        {
            "last_login_0": "",
            "last_login_1": "",
            "date_joined_0": timezone.now().strftime("%Y-%m-%d"),
            "date_joined_1": "00:00:00",
            "profile-TOTAL_FORMS": "1",
            "profile-INITIAL_FORMS": "0",
            "profile-MIN_NUM_FORMS": "0",
            "profile-MAX_NUM_FORMS": "1",
            "profile-0-posix_user": "mx042",
            "profile-0-user": str(member.pk),
        }
    )
    resp = client.post(f"/admin/auth/user/{member.pk}/change/", data)
    assert resp.status_code == 302, resp.content.decode()[:3000]
    assert UserProfile.objects.get(user=member).posix_user == "mx042"
    data["profile-0-posix_user"] = "not valid!"
    data["profile-INITIAL_FORMS"] = "1"
    data["profile-0-id"] = str(UserProfile.objects.get(user=member).pk)
    assert client.post(f"/admin/auth/user/{member.pk}/change/", data).status_code == 200  # the form, with the error
    assert UserProfile.objects.get(user=member).posix_user == "mx042"
