"""The command you typed is the command that runs, and batch scripts run as written: npuctl, the API, real agents."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from npuctl.main import main
from quotas.access.tokens import issue_token
from scheduling.models import Job
from tests.test_lifecycle_harness import cluster, eager_celery, poll, submit, tick

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
__all__ = ["cluster", "eager_celery", "submit"]  # fixtures, imported for pytest


@pytest.fixture
def npuctl(live_server, monkeypatch, capsys):  # type: ignore[no-untyped-def]
    """``run(*argv) -> (exit code, stdout, stderr)`` as the training lead, against the live server."""
    key = issue_token(get_user_model().objects.get(username="lead-training"), "batch")[1]
    monkeypatch.setenv("NPUPORTAL_URL", live_server.url)
    monkeypatch.setenv("NPUPORTAL_TOKEN", key)

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _run_to_the_end(job_id: int) -> Job:
    """Tick until the job starts, then poll until it has ended (generous deadlines: a shared machine)."""
    deadline = time.monotonic() + 60
    job = Job.objects.get(pk=job_id)
    while job.state == Job.State.PENDING and time.monotonic() < deadline:
        tick()
        job = Job.objects.get(pk=job_id)
    while not job.is_final and time.monotonic() < deadline:
        poll()
        time.sleep(0.3)
        job = Job.objects.get(pk=job_id)
    assert job.is_final, f"job {job_id} still {job.state}"
    return job


def _whole_log(npuctl, job_id: int) -> str:  # type: ignore[no-untyped-def]
    code, out, err = npuctl("logs", str(job_id))
    assert code == 0, err
    return out


def test_the_arguments_after_dashes_are_the_command_that_runs(cluster, npuctl) -> None:
    """Issue 26, 2: `npuctl submit -- bash -c 'for i in 1 2; do echo $i; done'` once failed: the words were joined."""
    code, out, err = npuctl("submit", "--chip", "910B4", "--", "bash", "-c", "for i in 1 2; do echo $i; done", "x y")
    assert code == 0, err
    job_id = int(out.split()[2])
    job = Job.objects.get(pk=job_id)
    assert job.command == "bash -c 'for i in 1 2; do echo $i; done' 'x y'" and job.name == "bash"
    code, out, _ = npuctl("show", str(job_id))
    assert code == 0 and "command      bash -c 'for i in 1 2; do echo $i; done' 'x y'" in out, out
    job = _run_to_the_end(job_id)
    assert (job.state, job.exit_code) == (Job.State.COMPLETED, 0)
    assert _whole_log(npuctl, job_id) == "1\n2\n"

    # One argument alone is a command line, as before.
    code, out, err = npuctl("submit", "--chip", "910B4", "--", "echo one; echo two")
    assert code == 0, err
    job_id = int(out.split()[2])
    assert Job.objects.get(pk=job_id).command == "echo one; echo two"
    _run_to_the_end(job_id)
    assert _whole_log(npuctl, job_id) == "one\ntwo\n"


def test_the_api_takes_argv_beside_command(demo, api) -> None:
    lead = api(get_user_model().objects.get(username="lead-training"))
    resp = lead.post("/api/v1/jobs/", {"name": "a", "argv": ["printf", "%s\n", "a b", ""]}, format="json")
    assert resp.status_code == 201, resp.content
    assert resp.json()["command"] == "printf '%s\n' 'a b' ''"
    for body, field in (
        ({"name": "a"}, "command"),
        ({"name": "a", "command": "x", "argv": ["x"]}, "argv"),
        ({"name": "a", "argv": []}, "argv"),
        ({"name": "a", "argv": "ls -l"}, "argv"),
        ({"name": "a", "argv": ["ls", 3]}, "argv.1"),
    ):
        resp = lead.post("/api/v1/jobs/", body, format="json")
        assert resp.status_code == 400 and resp.json()["field"] == field, (body, resp.content)


BATCH_SCRIPT = """#!/bin/bash
#SBATCH --job-name=sweep
#SBATCH --gres=npu:2 --nodes=1 --ntasks-per-node=1
#SBATCH --time=00:10:00
#SBATCH --output={out}/%x-%j.out --error={out}/%x-%j.out
#SBATCH --chdir={out}
#SBATCH --array=0-1%1
#SBATCH --export=NONE,GREETING=hello
#SBATCH --dependency=afterok:{after}
#NPU --chip 910B4

for i in 1 2; do echo "step $i"; done
echo "args: $1|$2"
echo "in: $(pwd)"
echo "$GREETING from ${{JOB_NAME}}"
"""


def test_npuctl_batch_honours_every_directive_and_runs_the_script(cluster, npuctl, tmp_path: Path) -> None:
    """Issue 26, 3: the directives become the request (or are named, in one line), and the script runs on a node."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    earlier = Job.objects.filter(state=Job.State.COMPLETED, team__name="training").order_by("-pk").first()  # satisfied
    script = tmp_path / "sweep.sh"
    script.write_text(BATCH_SCRIPT.format(out=out_dir, after=earlier.pk))
    code, out, err = npuctl("batch", str(script), "first arg", "second")
    assert code == 0, err
    assert err.strip() == "", err  # every directive honoured: no warning line
    ids = [int(word) for word in out.split(":")[1].split()]
    jobs = list(Job.objects.filter(pk__in=ids).order_by("array_index"))
    assert [j.array_index for j in jobs] == [0, 1] and {j.name for j in jobs} == {"sweep[0]", "sweep[1]"}
    first = jobs[0]
    assert {(j.array_limit, j.depends_on) for j in jobs} == {(1, f"afterok:{earlier.pk}")}
    assert (first.num_devices, first.chip_model, first.max_duration_s, first.estimated_duration_s) == (
        2, "910B4", 600, 600,
    )  # fmt: skip
    assert first.cwd == str(out_dir) and first.output == f"{out_dir}/%x-%j.out" and first.env == {"GREETING": "hello"}
    code, shown, _ = npuctl("show", str(first.pk))
    assert code == 0 and "#SBATCH --job-name=sweep" in shown and "\n             for i in 1 2" in shown, shown

    for job in jobs:
        ended = _run_to_the_end(job.pk)
        assert (ended.state, ended.exit_code) == (Job.State.COMPLETED, 0), ended.state
    text = _whole_log(npuctl, first.pk)
    assert text == f"step 1\nstep 2\nargs: first arg|second\nin: {out_dir}\nhello from {first.name}\n", text
    # The output file's name has its patterns filled in, as sbatch fills them.
    assert (out_dir / f"sweep[0]-{first.pk}.out").read_text() == text


def test_submit_given_a_file_submits_it_as_a_batch_script(cluster, npuctl, tmp_path: Path, monkeypatch) -> None:
    script = tmp_path / "hello.py"
    script.write_text("#!/usr/bin/env python3\n#SBATCH --gres=npu:1 --frobnicate\n#NPU --chip 910B4\nimport sys\n"
                      "print('hello', sys.argv[1:])\n")  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, out, err = npuctl("submit", "--json", "hello.py", "--lr", "3")
    assert code == 0, err
    assert "directives not honoured: --frobnicate (line 2: unknown option)" in err
    job = json.loads(out)
    assert job["name"] == "hello.py" and job["command"].startswith("exec /usr/bin/env python3 /dev/fd/3 --lr 3 3<<")
    _run_to_the_end(job["id"])
    assert _whole_log(npuctl, job["id"]) == "hello ['--lr', '3']\n"
    # After `--` a file name is a command, as ever: the path runs on the node.
    code, out, _ = npuctl("--json", "submit", "--", "hello.py")
    assert code == 0 and json.loads(out)["command"] == "hello.py"


def test_a_script_that_cannot_be_read_changes_nothing(demo, npuctl, tmp_path: Path) -> None:
    before = Job.objects.count()
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/bin/bash\n#SBATCH --time=soon\nhostname\n")
    code, out, err = npuctl("batch", str(bad))
    assert (code, out) == (2, "") and err.startswith(f"npuctl: {bad}: line 2: --time=soon: 'soon' is not a duration")
    bad.write_bytes(b"#!/bin/bash\r\nhostname\r\n")
    assert npuctl("batch", str(bad))[0] == 2
    assert npuctl("batch", str(tmp_path / "missing.sh"))[2].startswith("npuctl: cannot read")
    assert Job.objects.count() == before


def test_command_line_flags_win_over_directives(demo, npuctl, tmp_path: Path) -> None:
    script = tmp_path / "j.sh"
    script.write_text("#SBATCH --gres=npu:4 --time=2:00:00 --export=A=1,B=2\n#NPU --class low\nhostname\n")
    flags = ("-n", "2", "--max-time", "30m", "--env", "B=3", "--name", "x")
    code, out, err = npuctl("--json", "batch", *flags, str(script))
    assert code == 0 and err == "", err
    job = Job.objects.get(pk=json.loads(out)["id"])
    assert (job.num_devices, job.max_duration_s, job.estimated_duration_s, job.priority_class) == (2, 1800, 1800, "low")
    assert job.env == {"A": "1", "B": "3"} and job.name == "x"
