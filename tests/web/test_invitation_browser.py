"""In a real browser (Debian's chromium driven by Playwright), at 390 px: a competitor who uses only the site joins a
closed leaderboard through an organiser's invitation link. Signed out, the link sends them to log in and back; the page
names the board the code opens; joining opens it; a used-up code says so on the form."""

from __future__ import annotations

import pytest

from leaderboards.access.actions import do_create_invite
from leaderboards.access.models import Membership
from leaderboards.models import Visibility

from ..factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from
from .test_browser import browser, shot  # noqa: F401 - fixtures

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
PASSWORD = "kernels-are-fun-42"


@pytest.fixture
def invited(live_server, demo_task, monkeypatch):
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # Playwright's sync API runs an event loop
    board = LeaderboardFactory(name="members-only", problem=problem_from(demo_task), visibility=Visibility.CLOSED,
                               gpu_types=[local_cpu_pool().cpu])
    user = UserFactory(username="web-only-competitor")
    user.set_password(PASSWORD)
    user.save()
    spent = do_create_invite(board)
    Membership.objects.create(leaderboard=board, user=UserFactory(), invite=spent)
    spent.uses = 1
    spent.save()
    return live_server.url, board, user, do_create_invite(board).code, spent.code


def test_a_web_only_user_joins_a_closed_board_through_the_invitation_page(invited, browser):  # noqa: F811
    base, board, user, code, spent = invited
    page = browser.new_context(viewport={"width": 390, "height": 844}).new_page()

    page.goto(f"{base}/join/?code={code}")  # the organiser's link, signed out: log in first, then back
    page.wait_for_url(f"{base}/accounts/login/**")
    page.fill("input[name=login]", user.username)
    page.fill("input[name=password]", PASSWORD)
    page.click("form [type=submit]")
    page.wait_for_url(f"{base}/join/?code={code}")
    assert page.text_content("#invite-boards") == f"This code opens {board.name}."
    assert page.input_value("input[name=code]") == code and not Membership.objects.filter(user=user).exists()
    assert page.evaluate("document.documentElement.scrollWidth - window.innerWidth") <= 0
    shot(page, "narrow-join")

    page.fill("input[name=code]", spent)  # another one's code, used up: the form says so
    page.click("#join button[type=submit]")
    assert "This invite code has been used up" in page.text_content("#join .errorlist")

    page.fill("input[name=code]", code)
    page.click("#join button[type=submit]")
    page.wait_for_url(f"{base}/lb/{board.name}/")
    assert f"You are a member of {board.name}" in page.text_content(".flash")
    assert Membership.objects.filter(user=user, leaderboard=board).exists()
    page.goto(f"{base}/")
    assert page.locator(f"table.boards a[href='/lb/{board.name}/']").count() == 1
