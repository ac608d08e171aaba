"""Migrating job events to recorded times and a stored other job, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BEFORE = [("scheduling", "0006_job_preempted_for")]
AFTER = [("scheduling", "0009_job_event_recorded_at_required")]


def _migrate(targets: list[tuple[str, str]]):  # type: ignore[no-untyped-def]
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_existing_events_keep_their_time_as_recorded_time_and_lose_the_other_jobs_number() -> None:
    old = _migrate(BEFORE)
    User = old.get_model("auth", "User")
    Department = old.get_model("quotas", "Department")
    Team = old.get_model("quotas", "Team")
    Job = old.get_model("scheduling", "Job")
    JobEvent = old.get_model("scheduling", "JobEvent")
    user = User.objects.create(username="mig")
    dept = Department.objects.create(name="d")
    team = Team.objects.create(name="t", department=dept)
    t = datetime(2026, 11, 3, 10, 0, tzinfo=UTC)

    def job(name: str):  # type: ignore[no-untyped-def]
        return Job.objects.create(team=team, submitter=user, name=name, command="c", priority_class="low",
                                  submitted_at=t)  # fmt: skip

    victim, beneficiary = job("victim"), job("beneficiary")
    kept = JobEvent.objects.create(job=victim, at=t, to_state="pending", reason="Submitted")
    named = JobEvent.objects.create(job=victim, at=t + timedelta(minutes=1), from_state="running",
                                    to_state="running", reason="PreemptionScheduled",
                                    detail=f"GuaranteeReclaim for job #{beneficiary.pk}")  # fmt: skip
    gone = JobEvent.objects.create(job=victim, at=t + timedelta(minutes=2), from_state="running",
                                   to_state="running", reason="PreemptionScheduled",
                                   detail="PriorityPreemption for job #999999")  # fmt: skip
    try:
        new = _migrate(AFTER)
        Event = new.get_model("scheduling", "JobEvent")
        rows = {e.pk: e for e in Event.objects.all()}
        assert rows[kept.pk].recorded_at == t and rows[kept.pk].reported_at is None
        assert rows[named.pk].recorded_at == t + timedelta(minutes=1)
        assert (rows[named.pk].detail, rows[named.pk].other_job_id) == ("GuaranteeReclaim", beneficiary.pk)
        assert (rows[gone.pk].detail, rows[gone.pk].other_job_id) == ("PriorityPreemption", None)
        assert rows[kept.pk].detail == ""

        back = _migrate(BEFORE)  # and back: the number returns to the detail
        details = dict(back.get_model("scheduling", "JobEvent").objects.values_list("pk", "detail"))
        assert details[named.pk] == f"GuaranteeReclaim for job #{beneficiary.pk}"
    finally:
        _migrate(executor_leaf())


def executor_leaf() -> list[tuple[str, str]]:
    """Every app at its latest migration, as the rest of the suite expects the database."""
    executor = MigrationExecutor(connection)
    return executor.loader.graph.leaf_nodes()
