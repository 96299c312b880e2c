import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = ("Run the whole platform on this machine: migrate, load the demo (unless --no-demo), make sure an "
            "admin exists, then start the ASGI server (daphne), the supervised django-q2 worker cluster and, when "
            "DISCORD_TOKEN is set, the Discord bot (restarted with a back-off if it exits).")

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true")

    def handle(self, host, port, no_demo, **options):
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        if not no_demo:
            call_command("load_demo", stdout=self.stdout)
        call_command("ensure_admin", stdout=self.stdout)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the children below on SIGTERM too
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        children = [
            subprocess.Popen([*manage, "workers"]),  # the supervised qcluster (runners/supervisor.py)
            subprocess.Popen([sys.executable, "-m", "daphne", "-b", host, "-p", str(port),
                              "kernelbot.asgi:application"], cwd=settings.BASE_DIR),
        ]
        bot = BotProcess([*manage, "discordbot"]) if settings.DISCORD_TOKEN else None
        self.stdout.write(self.style.SUCCESS(f"kernelbot is up: http://{host}:{port}/ (admin: /admin/). "
                                             "Ctrl-C stops it."))
        try:
            while all(child.poll() is None for child in children):
                if bot is not None:
                    bot.keep_alive()
                time.sleep(0.5)
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            if bot is not None and bot.process is not None:
                children.append(bot.process)
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()


class BotProcess:
    """The Discord bot as a child that is restarted when it exits (Discord outages, a bad token: backing off up to
    60 s), so it never takes the web or the workers down with it."""

    def __init__(self, command: list[str]):
        self.command, self.failures, self.next_start = command, 0, 0.0
        self.process: subprocess.Popen | None = None
        self.keep_alive()

    def keep_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            self.failures = 0 if time.monotonic() - self.started > 60 else self.failures + 1
            self.next_start = time.monotonic() + min(60, 2 ** self.failures)
            self.process = None
        if self.process is None and time.monotonic() >= self.next_start:
            self.process, self.started = subprocess.Popen(self.command), time.monotonic()
