from django.db import migrations


def create_schedules(apps, schema_editor):
    Schedule = apps.get_model("django_q", "Schedule")
    Schedule.objects.update_or_create(
        name="reap overdue runs",
        defaults={"func": "leaderboards.tasks.reap_runs", "schedule_type": "I", "minutes": 1, "repeats": -1},
    )


def remove_schedules(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name="reap overdue runs").delete()


class Migration(migrations.Migration):
    dependencies = [("leaderboards", "0001_initial"), ("django_q", "0018_task_success_index")]
    operations = [migrations.RunPython(create_schedules, remove_schedules)]
