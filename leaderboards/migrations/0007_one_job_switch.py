from django.db import migrations


def keep_newest_switch(apps, schema_editor):
    """Rows beyond pk=1 were never read: the newest row is what the organisers last set, so it becomes the switch."""
    switch = apps.get_model("leaderboards", "JobSwitch")
    newest = switch.objects.order_by("-changed", "-pk").first()
    if newest is None or newest.pk == 1 and switch.objects.count() == 1:
        return
    accepting, reason = newest.accepting, newest.reason
    switch.objects.exclude(pk=1).delete()
    switch.objects.update_or_create(pk=1, defaults={"accepting": accepting, "reason": reason})


class Migration(migrations.Migration):
    dependencies = [("leaderboards", "0006_run_attempts")]

    operations = [
        migrations.AlterModelOptions(name="jobswitch",
                                     options={"verbose_name": "jobs switch", "verbose_name_plural": "jobs switch"}),
        migrations.RunPython(keep_newest_switch, migrations.RunPython.noop),
    ]
