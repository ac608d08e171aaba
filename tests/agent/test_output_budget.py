"""The node's output budget with real agents and jobs: ended output removed oldest first, a team's share kept.

Tiny budgets (``--output-budget 64K``) stand for the real 4 GiB; the jobs write tens of KiB each. The
agent checks once a second, so every wait below is a poll with a generous deadline; jobs that must
write at a given moment wait for a file (a handshake), never for a time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.agent.test_agent_http import Agent, agents, wait_for

__all__ = ["agents"]  # a fixture, imported for pytest
KIB = 1024


def write(count: int, letter: str) -> str:
    """A command writing ``count`` bytes of ``letter`` and a newline."""
    return f"head -c {count} /dev/zero | tr '\\0' {letter}; echo"


def waiting(path: Path, then: str) -> str:
    """A command that waits for ``path`` to exist, then runs ``then``."""
    return f"while [ ! -e {path} ]; do sleep 0.05; done; {then}"


def log(agent: Agent, job_id: str) -> dict[str, Any]:
    status, body = agent.call("GET", f"/v1/jobs/{job_id}/log")
    assert status == 200, body
    return body


def test_the_output_of_the_jobs_that_ended_first_is_removed_first_and_they_say_so(
    agents: Callable[..., Agent], tmp_path: Path
) -> None:
    agent = agents("--output-budget", "64K", "--output-team-share", "1")
    assert "job output kept within 64 KiB" in agent.log()
    go = tmp_path / "go"
    agent.launch("a", waiting(go, write(30 * KIB, "a")), [0], team="vision")  # started first, ends second
    agent.launch("b", write(30 * KIB, "b"), [1], team="nlp")
    agent.wait_state("b", "succeeded")
    go.touch()
    agent.wait_state("a", "succeeded")

    agent.launch("c", write(30 * KIB, "c"), [2], team="vision")  # 90 KiB: one ended job's output must go
    agent.wait_state("c", "succeeded")
    removed = wait_for(lambda: agent.job("b")["output_removed"], timeout=30)
    assert removed.startswith("this run's output was removed from the node at 20")
    assert "to keep the node's output budget (64 KiB; the output of the jobs that ended first goes first)" in removed
    answer = log(agent, "b")
    assert (answer["data"], answer["complete"], answer["note"]) == ("", True, removed)
    assert answer["removed_at"] and answer["removed_at"] in removed
    assert agent.job("b")["output_tail"] == []
    assert not (agent.state_dir / "jobs" / "b.log").exists()
    for kept, letter in (("a", "a"), ("c", "c")):
        assert log(agent, kept)["data"] == letter * 30 * KIB + "\n"
        assert agent.job(kept)["output_removed"] is None
    assert "job b: removed its output (30721 bytes) to keep the node's output budget" in agent.log()

    # A restarted agent counts what is left (a, then c) and keeps the note of b.
    agent.stop()
    again = agents("--output-budget", "64K", "--output-team-share", "1")
    assert again.job("b")["output_removed"] == removed
    again.launch("d", write(30 * KIB, "d"), [3], team="nlp")
    again.wait_state("d", "succeeded")
    wait_for(lambda: again.job("a")["output_removed"], timeout=30)
    assert again.job("c")["output_removed"] is None
    assert log(again, "c")["data"].startswith("ccc")


def test_a_teams_running_jobs_beyond_their_share_stop_writing_and_keep_running(
    agents: Callable[..., Agent], tmp_path: Path
) -> None:
    """Budget 256 KiB, a team's share a quarter (64 KiB): vision's two jobs write 80 KiB, nlp's 40 KiB."""
    agent = agents("--output-budget", "256K", "--output-team-share", "0.25")
    go, done = tmp_path / "go", tmp_path / "vision-ran-on"
    rest = f"echo written-after-the-stop; touch {done}"
    agent.launch("v1", write(40 * KIB, "v") + "; " + waiting(go, rest), [0], team="vision")
    agent.launch("v2", write(40 * KIB, "w") + "; " + waiting(go, "echo v2-after"), [1], team="vision")
    agent.launch("n1", write(40 * KIB, "n") + "; " + waiting(go, "echo nlp-after"), [2], team="nlp")
    why = (
        "the running jobs of team vision on this node hold 80 KiB of output, more than a team's share of "
        "the node's output budget (25% of 256 KiB)"
    )
    for job_id in ("v1", "v2"):
        assert wait_for(lambda job_id=job_id: agent.job(job_id)["output_stopped"], timeout=30) == why
    assert agent.job("n1")["output_stopped"] is None
    go.touch()
    for job_id in ("v1", "v2", "n1"):
        assert agent.wait_state(job_id, "succeeded", "failed")["state"] == "succeeded"
    assert done.exists()  # the job went on running after its output stopped
    marker = f"[npuportal: output stopped here: {why}; the job keeps running]"
    for job_id, letter in (("v1", "v"), ("v2", "w")):
        assert log(agent, job_id)["data"] == letter * 40 * KIB + "\n\n" + marker + "\n"
    assert log(agent, "n1")["data"] == "n" * 40 * KIB + "\nnlp-after\n"
    assert f"job v1: output stopped: {why}" in agent.log()


def test_running_jobs_that_fill_the_budget_alone_stop_writing(agents: Callable[..., Agent], tmp_path: Path) -> None:
    """Nothing ended to remove: the output of every running job stops, whatever its team."""
    agent = agents("--output-budget", "64K", "--output-team-share", "1")
    go = tmp_path / "go"
    agent.launch("x", write(40 * KIB, "x") + "; " + waiting(go, "echo x-after"), [0], team="vision")
    agent.launch("y", write(40 * KIB, "y") + "; " + waiting(go, "echo y-after"), [1], team="nlp")
    why = "this node's output budget (64 KiB) is full with running jobs' output"
    for job_id in ("x", "y"):
        assert wait_for(lambda job_id=job_id: agent.job(job_id)["output_stopped"], timeout=30) == why
    go.touch()
    for job_id in ("x", "y"):
        agent.wait_state(job_id, "succeeded")
        assert log(agent, job_id)["data"].endswith(f"[npuportal: output stopped here: {why}; the job keeps running]\n")


def test_bad_budget_flags_exit_2(tmp_path: Path) -> None:
    from tests.agent.test_agent_http import run_agent_cli

    (tmp_path / "token").write_text("agent-test-token-5f1b9c0e7d2a")
    base = ["--backend", "sim", "--listen", "127.0.0.1:0", "--token-file", str(tmp_path / "token")]
    base += ["--state-dir", str(tmp_path / "state")]
    for flags, words in (
        (["--output-budget", "lots"], "--output-budget"),
        (["--output-budget", "100"], "at least 1024"),
        (["--output-team-share", "0"], "--output-team-share"),
        (["--output-team-share", "1.5"], "--output-team-share"),
    ):
        done = run_agent_cli(*base, *flags)
        assert done.returncode == 2 and words in done.stderr, (flags, done.stderr)
