from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from leaderboards import dataset
from leaderboards.errors import Refused
from leaderboards.models import Leaderboard


class Command(BaseCommand):
    help = ("Write the submissions dataset (parquet, KernelBot's schema plus per-run columns; one row per distinct "
            "code; users who opted out left out) of the named closed leaderboards, or of every closed board whose "
            "code is public; optionally push it to a Hugging Face dataset repository (token from HF_TOKEN).")

    def add_arguments(self, parser):
        parser.add_argument("leaderboards", nargs="*", help="leaderboard names (default: every closed board whose "
                            "code is public)")
        parser.add_argument("--out", help="where to write the parquet file (default: <board or submissions>.parquet)")
        parser.add_argument("--push", metavar="OWNER/NAME", help="also upload it to this Hugging Face dataset repo")
        parser.add_argument("--path-in-repo", help="its path in the repository (default: the file's name)")

    def handle(self, leaderboards, out=None, push=None, path_in_repo=None, **options):
        if leaderboards:
            boards = list(Leaderboard.objects.filter(name__in=leaderboards, internal=False))
            missing = sorted(set(leaderboards) - {b.name for b in boards})
            if missing:
                raise CommandError(f"no leaderboard named {', '.join(missing)}")
        else:
            boards = dataset.published_leaderboards()
            if not boards:
                raise CommandError("no closed leaderboard has public code; name the leaderboards to export")
        target = Path(out or dataset.file_name(boards))
        try:
            data = dataset.parquet_bytes(boards)
            target.write_bytes(data)
            self.stdout.write(f"wrote {target} ({len(data)} bytes) from {', '.join(b.name for b in boards)}")
            if push:
                url = dataset.push_to_hub(data, push, path_in_repo or target.name)
                self.stdout.write(f"pushed to {url}")
        except Refused as exc:
            raise CommandError(exc.message) from exc
