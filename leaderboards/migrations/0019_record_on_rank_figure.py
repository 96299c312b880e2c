"""Records follow what their board ranks on: a board ranking on the ratio to the reference had its record progression
on time, so the chart's lowest point was not rank 1. Such boards' progressions are rebuilt here on the ratio (a
board on time keeps its rows), as ranking.progression and ranks._candidates build them."""

import math

from django.db import migrations, models


def rebuild_on_ratio(apps, schema_editor):
    Board = apps.get_model("leaderboards", "Board")
    Record = apps.get_model("leaderboards", "Record")
    Run = apps.get_model("leaderboards", "Run")
    for board in Board.objects.filter(ranks_on_ratio=True):
        runs = Run.objects.filter(submission__leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id,
                                  submission__mode="leaderboard", submission__final_entry__isnull=True,
                                  status="succeeded", passed=True, score__isnull=False).values_list(
            "submission_id", "submission__user_id", "submission__created", "secret", "ratio")
        by_submission: dict = {}
        for submission_id, user_id, created, secret, ratio in runs:
            entry = by_submission.setdefault(submission_id, [user_id, created, {}])
            entry[2][secret] = ratio
        candidates = sorted(((created, sid, user, max(ratios.values())) for sid, (user, created, ratios)
                             in by_submission.items() if len(ratios) == 2 and None not in ratios.values()),
                            key=lambda c: (c[0], c[1]))
        steps, mine, best = [], {}, math.inf
        for created, sid, user, figure in candidates:
            if figure < mine.get(user, math.inf):
                mine[user] = figure
                steps.append(Record(leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id, user_id=user,
                                    submission_id=sid, score=figure, submitted_at=created, board_best=figure < best))
                best = min(best, figure)
        Record.objects.filter(leaderboard_id=board.leaderboard_id, gpu_type_id=board.gpu_type_id).delete()
        Record.objects.bulk_create(steps)


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboards', '0018_problem_collection'),
    ]

    operations = [
        migrations.AlterField(
            model_name='record',
            name='score',
            field=models.FloatField(help_text='What the board ranks on (Board.ranks_on_ratio): the ratio to the reference, else seconds; lower is better.'),
        ),
        migrations.RunPython(rebuild_on_ratio, migrations.RunPython.noop),
    ]
