"""The unmodified bot against the loopback fake of Discord (tests/fakes/discord.py), in a thread of its own event
loop, with a real django-q2 cluster running the submissions. Any unhandled exception or error log inside the bot
fails the test."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback

import discord
import pytest
from channels.layers import channel_layers
from django.db import connection

from discordbot.bot import KernelBot, point_at
from discordbot.models import Guild, OrganiserRole
from kernelbot.settings import deployment_name

from ..conftest import REPO, reap_group, stop_groups
from ..fakes.discord import CHANNEL_ID, GUILD_ID, ORGANISER_ROLE_ID, FakeDiscord

ANNOUNCE_CHANNEL_ID = 900_000_000_000_000_010
REPORT_CHANNEL_ID = 900_000_000_000_000_011
WATCHED = ("discord", "discordbot", "leaderboards", "asyncio")
TOLERATED = ("Unexpected exception in receive task",)  # channels-redis, before it reconnects (a Redis cut)


class ErrorLog(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in WATCHED:
            self.records.append(record)


class BotThread:
    def __init__(self, fake: FakeDiscord):
        self.fake = fake
        self.errors: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(lambda loop, context: self.errors.append(str(context)))
        self.client: KernelBot | None = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="discordbot")

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.client = KernelBot(guild_ready_timeout=0.1)
        try:
            self.loop.run_until_complete(self.client.start("fake-token"))
        except RuntimeError as exc:
            if "Event loop stopped" not in str(exc):
                self.errors.append(f"bot stopped: {''.join(traceback.format_exception(exc))}")
        except Exception as exc:  # noqa: BLE001 - reported by the fixture
            self.errors.append(f"bot stopped: {''.join(traceback.format_exception(exc))}")

    def start(self) -> None:
        self.thread.start()
        assert self.fake.ready.wait(20), f"the bot never identified: {self.errors}"
        self.fake.wait_for(lambda: self.client and self.client.is_ready() and self.client.live.channel, 20,
                           "the bot to be ready")

    def idle(self, timeout: float = 10) -> None:
        """Wait until no command is still being answered (its last REST call may be in flight)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
                t.get_name() == "CommandTree-invoker" and not t.done() for t in list(asyncio.all_tasks(self.loop))):
            time.sleep(0.05)

    def stop(self) -> None:
        self.idle()
        if self.thread.is_alive() and self.client is not None and not self.client.is_closed():
            for task in list(self.client.live.tasks):
                self.loop.call_soon_threadsafe(task.cancel)
            closing = asyncio.run_coroutine_threadsafe(self.client.close(), self.loop)
            with contextlib.suppress(TimeoutError):  # aiohttp may wait on the fake's idle keep-alive sockets
                closing.result(10)
            if self.thread.is_alive():
                self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(20)
        if self.loop.is_running():
            return
        pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        self.loop.close()


@pytest.fixture
def fake_discord():
    fake = FakeDiscord()
    fake.start()
    base, gateway = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    point_at(fake.url)
    yield fake
    discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = base, gateway
    fake.stop()


@pytest.fixture
def guild(db):
    guild = Guild.objects.create(guild_id=GUILD_ID, name="Kernel Club", submission_channel_id=CHANNEL_ID,
                                 announcement_channel_id=ANNOUNCE_CHANNEL_ID, report_channel_id=REPORT_CHANNEL_ID)
    OrganiserRole.objects.create(guild=guild, role_id=ORGANISER_ROLE_ID, name="organisers")
    return guild


@pytest.fixture
def live_layer(settings, redis_url, tmp_path):
    """The bot (this process) and the cluster (a subprocess) share one channels-redis layer, as in production."""
    instance = os.environ["KERNELBOT_INSTANCE"]  # the suite's (tests/settings.py): this process's task queue too
    # the prefix the processes it starts derive from KERNELBOT_INSTANCE (settings.deployment_name: under xdist the
    # instance is "test-N@gwK", whose "@" the name turns into "-"; "kb.test-N@gwK" here put the bot on channels the
    # cluster never sent to, so only its minute sweep announced anything)
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [redis_url], "prefix": deployment_name()}}}
    channel_layers.backends.clear()
    settings.DISCORD_EDIT_INTERVAL = 0.3
    yield instance
    channel_layers.backends.clear()


def process_env(instance: str, **extra: str) -> dict[str, str]:
    """What a platform process started by a test needs: this test's database and channel layer."""
    db = connection.settings_dict
    return {**os.environ, "KERNELBOT_INSTANCE": instance,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
            **extra}


@pytest.fixture
def cluster(postgres, live_layer, tmp_path, live_server, cpu_pool):
    """A qcluster on the test database and the CPU pool's node agent against the live server's runner API."""
    env = process_env(live_layer, KERNELBOT_RUNS_DIR=str(tmp_path / "runs"), Q_WORKERS="2", KERNELBOT_REL_CI="0.05",
                      KERNELBOT_CASE_BUDGET_S="0.3", KERNELBOT_MAX_SAMPLES="50")
    (tmp_path / "runs").mkdir(exist_ok=True)
    log = (tmp_path / "qcluster.log").open("w")
    process = subprocess.Popen([sys.executable, "manage.py", "qcluster"], cwd=REPO, env=env, start_new_session=True,
                               stdout=log, stderr=subprocess.STDOUT)
    agent = subprocess.Popen([sys.executable, "-m", "runners.harness.node", "--platform", live_server.url, "--pool",
                              cpu_pool.name, "--hostname", "localhost", "--workdir", str(tmp_path / "runs"),
                              "--poll", "0.2"], cwd=REPO, env=env, start_new_session=True, stdout=log,
                             stderr=subprocess.STDOUT)
    yield process
    stop_groups(process, agent)


@pytest.fixture
def bot(fake_discord, guild, live_layer):
    errors = ErrorLog()
    logging.getLogger().addHandler(errors)
    thread = BotThread(fake_discord)
    try:
        thread.start()
        yield thread
    finally:
        thread.stop()
        logging.getLogger().removeHandler(errors)
    problems = thread.errors + [logging.Formatter().format(r) for r in errors.records]
    assert not problems, "errors inside the bot:\n" + "\n".join(problems)


class Bots:
    """Real bot processes (`manage.py discordbot`) against the fake, on this test's database and channel layer."""

    def __init__(self, fake, instance: str, logs):
        self.fake, self.instance, self.logs = fake, instance, logs
        self.processes: list[subprocess.Popen] = []

    def start(self, count: int, **env: str) -> list[subprocess.Popen]:
        identified = self.fake.identifies
        started = []
        for _ in range(count):
            environ = process_env(self.instance, DISCORD_TOKEN="fake-token", DISCORD_API_URL=self.fake.url,
                                  DISCORD_ANNOUNCE_RETRY_SECONDS="2", DISCORD_SWEEP_SECONDS="1", LOG_LEVEL="INFO",
                                  DISCORD_EDIT_INTERVAL="0.3", **env)
            log = (self.logs / f"bot-{len(self.processes)}.log").open("w")
            started.append(subprocess.Popen([sys.executable, "manage.py", "discordbot"], cwd=REPO, env=environ,
                                            start_new_session=True, stdout=log, stderr=subprocess.STDOUT))
            self.processes.append(started[-1])
        self.fake.wait_for(lambda: self.fake.identifies == identified + count, 60, f"{count} bots to identify")
        return started

    def kill(self, *processes: subprocess.Popen) -> None:
        """SIGKILL: no goodbye, as a crash or an OOM kill."""
        for process in processes or self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            reap_group(process.pid)

    def log_text(self) -> str:
        return "".join(path.read_text() for path in sorted(self.logs.glob("bot-*.log")))

    def failures(self) -> list[str]:
        """The messages the bots logged with a traceback (the line before one that is not a chained exception's),
        except channels-redis's own, before it reconnects after a Redis cut."""
        lines = self.log_text().splitlines()
        logged = [lines[i - 1] for i, line in enumerate(lines) if line.startswith("Traceback") and i
                  and lines[i - 1].strip()]
        return [message for message in logged if not message.startswith(TOLERATED)]


@pytest.fixture
def bots(fake_discord, guild, live_layer, tmp_path):
    started = Bots(fake_discord, live_layer, tmp_path)
    yield started
    started.kill()
    assert not started.failures(), started.log_text()
