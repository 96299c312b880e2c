"""Redis away or hanging never stalls a request nor makes it a 500 (issue 35): the cache, the task broker and the
channel layer, configured as production configures them (kernelbot/settings.py), against a redis-server of the
test's own that is SIGSTOPped (it accepts connections and never answers) or a port nothing listens on. A process pays
one call's timeout per outage window; every call meanwhile fails at once and requests read the database."""

from __future__ import annotations

import pytest
from channels.layers import channel_layers
from django.core.cache import cache
from django.core.files.uploadedfile import SimpleUploadedFile
from redis.exceptions import ConnectionError as RedisConnectionError

from kernelbot import redis_clients
from kernelbot.settings import redis_cache, redis_layer
from leaderboards.models import RunStatus, Submission
from runners import queue

from .factories import UserFactory

GOOD = b"#!POPCORN gpu CPU\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]  # a client without timeouts hangs until this


@pytest.fixture
def production_redis(settings, monkeypatch):
    """Points this process's cache, channel layer and task broker at a Redis URL, as production settings do."""
    def point_at(url: str) -> str:
        settings.CACHES = {"default": redis_cache(url)}
        settings.CHANNEL_LAYERS = {"default": redis_layer(url)}
        settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": url}
        settings.REDIS_RETRY_AFTER = 600  # one window for the whole test, however slow the machine
        channel_layers.backends.clear()
        broker = redis_clients.Broker("kb-outage-test")
        monkeypatch.setattr(queue, "broker", lambda: broker)
        return redis_clients.server(url)

    yield point_at
    channel_layers.backends.clear()


@pytest.fixture
def failures(monkeypatch) -> list[str]:
    """Each time a client waited for Redis in vain (a timeout, a refused connection)."""
    seen: list[str] = []
    mark_away = redis_clients.mark_away
    monkeypatch.setattr(redis_clients, "mark_away", lambda name, error: (seen.append(name), mark_away(name, error)))
    return seen


def submit(client, leaderboard, raw: str, mode: str = "test"):
    return client.post("/api/v1/submissions", {"file": SimpleUploadedFile("add.py", GOOD), "mode": mode,
                                               "leaderboard": leaderboard.name},
                       headers={"Authorization": f"Bearer {raw}"})


@pytest.mark.parametrize("outage", ["hanging", "refusing"])
def test_requests_answer_from_the_database_and_pay_one_timeout(
        outage, request, client, leaderboard, production_redis, failures, django_capture_on_commit_callbacks):
    from leaderboards.access.actions import do_create_token

    if outage == "hanging":
        redis = request.getfixturevalue("redis_server")
        server = production_redis(redis.url)
        alice, bob = UserFactory(), UserFactory()
        alice_raw, bob_raw = do_create_token(alice)[1], do_create_token(bob)[1]
        assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {alice_raw}"}).status_code == 200
        assert cache.keys("*")  # Redis answered: the token is cached there
        redis.hang()
    else:
        server = production_redis(request.getfixturevalue("dead_redis_url"))
        alice, bob = UserFactory(), UserFactory()
        alice_raw, bob_raw = do_create_token(alice)[1], do_create_token(bob)[1]
    for raw, user in ((alice_raw, alice), (bob_raw, bob), (alice_raw, alice)):
        me = client.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"})
        assert me.status_code == 200 and me.json()["username"] == user.username
    with django_capture_on_commit_callbacks(execute=True):  # the wake-up and the live update: lost
        created = submit(client, leaderboard, bob_raw)
    assert created.status_code == 201, created.content
    assert client.get(f"/api/v1/submissions/{created.json()['id']}",
                      headers={"Authorization": f"Bearer {bob_raw}"}).status_code == 200
    # a node agents' run needs no message: the submission dispatched it (its agents find it at their heartbeat)
    assert {run.status for run in Submission.objects.get(pk=created.json()["id"]).runs.all()} == {RunStatus.DISPATCHED}
    # the first call that met the outage waited; every later one (cache reads and writes, the wake-up, the event)
    # was refused at once
    assert failures == [server] and redis_clients.is_away(server)


def test_the_cache_is_used_again_once_redis_is_back(client, redis_server, production_redis, failures, settings):
    server = production_redis(redis_server.url)
    user = UserFactory()
    from leaderboards.access.actions import do_create_token
    raw = do_create_token(user)[1]
    redis_server.hang()
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 200
    with pytest.raises(RedisConnectionError, match="is away"):  # at once: not asked
        cache.get("kb:anything")
    assert failures == [server]
    redis_server.resume()
    settings.REDIS_RETRY_AFTER = 0  # the window has passed
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 200
    assert cache.keys("*") and not redis_clients.is_away(server) and failures == [server]


@pytest.mark.parametrize("outage", ["hanging", "refusing"])
def test_the_site_login_works_while_redis_is_away(outage, request, client, production_redis):
    """allauth's rate limits live in the cache; while Redis is away they are counted in the process instead."""
    if outage == "hanging":
        redis = request.getfixturevalue("redis_server")
        production_redis(redis.url)
        redis.hang()
    else:
        production_redis(request.getfixturevalue("dead_redis_url"))
    user = UserFactory(username="carol")
    user.set_password("correct horse")
    user.save()
    wrong = client.post("/accounts/login/", {"login": "carol", "password": "wrong"})
    assert wrong.status_code == 200 and b"not correct" in wrong.content
    right = client.post("/accounts/login/", {"login": "carol", "password": "correct horse"})
    assert right.status_code == 302 and client.session.get("_auth_user_id") == str(user.pk)


def test_a_result_that_ends_while_redis_hangs_still_reaches_its_board(
        redis_server, production_redis, leaderboard, monkeypatch, settings, django_capture_on_commit_callbacks):
    """A ranked run's result arriving while Redis hangs is stored, but the task that ranks it (its `on_finish`) has
    no message: the reaper sends it again once it is overdue, so the board ends as a rebuild from the runs would be
    (issue 35's fault round: the incremental records went on without it and differed from a rebuild)."""
    from datetime import timedelta

    from django.utils import timezone
    from django_q.conf import Conf

    from leaderboards import lifecycle, ranks
    from leaderboards.models import BoardEntry, Record, Run

    from .factories import submission
    from .leaderboards.test_lifecycle import finish

    production_redis(redis_server.url)
    redis_server.hang()
    sub = submission(leaderboard)
    with django_capture_on_commit_callbacks(execute=True):
        finish(sub, [1000.0])  # both runs pass; their rank tasks meet the hanging broker
    assert not BoardEntry.objects.exists() and Run.objects.filter(hook_due__isnull=False).count() == 2
    redis_server.resume()
    monkeypatch.setattr(Conf, "SYNC", True)  # from here a worker takes every task sent
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.do_reap_overdue_runs(timezone.now() + timedelta(seconds=settings.RUN_HOOK_RESEND - 1))
    assert not BoardEntry.objects.exists()  # not due yet: a slow queue is not a lost message
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.do_reap_overdue_runs(timezone.now() + timedelta(seconds=settings.RUN_HOOK_RESEND + 1))
    assert BoardEntry.objects.get().submission_id == sub.pk and Record.objects.get().submission_id == sub.pk
    assert not Run.objects.filter(hook_due__isnull=False).exists()  # done: not sent again
    assert not ranks.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)  # a rebuild changes nothing
