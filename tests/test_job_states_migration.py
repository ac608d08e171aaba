"""Migrating failed jobs to Slurm's end states (timeout, out_of_memory, node_fail), on a database with jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.test_event_migration import _migrate, executor_leaf

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("scheduling", "0014_job_output_lines")]
AFTER = [("scheduling", "0015_job_end_states")]


def test_failed_jobs_take_the_state_their_ending_event_says_and_back() -> None:
    old = _migrate(BEFORE)
    User = old.get_model("auth", "User")
    Department = old.get_model("quotas", "Department")
    Team = old.get_model("quotas", "Team")
    Job = old.get_model("scheduling", "Job")
    JobEvent = old.get_model("scheduling", "JobEvent")
    user = User.objects.create(username="mig-states")
    team = Team.objects.create(name="t-states", department=Department.objects.create(name="d-states"))
    t = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)

    def ended(name: str, state: str, reason: str, detail: str = "", *, requeued_before: bool = False) -> int:
        """A job that ended in ``state`` by an event of ``reason``; returns that event's id."""
        end = t + timedelta(hours=1)
        job = Job.objects.create(team=team, submitter=user, name=name, command="c", priority_class="low",
                                 submitted_at=t, state=state, started_at=t, ended_at=end)  # fmt: skip
        JobEvent.objects.create(job=job, at=t, recorded_at=t, to_state="pending", reason="Submitted")
        if requeued_before:  # an earlier run lost on its node, then the last one failed by itself
            JobEvent.objects.create(job=job, at=t, recorded_at=t + timedelta(minutes=1), from_state="running",
                                    to_state="pending", reason="LostOnAgent")  # fmt: skip
        return JobEvent.objects.create(job=job, at=end, recorded_at=end, from_state="running", to_state=state,
                                       reason=reason, detail=detail).pk  # fmt: skip

    timeout_event = ended("walltime", "failed", "Walltime", "the agent stopped it at its maximum duration")
    oom_event = ended("oom", "failed", "OutOfMemory")
    lost_event = ended("lost", "failed", "LostOnAgent", "node n1 lost it; retry budget (3) used up")
    ended("launch", "failed", "LaunchFailed", "the agents refused run 9.1 3 times; retry budget (3) used up")
    refused_event = ended("too-large", "failed", "LaunchFailed", "run 10.1 refused for good, not retried")
    plain_event = ended("exit3", "failed", "NonZeroExit", "exit code 3", requeued_before=True)
    ended("done", "completed", "Completed")
    ended("cancelled", "cancelled", "Cancelled")
    try:
        new = _migrate(AFTER)
        states = dict(new.get_model("scheduling", "Job").objects.values_list("name", "state"))
        assert states == {
            "walltime": "timeout",
            "oom": "out_of_memory",
            "lost": "node_fail",
            "launch": "node_fail",
            "too-large": "failed",  # the agent's refusal is the job's own: no retry changes it
            "exit3": "failed",
            "done": "completed",
            "cancelled": "cancelled",
        }
        to_state = dict(new.get_model("scheduling", "JobEvent").objects.values_list("pk", "to_state"))
        assert to_state[timeout_event] == "timeout", "the job's last event agrees with its state"
        assert to_state[oom_event] == "out_of_memory"
        assert to_state[lost_event] == "node_fail"
        assert to_state[refused_event] == to_state[plain_event] == "failed"

        back = _migrate(BEFORE)
        states = dict(back.get_model("scheduling", "Job").objects.values_list("name", "state"))
        assert {states[n] for n in ("walltime", "oom", "lost", "launch", "too-large", "exit3")} == {"failed"}
        events = back.get_model("scheduling", "JobEvent").objects
        assert not events.filter(to_state__in=["timeout", "out_of_memory", "node_fail"]).exists()
    finally:
        _migrate(executor_leaf())
