"""The bot under faults (issue 27): Discord answering 500 for a minute, the bot's Redis cut for 20 s, three bot
processes at once and the owner of a message killed. Each time the live status message ends right, once, and its
report is sent once. No cluster: the test finishes the runs itself (cancelled), which ends the message as a run's
result does."""

from __future__ import annotations

import time

import pytest
from channels.layers import channel_layers

from discordbot.models import StatusMessage
from kernelbot.settings import redis_layer
from leaderboards.actions import do_cancel_run
from leaderboards.models import Submission

from ..conftest import REPO
from ..fakes.discord import Attachment
from ..fakes.tcp import CuttableProxy

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ALICE, BOB = 700_000_000_000_000_001, 700_000_000_000_000_002


def submit(fake, leaderboard, user=ALICE) -> tuple[int, Submission]:
    """A ranked submission (public status message) acknowledged and tracked; its submission."""
    before = set(Submission.objects.values_list("pk", flat=True))
    interaction = fake.command("leaderboard submit ranked", user, script=Attachment("k.py", CORRECT),
                               leaderboard_name=leaderboard.name, gpu="CPU")
    fake.answer(interaction)
    fake.wait_for(lambda: StatusMessage.objects.exclude(submission_id__in=before).exists(), 20, "the status row")
    return interaction, Submission.objects.exclude(pk__in=before).get()


def finish(submission: Submission) -> None:
    for run in submission.runs.all():
        do_cancel_run(run)


def ends_once(fake, interaction, submission: Submission, timeout: float) -> None:
    """The message ends cancelled, its report was sent once, and no content was written twice in a row (two
    writers)."""
    message = fake.original(interaction)
    fake.wait_for(lambda: "cancelled" in message.content.split("\n")[0], timeout, "the final edit")
    fake.wait_for(lambda: StatusMessage.objects.filter(submission=submission, finished=True).exists(), 20,
                  "the row finished")
    reports = fake.followups(interaction)
    assert len(reports) == 1 and reports[0].ephemeral and b"cancelled" in reports[0].files[0][1]
    assert all(a != b for a, b in zip(message.history, message.history[1:], strict=False)), message.history
    assert StatusMessage.objects.get(submission=submission).reported


@pytest.mark.slow(seconds=65)
def test_discord_answering_500_for_a_minute_delays_the_status_and_its_report_but_loses_nothing(bot, leaderboard):
    fake = bot.fake
    interaction, submission = submit(fake, leaderboard)
    fake.fail_for(60)
    finish(submission)  # the run ends during the outage
    # discord.py's own retries (5 tries, about 16 s) run out: the bot must try again later itself; waited for rather
    # than slept through, so a busy machine that starts the edit late still sees them all within the outage
    fake.wait_for(lambda: fake.failed >= 5, 45, "discord.py's retries of the edit to run out")
    assert "cancelled" not in fake.original(interaction).content
    ends_once(fake, interaction, submission, 120)
    assert fake.rate_limited == 0


def test_a_message_that_cannot_be_edited_for_long_is_given_up(bot, leaderboard, monkeypatch):
    monkeypatch.setattr("discordbot.bot.GIVE_UP_AFTER", 3.0)  # an hour in production
    fake = bot.fake
    interaction, submission = submit(fake, leaderboard)
    fake.fail_for(3600)
    finish(submission)
    row = StatusMessage.objects.get(submission=submission)
    fake.wait_for(lambda: StatusMessage.objects.get(pk=row.pk).finished, 90, "the message given up")
    assert "cancelled" not in fake.original(interaction).content and not fake.followups(interaction)
    assert submission.pk not in bot.client.live.watches


@pytest.fixture
def redis_proxy(redis_url):
    from urllib.parse import urlparse

    url = urlparse(redis_url)
    proxy = CuttableProxy(url.hostname, url.port or 6379).start()
    proxy.url = url._replace(netloc=f"127.0.0.1:{proxy.port}").geturl()
    yield proxy
    proxy.stop()


def test_a_20_second_redis_cut_neither_stalls_a_status_nor_refuses_a_submission(bots, redis_proxy, leaderboard):
    fake = bots.fake
    bots.start(1, REDIS_URL=redis_proxy.url)  # its channel layer and cache reach Redis through the proxy
    first, first_submission = submit(fake, leaderboard)
    redis_proxy.cut()
    finish(first_submission)  # its events go to Redis, which the bot cannot hear now
    second, second_submission = submit(fake, leaderboard, BOB)  # a submission during the cut is taken
    assert "went wrong" not in (fake.original(second).content or "")
    time.sleep(20)
    redis_proxy.restore()
    assert redis_proxy.cuts > 0
    finish(second_submission)
    ends_once(fake, first, first_submission, 60)
    ends_once(fake, second, second_submission, 60)


def test_a_hanging_redis_delays_neither_the_acceptance_of_a_submission_nor_its_status(
        bots, redis_server, leaderboard, live_layer, settings):
    """Redis SIGSTOPped (it accepts connections and never answers; issue 35): the submission is taken from the database
    while Redis still hangs, not when it returns, and its status ends right once it is back."""
    fake = bots.fake
    settings.CHANNEL_LAYERS = {"default": {**redis_layer(redis_server.url), "CONFIG": {
        **redis_layer(redis_server.url)["CONFIG"], "prefix": f"kb.{live_layer}"}}}  # this process speaks there too
    channel_layers.backends.clear()
    bots.start(1, REDIS_URL=redis_server.url)  # its cache, task broker and channel layer
    redis_server.hang()
    interaction, submission = submit(fake, leaderboard)  # the status row within 20 s, Redis still stopped
    assert "went wrong" not in (fake.original(interaction).content or "")
    assert submission.runs.exists()
    redis_server.resume()
    finish(submission)
    ends_once(fake, interaction, submission, 60)


def test_three_bot_processes_edit_a_message_from_one_and_a_killed_owner_is_taken_over(bots, leaderboard):
    fake = bots.fake
    (first_bot,) = bots.start(1, DISCORD_LEASE_SECONDS="3")
    interaction, submission = submit(fake, leaderboard)
    bots.start(2, DISCORD_LEASE_SECONDS="3")  # two quick restarts: the old process still runs
    time.sleep(4)  # more than a lease: the new processes' claims must all lose to the live owner
    finish(submission)
    ends_once(fake, interaction, submission, 30)
    assert StatusMessage.objects.get(submission=submission).owner.split(":")[1] == str(first_bot.pid)
    assert fake.rate_limited == 0

    # the process that answers the next submission dies before its run ends
    interaction, submission = submit(fake, leaderboard, BOB)
    owner = StatusMessage.objects.get(submission=submission).owner
    dying = next(p for p in bots.processes if owner.split(":")[1] == str(p.pid))
    bots.kill(dying)
    finish(submission)
    ends_once(fake, interaction, submission, 40)
    assert StatusMessage.objects.get(submission=submission).owner != owner
    assert fake.rate_limited == 0
