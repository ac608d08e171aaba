"""The job environment builder and the submitter's ``env`` rules (``devices/agent/environment.py``): no root needed."""

from __future__ import annotations

from pathlib import Path

import pytest

from devices.agent.environment import (
    DEFAULT_JOB_PATH,
    MAX_ENV_BYTES,
    MAX_ENV_VARS,
    build_job_env,
    check_site_env,
    check_submitted_env,
    read_env_file,
    reserved,
)

AGENT_ENV = {
    "DATABASE_URL": "postgres://secret@db/npuportal",
    "REDIS_URL": "redis://secret@cache",
    "NPUPORTAL_SECRET_KEY": "s3cret",
    "NPUPORTAL_AGENT_TOKEN": "tok-secret",
    "PATH": "/opt/agent/venv/bin:/usr/bin",
    "HOME": "/root",
    "LD_PRELOAD": "/opt/agent/hook.so",
    "PYTHONPATH": "/opt/npuportal",
    "LANG": "en_US.UTF-8",
    "TZ": "Asia/Shanghai",
}


def build(**overrides: object) -> dict[str, str]:
    args: dict[str, object] = {
        "job_id": "12.1",
        "team": "vision",
        "home": "/home/alice",
        "user": "alice",
        "shell": "/bin/bash",
        "submitted": {},
        "plan_env": {"ASCEND_RT_VISIBLE_DEVICES": "0,1"},
        "agent_env": AGENT_ENV,
    }
    args.update(overrides)
    return build_job_env(**args)  # type: ignore[arg-type]


def test_nothing_of_the_agents_environment_leaks() -> None:
    env = build()
    assert env == {
        "PATH": DEFAULT_JOB_PATH,
        "HOME": "/home/alice",
        "USER": "alice",
        "LOGNAME": "alice",
        "SHELL": "/bin/bash",
        "LANG": "en_US.UTF-8",
        "TZ": "Asia/Shanghai",
        "ASCEND_RT_VISIBLE_DEVICES": "0,1",
        "NPUPORTAL_JOB_ID": "12.1",
        "NPUPORTAL_TEAM": "vision",
    }
    assert not any("secret" in value for value in env.values())


def test_locale_defaults_to_c_utf8_and_tz_is_left_to_the_node() -> None:
    env = build(agent_env={})
    assert env["LANG"] == "C.UTF-8"
    assert "TZ" not in env and "LC_ALL" not in env


def test_layers_site_then_submitter_then_plan_then_the_agents_own() -> None:
    env = build(
        site_env={"LD_LIBRARY_PATH": "/usr/local/Ascend/lib64", "ASCEND_HOME": "/usr/local/Ascend"},
        submitted={"LD_LIBRARY_PATH": "/home/alice/lib", "FOO": "bar baz"},
        plan_env={"ASCEND_RT_VISIBLE_DEVICES": "3", "MASTER_ADDR": "10.0.0.1", "NPUPORTAL_VNPU_ID": "100"},
        job_path="/opt/site/bin:/usr/bin",
    )
    assert env["PATH"] == "/opt/site/bin:/usr/bin"
    assert env["ASCEND_HOME"] == "/usr/local/Ascend"
    assert env["LD_LIBRARY_PATH"] == "/home/alice/lib"  # the submitter's wins over the site's
    assert env["FOO"] == "bar baz"
    assert (env["ASCEND_RT_VISIBLE_DEVICES"], env["MASTER_ADDR"], env["NPUPORTAL_VNPU_ID"]) == ("3", "10.0.0.1", "100")


def test_a_reserved_name_in_the_submitted_env_never_lands() -> None:
    """The request parser refuses them; the builder drops them all the same (defence in depth)."""
    env = build(submitted={"PATH": "/tmp/evil", "NPUPORTAL_JOB_ID": "other", "ASCEND_RT_VISIBLE_DEVICES": "0-7"})
    assert env["PATH"] == DEFAULT_JOB_PATH
    assert env["NPUPORTAL_JOB_ID"] == "12.1"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "0,1"


def test_no_team_no_team_variable() -> None:
    assert "NPUPORTAL_TEAM" not in build(team=None)


def test_submitted_env_is_checked() -> None:
    assert check_submitted_env(None) == {}
    assert check_submitted_env({"A": "", "b_2": "x=y"}) == {"A": "", "b_2": "x=y"}


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ([], "must be an object"),
        ("A=1", "must be an object"),
        ({"1A": "x"}, "not a valid variable name"),
        ({"A-B": "x"}, "not a valid variable name"),
        ({"": "x"}, "not a valid variable name"),
        ({"A": 1}, "A must be a string"),
        ({"A": None}, "A must be a string"),
        ({"A": "x\0y"}, "NUL"),
        ({"PATH": "/x"}, "PATH is set by the node agent"),
        ({"HOME": "/x"}, "HOME is set"),
        ({"LD_PRELOAD": "/x.so"}, "LD_PRELOAD is set"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0"}, "is set by the node agent"),
        ({"MASTER_ADDR": "x"}, "is set by the node agent"),
        ({"NPUPORTAL_ANYTHING": "x"}, "is set by the node agent"),
        ({f"V{i}": "" for i in range(MAX_ENV_VARS + 1)}, f"at most {MAX_ENV_VARS}"),
        ({"BIG": "x" * MAX_ENV_BYTES}, "bytes"),
    ],
)
def test_bad_submitted_env_is_refused_with_a_reason(env: object, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        check_submitted_env(env)


def test_the_limits_are_inclusive() -> None:
    check_submitted_env({f"V{i}": "" for i in range(MAX_ENV_VARS)})
    check_submitted_env({"BIG": "x" * (MAX_ENV_BYTES - len("BIG="))})


def test_reserved_names() -> None:
    for name in ("PATH", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "RANK_TABLE_FILE", "NPUPORTAL_X"):
        assert reserved(name), name
    for name in ("LD_LIBRARY_PATH", "PYTHONPATH", "HCCL_CONNECT_TIMEOUT", "JOB_NAME"):
        assert not reserved(name), name


def test_site_env_may_set_path_and_libraries_but_not_identity_devices_or_rendezvous() -> None:
    assert check_site_env({"PATH": "/opt/bin", "LD_LIBRARY_PATH": "/opt/lib"}) == {
        "PATH": "/opt/bin",
        "LD_LIBRARY_PATH": "/opt/lib",
    }
    for name in ("NPUPORTAL_TEAM", "ASCEND_RT_VISIBLE_DEVICES", "MASTER_PORT", "HOME", "USER"):
        with pytest.raises(ValueError, match=name):
            check_site_env({name: "x"})


def test_env_file_lines(tmp_path: Path) -> None:
    path = tmp_path / "job.env"
    path.write_text("# CANN\n\nASCEND_HOME=/usr/local/Ascend\nexport HCCL_BUFFSIZE=120\nOPTS=a=b c\nEMPTY=\n")
    assert read_env_file(path) == {
        "ASCEND_HOME": "/usr/local/Ascend",
        "HCCL_BUFFSIZE": "120",
        "OPTS": "a=b c",
        "EMPTY": "",
    }
    path.write_text("GOOD=1\nnot an assignment\n")
    with pytest.raises(ValueError, match="line 2"):
        read_env_file(path)


def test_a_copy_of_an_array_is_told_which_it_is_by_slurms_names_and_ours() -> None:
    from devices.agent.environment import identity_env

    portal_job = {"id": 13, "name": "sweep[3]", "array": {"id": "A10", "index": 3, "count": 4, "min": 0, "max": 6}}
    env = build(identity=identity_env(portal_job))
    assert {k: v for k, v in env.items() if k.startswith(("SLURM_", "NPUPORTAL_ARRAY_"))} == {
        "SLURM_JOB_ID": "13",
        "SLURM_JOB_NAME": "sweep[3]",
        "SLURM_ARRAY_JOB_ID": "10",  # the array's first job's id, as Slurm's
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_ARRAY_TASK_COUNT": "4",
        "SLURM_ARRAY_TASK_MIN": "0",
        "SLURM_ARRAY_TASK_MAX": "6",
        "NPUPORTAL_ARRAY_ID": "A10",
        "NPUPORTAL_ARRAY_INDEX": "3",
        "NPUPORTAL_ARRAY_COUNT": "4",
    }
    plain = build(identity=identity_env({"id": 12, "name": "train"}))
    assert (plain["SLURM_JOB_ID"], plain["SLURM_JOB_NAME"]) == ("12", "train")
    assert not any(k.startswith(("SLURM_ARRAY_", "NPUPORTAL_ARRAY_")) for k in plain)
    assert identity_env(None) == {}, "a portal that sends none: nothing is added"


@pytest.mark.parametrize(
    ("portal_job", "words"),
    [
        ("12", "must be an object"),
        ({"id": 0, "name": "x"}, "id must be the job's id"),
        ({"id": 1, "name": "a\nb"}, "name must be printable text"),
        ({"id": 1, "name": "x", "array": {"id": "B1"}}, "array must be an object whose id is an array id"),
        ({"id": 1, "name": "x", "array": {"id": "A1", "index": -1, "count": 1, "min": 0, "max": 0}}, "array.index"),
    ],
)
def test_a_malformed_portal_job_is_refused(portal_job: object, words: str) -> None:
    from devices.agent.environment import identity_env

    with pytest.raises(ValueError, match=words):
        identity_env(portal_job)


@pytest.mark.parametrize("name", ["SLURM_JOB_ID", "SLURM_ARRAY_TASK_ID", "NPUPORTAL_ARRAY_INDEX"])
def test_the_identity_variables_are_the_agents_to_set(name: str) -> None:
    assert reserved(name)
    with pytest.raises(ValueError, match="set by the node agent"):
        check_submitted_env({name: "7"})
