"""Problems keyed by collection and name: existing rows learn where they came from, and each line renumbers from v1
(pmpp_v2's matmul_py was "v2" of the demo's unrelated matmul_py)."""

from collections import Counter, defaultdict

from django.db import migrations, models


def backfill(apps, schema_editor):
    Problem = apps.get_model("leaderboards", "Problem")
    Leaderboard = apps.get_model("leaderboards", "Leaderboard")
    Submission = apps.get_model("leaderboards", "Submission")
    by_name = defaultdict(list)
    for problem in Problem.objects.order_by("name", "version", "pk"):
        by_name[problem.name].append(problem)
    for versions in by_name.values():
        # A version's collection: the competition of the boards that used it (as their problem, or for submissions).
        found: list[str | None] = []
        for problem in versions:
            names = Counter(Leaderboard.objects.filter(problem=problem, competition__isnull=False)
                            .values_list("competition__name", flat=True))
            names.update(Submission.objects.filter(problem=problem, leaderboard__competition__isnull=False)
                         .values_list("leaderboard__competition__name", flat=True))
            used = Leaderboard.objects.filter(problem=problem).exists() or \
                Submission.objects.filter(problem=problem).exists()
            found.append(names.most_common(1)[0][0] if names else ("" if used else None))
        # A version nothing used was replaced by a later one of its line (else it follows an earlier one).
        for i, problem in enumerate(versions):
            near = [c for c in found[i:] if c is not None] + [c for c in reversed(found[:i]) if c is not None]
            problem.collection = near[0] if near else ""
        numbers: Counter = Counter()
        for problem in versions:
            numbers[problem.collection] += 1
            problem.version = numbers[problem.collection]
        Problem.objects.bulk_update(versions, ["collection", "version"])


class Migration(migrations.Migration):

    dependencies = [
        ('leaderboards', '0017_profile_publish_submissions'),
    ]

    operations = [
        migrations.RemoveConstraint(model_name='problem', name='problem_unique_version'),
        migrations.AddField(
            model_name='problem',
            name='collection',
            field=models.CharField(blank=True, help_text='Where it came from: the competition file\'s name, or the folder a single task was imported from; empty: an uploaded archive, or a standalone import from before collections.', max_length=120),
        ),
        migrations.AlterModelOptions(name='problem', options={'ordering': ['name', 'collection', '-version']}),
        migrations.RunPython(backfill, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name='problem',
            constraint=models.UniqueConstraint(fields=('collection', 'name', 'version'), name='problem_unique_collection_version'),
        ),
    ]
