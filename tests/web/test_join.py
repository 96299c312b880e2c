"""The site's invitation page: a web-only competitor joins closed leaderboards with an invite code."""

from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.access.actions import do_create_invite, do_create_token
from leaderboards.access.models import Invite, Membership
from leaderboards.models import Visibility

from ..factories import LeaderboardFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def closed(leaderboard):
    leaderboard.visibility = Visibility.CLOSED
    leaderboard.save()
    return leaderboard


def test_a_link_shows_the_boards_and_joining_takes_the_post(client, closed):
    other = LeaderboardFactory(problem=closed.problem, visibility=Visibility.CLOSED)
    invite = do_create_invite(closed, more=[other])
    user = UserFactory()
    client.force_login(user)
    assert client.get(f"/lb/{closed.name}/").status_code == 404
    shown = client.get(f"/join/?code={invite.code}")  # a link preview (a GET) never uses the code
    assert shown.status_code == 200 and f"This code opens <strong>{closed.name}</strong>, " \
        f"<strong>{other.name}</strong>." in shown.content.decode()
    assert not Membership.objects.exists() and Invite.objects.get().uses == 0

    joined = client.post("/join/", {"code": f"  {invite.code} "}, follow=True)
    assert joined.redirect_chain == [(f"/lb/{closed.name}/", 302)]
    assert f"You are a member of {closed.name}, {other.name}: you can see and submit to them now." \
        in joined.content.decode()
    assert set(Membership.objects.filter(user=user).values_list("leaderboard", flat=True)) == {closed.pk, other.pk}
    assert client.post("/join/", {"code": invite.code}).status_code == 302  # a member again: no second use
    assert Invite.objects.get().uses == 1


@pytest.mark.parametrize(("make", "status", "why"), [
    (lambda board: "no-such-code", 404, "Unknown invite code: check it for typos"),
    (lambda board: Invite.objects.create(leaderboard=board, expires=timezone.now() - timedelta(days=1)).code,
     410, "This invite code expired on "),
    (lambda board: Invite.objects.create(leaderboard=board, uses=1, max_uses=1).code, 410,
     "This invite code has been used up"),
    (lambda board: "a\x00b", 400, "Null characters are not allowed."),
    (lambda board: "x" * 65, 400, "Ensure this value has at most 64 characters"),
    (lambda board: "", 400, "This field is required."),
])
def test_a_refused_code_says_why_on_the_form(client, closed, make, status, why):
    client.force_login(UserFactory())
    answer = client.post("/join/", {"code": make(closed)})
    assert answer.status_code == status and why in answer.content.decode()
    assert 'class="errorlist' in answer.content.decode() and not Membership.objects.exists()


def test_an_expired_link_says_so_before_the_post(client, closed):
    code = Invite.objects.create(leaderboard=closed, expires=timezone.now() - timedelta(hours=1)).code
    client.force_login(UserFactory())
    answer = client.get(f"/join/?code={code}")
    assert answer.status_code == 410 and "This invite code expired on " in answer.content.decode()
    assert "This code opens" not in answer.content.decode()


def test_anonymous_visitors_sign_in_and_come_back_to_the_link(client, closed):
    code = do_create_invite(closed).code
    answer = client.get(f"/join/?code={code}")
    assert answer.status_code == 302 and answer["Location"].startswith("/accounts/login/?next=")
    assert answer["Location"].endswith(f"next=/join/%3Fcode%3D{code}")


def test_the_api_and_popcorn_refuse_as_the_page_does(client, closed):
    """One rule: /api/v1/join words an expired code as the page does."""
    code = Invite.objects.create(leaderboard=closed, expires=timezone.now() - timedelta(hours=1)).code
    _, token = do_create_token(UserFactory())
    answer = client.post("/api/v1/join", {"code": code}, content_type="application/json",
                         headers={"Authorization": f"Bearer {token}"})
    assert answer.status_code == 410 and "This invite code expired on " in answer.content.decode()


def test_competitors_find_the_page_and_organisers_copy_links_from_the_admin(client, admin_client, closed):
    assert 'href="/join/"' in client.get("/").content.decode()
    client.force_login(UserFactory())
    missing = client.get(f"/lb/{closed.name}/")
    assert missing.status_code == 404 and "Have an invitation code?" in missing.content.decode()
    assert "Have an invitation code?" not in client.get("/s/999999/").content.decode()
    invite = do_create_invite(closed)
    link = f"http://testserver/join/?code={invite.code}"
    assert link in admin_client.get("/admin/leaderboards/invite/").content.decode()
    assert link in admin_client.get(f"/admin/leaderboards/invite/{invite.pk}/change/").content.decode()
