"""Job events: the time they were written (the timeline's order), the agent's time, the other job."""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0006_job_preempted_for'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='jobevent',
            options={'ordering': ['recorded_at', 'id']},
        ),
        migrations.AddField(
            model_name='jobevent',
            name='other_job',
            field=models.ForeignKey(blank=True, help_text='The other job the event concerns (the waiting job a preemption was for)', null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to='scheduling.job'),
        ),
        migrations.AddField(
            model_name='jobevent',
            name='recorded_at',
            field=models.DateTimeField(null=True, help_text='When the portal wrote the event'),
        ),
        migrations.AddField(
            model_name='jobevent',
            name='reported_at',
            field=models.DateTimeField(blank=True, help_text='When the node agent says it happened, for a change an agent reported', null=True),
        ),
    ]
