import io
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from runners.models import GpuPool, RunnerBackendName


def port_taken(host: str, port: int) -> str:
    """Why `host:port` cannot be bound ("" when it can)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


def wait_for_port(host: str, port: int, children: list[subprocess.Popen], timeout: float = 60) -> bool:
    """True once the server accepts connections; False if a child exits first or it takes too long."""
    local = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and all(child.poll() is None for child in children):
        try:
            socket.create_connection((local, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.2)
    return False


class Command(BaseCommand):
    help = ("Run the whole platform on this machine: migrate, load the demo (unless --no-demo), make sure an "
            "admin exists, then start the ASGI server (granian), the supervised django-q2 worker cluster, this "
            "machine's node agent (it runs the local pool's kernels) and, when DISCORD_TOKEN is set, the Discord bot "
            "(restarted with a back-off if it exits).")

    def add_arguments(self, parser):
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--no-demo", action="store_true")
        self.add_agent_arguments(parser)

    def add_agent_arguments(self, parser):
        parser.add_argument("--pool", default="local", help="The local pool this machine's node agent serves.")

    def handle(self, host, port, no_demo, pool, **options):
        if busy := port_taken(host, port):
            raise CommandError(f"cannot serve on {host}:{port}: {busy}. Stop what uses it or pick another port "
                               "(./dev serve --port 8001).")
        settings.DATA_DIR.mkdir(parents=True, exist_ok=True)
        call_command("migrate", interactive=False, verbosity=0)
        if not no_demo:
            call_command("load_demo", stdout=self.stdout)
        admin = io.StringIO()  # a new admin's one-time password, printed again last, where it is not scrolled away
        call_command("ensure_admin", stdout=admin)
        self.stdout.write(admin.getvalue(), ending="")
        # the task queue's line per task (ticks every few seconds: ~30 lines a minute) only with Q_LOG_LEVEL=INFO
        os.environ.setdefault("Q_LOG_LEVEL", "WARNING")
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # stop the children below on SIGTERM too
        if not os.environ.get("KERNELBOT_RUNNER_KEY"):  # the agent below and the server share it; kept per start
            os.environ["KERNELBOT_RUNNER_KEY"] = settings.RUNNER_KEY = secrets.token_hex(32)
        manage = [sys.executable, str(settings.BASE_DIR / "manage.py")]
        children = [
            subprocess.Popen([*manage, "workers"]),  # the supervised qcluster (runners/supervisor.py)
            # granian, as production runs the site (docs/operations.md): it streams request bodies to Django, which
            # spools them to disk, where daphne held each whole body in memory and stalled other clients meanwhile
            subprocess.Popen([sys.executable, "-m", "granian", "--interface", "asginl", "--host", host, "--port",
                              str(port), "--workers", "1", "--respawn-failed-workers", "--backlog", "4096",
                              "--backpressure", "4096", "kernelbot.asgi:application"], cwd=settings.BASE_DIR),
        ]
        local = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
        agent = [sys.executable, "-m", "runners.harness.node", "--platform", f"http://{local}:{port}", "--pool", pool,
                 "--hostname", socket.gethostname(), "--python", settings.HARNESS_PYTHON or sys.executable,
                 "--workdir", str(settings.RUNS_DIR)]
        settings.RUNS_DIR.mkdir(parents=True, exist_ok=True)
        kept = [KeptAlive([*manage, "discordbot"])] if settings.DISCORD_TOKEN else []
        if GpuPool.objects.filter(name=pool, backend=RunnerBackendName.LOCAL).exists():
            kept.append(KeptAlive(agent))
        else:
            self.stderr.write(f"no local pool named {pool}: this machine's node agent is not started")
        try:
            if not wait_for_port(host, port, children):
                raise CommandError(f"the web server did not start on {host}:{port} (see its output above)")
            self.stdout.write(self.style.SUCCESS(f"kernelbot is up: http://{host}:{port}/ (admin: /admin/). "
                                                 "Ctrl-C stops it."))
            if "password" in admin.getvalue():
                self.stdout.write(admin.getvalue(), ending="")
            while all(child.poll() is None for child in children):
                for process in kept:
                    process.keep_alive()
                time.sleep(0.5)
        except (KeyboardInterrupt, SystemExit):
            pass
        finally:
            children += [process.process for process in kept if process.process is not None]
            for child in children:
                if child.poll() is None:
                    child.send_signal(signal.SIGTERM)
            for child in children:
                try:
                    child.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    child.kill()


class KeptAlive:
    """A child that is restarted when it exits, backing off up to 60 s (the Discord bot: Discord outages, a bad
    token; the node agent), so it never takes the web or the workers down with it."""

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
