from django.db import migrations, models


def fill_missing_keys(apps, schema_editor):
    """0010 gave every entry a key; any still without one ranks on its time until the board's next rebuild."""
    apps.get_model("leaderboards", "BoardEntry").objects.filter(rank_key__isnull=True).update(
        rank_key=models.F("score"))


def store_ranks(apps, schema_editor):
    """Going back: the stored ranks, 1 + the board's entries with a smaller key."""
    BoardEntry = apps.get_model("leaderboards", "BoardEntry")
    for board in BoardEntry.objects.values("leaderboard_id", "gpu_type_id").distinct():
        rows = list(BoardEntry.objects.filter(**board).order_by("rank_key", "submitted_at", "submission_id"))
        for position, row in enumerate(rows):
            above = rows[position - 1] if position else None
            row.rank = above.rank if above is not None and above.rank_key == row.rank_key else position + 1
        BoardEntry.objects.bulk_update(rows, ["rank"], batch_size=500)


def fillfactor(value: int | None):
    def run(apps, schema_editor):
        if schema_editor.connection.vendor == "postgresql":
            schema_editor.execute("ALTER TABLE leaderboards_boardentry "
                                  + ("RESET (fillfactor)" if value is None else f"SET (fillfactor = {value})"))
    return run


class Migration(migrations.Migration):
    """Ranks are read from the keys' order instead of stored: a result no longer rewrites the rank of every entry
    it passes, so the free room 0010 left on each page for those updates goes back."""

    dependencies = [
        ("leaderboards", "0012_leaderboard_internal"),
    ]

    operations = [
        migrations.RunPython(fill_missing_keys, migrations.RunPython.noop),
        migrations.AlterField(
            model_name="boardentry",
            name="rank_key",
            field=models.FloatField(help_text="What the board ranks on: the ratio, or the time when a ranked "
                                    "submission lacks a ratio (Board.ranks_on_ratio). The rank is read from it."),
        ),
        migrations.AlterField(model_name="boardentry", name="rank", field=models.PositiveIntegerField(default=0)),
        migrations.RunPython(migrations.RunPython.noop, store_ranks),
        migrations.RemoveField(model_name="boardentry", name="rank"),
        migrations.RunPython(fillfactor(None), fillfactor(70)),
    ]
