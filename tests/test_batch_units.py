"""Batch scripts read by npuctl.batch: each directive honoured, or named in the one warning line; the command runs."""

from __future__ import annotations

import subprocess

import pytest

from npuctl.batch import ScriptError, interpreter, read_script, script_command

EVERY_DIRECTIVE = """#!/bin/bash
#SBATCH --job-name=bert-ft
#SBATCH --gres=npu:2 --nodes=2 --ntasks-per-node=1   # two servers, two cards each
#SBATCH --time=1-02:30
#SBATCH --output=logs/%x-%j.out --error=logs/%x-%j.out
#SBATCH --chdir=/scratch/bert
#SBATCH --array=0-15%4
#SBATCH --export=NONE,LR=3e-4,FROM_HOME
#SBATCH --dependency=afterok:12:13
#NPU --class high

python train.py --lr "$LR"
"""


def test_every_directive_is_honoured_or_named() -> None:
    batch = read_script(EVERY_DIRECTIVE, name="bert.sh", environ={"FROM_HOME": "yes", "SECRET": "no"})
    assert batch.fields == {
        "name": "bert-ft",
        "num_devices": 4,  # --gres is per node, as in Slurm
        "max_duration_s": 95400,
        "estimated_duration_s": 95400,
        "output": "/scratch/bert/logs/%x-%j.out",  # relative to --chdir; the patterns kept for the portal
        "cwd": "/scratch/bert",
        "array": "0-15%4",  # Slurm's index list and limit, as the API reads them
        "depends_on": "afterok:12:13",
        "env": {"LR": "3e-4", "FROM_HOME": "yes"},  # only what was named: never the whole environment
        "priority_class": "high",
    }
    assert batch.warning() is None


@pytest.mark.parametrize(
    ("directive", "fields"),
    [
        ("#SBATCH --array=1-8", {"array": "1-8"}),
        ("#SBATCH --array=1,3,5", {"array": "1,3,5"}),
        ("#SBATCH -a 0-15:4%2", {"array": "0-15:4%2"}),
        ("#NPU --array 3", {"array": 3}),
        ("#NPU --array 0-7%2", {"array": "0-7%2"}),
        ("#SBATCH --dependency=afterany:3,afternotok:4:5", {"depends_on": "afterany:3,afternotok:4:5"}),
    ],
)
def test_arrays_and_dependencies_go_as_slurm_writes_them(directive: str, fields: dict) -> None:
    batch = read_script(f"{directive}\necho hi\n")
    assert batch.fields == fields and batch.warning() is None


def test_unknown_and_unsupported_directives_are_named_in_one_line() -> None:
    batch = read_script(
        "#!/bin/sh\n#SBATCH --partition debug --mem=64G -c 8 --frobnicate=3 --mail-type END\n"
        "#SBATCH --ntasks-per-node=8 --export=ALL\n#NPU --colour blue\necho hi\n#SBATCH --time=5\n"
    )
    warning = batch.warning()
    assert warning is not None and "\n" not in warning
    for named in (
        "--partition=debug (line 2: no partitions here",
        "--mem=64G (line 2: not a resource scheduled here)",
        "--cpus-per-task=8 (line 2",
        "--frobnicate=3 (line 2: unknown option)",
        "--mail-type=END (line 2: no mail is sent)",
        "--ntasks-per-node=8 (line 3: the script runs once on each node",
        "--export=ALL (line 3: a job starts with a clean environment",
        "#NPU --colour=blue (line 4: unknown option)",
        "#SBATCH --time=5 (line 6: after the first command: sbatch ignores it too)",
    ):
        assert named in warning, (named, warning)
    assert batch.fields == {}


@pytest.mark.parametrize(
    ("directive", "fields"),
    [
        ("--time=30", {"max_duration_s": 1800, "estimated_duration_s": 1800}),  # Slurm: minutes
        ("-t 10:00", {"max_duration_s": 600, "estimated_duration_s": 600}),  # MM:SS
        ("--time=00:10:00", {"max_duration_s": 600, "estimated_duration_s": 600}),
        ("--time=2-00", {"max_duration_s": 172800, "estimated_duration_s": 172800}),
        ("--time=UNLIMITED", {}),
        ("--gpus=8", {"num_devices": 8}),
        ("-G 910B4:4", {"num_devices": 4, "chip_model": "910B4"}),
        ("--gres=npu:910B4:2", {"num_devices": 2, "chip_model": "910B4"}),
        ("--gres=gpu:1 -N1", {"num_devices": 1}),
        ("-J eval -o /tmp/o.log -e /tmp/o.log -D /tmp", {"name": "eval", "output": "/tmp/o.log", "cwd": "/tmp"}),
        ("--account=research --qos=low", {"team": "research", "priority_class": "low"}),
        ("--array=0-3", {"array": "0-3"}),
    ],
)
def test_sbatch_directives(directive: str, fields: dict) -> None:
    batch = read_script(f"#!/bin/bash\n#SBATCH {directive}\nhostname\n")
    assert batch.fields == fields and batch.warning() is None


@pytest.mark.parametrize(
    ("directive", "fields"),
    [
        ("--devices 2 --chip 910B4 --time 90", {"num_devices": 2, "chip_model": "910B4", "estimated_duration_s": 90}),
        (
            "-n 4 --max-time 2h --checkpoint-interval 30m",
            {"num_devices": 4, "max_duration_s": 7200, "checkpoint_interval_s": 1800},
        ),
        ("--vnpu vir02 --array 3 --team training", {"vnpu_template": "vir02", "array": 3, "team": "training"}),
        ("--env A=1 --env B=x=y -D /w -o /w/out", {"env": {"A": "1", "B": "x=y"}, "cwd": "/w", "output": "/w/out"}),
    ],
)
def test_npu_directives_take_npuctl_submits_options(directive: str, fields: dict) -> None:
    batch = read_script(f"#NPU {directive}\nhostname\n")
    assert batch.fields == fields and batch.warning() is None


@pytest.mark.parametrize(
    ("directive", "warned"),
    [
        ("--nodes=2", "--nodes=2 (give the cards each node runs with --gres=npu:N)"),
        ("--nodes=1-3", "--nodes=1-3 (line 2: a job runs on a fixed number of nodes"),
        ("--output=out.log", "--output=out.log (line 2: a relative path needs --chdir"),
        ("--output=/a/o --error=/a/e", "--error=/a/e (errors go with the output"),
        ("--dependency=singleton", "--dependency=singleton (line 2: only afterok, afterany and afternotok:ID"),
        ("--gres=fpga:1", "--gres=fpga:1 (line 2: only npu and gpu are scheduled here)"),
        ("--export=HOME_ONLY", "--export=HOME_ONLY (line 2: no value here to pass on"),
    ],
)
def test_directives_honoured_in_part_or_not_at_all_are_named(directive: str, warned: str) -> None:
    warning = read_script(f"#!/bin/bash\n#SBATCH {directive}\nhostname\n").warning()
    assert warning is not None and warned in warning, warning


@pytest.mark.parametrize(
    ("script", "error"),
    [
        ("#SBATCH --time=soon\nx\n", "line 1: --time=soon: 'soon' is not a duration like"),
        ("#SBATCH --gres=npu:two\nx\n", "line 1: --gres=npu:two: 'two' is not a whole number"),
        ("#!/bin/sh\n#SBATCH --chdir=rel\nx\n", "line 2: --chdir=rel: 'rel' is not an absolute path"),
        ("#SBATCH --job-name\n", "line 1: --job-name: needs a value"),
        ("#SBATCH --job-name='unclosed\nx\n", "line 1: #SBATCH: No closing quotation"),
        ("#NPU --env NOEQUALS\nx\n", "line 1: --env=NOEQUALS: 'NOEQUALS' is not NAME=VALUE"),
        ("#!/bin/sh\r\necho hi\r\n", "DOS line breaks"),
        ("   \n", "the script is empty"),
    ],
)
def test_what_cannot_be_read_is_an_error_naming_the_line(script: str, error: str) -> None:
    with pytest.raises(ScriptError) as caught:
        read_script(script)
    assert error in str(caught.value)


def test_given_options_win_over_directives() -> None:
    batch = read_script("#SBATCH --gres=npu:2 --time=4:00:00 --export=A=1,B=2\n#NPU --class low\nx\n", name="j.sh")
    body = batch.request({"num_devices": 8, "max_duration_s": 3600, "env": {"B": "3"}, "priority_class": None})
    assert body["num_devices"] == 8 and body["priority_class"] == "low" and body["name"] == "j.sh"
    assert body["env"] == {"A": "1", "B": "3"}  # merged variable by variable
    # The estimate was only sbatch's limit: it follows the lower limit given on top of it.
    assert body["max_duration_s"] == 3600 and body["estimated_duration_s"] == 3600
    assert read_script("#SBATCH -t 4:00:00\nx\n").request({"estimated_duration_s": 60})["estimated_duration_s"] == 60


def test_directives_end_at_the_first_command_as_in_sbatch() -> None:
    batch = read_script("#!/bin/bash\n\n# a comment\n#SBATCH -J one\nexport X=1\n#SBATCH -J two\n")
    assert batch.fields["name"] == "one"
    assert "#SBATCH -J two (line 6: after the first command" in (batch.warning() or "")
    assert read_script("#SBATCHED -J no\n#NPUX\nx\n").warning() is None  # comments, not directives


@pytest.mark.parametrize(
    ("first", "program"),
    [
        ("#!/bin/bash", ["/bin/bash"]),
        ("#!/usr/bin/env python3", ["/usr/bin/env", "python3"]),
        ("#! /bin/bash -l", ["/bin/bash", "-l"]),
        ("#!/usr/bin/env -S python3 -u", ["/usr/bin/env", "-S python3 -u"]),  # one argument, as Linux passes it
        ("echo no shebang", ["bash"]),
        ("#!", ["bash"]),
    ],
)
def test_the_interpreter_is_the_shebangs(first: str, program: list[str]) -> None:
    assert interpreter(first + "\necho\n") == program


def _run(command: str) -> subprocess.CompletedProcess[str]:
    """The command as a node agent runs it: ``/bin/sh -c COMMAND``."""
    return subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, input="from stdin\n", timeout=60)


def test_the_script_runs_by_its_interpreter_with_its_arguments_and_its_stdin() -> None:
    script = (
        '#!/bin/bash\n#SBATCH --job-name=x\nfor i in 1 2; do echo "$i"; done\n'
        'printf "%s|" "$@"; echo\nread -r line; echo "stdin: $line"\n'
        "cat <<EOF\nNPUPORTAL_SCRIPT\nEOF\n"  # the here-document's own marker, inside the script
    )
    result = _run(script_command(script, ["a b", "'c'", "$HOME"]))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1\n2\na b|'c'|$HOME|\nstdin: from stdin\nNPUPORTAL_SCRIPT\n"


def test_a_python_script_runs_by_env_python3_and_a_large_one_whole() -> None:
    script = "#!/usr/bin/env python3\nimport sys\nprint('args', sys.argv[1:])\n" + "x = 1\n" * 8000 + "print('end')\n"
    result = _run(script_command(script, ["--lr", "3e-4"]))
    assert (result.returncode, result.stdout) == (0, "args ['--lr', '3e-4']\nend\n"), result.stderr
    assert _run(script_command("exit 7\n")).returncode == 7  # no shebang: bash, and its exit status is the job's
