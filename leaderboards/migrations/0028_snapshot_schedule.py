from django.db import migrations


def create_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.update_or_create(
        name="private snapshot",
        defaults={"func": "leaderboards.tasks.export_snapshot", "schedule_type": "I", "minutes": 360, "repeats": -1},
    )


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="private snapshot").delete()


class Migration(migrations.Migration):

    dependencies = [
        ("leaderboards", "0027_submissionquota_frozen"),
        ("django_q", "0018_task_success_index"),
    ]

    operations = [migrations.RunPython(create_schedule, remove_schedule)]
