"""Dependencies (Slurm's --dependency) and an array's %N, through the API and the tick on the demo site.

A job that depends on others waits with ``Dependency`` until they end as it asked, then runs; one whose
dependency can never be satisfied is cancelled with ``DependencyNeverSatisfied`` and says why; a job of
another team reads exactly as one that does not exist. The same through real agents and npuctl:
tests/test_job_arrays_live.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.utils import timezone

from scheduling.models import Job
from scheduling.services.jobs import finish_job
from scheduling.services.tick import run_tick

pytestmark = pytest.mark.django_db

JOB = {"name": "step", "command": "python step.py", "num_devices": 1, "chip_model": "910B4", "estimated_duration_s": 60}


@pytest.fixture
def people(demo, user_factory, isolated_api_state):
    return {
        "member": user_factory("dep-member", team="training"),
        "other": user_factory("dep-other", team="research"),
        "admin": user_factory("dep-admin", staff=True),
    }


def _submit(api: Any, user: Any, **body: Any) -> Any:
    resp = api(user).post("/api/v1/jobs/", {**JOB, **body}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def _refusal(api: Any, user: Any, **body: Any) -> dict[str, Any]:
    before = Job.objects.count()
    resp = api(user).post("/api/v1/jobs/", {**JOB, **body}, format="json")
    assert resp.status_code == 400, resp.content
    assert Job.objects.count() == before, "a refused submission changes nothing"
    return resp.json()


def _end(job_id: int, exit_code: int) -> None:
    """The job runs (a tick starts it) and ends with ``exit_code``, as its agent would report."""
    if Job.objects.get(pk=job_id).state == Job.State.PENDING:
        assert job_id in run_tick().started
    finish_job(job_id, exit_code=exit_code, ended_at=timezone.now())


def test_afterok_waits_with_dependency_then_runs(people, api) -> None:
    first = _submit(api, people["member"], name="prepare")
    second = _submit(api, people["member"], name="train", depends_on=f"afterok:{first['id']}")
    assert second["depends_on"] == f"afterok:{first['id']}"
    result = run_tick()
    assert first["id"] in result.started and second["id"] not in result.started
    waiting = api(people["member"]).get(f"/api/v1/jobs/{second['id']}/").json()
    assert (waiting["state"], waiting["pending_reason"]) == ("pending", "Dependency")
    assert waiting["pending_detail"] == f"waits for job {first['id']} to complete"
    assert "depends on" in waiting["pending_reason_text"]
    assert waiting["estimated_start"] is None, "no estimate for a job that may not start yet"

    explained = api(people["member"]).get(f"/api/v1/jobs/{second['id']}/explain/").json()
    assert (explained["decision"], explained["reason"]) == ("wait", "Dependency"), "explain holds it as the tick"
    assert explained["detail"] == waiting["pending_detail"] and explained["estimated_start"] is None

    finish_job(first["id"], exit_code=0, ended_at=timezone.now())
    assert second["id"] in run_tick().started, "its dependency is met: it runs"


def test_afterok_on_a_failed_job_is_cancelled_dependency_never_satisfied(people, api) -> None:
    first = _submit(api, people["member"], name="prepare")
    second = _submit(api, people["member"], name="train", depends_on=[first["id"]])  # a list: afterok
    either = _submit(api, people["member"], name="report", depends_on=f"afterany:{first['id']}")
    rescue = _submit(api, people["member"], name="rescue", depends_on=[{"type": "afternotok", "job": first["id"]}])
    _end(first["id"], exit_code=3)
    result = run_tick()
    assert result.cancelled == [second["id"]]
    assert either["id"] in result.started and rescue["id"] in result.started, "afterany and afternotok are met"
    body = api(people["member"]).get(f"/api/v1/jobs/{second['id']}/").json()
    assert body["state"] == "cancelled" and body["pending_reason"] == ""
    event = body["events"][-1]
    assert (event["from_state"], event["to_state"], event["reason"]) == (
        "pending",
        "cancelled",
        "DependencyNeverSatisfied",
    )
    assert event["detail"] == f"afterok:{first['id']} can never be satisfied: job {first['id']} ended failed"
    assert event["reason_text"] == "Dependency never satisfied"


def test_afternotok_on_a_job_that_completed_is_cancelled(people, api) -> None:
    first = _submit(api, people["member"])
    rescue = _submit(api, people["member"], name="rescue", depends_on=f"afternotok:{first['id']}")
    _end(first["id"], exit_code=0)
    assert run_tick().cancelled == [rescue["id"]]
    assert Job.objects.get(pk=rescue["id"]).events.last().detail.endswith(f"job {first['id']} completed")


def test_a_job_of_another_team_is_refused_as_one_that_does_not_exist(people, api) -> None:
    theirs = _submit(api, people["other"], name="theirs")
    missing = Job.objects.order_by("-pk").values_list("pk", flat=True).first() + 1000
    refused = _refusal(api, people["member"], depends_on=f"afterok:{theirs['id']}")
    unknown = _refusal(api, people["member"], depends_on=f"afterok:{missing}")
    assert refused["field"] == unknown["field"] == "depends_on"
    assert refused["error"] == f"depends_on: job {theirs['id']}: no such job in your teams"
    assert unknown["error"] == f"depends_on: job {missing}: no such job in your teams"
    assert _refusal(api, people["member"], depends_on=f"afterok:A{theirs['id']}")["error"].endswith(
        f"array A{theirs['id']}: no such array in your teams"
    )
    # An admin may depend on any job.
    assert _submit(api, people["admin"], team="training", depends_on=f"afterok:{theirs['id']}")["depends_on"]


@pytest.mark.parametrize(
    ("depends_on", "words"),
    [
        ("after:5", "'after' is not a dependency type; one of afterok, afterany, afternotok"),
        ("afterok", "afterok needs job ids after it"),
        ("afterok:5?afterany:6", "'?' (any of) is not supported"),
        ("afterok:x", "'x' is not a job id (12), an array (A12) or an array's copy (12_3)"),
        (7, "must be a string such as 'afterok:12:13,afterany:14' or a list"),
        ([True], "list items are job ids"),
        ("afterok:" + ":".join(str(i) for i in range(1, 102)), "names 101 jobs; at most 100"),
    ],
)
def test_a_bad_dependency_is_a_400_naming_depends_on(people, api, depends_on, words) -> None:
    refused = _refusal(api, people["member"], depends_on=depends_on)
    assert refused["field"] == "depends_on" and words in refused["error"], refused


def test_afterok_on_an_array_waits_for_every_copy_and_one_copy_by_index(people, api) -> None:
    copies = _submit(api, people["member"], name="shard", array=3)
    array_id = copies[0]["array_id"]
    # Slurm's array job id (the first job's id) means every copy; 12_1 is one copy.
    whole = _submit(api, people["member"], name="merge", depends_on=f"afterok:{copies[0]['id']}")
    one = _submit(api, people["member"], name="peek", depends_on=f"afterok:{copies[0]['id']}_1")
    assert whole["depends_on"] == f"afterok:{array_id}"
    assert one["depends_on"] == f"afterok:{copies[1]['id']}"
    started = run_tick().started
    assert whole["id"] not in started and one["id"] not in started
    _end(copies[1]["id"], exit_code=0)
    _end(copies[0]["id"], exit_code=0)
    started = run_tick().started
    assert one["id"] in started and whole["id"] not in started
    assert Job.objects.get(pk=whole["id"]).pending_detail == (
        f"waits for array {array_id} to complete (2 of 3 copies completed)"
    )
    _end(copies[2]["id"], exit_code=0)
    assert whole["id"] in run_tick().started


def test_an_array_with_a_limit_runs_at_most_that_many_copies_at_once(people, api) -> None:
    copies = _submit(api, people["member"], name="sweep", array="0-4%2")
    assert [c["array_index"] for c in copies] == [0, 1, 2, 3, 4] and {c["array_limit"] for c in copies} == {2}
    ids = [c["id"] for c in copies]
    started = [i for i in run_tick().started if i in ids]
    assert started == ids[:2], "the lowest indices first"
    held = Job.objects.get(pk=ids[2])
    assert held.pending_reason == "JobArrayTaskLimit"
    assert held.pending_detail == f"array {copies[0]['array_id']} runs at most 2 copies at once"
    finish_job(ids[0], exit_code=0, ended_at=timezone.now())
    assert [i for i in run_tick().started if i in ids] == [ids[2]]
    assert Job.objects.filter(pk__in=ids, state=Job.State.RUNNING).count() == 2


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"array": "3-1"}, "array", "'3-1': the range ends before it starts"),
        ({"array": "0-3%0"}, "array", "%0: the number after % (copies running at once) must be 1 or more"),
        ({"array": "1,x"}, "array", "'x' is not an index or a range"),
        ({"array": "0-999999"}, "array", "asks for 1,000,000 copies; at most 1,000 in one array"),
        ({"array": "1,1"}, "array", "names an index twice"),
        ({"array": 0}, "array", "must be a whole number >= 1"),
        ({"array": "0-3%2", "array_limit": 3}, "array_limit", "3 disagrees with the %2 of array"),
        ({"array_limit": 2}, "array", "required with array_limit"),
    ],
)
def test_a_bad_array_is_a_400_naming_its_field(people, api, body, field, words) -> None:
    refused = _refusal(api, people["member"], **body)
    assert refused["field"] == field and words in refused["error"], refused


def test_array_limit_as_its_own_field(people, api) -> None:
    copies = _submit(api, people["member"], array=3, array_limit=1)
    assert {c["array_limit"] for c in copies} == {1}
    assert len([i for i in run_tick().started if i in {c["id"] for c in copies}]) == 1


def test_dependency_reasons_have_their_words_in_the_one_table() -> None:
    from scheduling.engine import reasons
    from scheduling.reason_text import reason_text

    assert reason_text("Dependency") == reasons.TEXT[reasons.DEPENDENCY]
    assert reason_text("JobArrayTaskLimit") == reasons.TEXT[reasons.JOB_ARRAY_TASK_LIMIT]
    assert "cancelled" in reason_text("DependencyNeverSatisfied")
