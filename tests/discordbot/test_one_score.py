"""A ranked submission has one score per GPU, the slower of its public and secret runs: the status message shows
the one the board and the announcement show (issue 27, item 6)."""

import pytest
from django.utils import timezone

from discordbot import announce, render, service
from leaderboards import actions
from leaderboards.models import BoardEntry, Run, RunStatus

from ..factories import UserFactory, ranked_result, submission

pytestmark = pytest.mark.django_db


def test_the_status_message_shows_the_scored_run_as_the_board_and_the_announcement_do(leaderboard, cpu_pool):
    ranked = submission(leaderboard, UserFactory(), mode="leaderboard")
    # the public run is faster in time but the secret run is the slower by its ratio: the secret one is scored
    for secret, score, ratio in ((False, 472e-6, 1.25), (True, 469e-6, 1.27)):
        Run.objects.filter(submission=ranked, secret=secret).update(
            status=RunStatus.SUCCEEDED, passed=True, score=score, ratio=ratio, ratio_low=ratio - 0.01,
            ratio_high=ratio + 0.01, result=ranked_result([score * 1e9]), finished_at=timezone.now())
    actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    entry = BoardEntry.objects.with_rank().select_related("leaderboard", "gpu_type", "user").get(submission=ranked)
    board = f"{render.seconds(entry.score)}{render.ratio(entry.ratio_low, entry.ratio, entry.ratio_high)}"
    assert board.startswith("469 µs · 1.27×")

    for public in (True, False):
        shown = service.progress(ranked.pk, public).content
        assert f"Score on **CPU**: {board}" in shown, shown
        assert "472" not in shown and "1.25×" not in shown, shown
    said = announce.measure(entry, on_ratio=True)
    assert said.startswith("1.27×") and "1.25" not in said
