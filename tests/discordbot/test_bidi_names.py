"""User text in Discord messages is isolated as on the site (issue 52): a display name (or a file name) starting with
U+202E RIGHT-TO-LEFT OVERRIDE is closed by POP DIRECTIONAL ISOLATE before the rest of the message, in every kind of
message the bot sends: podium and personal announcements, final standings, rankings, status messages, lists,
organiser answers and errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.utils import timezone

from discordbot import announce, render
from discordbot.models import Guild
from leaderboards.models import Final, FinalEntry, FinalStatus, Submission

from ..factories import UserFactory
from ..fakes.discord import CHANNEL_ID, GUILD_ID, ORGANISER_ROLE_ID, Attachment
from .conftest import ANNOUNCE_CHANNEL_ID
from .test_commands import ALICE, CORRECT, ORG, refused, reply
from .test_podium import fast_sweep, finish  # noqa: F401 - a fixture

RLO = "\u202e"
NAME = f"{RLO}ecalevol ada"  # shows as "ada lovelace", and turns whatever follows it unless isolated
FILE = f"{RLO}yp.lenrek.py"
EMBEDDINGS, ISOLATES, PDF, PDI = "\u202a\u202b\u202d\u202e", "\u2066\u2067\u2068", "\u202c", "\u2069"


def leaks(text: str) -> list[int]:
    """Where an embedding or override (U+202A–U+202E) from earlier in the text still governs text outside every
    isolate, by UAX #9's explicit rules (X1–X8, isolates matched as BD9 matches them, the message one paragraph); and
    len(text) when an isolate is still open at its end (all that follows it would be inside it)."""
    matched: set[int] = set()
    opened: list[int] = []
    for i, char in enumerate(text):
        if char in ISOLATES:
            opened.append(i)
        elif char == PDI and opened:
            matched.update((opened.pop(), i))
    stack: list[str] = []
    found = []
    for i, char in enumerate(text):
        if char in EMBEDDINGS:
            stack.append("embedding")
        elif char == PDF:
            if stack and stack[-1] == "embedding":
                stack.pop()
        elif char in ISOLATES:
            stack.append("isolate")
        elif char == PDI:
            if i in matched:
                while stack.pop() != "isolate":
                    pass
        elif "isolate" not in stack and "embedding" in stack:
            found.append(i)
    return found + ([len(text)] if "isolate" in stack else [])


def assert_contained(text: str, *user_texts: str) -> None:
    assert not leaks(text), f"text governed by a user's override: {text!r}"
    for user_text in user_texts:
        assert render.isolate(user_text) in text, (user_text, text)


@pytest.mark.parametrize(("text", "leaked"), [
    (f"**{NAME}** took **#1**", True),  # the checker sees the attack
    (f"**{render.isolate(NAME)}** took **#1**", False),
    (f"{render.isolate('a' + PDI + RLO + 'b')} took #1", False),  # a stray PDI in the name does not end the isolate
    (f"'{FILE}' is empty.", True),
])
def test_a_name_is_isolated_and_a_whole_message_contains_every_override(text, leaked):
    assert bool(leaks(text)) is leaked
    assert not leaks(render.contained(text))
    assert render.contained(render.isolate(NAME) + " after") == render.isolate(NAME) + " after"  # kept as it is
    for unbalanced in (f"\u2068{RLO}abc after", f"abc{PDI}{RLO} after", f"\u2068x\n{RLO}y{PDI} after"):
        assert not leaks(render.contained(unbalanced)), unbalanced


@pytest.mark.django_db
def test_final_standings_isolate_each_name(leaderboard, monkeypatch):
    eve = UserFactory(username=f"{RLO}eve")  # no form takes such a name; the announcement does not trust that
    entry = SimpleNamespace(gpu_type=SimpleNamespace(name="CPU"), user=eve, rank=1, tied=False, score=1e-3,
                            ratio_low=None, ratio=None, ratio_high=None, dropped=False)
    monkeypatch.setattr(announce.finals, "final_entries", lambda final: [entry])
    text = announce._final_text(SimpleNamespace(leaderboard=leaderboard, top_n=3, rounds=2))
    assert_contained(text, eve.username)


@pytest.mark.django_db(transaction=True)
def test_a_right_to_left_override_name_turns_nothing_after_it_in_any_message(fast_sweep, bot, leaderboard):  # noqa: F811
    fake = bot.fake
    Guild.objects.filter(guild_id=GUILD_ID).update(personal_bests=True)
    fake.user(ALICE, NAME)  # Discord sends display names as they are
    org = {"roles": [ORGANISER_ROLE_ID]}

    # an error and a status message carrying the file's name
    empty = fake.command("leaderboard submit test", ALICE, leaderboard_name=leaderboard.name, gpu="CPU",
                         script=Attachment(FILE, b""))
    assert_contained(refused(fake, empty), FILE)
    text, _ = reply(fake, fake.command("leaderboard submit test", ALICE, leaderboard_name=leaderboard.name, gpu="CPU",
                                       script=Attachment(FILE, CORRECT)))
    assert "dispatched" in text  # its node agents' pool: dispatched by the submission
    assert_contained(text, FILE)
    alice = Submission.objects.get().user
    assert alice.profile.display_name == NAME

    # announcements, each podium change posted before the next: her first success and #1, then she loses #1 and
    # falls out of the top 3
    def posted(*words: str) -> list[str]:
        return [m.content for m in fake.messages.values() if m.via == "channel" and all(w in m.content for w in words)]
    for user, ratio, words in ((alice, 1.5, "took **#1**"), (UserFactory(username="bob"), 1.0, "lost **#1**"),
                               (UserFactory(username="carol"), 1.1, "carol"),
                               (UserFactory(username="dave"), 1.2, "fell out of the **top 3**")):
        finish(leaderboard, user, ratio)
        fake.wait_for(lambda words=words: posted(words), 30, f"the post saying {words}")
    fake.wait_for(lambda: posted("first successful submission", render.isolate(NAME)), 30, "her first success")
    best = finish(leaderboard, alice, 0.9)  # her personal best, and #1 again
    fake.wait_for(lambda: posted("Personal best of", render.isolate(NAME)), 30, "her personal best")

    # the final standings, published after the deadline, name her as the podium does
    final = Final.objects.create(leaderboard=leaderboard, status=FinalStatus.PUBLISHED, top_n=3, rounds=2,
                                 published_at=timezone.now())
    FinalEntry.objects.create(final=final, gpu_type=leaderboard.gpu_types.get(), submission=best, user=alice,
                              board_rank=1, position=0, rank=1, score=0.9e-3)
    fake.wait_for(lambda: posted("Final standings", render.isolate(NAME)), 30, "the final standings")
    assert {m.channel_id for m in fake.messages.values() if m.via == "channel"} <= {CHANNEL_ID, ANNOUNCE_CHANNEL_ID}
    posts = posted()
    for kind in ("took **#1**", "lost **#1**", "fell out of the **top 3**", "first successful submission",
                 "Personal best of", "Final standings"):
        assert posted(kind, render.isolate(NAME)), (kind, posts)
    for post in posts:
        assert_contained(post)

    # the board, her own list, an organiser's view, a delete's confirmation and the statistics
    ranking, _ = reply(fake, fake.command("leaderboard show", ALICE, leaderboard_name=leaderboard.name, gpu="CPU"))
    assert_contained(ranking, NAME)
    mine, _ = reply(fake, fake.command("leaderboard show-personal", ALICE, leaderboard_name=leaderboard.name))
    assert_contained(mine, FILE)
    tested = Submission.objects.get(file_name=FILE)
    shown, _ = reply(fake, fake.command("submission status", ALICE, submission_id=tested.pk))
    assert_contained(shown, FILE)
    summary, _ = reply(fake, fake.command("admin get-submission", ORG, submission_id=tested.pk, **org))
    assert_contained(summary, alice.get_username())
    ask, _ = reply(fake, fake.command("admin delete-submission", ORG, submission=tested.pk, **org))
    assert_contained(ask, FILE, alice.get_username())
    stats, _ = reply(fake, fake.command("admin stats", ORG, **org))
    assert_contained(stats, "bob")
