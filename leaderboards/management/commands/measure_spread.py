from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from leaderboards.errors import SubmissionRejected
from leaderboards.models import Leaderboard, RunSpread
from leaderboards.spread import do_measure_spread


class Command(BaseCommand):
    help = ("Queue A/A runs (each problem's reference timed against itself, as a submission is) that measure the "
            "between-run spread of every (problem, GPU type) of the open leaderboards (or the named ones) not yet "
            "measured (all of them with --again), within a budget of runs; each figure replaces the last when its "
            "runs end (leaderboards/spread.py).")

    def add_arguments(self, parser):
        parser.add_argument("leaderboards", nargs="*", help="leaderboard names (default: the open ones)")
        parser.add_argument("--runs", type=int, default=settings.SPREAD_RUNS, help="A/A runs per (problem, GPU type)")
        parser.add_argument("--budget", type=int, default=0, help="queue at most this many runs in all (0: no cap)")
        parser.add_argument("--again", action="store_true", help="measure pairs that have a figure too")

    def handle(self, leaderboards, runs, budget, again, **options):
        boards = Leaderboard.objects.filter(internal=False).select_related("problem").prefetch_related("gpu_types")
        boards = boards.filter(name__in=leaderboards) if leaderboards else [b for b in boards if b.is_open]
        measured = set(RunSpread.objects.filter(spread__isnull=False).values_list("problem_id", "gpu_type_id"))
        pairs = {(b.problem, g) for b in boards for g in b.gpu_types.all()
                 if again or (b.problem_id, g.pk) not in measured}
        queued = 0
        for problem, gpu_type in sorted(pairs, key=lambda p: (p[0].name, p[0].version, p[1].name)):
            if budget and queued + runs > budget:
                self.stdout.write(f"{problem.name} v{problem.version} on {gpu_type}: not queued (budget spent)")
                continue
            try:
                queued += len(do_measure_spread(problem, gpu_type, runs))
            except SubmissionRejected as exc:
                self.stdout.write(f"{problem.name} v{problem.version} on {gpu_type}: {exc}")
                continue
            self.stdout.write(f"{problem.name} v{problem.version} on {gpu_type}: A/A runs queued")
        if leaderboards and not boards:
            raise CommandError(f"no leaderboard named {', '.join(leaderboards)}")
        self.stdout.write(f"{queued} A/A runs queued")
