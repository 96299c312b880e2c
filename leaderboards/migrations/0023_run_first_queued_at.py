from django.db import migrations, models
from django.db.models import F
from django.utils import timezone


def from_queued_at(apps, schema_editor):
    apps.get_model("leaderboards", "Run").objects.update(first_queued_at=F("queued_at"))


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboards', '0022_run_hook_due'),
    ]

    operations = [
        migrations.AddField(
            model_name='run',
            name='first_queued_at',
            field=models.DateTimeField(null=True),
        ),
        migrations.RunPython(from_queued_at, migrations.RunPython.noop),
        migrations.AlterField(
            model_name='run',
            name='first_queued_at',
            field=models.DateTimeField(default=timezone.now, help_text="When it was first queued: a retry keeps its place in the queue (agents take the earliest first); set again only by an organiser's requeue."),
        ),
    ]
