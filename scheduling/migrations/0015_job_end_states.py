"""Slurm's end states: a job stopped at its time limit is ``timeout``, one killed for its memory
``out_of_memory``, one whose nodes' faults used up its retries ``node_fail``, where all were ``failed``.

Existing failed jobs move by the reason of the event that ended them, and that event's ``to_state``
with them, so a job's state and its last event agree: ``Walltime`` → timeout, ``OutOfMemory`` →
out_of_memory, a node's fault that used up the retry budget → node_fail. A ``LaunchFailed`` without
that budget is an agent's refusal no retry changes (the job's own fault): it stays failed. Back, every
one of them is ``failed`` again.
"""

from django.db import migrations, models

#: Rows moved per statement (an ``IN`` list a database takes everywhere).
CHUNK = 500
#: The reasons of a requeue, which end a job only once its retry budget is used up.
NODE_REASONS = ("NodeFail", "NodeUnreachable", "LostOnAgent", "DeviceFailed")


def _new_state(reason: str, detail: str) -> str | None:
    if reason == "Walltime":
        return "timeout"
    if reason == "OutOfMemory":
        return "out_of_memory"
    if reason in NODE_REASONS or (reason == "LaunchFailed" and "retry budget" in detail):
        return "node_fail"
    return None


def forwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("scheduling", "Job")
    JobEvent = apps.get_model("scheduling", "JobEvent")
    # The event that ended each failed job: its last one into ``failed`` (a job fails once).
    ending: dict[int, tuple[int, str]] = {}
    rows = (
        JobEvent.objects.filter(to_state="failed", job__state="failed")
        .order_by("job_id", "recorded_at", "id")
        .values_list("id", "job_id", "reason", "detail")
    )
    for event_id, job_id, reason, detail in rows.iterator(chunk_size=2000):
        state = _new_state(reason, detail)
        if state is None:
            ending.pop(job_id, None)
        else:
            ending[job_id] = (event_id, state)
    by_state: dict[str, list[tuple[int, int]]] = {}
    for job_id, (event_id, state) in ending.items():
        by_state.setdefault(state, []).append((job_id, event_id))
    for state, pairs in by_state.items():
        for i in range(0, len(pairs), CHUNK):
            part = pairs[i : i + CHUNK]
            Job.objects.filter(pk__in=[j for j, _ in part], state="failed").update(state=state)
            JobEvent.objects.filter(pk__in=[e for _, e in part]).update(to_state=state)


def backwards(apps, schema_editor):  # type: ignore[no-untyped-def]
    Job = apps.get_model("scheduling", "Job")
    JobEvent = apps.get_model("scheduling", "JobEvent")
    moved = ("timeout", "out_of_memory", "node_fail")
    Job.objects.filter(state__in=moved).update(state="failed")
    JobEvent.objects.filter(to_state__in=moved).update(to_state="failed")


class Migration(migrations.Migration):
    dependencies = [
        ("scheduling", "0014_job_output_lines"),
    ]

    operations = [
        migrations.AlterField(
            model_name="job",
            name="state",
            field=models.CharField(
                choices=[
                    ("pending", "Pending"),
                    ("running", "Running"),
                    ("completed", "Completed"),
                    ("failed", "Failed"),
                    ("timeout", "Timeout"),
                    ("out_of_memory", "Out of memory"),
                    ("node_fail", "Node failure"),
                    ("cancelled", "Cancelled"),
                    ("preempted", "Preempted"),
                ],
                default="pending",
                max_length=16,
            ),
        ),
        migrations.RunPython(forwards, backwards),
    ]
