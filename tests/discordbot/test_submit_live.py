"""A submission through /leaderboard submit, run by a real cluster, watched live in Discord."""

from datetime import timedelta

import pytest
from django.utils import timezone

from discordbot.models import Announcement, StatusMessage
from leaderboards.models import BoardEntry, Leaderboard, Submission

from ..conftest import REPO
from ..fakes.discord import CHANNEL_ID, Attachment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ALICE = 700_000_000_000_000_001


@pytest.mark.slow(seconds=60)
def test_ranked_submission_is_acked_edited_live_reported_and_announced(bot, cluster, leaderboard):
    fake = bot.fake
    Leaderboard.objects.filter(pk=leaderboard.pk).update(created=timezone.now() - timedelta(hours=2))  # not new
    code = b"#!POPCORN leaderboard " + leaderboard.name.encode() + b"\n#!POPCORN gpu CPU\n" + CORRECT
    interaction = fake.command("leaderboard submit ranked", ALICE, script=Attachment("kernel.py", code))
    body = fake.answer(interaction)
    assert body["type"] == 5 and not ((body.get("data") or {}).get("flags") or 0) & 64  # acknowledged; ranked: public
    assert fake.answered[interaction] < 3
    message = fake.original(interaction)
    fake.wait_for(lambda: message.content, 10, "the deferred answer's status")
    submission = Submission.objects.get()
    assert submission.user.socialaccount_set.get().uid == str(ALICE)
    assert f"#{submission.pk}" in message.content and "dispatched" in message.history[1]
    fake.wait_for(lambda: "succeeded" in message.content.split("\n")[0], 180, "the final edit")
    assert len(message.history) >= 3, message.history  # dispatched → running/progress → succeeded
    assert "✓" in message.content and "reference" in message.content
    report = fake.wait_for(lambda: fake.followups(interaction), 20, "the report")
    assert report[0].ephemeral and report[0].files and b"score:" in report[0].files[0][1]

    fake.wait_for(lambda: BoardEntry.objects.with_rank().filter(submission=submission, rank=1).exists(), 90, "the rank")
    # the ranks event's announcement (the bot's sweep, which would also post it, comes once a minute)
    posted = fake.wait_for(lambda: fake.in_channel(CHANNEL_ID), 30, "the podium announcement")
    assert len(posted) == 1 and "took **#1**" in posted[0].content, posted[0].content
    fake.wait_for(lambda: Announcement.objects.filter(message_id=posted[0].id).exists(), 10, "the claim's message id")
    assert Announcement.objects.count() == 1
    fake.wait_for(lambda: StatusMessage.objects.get().finished, 20, "the status row marked finished")
    assert fake.rate_limited == 0
