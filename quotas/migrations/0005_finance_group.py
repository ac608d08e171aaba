"""The ``finance`` group: its members see every team's reports, statements and exports (docs/chargeback.md)."""

from django.db import migrations


def create_group(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.get_or_create(name="finance")


def remove_group(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    Group.objects.filter(name="finance").delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("quotas", "0004_chargeback"),
    ]

    operations = [migrations.RunPython(create_group, remove_group)]
