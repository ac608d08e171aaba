"""Job events: the time they were written (the timeline's order), the agent's time, the other job.

Existing events get ``recorded_at = at`` (the best record of when they were written), and a
preemption's ``... for job #N`` moves out of its detail into ``other_job``, so the detail of an
old event no longer names another team's job either. A migration of its own: on PostgreSQL a
table whose rows were just updated with a foreign key set cannot be altered (nor indexed) in the
same transaction, so the fields are added before and ``recorded_at`` is made required after.
"""

import re

from django.db import migrations
from django.db.models import F

_FOR_JOB = re.compile(r"^(?P<detail>.*?) for job #(?P<job>[0-9]+)$", re.DOTALL)


def backfill(apps, schema_editor):
    JobEvent = apps.get_model("scheduling", "JobEvent")
    Job = apps.get_model("scheduling", "Job")
    db = schema_editor.connection.alias
    JobEvent.objects.using(db).filter(recorded_at__isnull=True).update(recorded_at=F("at"))
    rows = JobEvent.objects.using(db).filter(reason="PreemptionScheduled", detail__contains=" for job #")
    for pk, detail in list(rows.values_list("pk", "detail")):  # a few rows; read before writing
        match = _FOR_JOB.match(detail)
        if match is None:
            continue
        other = int(match["job"])
        exists = Job.objects.using(db).filter(pk=other).exists()
        JobEvent.objects.using(db).filter(pk=pk).update(detail=match["detail"], other_job_id=other if exists else None)


def restore(apps, schema_editor):
    JobEvent = apps.get_model("scheduling", "JobEvent")
    db = schema_editor.connection.alias
    rows = JobEvent.objects.using(db).filter(reason="PreemptionScheduled", other_job__isnull=False)
    for pk, detail, other in list(rows.values_list("pk", "detail", "other_job_id")):
        JobEvent.objects.using(db).filter(pk=pk).update(detail=f"{detail} for job #{other}"[:500])


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0007_job_event_fields'),
    ]

    operations = [
        migrations.RunPython(backfill, restore, elidable=False),
    ]
