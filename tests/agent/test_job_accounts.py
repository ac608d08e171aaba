"""Jobs as a site's security team reads them: a clean environment, the owner's account, cwd and output.

Real agents (``python -m devices.agent --backend sim``) in subprocesses, real jobs. The account tests
need root (CI and this machine run as root) and create two throw-away POSIX accounts; they are
skipped elsewhere.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.agent.test_agent_http import Agent, run_agent_cli

#: What a job's ``env`` may print: the documented set (docs/agent.md#environment) and what sh adds itself.
DOCUMENTED = {
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "NPUPORTAL_JOB_ID", "NPUPORTAL_TEAM",
    "NPUPORTAL_JOB_MARK",  # how the agent finds the job's processes (docs/agent.md, "Stopping a job")
}  # fmt: skip
SHELL_OWN = {"PWD", "SHLVL", "_", "OLDPWD"}
AGENT_SECRETS = {
    "DATABASE_URL": "postgres://secret@db/npuportal",
    "REDIS_URL": "redis://secret@cache:6379/0",
    "NPUPORTAL_SECRET_KEY": "secret-key",
    "NPUPORTAL_AGENT_TOKEN": "secret-token",
    "AWS_SECRET_ACCESS_KEY": "secret-aws",
}
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="switching accounts needs root")


class OwnerAgent(Agent):
    """An agent as a real node runs it: as root, each job as its submitter's account."""

    account_flags = ()


def parse_env(lines: list[str]) -> dict[str, str]:
    return dict(line.split("=", 1) for line in lines if "=" in line)


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Callable[..., Agent]]:
    agents: list[Agent] = []

    def start(*extra: str, kind: type[Agent] = Agent, state_dir: Path | None = None) -> Agent:
        agent = kind(tmp_path, *extra, state_dir=state_dir).start()
        agents.append(agent)
        return agent

    yield start
    for agent in agents:
        agent.stop()


# --------------------------------------------------------------------------------------------------
# the environment (any user)


def test_a_jobs_env_has_none_of_the_agents_variables(
    started: Callable[..., Agent], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in AGENT_SECRETS.items():
        monkeypatch.setenv(name, value)  # the agent's own environment, as under `make run`
    agent = started("--job-env", "ASCEND_HOME=/usr/local/Ascend")
    agent.launch("env-1", "env", [2, 5], env={"FOO": "bar baz"}, team="vision", user="someone")
    done = agent.wait_state("env-1", "succeeded")
    env = parse_env(done["output_tail"])
    assert not set(env) & set(AGENT_SECRETS)
    assert not any("secret" in value for value in env.values()), env
    assert set(env) <= DOCUMENTED | SHELL_OWN | {"ASCEND_RT_VISIBLE_DEVICES", "ASCEND_HOME", "FOO"}, env
    assert env["NPUPORTAL_JOB_ID"] == "env-1"
    assert env["NPUPORTAL_TEAM"] == "vision"
    assert env["ASCEND_RT_VISIBLE_DEVICES"] == "2,5"
    assert env["FOO"] == "bar baz"
    assert env["ASCEND_HOME"] == "/usr/local/Ascend"
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["USER"] == env["LOGNAME"] == pwd.getpwuid(os.geteuid()).pw_name
    assert "jobs run as this agent's own account" in agent.log()


def test_the_job_wrapper_option_sets_a_toolkit_up_in_the_job(started: Callable[..., Agent], tmp_path: Path) -> None:
    wrapper = tmp_path / "with-cann"
    wrapper.write_text('#!/bin/sh\nexport ASCEND_TOOLKIT_HOME=/usr/local/Ascend/ascend-toolkit/latest\nexec "$@"\n')
    wrapper.chmod(0o755)
    agent = started("--job-wrapper", str(wrapper), "--job-path", "/usr/bin:/bin")
    agent.launch("w-1", 'echo "$ASCEND_TOOLKIT_HOME $PATH"', [0])
    assert agent.wait_state("w-1", "succeeded")["output_tail"] == [
        "/usr/local/Ascend/ascend-toolkit/latest /usr/bin:/bin"
    ]


def test_cwd_and_an_output_file_besides_the_agents_log(started: Callable[..., Agent], tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    agent = started()
    out = work / "train.out"
    agent.launch("o-1", "pwd; echo second", [0], cwd=str(work), output=str(out))
    done = agent.wait_state("o-1", "succeeded")
    assert done["output_tail"] == [str(work), "second"]
    assert out.read_text().splitlines() == [str(work), "second"]
    assert (done["cwd"], done["output"]) == (str(work), str(out))
    assert out.stat().st_mode & 0o077 == 0  # the job's umask is 077


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"output": "relative.out"}, "output", "absolute"),
        ({"output": "/nonexistent-dir/x.out"}, "output", "cannot write it"),
        ({"output": "/tmp"}, "output", "directory"),
        ({"cwd": "/nonexistent-dir"}, "cwd", "cannot enter it"),
        ({"cwd": "relative/dir"}, "cwd", "absolute"),
        ({"user": "no such"}, "user", "POSIX account name"),
        ({"team": "x" * 201}, "team", "at most 200"),
    ],
)
def test_bad_cwd_output_user_or_team_is_refused_and_nothing_runs(
    started: Callable[..., Agent], fields: dict[str, str], field: str, words: str
) -> None:
    agent = started()
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "b", "command": "true", "devices": [0], **fields})
    assert (status, reply["field"]) == (400, field), reply
    assert words in reply["error"]
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--job-env", "NOVALUE"], "NAME=VALUE"),
        (["--job-env", "NPUPORTAL_TEAM=x"], "set by the agent"),
        (["--job-env", "HOME=/x"], "account"),
        (["--job-env-file", "/nonexistent/env"], "--job-env-file"),
        (["--job-wrapper", "relative/with-cann"], "absolute path"),
    ],
)
def test_bad_job_flags_exit_2(tmp_path: Path, flags: list[str], words: str) -> None:
    (tmp_path / "token").write_text("agent-test-token-5f1b9c0e7d2a")
    done = run_agent_cli(
        "--backend", "sim", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token"),
        "--state-dir", str(tmp_path / "state"), *flags,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert words in done.stderr


@ROOT_ONLY
def test_jobs_as_agent_under_root_needs_allow_root_jobs(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("agent-test-token-5f1b9c0e7d2a")
    done = run_agent_cli(
        "--backend", "sim", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token"),
        "--state-dir", str(tmp_path / "state"), "--jobs-as-agent",
    )  # fmt: skip
    assert done.returncode == 2 and "--allow-root-jobs" in done.stderr


# --------------------------------------------------------------------------------------------------
# the owner's account (root)


@pytest.fixture(scope="module")
def accounts() -> Iterator[dict[str, pwd.struct_passwd]]:
    """Two POSIX accounts made for these tests, removed (with their homes) afterwards."""
    if os.geteuid() != 0:
        pytest.skip("switching accounts needs root")
    if shutil.which("useradd") is None:
        pytest.skip("no useradd on this machine")
    tag = secrets.token_hex(3)
    made: dict[str, pwd.struct_passwd] = {}
    try:
        for who in ("alice", "bob"):
            name = f"npt-{who}-{tag}"
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True, capture_output=True)
            made[who] = pwd.getpwnam(name)
        yield made
    finally:
        for entry in made.values():
            subprocess.run(["userdel", "-r", entry.pw_name], check=False, capture_output=True)


@pytest.fixture
def node_state() -> Iterator[Path]:
    """A state dir the test accounts can reach (pytest's tmp dirs are root's alone), as /var/lib is.

    Asked for before ``started``, so it is removed after the agents have stopped.
    """
    top = Path(tempfile.mkdtemp(prefix="npt-agent-"))
    top.chmod(0o755)
    yield top / "state"
    shutil.rmtree(top, ignore_errors=True)


@ROOT_ONLY
def test_each_job_runs_as_its_owner_with_home_groups_and_a_private_umask(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent]
) -> None:
    agent = started(kind=OwnerAgent, state_dir=node_state)
    assert "jobs run as their submitters' POSIX accounts (never as root; uid 1000 or above)" in agent.log()
    for index, (who, entry) in enumerate(accounts.items()):
        command = 'id -un; id -u; echo "$HOME $USER"; pwd; umask; touch made'
        agent.launch(f"{who}-1", command, [index], user=entry.pw_name)
    for who, entry in accounts.items():
        done = agent.wait_state(f"{who}-1", "succeeded", "failed")
        assert done["output_tail"] == [
            entry.pw_name,
            str(entry.pw_uid),
            f"{entry.pw_dir} {entry.pw_name}",
            entry.pw_dir,
            "0077",
        ], done
        assert done["user"] == entry.pw_name
        made = Path(entry.pw_dir) / "made"
        assert (made.stat().st_uid, made.stat().st_mode & 0o777) == (entry.pw_uid, 0o600)
        log = node_state / "jobs" / f"{who}-1.log"
        assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (entry.pw_uid, 0o600)


@ROOT_ONLY
def test_one_accounts_job_cannot_read_anothers_job_files(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent]
) -> None:
    agent = started(kind=OwnerAgent, state_dir=node_state)
    alice, bob = accounts["alice"].pw_name, accounts["bob"].pw_name
    agent.launch("a-secret", "echo alice-secret-output", [0], user=alice)
    agent.wait_state("a-secret", "succeeded")
    jobs = node_state / "jobs"
    others = " ".join(str(jobs / f"a-secret.{ext}") for ext in ("log", "json", "exit"))
    agent.launch("b-snoop", f"for f in {others}; do cat $f; done 2>&1; ls {jobs} 2>&1", [1], user=bob)
    snoop = agent.wait_state("b-snoop", "succeeded", "failed")["output_tail"]
    assert not any("alice-secret-output" in line or "a-secret" in line.split(":")[-1] for line in snoop), snoop
    assert sum("Permission denied" in line for line in snoop) == 4, snoop
    agent.launch("a-own", f"cat {jobs / 'a-secret.log'}", [1], user=alice)
    assert agent.wait_state("a-own", "succeeded")["output_tail"] == ["alice-secret-output"]


@ROOT_ONLY
def test_a_user_without_an_account_is_refused_with_the_reason_and_nothing_runs(
    node_state: Path, started: Callable[..., Agent], tmp_path: Path
) -> None:
    agent = started(kind=OwnerAgent, state_dir=node_state)
    marker = tmp_path / "ran"
    ghost = f"npt-ghost-{secrets.token_hex(3)}"
    status, reply = agent.call(
        "POST", "/v1/jobs", {"job_id": "g-1", "command": f"touch {marker}", "devices": [0], "user": ghost}
    )
    assert (status, reply["field"]) == (400, "user")
    assert reply["error"] == f"no POSIX account '{ghost}' on node test-node"
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "g-2", "command": f"touch {marker}", "devices": [0]})
    assert (status, reply["field"]) == (400, "user") and "user is required" in reply["error"]
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    assert not marker.exists()
    assert not list((node_state / "jobs").iterdir())


@ROOT_ONLY
def test_root_is_never_a_jobs_account_unless_the_agent_allows_it(
    node_state: Path, started: Callable[..., Agent]
) -> None:
    agent = started(kind=OwnerAgent, state_dir=node_state)
    status, reply = agent.call("POST", "/v1/jobs", {"job_id": "r-1", "command": "id", "devices": [0], "user": "root"})
    assert (status, reply["field"]) == (400, "user") and "never run as root" in reply["error"]
    agent.stop()
    allowed = started("--allow-root-jobs", kind=OwnerAgent, state_dir=node_state)
    allowed.launch("r-2", "id -un", [0], user="root")
    assert allowed.wait_state("r-2", "succeeded")["output_tail"] == ["root"]


@ROOT_ONLY
def test_cwd_and_output_are_checked_for_the_jobs_account(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent]
) -> None:
    agent = started(kind=OwnerAgent, state_dir=node_state)
    alice, bob = accounts["alice"], accounts["bob"]
    private = Path(bob.pw_dir) / "private"
    private.mkdir(mode=0o700, exist_ok=True)
    os.chown(private, bob.pw_uid, bob.pw_gid)
    status, reply = agent.call(
        "POST",
        "/v1/jobs",
        {"job_id": "c-1", "command": "true", "devices": [0], "user": alice.pw_name, "cwd": str(private)},
    )
    assert (status, reply["field"]) == (400, "cwd") and f"account {alice.pw_name} cannot enter it" in reply["error"]
    status, reply = agent.call(
        "POST",
        "/v1/jobs",
        {"job_id": "c-2", "command": "true", "devices": [0], "user": alice.pw_name, "output": "/root/x.out"},
    )
    assert (status, reply["field"]) == (400, "output") and "cannot write it" in reply["error"]
    out = Path(alice.pw_dir) / "run.out"
    agent.launch("c-3", "echo to-both", [0], user=alice.pw_name, output=str(out))
    assert agent.wait_state("c-3", "succeeded")["output_tail"] == ["to-both"]
    assert out.read_text() == "to-both\n"
    assert (out.stat().st_uid, out.stat().st_mode & 0o777) == (alice.pw_uid, 0o600)


# --------------------------------------------------------------------------------------------------
# system accounts, and paths checked as the job's account (root)


@ROOT_ONLY
def test_a_system_account_below_the_min_uid_is_refused(node_state: Path, started: Callable[..., Agent]) -> None:
    daemon = pwd.getpwnam("daemon")  # uid 1 wherever useradd's UID_MIN is 1000
    agent = started(kind=OwnerAgent, state_dir=node_state)
    status, reply = agent.call(
        "POST", "/v1/jobs", {"job_id": "s-1", "command": "id -u", "devices": [0], "user": "daemon"}
    )
    assert (status, reply["field"]) == (400, "user"), reply
    assert reply["error"] == (
        f"account 'daemon' (uid {daemon.pw_uid}) is a system account on node test-node; "
        "jobs run only as accounts with uid 1000 or above (--min-uid)"
    )
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    agent.stop()
    lowered = started("--min-uid", str(daemon.pw_uid), kind=OwnerAgent, state_dir=node_state)
    lowered.launch("s-2", "id -u", [0], user="daemon")
    assert lowered.wait_state("s-2", "succeeded", "failed")["output_tail"] == [str(daemon.pw_uid)]


@ROOT_ONLY
def test_a_refusal_reveals_nothing_of_paths_the_account_cannot_look_at(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent]
) -> None:
    """Alice names paths inside Bob's private directory: there or not, she is told the same."""
    agent = started(kind=OwnerAgent, state_dir=node_state)
    alice, bob = accounts["alice"], accounts["bob"]
    private = Path(bob.pw_dir) / "hidden"
    (private / "there").mkdir(parents=True, exist_ok=True)
    (private / "there" / "file.out").write_text("")
    for path in (private, private / "there", private / "there" / "file.out"):
        os.chown(path, bob.pw_uid, bob.pw_gid)
    private.chmod(0o700)

    def refusal(field: str, path: Path) -> str:
        body = {"job_id": "h", "command": "true", "devices": [0], "user": alice.pw_name, field: str(path)}
        status, reply = agent.call("POST", "/v1/jobs", body)
        assert (status, reply["field"]) == (400, field), reply
        return str(reply["error"]).replace(str(path), "PATH")

    said = {refusal("cwd", private / name) for name in ("there", "missing", "there/file.out")}
    assert said == {
        f"cwd PATH: account {alice.pw_name} cannot enter it on node test-node "
        f"(it does not exist there, or {alice.pw_name} may not reach it)"
    }
    said = {refusal("output", private / name) for name in ("there/file.out", "there/new.out", "gone/x.out", "there")}
    assert said == {
        f"output PATH: account {alice.pw_name} cannot write it on node test-node "
        f"(it or its directory does not exist there, or {alice.pw_name} may not reach or write it)"
    }
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []


@ROOT_ONLY
def test_a_directory_behind_one_the_account_cannot_pass_is_refused(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent], tmp_path: Path
) -> None:
    """An open directory inside a closed one: its own mode says yes, but the account cannot reach it."""
    agent = started(kind=OwnerAgent, state_dir=node_state)
    alice, bob = accounts["alice"], accounts["bob"]
    closed = Path(bob.pw_dir) / "closed"
    inside = closed / "open"
    inside.mkdir(parents=True, exist_ok=True)
    (inside / "bobs-notes").write_text("bob's secret\n")
    os.chown(closed, bob.pw_uid, bob.pw_gid)
    closed.chmod(0o700)
    inside.chmod(0o777)
    for field, path in (("cwd", inside), ("output", inside / "x.out")):
        body = {"job_id": f"in-{field}", "command": "ls; cat bobs-notes", "devices": [0], "user": alice.pw_name}
        status, reply = agent.call("POST", "/v1/jobs", {**body, field: str(path)})
        assert (status, reply["field"]) == (400, field), reply
    assert agent.call("GET", "/v1/jobs")[1]["jobs"] == []
    agent.launch("own", "pwd", [0], user=alice.pw_name, cwd=alice.pw_dir, output=f"{alice.pw_dir}/own.out")
    assert agent.wait_state("own", "succeeded")["output_tail"] == [alice.pw_dir]


# --------------------------------------------------------------------------------------------------
# every job as one fixed account (--jobs-as, the demo under root)


@ROOT_ONLY
def test_jobs_as_runs_every_job_as_one_account_which_reads_no_jobs_log(
    node_state: Path, accounts: dict[str, pwd.struct_passwd], started: Callable[..., Agent]
) -> None:
    alice, bob = accounts["alice"], accounts["bob"]
    agent = started("--jobs-as", alice.pw_name, kind=OwnerAgent, state_dir=node_state)
    assert f"every job runs as the account {alice.pw_name} (uid {alice.pw_uid})" in agent.log()
    agent.launch("f-1", "echo first-secret; id -un", [0], user=bob.pw_name)
    done = agent.wait_state("f-1", "succeeded", "failed")
    assert (done["output_tail"], done["user"]) == (["first-secret", alice.pw_name], alice.pw_name)
    log = node_state / "jobs" / "f-1.log"
    assert (log.stat().st_uid, log.stat().st_mode & 0o777) == (0, 0o600)  # not the shared account's
    agent.launch("f-2", f"id -un; cat {log} 2>&1", [1])  # no user at all: the same account
    snoop = agent.wait_state("f-2", "succeeded", "failed")["output_tail"]
    assert snoop[0] == alice.pw_name and "Permission denied" in snoop[1], snoop
    assert not any("first-secret" in line for line in snoop), snoop


@ROOT_ONLY
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--jobs-as", "daemon"], "system account"),
        (["--jobs-as", "root"], "never run as root"),
        (["--jobs-as", "npt-nobody-such"], "no such POSIX account"),
        (["--jobs-as", "nobody", "--jobs-as-agent", "--allow-root-jobs"], "not both"),
        (["--min-uid", "-1"], "--min-uid"),
    ],
)
def test_bad_account_flags_exit_2(tmp_path: Path, flags: list[str], words: str) -> None:
    (tmp_path / "token").write_text("agent-test-token-5f1b9c0e7d2a")
    done = run_agent_cli(
        "--backend", "sim", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token"),
        "--state-dir", str(tmp_path / "state"), *flags,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert words in done.stderr
