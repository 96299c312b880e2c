"""Announcements are posted once per change with several real bot processes (`manage.py discordbot`), when the bots
were down while the change happened, and when Discord refused the first post."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from discordbot.models import Announcement
from leaderboards import actions
from leaderboards.models import BoardEntry, Leaderboard, SubmissionMode

from ..conftest import REPO
from ..factories import UserFactory
from ..fakes.discord import CHANNEL_ID

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


def ranked(leaderboard, name: str):
    user = UserFactory(username=name)
    request = actions.check_submission(user, leaderboard.name, ["CPU"], SubmissionMode.LEADERBOARD, "k.py",
                                       CORRECT + f"\n# {name}\n".encode())
    return actions.do_submit(user, request)


def posted(fake) -> list[str]:
    return [m.content for m in fake.in_channel(CHANNEL_ID)]


@pytest.mark.slow(seconds=130)
@pytest.mark.timeout(600)
def test_each_change_is_announced_once_across_processes_restarts_and_a_refused_post(bots, cluster, leaderboard):
    fake = bots.fake
    Leaderboard.objects.filter(pk=leaderboard.pk).update(created=timezone.now() - timedelta(hours=2))  # not new
    bots.start(2)
    ranked(leaderboard, "alice")
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 1, 180, "alice's post")
    # the other bot either loses the podium's compare-and-set or finds the change announced: nothing is posted twice
    # (checked at the end, after more sweeps)

    bots.kill()  # the change below happens while no bot listens
    bob = ranked(leaderboard, "bob")
    fake.wait_for(lambda: BoardEntry.objects.filter(submission=bob).exists(), 180, "bob's entry")
    bots.start(2)  # both catch up at once
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 2, 30, "bob's post")

    fake.refuse_posts = 1
    ranked(leaderboard, "carol")
    fake.wait_for(lambda: Announcement.objects.filter(message_id__isnull=False).count() == 3, 180,
                  "carol's post, retried after the refusal")
    assert fake.refuse_posts == 0 and Announcement.objects.latest("pk").attempts == 2

    time.sleep(3)  # a retry period and more sweeps: nothing is posted twice
    texts = posted(fake)
    assert len(texts) == 3, texts
    for name in ("alice", "bob", "carol"):  # each took #1 or entered the top 3, once
        assert len([t for t in texts if re.match(rf"\*\*\u2068{name}\u2069\*\* (took|entered)", t)]) == 1, texts
    assert Announcement.objects.count() == 3
