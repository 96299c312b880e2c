"""In a real browser: a closed board is marked provisional; an organiser re-verifies its top entries from the admin
(real re-runs by a node agent through daphne and a django-q2 cluster), compares the ranks and publishes; the board
page then shows the final standings, the dropped entry without its reason to a spectator and with it to its author.

Uses test_browser.py's fixtures: daphne, a django-q2 cluster and a node agent on the PostgreSQL test database."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.contrib.auth.hashers import make_password
from django.utils import timezone

from leaderboards import actions, lifecycle
from leaderboards.models import Final, FinalStatus

from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .test_browser import SOLUTIONS, browser, platform, shot  # noqa: F401 - fixtures
from .test_first_hour import PASSWORD, log_in
from .test_organiser_walk import confirm, eventually

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def entrant(board, username: str, solution: str, mean: float):
    """A board entry from an earlier (made-up) result, whose code is a real demo solution."""
    user = UserFactory(username=username, password=make_password(PASSWORD))
    code = (SOLUTIONS / solution).read_text() + f"\n# {username}\n"
    for run in submission(board, user=user, code=code).runs.all():
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([mean]))
    return user


@pytest.mark.slow(seconds=70)
def test_a_closed_board_is_provisional_until_its_re_verified_standings_are_published(browser, platform):  # noqa: F811
    base, board = platform
    entrant(board, "quick", "slow.py", 1000.0)  # first on the board, slow on fresh inputs
    entrant(board, "wrong", "wrong.py", 2000.0)  # second on the board, wrong on any input
    entrant(board, "steady", "correct.py", 3000.0)
    actions.do_recompute_ranks(board.pk, board.gpu_types.get().pk)
    # closed three days ago: past the scheduled re-verification's window, so the organiser starts it
    board.deadline, board.final_rounds = timezone.now() - timedelta(days=3), 1
    board.save(update_fields=["deadline", "final_rounds"])
    UserFactory(username="organiser", is_staff=True, is_superuser=True, password=make_password(PASSWORD))

    spectator = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    assert spectator.goto(f"{base}/lb/{board.name}/").status == 200
    assert "Provisional standings" in spectator.inner_text("#final-status")
    assert "provisional" in spectator.inner_text("h2:has(#live-status)")
    shot(spectator, "final-provisional")

    admin = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(admin, base, "organiser", admin=True)
    admin.goto(f"{base}/admin/leaderboards/leaderboard/{board.pk}/change/")
    admin.click("a.kb-action:has-text('Re-verify final standings')")
    confirm(admin)
    final = Final.objects.get()
    eventually(spectator, lambda: spectator.inner_text("#final-status"), lambda text: "runs done" in text)
    # the re-runs end on their own: read the database while they run, reloading no page (each reload of the admin's
    # change page costs this machine's two cores a render, which the re-runs' harness would otherwise have)
    deadline = time.monotonic() + 240
    while (status := Final.objects.get().status) != FinalStatus.DONE:
        assert time.monotonic() < deadline, status
        time.sleep(0.5)
    assert "#final-standings" not in spectator.content() and spectator.locator("#final-standings").count() == 0

    admin.goto(f"{base}/admin/leaderboards/final/{final.pk}/change/")
    compared = admin.inner_text(".field-comparison")
    assert "steady" in compared and "dropped" in compared and "re-run 1 on fresh inputs: failed" in compared
    shot(admin, "final-compare")
    admin.click("a.kb-action:has-text('Publish')")
    confirm(admin)
    assert Final.objects.get().status == FinalStatus.PUBLISHED

    spectator.reload()
    rows = spectator.locator("#final-ranking tbody tr").all_inner_texts()
    ranked = [e.user.username for e in Final.objects.get().entries.filter(rank__isnull=False).order_by("rank")]
    assert sorted(ranked) == ["quick", "steady"]  # both correct kernels kept; the re-runs decided their order
    assert [row.split("\t")[1] for row in rows] == [*ranked, "wrong"]
    assert rows[-1].startswith("–") and "dropped out" in rows[-1] and "failed" not in rows[-1]
    assert "Board before the re-verification" in spectator.inner_text("h2:has(#live-status)")
    assert spectator.locator("#final-status").count() == 0
    shot(spectator, "final-published")

    author = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    log_in(author, base, "wrong")
    author.goto(f"{base}/lb/{board.name}/")
    assert "re-run 1 on fresh inputs: failed" in author.locator("#final-ranking tr.dropped").inner_text()
