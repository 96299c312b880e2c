from django.db import migrations

SCHEDULES = {"reservations tick": ("runners.reservations.tasks.tick", 1),
             "daily GPU usage post": ("runners.reservations.chat.post_daily_report", 60)}


def create_schedule(apps, schema_editor):
    for name, (func, minutes) in SCHEDULES.items():
        apps.get_model("django_q", "Schedule").objects.update_or_create(
            name=name, defaults={"func": func, "schedule_type": "I", "minutes": minutes, "repeats": -1})


def remove_schedule(apps, schema_editor):
    apps.get_model("django_q", "Schedule").objects.filter(name__in=SCHEDULES).delete()


class Migration(migrations.Migration):
    dependencies = [("reservations", "0001_initial"), ("django_q", "0018_task_success_index")]
    operations = [migrations.RunPython(create_schedule, remove_schedule)]
