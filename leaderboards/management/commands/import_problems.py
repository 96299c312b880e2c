from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from leaderboards.importing import ImportRejected, do_import_competition, do_import_task
from leaderboards.taskfile import TaskFileError, load_competition, load_task


class Command(BaseCommand):
    help = ("Import a competition file (problems/<set>.yaml) or one problem directory (holding task.yml). "
            "Nothing is written unless everything is valid.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="A competition .yaml file or a problem directory; relative paths are "
                            "looked up in the working directory, then in KERNELBOT_PROBLEMS_DIR.")
        parser.add_argument("--force", action="store_true", help="Allow changing a running leaderboard.")
        parser.add_argument("--harness", choices=["auto", "kernelbot", "popcorn"], default="auto")
        parser.add_argument("--leaderboard", help="For a problem directory: open or update this leaderboard.")
        parser.add_argument("--deadline", type=datetime.fromisoformat, help="ISO-8601; naive means UTC.")
        parser.add_argument("--gpu", action="append", dest="gpus", help="GPU type (repeatable).")

    def handle(self, path, force, harness, leaderboard, deadline, gpus, **options):
        target = Path(path)
        if not target.exists() and (settings.PROBLEMS_DIR / path).exists():
            target = settings.PROBLEMS_DIR / path
        if not target.exists():
            raise CommandError(f"{path}: no such file or directory")
        if deadline and deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        try:
            if target.is_dir():
                report = do_import_task(load_task(target), leaderboard=leaderboard, deadline=deadline, gpus=gpus,
                                        harness=harness, force=force)
            else:
                report = do_import_competition(load_competition(target), force=force)
        except TaskFileError as exc:
            raise CommandError(str(exc)) from exc
        except ImportRejected as exc:
            raise CommandError("nothing was imported:\n  " + "\n  ".join(exc.errors)) from exc
        self.stdout.write(self.style.SUCCESS(str(report)))
