"""Podium announcements as KernelBot words them (issue 44, point 1): a board with 30 submissions from 30 users posts
only its podium changes, in the submission channel, once each (the top three last announced is kept in the
database, so a restarted bot or a second one announces nothing again); beginner, closed and expired boards are not
announced; a new board is announced with its deadline and the participant role; personal bests only where a guild
keeps them, saying by what measure they improved."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from discordbot import announce
from discordbot.models import Announcement, Guild, Podium
from leaderboards import actions
from leaderboards.models import Run, RunStatus, Visibility

from ..factories import LeaderboardFactory, UserFactory, problem_from, ranked_result, submission
from ..fakes.discord import CHANNEL_ID, GUILD_ID
from .conftest import ANNOUNCE_CHANNEL_ID

PARTICIPANTS = 900_000_000_000_000_077


def finish(leaderboard, user, ratio: float):
    """A ranked submission of `user` whose runs passed with `ratio` (and a time in proportion), ranked."""
    sub = submission(leaderboard, user)
    Run.objects.filter(submission=sub).update(status=RunStatus.SUCCEEDED, passed=True, score=ratio * 1e-3,
                                              ratio=ratio, ratio_low=ratio * 0.99, ratio_high=ratio * 1.01,
                                              result=ranked_result([ratio * 1e6]), finished_at=timezone.now())
    gpu = leaderboard.gpu_types.get()
    actions.do_recompute_ranks(leaderboard.pk, gpu.pk)
    return sub


def expected_changes(ratios: list[float]) -> list[bool]:
    """For each submission in turn, whether the top three's members or its #1 changed (KernelBot's rule)."""
    best: dict[int, float] = {}
    before: list[int] = []
    changes = []
    for user, ratio in enumerate(ratios):
        best[user] = min(ratio, best.get(user, ratio))
        after = sorted(best, key=lambda u: (best[u], u))[:3]
        changes.append(set(after) != set(before) or after[:1] != before[:1])
        before = after
    return changes


@pytest.fixture
def fast_sweep(settings):
    settings.DISCORD_SWEEP_SECONDS = 0.3
    settings.DISCORD_BEGINNER_BOARDS = {"vectoradd_v2"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_thirty_users_post_only_podium_changes(fast_sweep, bot, leaderboard):
    fake = bot.fake
    Guild.objects.filter(guild_id=GUILD_ID).update(participant_role_id=PARTICIPANTS)
    ratios = [1 + ((i * 7) % 30) / 10 for i in range(30)]  # a permutation of 1.0 … 3.9
    changes = expected_changes(ratios)
    assert 3 < sum(changes) < 10  # the sequence has podium changes, and far fewer than submissions

    def podium_posts():
        return [m.content for m in fake.in_channel(CHANNEL_ID)]

    users = [UserFactory(username=f"user{i:02}") for i in range(30)]
    for i, (user, ratio) in enumerate(zip(users, ratios, strict=True)):
        finish(leaderboard, user, ratio)
        if changes[i]:
            want = sum(changes[:i + 1])
            fake.wait_for(lambda want=want: len(podium_posts()) >= want, 30, f"the podium change of submission {i}")
    time.sleep(1.5)  # several sweeps more: nothing is posted twice

    posts = podium_posts()
    assert len(posts) == sum(changes), posts
    where = f"`{leaderboard.name}` (`CPU`)"
    assert posts[0] == f"**\u2068user00\u2069** took **#1** on {where} with 1× the reference's time (ranked by ratio)."
    assert posts[1] == f"**\u2068user01\u2069** entered the **top 3** on {where} with 1.7× the reference's time " \
                       "(ranked by ratio)."
    assert "**\u2068user02\u2069** entered the **top 3**" in posts[2]
    # user03 (3.1) does not get in; user04 (3.8) neither; user05 (1.5) pushes user02 (2.4) out
    assert posts[3].splitlines() == [
        f"**\u2068user05\u2069** entered the **top 3** on {where} with 1.5× the reference's time (ranked by ratio).",
        "**\u2068user02\u2069** fell out of the **top 3**."]
    took = [p for p in posts if "took **#1**" in p]
    assert all("lost **#1**" in p for p in took[1:]), took
    assert not [p for p in posts if "Personal best" in p or "first successful" in p]

    announced = [m.content for m in fake.in_channel(ANNOUNCE_CHANNEL_ID)]
    assert len(announced) == 1 and announced[0].startswith(f"# New leaderboard: {leaderboard.name}"), announced
    assert f"<@&{PARTICIPANTS}>" in announced[0] and "**Deadline**" in announced[0]
    pings = {tuple(sorted(m.allowed_mentions["parse"])) for m in fake.messages.values() if m.via == "channel"}
    assert pings == {("roles",)}  # the participant role may ping; no name in a podium post ever does
    assert Announcement.objects.filter(message_id__isnull=True).count() == 0
    assert Podium.objects.get().version == sum(changes)


@pytest.mark.django_db
def test_beginner_closed_expired_boards_are_not_announced_and_personal_bests_are_opt_in(settings, cpu_pool,
                                                                                      demo_task):
    settings.DISCORD_BEGINNER_BOARDS = {"vectoradd_v2"}
    guild = Guild.objects.create(guild_id=GUILD_ID, submission_channel_id=CHANNEL_ID,
                                 announcement_channel_id=ANNOUNCE_CHANNEL_ID)
    problem = problem_from(demo_task)
    quiet = [LeaderboardFactory(name="vectoradd_v2", problem=problem, gpu_types=[cpu_pool.cpu]),
             LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu], visibility=Visibility.CLOSED),
             LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu], visibility=Visibility.UNLISTED)]
    expired = LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu])
    board = LeaderboardFactory(problem=problem, gpu_types=[cpu_pool.cpu])
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    for leaderboard in [*quiet, expired, board]:
        finish(leaderboard, alice, 1.5)
    type(expired).objects.filter(pk=expired.pk).update(deadline=timezone.now() - timedelta(minutes=1))

    texts = [c.text for c in announce.claim_recent()]
    assert [t for t in texts if "took **#1**" in t] == [
        f"**\u2068alice\u2069** took **#1** on `{board.name}` (`CPU`) with 1.5× the reference's time "
        "(ranked by ratio)."]
    assert [t.splitlines()[0] for t in texts if t.startswith("# New")] == [f"# New leaderboard: {board.name}"]
    assert announce.claim_recent() == []  # claimed once

    guild.personal_bests = True
    guild.save()
    finish(board, alice, 1.2)  # a personal best at #1: no podium change; said with the measure it improved by
    finish(board, bob, 2.0)  # a first submission that enters the top 3
    claimed = announce.claim_recent()
    by_channel = {c.channel_id: [] for c in claimed}
    for c in claimed:
        by_channel[c.channel_id].append(c.text)
    assert by_channel[CHANNEL_ID] == [f"**\u2068bob\u2069** entered the **top 3** on `{board.name}` (`CPU`) with 2× "
                                      "the reference's time (ranked by ratio)."]
    personal = sorted(by_channel[ANNOUNCE_CHANNEL_ID])
    assert len(personal) == 2, personal
    assert personal[0].startswith("🎉 **\u2068bob\u2069**'s first successful submission")
    assert "2× the reference's time" in personal[0]
    assert (personal[1].startswith(f"📈 Personal best of **\u2068alice\u2069** on `{board.name}` (`CPU`): 1.2× the "
                                   "reference's time (ranked by ratio), was 1.5×; rank 1"))
