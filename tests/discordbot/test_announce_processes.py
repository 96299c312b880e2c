"""Announcements are posted once per change with several real bot processes (`manage.py discordbot`), when the bots
were down while the change happened, and when Discord refused the first post."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from discordbot.models import Announcement
from leaderboards import actions
from leaderboards.models import BoardEntry, SubmissionMode

from ..conftest import REPO, reap_group
from ..factories import UserFactory
from .conftest import ANNOUNCE_CHANNEL_ID, process_env

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


class Bots:
    def __init__(self, fake, instance: str, logs):
        self.fake, self.instance, self.logs = fake, instance, logs
        self.processes: list[subprocess.Popen] = []

    def start(self, count: int) -> None:
        identified = self.fake.identifies
        for _ in range(count):
            env = process_env(self.instance, DISCORD_TOKEN="fake-token", DISCORD_API_URL=self.fake.url,
                              DISCORD_ANNOUNCE_RETRY_SECONDS="2", DISCORD_SWEEP_SECONDS="1", LOG_LEVEL="INFO")
            log = (self.logs / f"bot-{len(self.processes)}.log").open("w")
            self.processes.append(subprocess.Popen([sys.executable, "manage.py", "discordbot"], cwd=REPO, env=env,
                                                   start_new_session=True, stdout=log, stderr=subprocess.STDOUT))
        self.fake.wait_for(lambda: self.fake.identifies == identified + count, 60, f"{count} bots to identify")

    def kill(self) -> None:
        """SIGKILL: no goodbye, as a crash or an OOM kill."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
            reap_group(process.pid)

    def log_text(self) -> str:
        return "".join(path.read_text() for path in sorted(self.logs.glob("bot-*.log")))


@pytest.fixture
def bots(fake_discord, guild, live_layer, tmp_path):
    started = Bots(fake_discord, live_layer, tmp_path)
    yield started
    started.kill()
    assert "Traceback" not in started.log_text(), started.log_text()


def ranked(leaderboard, name: str):
    user = UserFactory(username=name)
    request = actions.check_submission(user, leaderboard.name, ["CPU"], SubmissionMode.LEADERBOARD, "k.py",
                                       CORRECT + f"\n# {name}\n".encode())
    return actions.do_submit(user, request)


def posted(fake) -> list[str]:
    return [m.content for m in fake.in_channel(ANNOUNCE_CHANNEL_ID)]


def test_each_change_is_announced_once_across_processes_restarts_and_a_refused_post(bots, cluster, leaderboard):
    fake = bots.fake
    bots.start(2)
    alice = ranked(leaderboard, "alice")
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 1, 180, "alice's post")
    fake.wait_for(lambda: "claimed already" in bots.log_text(), 10, "the other bot's claim to lose")

    bots.kill()  # the change below happens while no bot listens
    bob = ranked(leaderboard, "bob")
    fake.wait_for(lambda: BoardEntry.objects.filter(submission=bob).exists(), 180, "bob's entry")
    bots.start(2)  # both catch up at once
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 2, 30, "bob's post")

    fake.refuse_posts = 1
    carol = ranked(leaderboard, "carol")
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 3, 180,
                  "carol's post, retried after the refusal")
    assert fake.refuse_posts == 0 and Announcement.objects.get(key__endswith=f":{carol.pk}").attempts == 2

    time.sleep(3)  # a retry period and more sweeps: nothing is posted twice
    texts = posted(fake)
    assert len(texts) == 3, texts
    for submission in (alice, bob, carol):
        assert len([t for t in texts if f"(#{submission.pk})" in t]) == 1, texts
    assert Announcement.objects.count() == 3
