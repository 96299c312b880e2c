"""A gateway reconnect (RESUME) in the middle of a submission's life, and a status that outlives its interaction
token moving to a channel message: no message lost or doubled."""

import pytest

from discordbot.models import StatusMessage
from leaderboards.actions import do_cancel_run
from leaderboards.models import Submission

from ..conftest import REPO
from ..fakes.discord import Attachment
from .conftest import REPORT_CHANNEL_ID

pytestmark = pytest.mark.django_db(transaction=True)
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ALICE = 700_000_000_000_000_001


def test_resume_mid_submission_loses_and_doubles_nothing(bot, leaderboard):
    fake = bot.fake
    first = fake.command("leaderboard submit ranked", ALICE, script=Attachment("k.py", CORRECT),
                         leaderboard_name=leaderboard.name, gpu="CPU")
    fake.answer(first)
    fake.wait_for(lambda: StatusMessage.objects.exists(), 10, "the status row")
    fake.drop_connection()
    assert fake.ready.wait(20) and fake.resumes == 1 and fake.identifies == 1
    for run in Submission.objects.get().runs.all():
        do_cancel_run(run)  # the run moves while and after the bot reconnects
    message = fake.original(first)
    fake.wait_for(lambda: "cancelled" in message.content.split("\n")[0], 20, "the final edit")
    second = fake.command("submission status", ALICE, submission_id=Submission.objects.get().pk)
    assert "cancelled" in fake.answer(second)["data"]["content"]
    bot.idle()
    assert len(fake.callback_bodies) == 2  # one answer per interaction, none replayed twice
    assert len([m for m in fake.messages.values() if m.via == "callback"]) == 2
    assert fake.rate_limited == 0


def test_status_outliving_the_interaction_token_moves_to_a_channel_message(bot, leaderboard, settings):
    fake = bot.fake
    settings.DISCORD_INTERACTION_TOKEN_SECONDS = 0.01  # the token is (nearly) spent at once
    first = fake.command("leaderboard submit ranked", ALICE, script=Attachment("k.py", CORRECT),
                         leaderboard_name=leaderboard.name, gpu="CPU")
    fake.answer(first)
    fake.wait_for(lambda: StatusMessage.objects.exists(), 10, "the status row")
    for run in Submission.objects.get().runs.all():
        do_cancel_run(run)
    moved = fake.wait_for(lambda: fake.in_channel(REPORT_CHANNEL_ID), 20, "the channel message")
    fake.wait_for(lambda: "cancelled" in moved[0].content.split("\n")[0], 20, "its final edit")
    assert len(fake.in_channel(REPORT_CHANNEL_ID)) == 1
    assert len(fake.original(first).history) == 2  # "thinking…", its status; never edited through the spent token
    fake.wait_for(lambda: StatusMessage.objects.filter(message_id=moved[0].id, interaction_token="").exists(), 10,
                  "the moved message recorded")
    dm = fake.wait_for(lambda: [m for m in fake.messages.values() if m.channel_id in fake.dm_channels], 20,
                       "the report by DM")
    assert dm[0].files and b"cancelled" in dm[0].files[0][1]
