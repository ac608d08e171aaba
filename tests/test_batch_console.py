"""The console's submit form takes a batch script as npuctl batch does: typed or uploaded, its directives read."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from quotas.models import Team
from scheduling.models import Job

SCRIPT = """#!/bin/bash
#SBATCH --job-name=bert --gres=npu:2 --time=00:20:00
#SBATCH --output=/scratch/%x-%j.out --chdir=/scratch --export=NONE,LR=3e-4
#SBATCH --partition=debug
#NPU --chip 910B4
python train.py --lr "$LR" "$@"
"""


def _form(**fields: object) -> dict[str, object]:
    """The form as a browser posts it with nothing changed: each field at the value it was shown with."""
    return {
        "team": str(Team.objects.order_by("name").filter(memberships__user__username="lena").first().pk),
        "name": "",
        "command": "",
        "script": "",
        "script_args": "",
        "priority_class": "normal",
        "num_devices": "1",
        "chip_model": "",
        "vnpu_template": "",
        "estimated_duration_s": "1h",
        "max_duration_s": "",
        "checkpoint_interval_s": "",
        "array": "",
        **fields,
    }


@pytest.fixture
def lena(demo, client, user_factory):  # type: ignore[no-untyped-def]
    client.force_login(user_factory("lena", team="training", role="lead"))
    return client


def test_a_typed_scripts_directives_fill_the_fields_left_alone(lena) -> None:
    response = lena.post("/jobs/new/", _form(script=SCRIPT, script_args="--epochs 3"), follow=True)
    job = Job.objects.get(name="bert")
    assert (job.num_devices, job.chip_model, job.max_duration_s, job.estimated_duration_s) == (2, "910B4", 1200, 1200)
    assert (job.cwd, job.output, job.env) == ("/scratch", "/scratch/%x-%j.out", {"LR": "3e-4"})
    assert job.command.startswith("exec /bin/bash /dev/fd/3 --epochs 3 3<<'NPUPORTAL_SCRIPT'\n#!/bin/bash\n")
    html = response.content.decode()
    assert "Batch script: directives not honoured: --partition=debug (line 4: no partitions here" in html


def test_a_browsers_textarea_line_breaks_are_not_the_scripts(lena) -> None:
    """Browsers send a textarea's lines with \\r\\n (the HTML rule): the script typed has Unix ones."""
    assert lena.post("/jobs/new/", _form(script=SCRIPT.replace("\n", "\r\n"))).status_code == 302
    assert "\r" not in Job.objects.get(name="bert").command
    upload = SimpleUploadedFile("dos.sh", SCRIPT.replace("\n", "\r\n").encode())
    assert "DOS line breaks" in lena.post("/jobs/new/", _form(script_file=upload)).content.decode()  # a file's own


def test_fields_the_user_changed_win_over_directives(lena) -> None:
    lena.post("/jobs/new/", _form(script=SCRIPT, num_devices="4", name="mine", max_duration_s="10m"))
    job = Job.objects.get(name="mine")
    # The estimate was only the script's --time limit: it follows the lower limit typed on the form.
    assert (job.num_devices, job.max_duration_s, job.estimated_duration_s) == (4, 600, 600)


def test_an_uploaded_script_is_read_the_same_way(lena) -> None:
    upload = SimpleUploadedFile("train.sh", b"#!/bin/sh\n#SBATCH --gres=npu:910B4:1\necho hi\n")
    response = lena.post("/jobs/new/", _form(script_file=upload))
    assert response.status_code == 302
    job = Job.objects.get(name="train.sh")  # named after the file, as sbatch names a job
    assert job.chip_model == "910B4" and "echo hi" in job.command


@pytest.mark.parametrize(
    ("fields", "field", "error"),
    [
        ({}, "command", "Give a command, or a batch script."),
        ({"command": "ls", "script": SCRIPT}, "script", "Give a command or one script, not both."),
        ({"script": "#SBATCH --time=soon\nls\n"}, "script", "Batch script: line 1: --time=soon: &#x27;soon&#x27; is"),
        ({"script": SCRIPT, "script_args": "'open"}, "script_args", "Script arguments: No closing quotation"),
        ({"script_file": SimpleUploadedFile("x.sh", b"\xff\xfe")}, "script_file", "not UTF-8 text (byte 0xff at 0)"),
        ({"script": "#SBATCH --qos=platinum\nls\n"}, "priority_class", "unknown class &#x27;platinum&#x27;"),
        ({"script": "#SBATCH --account=research\nls\n"}, "team", "--account &#x27;research&#x27; is not a team"),
        ({"script": "echo " + "x" * 70000}, "script", "at most 65,536 bytes"),
    ],
)
def test_a_script_that_cannot_be_submitted_says_why_on_its_field(lena, fields, field, error) -> None:
    before = Job.objects.count()
    response = lena.post("/jobs/new/", _form(**fields))
    html = response.content.decode()
    assert response.status_code == 200 and f'id="{field}-error"' in html, html[-3000:]
    assert error in html
    assert Job.objects.count() == before


def test_a_command_still_submits_with_its_programs_name(lena) -> None:
    assert lena.post("/jobs/new/", _form(command="python eval.py --shard 3")).status_code == 302
    assert Job.objects.get(name="python").command == "python eval.py --shard 3"


def test_sbatch_patterns_in_an_output_path_are_filled_in_for_each_launch(demo) -> None:
    """``%j %x %u %A %a %N %%`` as sbatch fills them; a pattern it does not know is left as written."""
    from django.contrib.auth import get_user_model

    from scheduling.services.jobs import JobSpec, submit_array, submit_job
    from scheduling.services.output import output_file

    lead = get_user_model().objects.get(username="lead-training")
    team = Team.objects.get(name="training")
    spec = JobSpec(name="a/b", command="x", output="/o/%x-%j-%u-%A-%a-%N-%%-%t.out")
    job = submit_job(team=team, user=lead, spec=spec)
    assert output_file(job, "n1") == f"/o/a_b-{job.pk}-lead-training-{job.pk}-0-n1-%-%t.out"
    copies = submit_array(team=team, user=lead, spec=JobSpec(name="s", command="x", output="/o/%A_%a.out"), count=2)
    first = copies[0].pk
    assert [output_file(c, "n1") for c in copies] == [f"/o/{first}_0.out", f"/o/{first}_1.out"]
    spec.output = "/o/plain.out"
    assert output_file(submit_job(team=team, user=lead, spec=spec), "n1") == "/o/plain.out"
