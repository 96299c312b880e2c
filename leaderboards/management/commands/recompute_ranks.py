from django.core.management.base import BaseCommand

from leaderboards.actions import do_recompute_ranks
from leaderboards.models import Leaderboard


class Command(BaseCommand):
    help = ("Rebuild the ranks and records of every board (or of the named leaderboards) from their runs, e.g. once "
            "after migration 0010, which adds the stored records (a board is otherwise rebuilt on its next result).")

    def add_arguments(self, parser):
        parser.add_argument("leaderboards", nargs="*", help="leaderboard names (default: all)")

    def handle(self, leaderboards, **options):
        boards = Leaderboard.objects.prefetch_related("gpu_types")
        if leaderboards:
            boards = boards.filter(name__in=leaderboards)
        for leaderboard in boards:
            for gpu_type in leaderboard.gpu_types.all():
                changed = do_recompute_ranks(leaderboard.pk, gpu_type.pk)
                self.stdout.write(f"{leaderboard.name}/{gpu_type.name}: {'rebuilt' if changed else 'unchanged'}")
