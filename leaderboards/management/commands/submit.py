import secrets
import time
from pathlib import Path

from allauth.account.adapter import get_adapter
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from leaderboards.actions import SubmissionRejected, check_submission, do_submit
from leaderboards.models import Run, Submission


class Command(BaseCommand):
    help = "Submit a kernel file as a user, as the web site, API and Discord bot do."

    def add_arguments(self, parser):
        parser.add_argument("file")
        parser.add_argument("--user", required=True, help="Username (created if missing with --create-user).")
        parser.add_argument("--create-user", action="store_true", help="Create the user if missing, with --password "
                            "or a generated one that is printed (for the site's log-in and `kernelbot login`).")
        parser.add_argument("--password", help="With --create-user: the new user's password.")
        parser.add_argument("--leaderboard", required=True)
        parser.add_argument("--gpu", action="append", dest="gpus", required=True)
        parser.add_argument("--mode", default="leaderboard")
        parser.add_argument("--wait", action="store_true", help="Wait for the runs to finish and print them.")
        parser.add_argument("--timeout", type=float, default=600)

    def handle(self, file, user, create_user, password, leaderboard, gpus, mode, wait, timeout, **options):
        User = get_user_model()
        account = User.objects.filter(username=user).first()
        if account is None:
            if not create_user:
                raise CommandError(f"no user '{user}' (pass --create-user to create one)")
            try:  # the name sign-up would accept, no other (a U+202E name reverses the pages it is shown on)
                get_adapter().clean_username(user)
            except ValidationError as exc:
                raise CommandError(f"{user!a} is not a valid username: {' '.join(exc.messages)}") from exc
            chosen = password or secrets.token_urlsafe(12)
            account = User.objects.create_user(user, password=chosen)
            self.stdout.write(f"created user {user}" + ("" if password else f" with password {chosen}") +
                              f" (log in on the site, or `kernelbot login --username {user}`)")
        path = Path(file)
        if not path.is_file():
            raise CommandError(f"{file}: no such file")
        try:
            request = check_submission(account, leaderboard, gpus, mode, path.name, path.read_bytes())
        except SubmissionRejected as exc:
            raise CommandError(exc.message) from exc
        submission = do_submit(account, request)
        self.stdout.write(f"submission {submission.pk} queued with {submission.runs.count()} runs")
        if wait:
            self.wait(submission, timeout)

    def wait(self, submission: Submission, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = list(submission.runs.select_related("gpu_type"))
            if all(run.is_terminal for run in runs):
                for run in runs:
                    self.stdout.write(run_report(run))
                return
            time.sleep(0.5)
        raise CommandError(f"submission {submission.pk} did not finish within {timeout} s")


def run_report(run: Run, cause_lines: int = 20) -> str:
    """One run as an operator needs it: outcome, how far it got, score, and the cause of a failure in full
    (its last lines: a traceback or a crashed process's stderr ends with the cause, not a warning)."""
    kind = "secret" if run.secret else "public"
    parts = [f"run {run.pk} {run.gpu_type} {kind}: {run.status}" + (f" ({run.verdict})" if run.verdict else "")]
    if run.progress.get("phase"):
        parts.append(f"{run.progress['phase']} {run.progress['done']}/{run.progress['total']} passed")
    if run.score is not None:
        parts.append(f"score {run.score * 1e6:.2f} µs")
    lines = ["  " + " · ".join(parts)]
    cause = run.error.strip().splitlines()[-cause_lines:]
    lines += ["    " + line for line in cause]
    return "\n".join(lines)
