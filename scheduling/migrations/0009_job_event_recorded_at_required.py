import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('scheduling', '0008_job_event_backfill'),
    ]

    operations = [
        migrations.AlterField(
            model_name='jobevent',
            name='recorded_at',
            field=models.DateTimeField(default=django.utils.timezone.now, help_text='When the portal wrote the event'),
        ),
    ]
