"""What real Discord refuses, from the fake: messages over 2,000 characters, uploads over the server's limit, an
interaction token that expires early (401, 50027), an interaction answered already (40060) and closed DMs (50007).
The bot's answers fit, and a status message still ends right with its report sent once (or, where there is nowhere
private to send it, not at all)."""

from __future__ import annotations

import pytest

from discordbot.models import StatusMessage
from leaderboards.actions import do_cancel_run
from leaderboards.models import Submission

from ..conftest import REPO
from ..factories import LeaderboardFactory, submission
from ..fakes.discord import MAX_CONTENT, Attachment
from .conftest import REPORT_CHANNEL_ID

pytestmark = pytest.mark.django_db(transaction=True)
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ALICE = 700_000_000_000_000_001


def texts(fake, interaction) -> list[str]:
    """The answer and its follow-ups, in order."""
    fake.answer(interaction)
    first = fake.wait_for(lambda: fake.original(interaction), 10, "the answer")
    return [first.content] + [m.content for m in fake.followups(interaction)]


def test_a_list_of_forty_five_boards_is_split_into_messages_that_fit(bot, leaderboard, cpu_pool):
    names = {LeaderboardFactory(name=f"an-open-board-with-a-rather-long-name-{i:02}", problem=leaderboard.problem,
                                gpu_types=[cpu_pool.cpu]).name for i in range(45)}
    interaction = bot.fake.command("leaderboard list", ALICE)
    bot.fake.wait_for(lambda: len(texts(bot.fake, interaction)) > 1, 10, "the follow-ups")
    bot.idle()
    parts = texts(bot.fake, interaction)
    assert all(len(p) <= MAX_CONTENT for p in parts) and not bot.fake.refused
    shown = "\n".join(parts)
    assert all(f"**{name}**" in shown for name in names | {leaderboard.name})


def test_show_personal_with_long_file_names_is_split(bot, leaderboard):
    reply = bot.fake.command("leaderboard submit test", ALICE, script=Attachment("k.py", CORRECT),
                             leaderboard_name=leaderboard.name, gpu="CPU")  # makes ALICE's account
    bot.fake.answer(reply)
    user = bot.fake.wait_for(lambda: Submission.objects.first(), 10, "the submission").user
    for i in range(19):
        s = submission(leaderboard, user, mode="test")
        Submission.objects.filter(pk=s.pk).update(file_name=f"{i:02}-" + "k" * 200 + ".py")
    interaction = bot.fake.command("leaderboard show-personal", ALICE, leaderboard_name=leaderboard.name)
    bot.fake.wait_for(lambda: len(texts(bot.fake, interaction)) > 1, 10, "the follow-ups")
    bot.idle()
    parts = texts(bot.fake, interaction)
    assert all(len(p) <= MAX_CONTENT for p in parts) and not bot.fake.refused
    assert sum(p.count("`") for p in parts) == 2 * 20  # every submission, no line cut in two


def test_an_interaction_answered_already_gets_a_follow_up(bot, leaderboard):
    interaction = bot.fake.command("leaderboard list", ALICE, acknowledged=True)
    followups = bot.fake.wait_for(lambda: bot.fake.followups(interaction), 10, "the follow-up")
    assert leaderboard.name in followups[0].content and followups[0].ephemeral
    assert [code for code, _ in bot.fake.refused] == [40060]


def test_a_submission_larger_than_the_upload_limit_is_not_attached(bot, leaderboard):
    sent = bot.fake.command("leaderboard submit test", ALICE, script=Attachment("k.py", CORRECT),
                            leaderboard_name=leaderboard.name, gpu="CPU")
    bot.fake.answer(sent)
    found = bot.fake.wait_for(lambda: Submission.objects.first(), 10, "the submission")
    bot.fake.upload_limit = 100
    interaction = bot.fake.command("leaderboard get-submission", ALICE, submission_id=found.pk)
    text = bot.fake.answer(interaction)["data"]["content"]
    assert f"is {len(CORRECT)} bytes, more than this server takes in an upload (100 bytes)" in text


def ranked(fake, leaderboard) -> tuple[int, Submission]:
    interaction = fake.command("leaderboard submit ranked", ALICE, script=Attachment("k.py", CORRECT),
                               leaderboard_name=leaderboard.name, gpu="CPU")
    fake.answer(interaction)
    fake.wait_for(lambda: StatusMessage.objects.exists(), 10, "the status row")
    return interaction, Submission.objects.get()


def test_a_token_expiring_early_moves_the_status_to_the_channel_and_the_report_to_a_dm(bot, leaderboard):
    fake = bot.fake
    interaction, sub = ranked(fake, leaderboard)
    fake.upload_limit = 150  # the report is cut to fit
    fake.expired_tokens.add(f"token-{interaction}")  # Discord refuses it before the bot thought it would
    for run in sub.runs.all():
        do_cancel_run(run)
    moved = fake.wait_for(lambda: fake.in_channel(REPORT_CHANNEL_ID), 20, "the channel message")
    fake.wait_for(lambda: "cancelled" in moved[0].content.split("\n")[0], 20, "its final edit")
    dm = fake.wait_for(lambda: [m for m in fake.messages.values() if m.channel_id in fake.dm_channels], 20,
                       "the report by DM")
    fake.wait_for(lambda: StatusMessage.objects.get().finished, 10, "the row finished")
    assert len(dm) == 1 and len(dm[0].files[0][1]) <= 150 and b"left out" in dm[0].files[0][1]
    assert 50027 in [code for code, _ in fake.refused] and not fake.followups(interaction)
    assert StatusMessage.objects.get().interaction_token == ""


def test_closed_dms_end_a_private_status_without_error(bot, leaderboard, settings):
    fake = bot.fake
    settings.DISCORD_INTERACTION_TOKEN_SECONDS = 0.01  # the status of a test submission moves to a DM at once
    fake.dm_closed.add(ALICE)
    interaction = fake.command("leaderboard submit test", ALICE, script=Attachment("k.py", CORRECT),
                               leaderboard_name=leaderboard.name, gpu="CPU")
    fake.answer(interaction)
    fake.wait_for(lambda: StatusMessage.objects.exists(), 10, "the status row")
    for run in Submission.objects.get().runs.all():
        do_cancel_run(run)
    fake.wait_for(lambda: StatusMessage.objects.get().finished, 20, "the row finished")
    assert 50007 in [code for code, _ in fake.refused]
    assert not [m for m in fake.messages.values() if m.channel_id in fake.dm_channels]


def test_a_bucket_that_says_it_is_spent_makes_the_bot_wait_not_fail(bot, leaderboard):
    fake = bot.fake
    fake.bucket_remaining, fake.bucket_reset_after = 0, 0.5  # every message call: "none left for 0.5 s"
    interaction, sub = ranked(fake, leaderboard)
    for run in sub.runs.all():
        do_cancel_run(run)
    message = fake.original(interaction)
    fake.wait_for(lambda: "cancelled" in message.content.split("\n")[0], 30, "the final edit")
    fake.wait_for(lambda: fake.followups(interaction), 20, "the report")
    assert fake.rate_limited == 0 and len(fake.followups(interaction)) == 1
