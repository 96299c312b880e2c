"""What every submission reads is kept in Django's cache, and an edit drops only what it changes."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.contrib.auth.models import AnonymousUser
from django.core.cache import cache
from django.db import connection
from django.utils import timezone

from leaderboards.access import cache as access_cache
from leaderboards.access.actions import authenticate_token, check_may_submit, do_create_token, do_revoke_token
from leaderboards.access.authority import access_leaderboard, may_see_leaderboard, may_see_submission
from leaderboards.access.models import ApiToken, Membership, SubmissionQuota
from leaderboards.errors import SubmissionRejected
from leaderboards.models import Leaderboard, Profile, Submission, Visibility

from ..conftest import REPO
from ..factories import UserFactory, submission

pytestmark = pytest.mark.django_db


def test_a_user_save_keeps_everyone_elses_cached_reads(leaderboard, django_assert_num_queries):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    alice_raw, bob_raw = do_create_token(alice)[1], do_create_token(bob)[1]
    assert authenticate_token(alice_raw) == alice and authenticate_token(bob_raw) == bob
    access_leaderboard(alice, leaderboard.name, for_submit=True)
    bob.last_name = "renamed"
    bob.save()  # e.g. a profile edit: bob's token is read again, nothing else
    with django_assert_num_queries(0):
        assert authenticate_token(alice_raw) == alice
        assert access_leaderboard(alice, leaderboard.name, for_submit=True) == leaderboard
    with django_assert_num_queries(1):
        assert authenticate_token(bob_raw).last_name == "renamed"
    bob.is_active = False
    bob.save()
    assert authenticate_token(bob_raw) is None  # at once, not after the cache's 2 s
    Profile.objects.create(user=alice, display_name="Al")  # the first submission creates it
    assert authenticate_token(alice_raw).profile.display_name == "Al"


def test_revocation_quota_and_visibility_edits_apply_at_once(leaderboard):
    user = UserFactory()
    token, raw = do_create_token(user)
    assert authenticate_token(raw) == user
    assert do_revoke_token(user, token.pk)
    assert authenticate_token(raw) is None
    check_may_submit(user, leaderboard, "test")  # caches the board's quotas (none: the defaults)
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="test", max_submissions=1, window_seconds=60)
    submission(leaderboard, user=user, mode="test")
    with pytest.raises(SubmissionRejected, match="at most 1 test submission"):
        check_may_submit(user, leaderboard, "test")
    access_leaderboard(user, leaderboard.name, for_submit=True)
    leaderboard.visibility = Visibility.CLOSED
    leaderboard.save()
    with pytest.raises(SubmissionRejected, match="Unknown leaderboard"):
        access_leaderboard(user, leaderboard.name, for_submit=True)


@pytest.mark.django_db(transaction=True)
def test_with_redis_a_revocation_in_another_process_applies_at_once_here(redis_url, postgres, settings):
    """The shared cache: another process's revocation deletes the entry this process would otherwise reuse."""
    prefix = f"kb-cache-test-{os.getpid()}"
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": redis_url, "KEY_PREFIX": prefix}}
    user = UserFactory()
    token, raw = do_create_token(user)
    try:
        assert authenticate_token(raw) == user and cache.get(access_cache.token_key(token.digest)) is not None
        db = connection.settings_dict
        script = ("import django; django.setup(); from django.conf import settings; "
                  f"settings.CACHES['default']['KEY_PREFIX'] = {prefix!r}; "
                  "from django.contrib.auth import get_user_model; "
                  "from leaderboards.access.actions import do_revoke_token; "
                  f"assert do_revoke_token(get_user_model().objects.get(pk={user.pk}), {token.pk})")
        env = {**os.environ, "REDIS_URL": redis_url,
               "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"}
        subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, check=True, timeout=60)
        assert authenticate_token(raw) is None  # no 2 s wait: the other process deleted the shared entry
    finally:
        cache.delete(access_cache.token_key(token.digest))  # not clear(): that would flush the whole Redis database


@pytest.fixture
def people(db):
    return {"anonymous": AnonymousUser(), "staff": UserFactory(username="staff", is_staff=True),
            "owner": UserFactory(username="owner"), "member": UserFactory(username="member"),
            "outsider": UserFactory(username="outsider")}


@pytest.mark.parametrize("visibility", Visibility.values)
def test_querysets_and_checks_are_the_same_rule(leaderboard, people, visibility):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=visibility)
    leaderboard.refresh_from_db()
    Membership.objects.create(leaderboard=leaderboard, user=people["member"])
    subs = [submission(leaderboard, user=people["owner"], mode=mode) for mode in ("leaderboard", "test")]
    for name, user in people.items():
        boards = set(Leaderboard.objects.visible_to(user))
        assert (leaderboard in boards) == may_see_leaderboard(user, leaderboard), name
        visible = set(Submission.objects.visible_to(user))
        for sub in subs:
            assert (sub in visible) == may_see_submission(user, sub), (name, sub.mode)
    closed = visibility == Visibility.CLOSED
    assert may_see_leaderboard(people["outsider"], leaderboard) is not closed
    assert may_see_submission(people["member"], subs[0]) and not may_see_submission(people["member"], subs[1])
    assert may_see_submission(people["owner"], subs[1]) and may_see_submission(people["staff"], subs[1])


def test_a_token_unused_for_a_minute_is_recorded_with_the_cache_away(client, settings, dead_redis_url):
    """Its use is written to the database and the cache's copy; the cache's refusal must not turn into a 500."""
    user = UserFactory()
    token, raw = do_create_token(user)
    ApiToken.objects.filter(pk=token.pk).update(last_used=timezone.now() - timedelta(minutes=5))
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": dead_redis_url}}
    response = client.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"})
    assert response.status_code == 200 and response.json()["username"] == user.username
    assert timezone.now() - ApiToken.objects.get(pk=token.pk).last_used < timedelta(minutes=1)
