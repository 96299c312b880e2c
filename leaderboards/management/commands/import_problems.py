import argparse
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from leaderboards.importing import ImportRejected, do_import_competition, do_import_task
from taskspec.loader import TaskFileError, collection_root, load_competition, load_task
from taskspec.model import parse_deadline


def deadline_argument(text: str) -> datetime | None:
    try:
        return parse_deadline(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class Command(BaseCommand):
    help = ("Import a competition file (problems/<set>.yaml) or one problem directory (holding task.yml). "
            "Nothing is written unless everything is valid; the report gives each leaderboard's deadline (UTC) "
            "and the harness its problem runs under.")

    def add_arguments(self, parser):
        parser.add_argument("path", help="A competition .yaml file or a problem directory; relative paths are "
                            "looked up in the working directory, then in KERNELBOT_PROBLEMS_DIR.")
        parser.add_argument("--root", type=Path, help="The problem collection: task directories and the files "
                            "their task.yml names (e.g. ../../pmpp_v2/utils.py) must lie inside it. Default: "
                            "for a problem directory, its nearest ancestor holding a competition file (else its "
                            "parent); for a competition file, the file's directory.")
        parser.add_argument("--force", action="store_true", help="Allow changing a running leaderboard, "
                            "moving a leaderboard another competition owns into this one, or a problem whose code "
                            "asks for CUDA on GPU types without it (such as --gpu CPU).")
        parser.add_argument("--harness", choices=["auto", "kernelbot", "popcorn"], default="auto",
                            help="For a problem directory: kernelbot = the trusted two-process harness (needs "
                            "reference.py defining generate_input, ref_kernel and check_implementation; config.main "
                            "is then not needed); popcorn = the problem's own eval.py "
                            "(config.main, weaker: it runs beside the submission); auto (default) = popcorn when "
                            "config.main names one of the files, else kernelbot. A competition file sets it per "
                            "problem (harness:).")
        parser.add_argument("--leaderboard", help="For a problem directory: open or update this leaderboard.")
        parser.add_argument("--deadline", type=deadline_argument, help="UTC unless a zone is given: 2027-01-31, "
                            "'2027-01-31 23:59' or ISO 8601. Default: an existing leaderboard keeps its "
                            "deadline, a new one closes a year from now.")
        parser.add_argument("--past-deadline", action="store_true", help="Allow a deadline in the past (--deadline, or "
                            "a competition file's): the leaderboard is then closed from the start.")
        parser.add_argument("--gpu", action="append", dest="gpus", help="GPU type (repeatable).")
        parser.add_argument("--reset", action="store_true", help="Take the file's (or these options') deadline, GPU "
                            "types and run_spread even where an organiser changed them since the last import. "
                            "Without it a re-import writes only the values that differ from the last import's.")

    def handle(self, path, root, force, past_deadline, harness, leaderboard, deadline, gpus, reset, **options):
        target = Path(path)
        if not target.exists() and (settings.PROBLEMS_DIR / path).exists():
            target = settings.PROBLEMS_DIR / path
        if not target.exists():
            raise CommandError(f"{path}: no such file or directory")
        if root is not None and not root.is_dir():
            raise CommandError(f"--root {root}: not a directory")
        given = [f"--{k}" for k, v in {"leaderboard": leaderboard, "deadline": deadline, "gpu": gpus}.items() if v]
        if target.is_file() and (given or harness != "auto"):
            raise CommandError(f"{', '.join(given + ['--harness'] * (harness != 'auto'))}: only for a problem "
                               "directory; a competition file sets these per problem")
        try:
            if target.is_dir():
                task = load_task(target, root=root)
                if root is None:
                    self.stdout.write(f"problem collection: {collection_root(target)}")
                report = do_import_task(task, leaderboard=leaderboard, deadline=deadline, gpus=gpus,
                                        harness=harness, force=force, past_deadline=past_deadline,
                                        reset=reset, collection=target.resolve().parent.name)
            else:
                report = do_import_competition(load_competition(target, root=root), force=force,
                                               past_deadline=past_deadline, reset=reset)
        except TaskFileError as exc:
            raise CommandError(str(exc)) from exc
        except ImportRejected as exc:
            raise CommandError("nothing was imported:\n  " + "\n  ".join(exc.errors)) from exc
        self.stdout.write(self.style.SUCCESS(str(report)))
