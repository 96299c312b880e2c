"""Rank changes and run progress reach channel-layer groups only after commit."""

import asyncio
import multiprocessing
import threading

import pytest
from asgiref.sync import async_to_sync
from channels.layers import channel_layers, get_channel_layer

from leaderboards import actions, events, lifecycle

from ..factories import ranked_result, submission
from .test_lifecycle import dispatch

pytestmark = pytest.mark.django_db


@pytest.fixture
def redis_layer(settings, redis_url):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": [redis_url], "prefix": "kernelbot-test"}}}
    channel_layers.backends.clear()
    yield get_channel_layer()
    channel_layers.backends.clear()


def listen(layer, group: str) -> str:
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(group, channel)
    return channel


def receive(layer, channel: str) -> dict:
    async def get():
        return await asyncio.wait_for(layer.receive(channel), timeout=5)
    return async_to_sync(get)()


def test_rank_change_is_broadcast_once_after_commit_through_redis(redis_layer, leaderboard, cpu_pool,
                                                                 django_capture_on_commit_callbacks):
    channel = listen(redis_layer, f"leaderboard.{leaderboard.pk}")
    sub = submission(leaderboard)
    for run in sub.runs.all():
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([2000.0]))
    with django_capture_on_commit_callbacks() as callbacks:
        assert actions.do_recompute_ranks(leaderboard.pk, cpu_pool.cpu.pk)
    assert len(callbacks) == 1  # nothing is sent before the transaction commits
    callbacks[0]()
    event = receive(redis_layer, channel)
    assert event["type"] == "leaderboard.ranks" and event["version"] == 1
    assert event["entries"] == [{"user": sub.user_id, "submission": sub.pk, "score": pytest.approx(2e-6),
                                 "rank": 1, "tied": False, "ratio": None}]


def test_run_status_changes_reach_the_submission_group(leaderboard, django_capture_on_commit_callbacks):
    layer = get_channel_layer()
    sub = submission(leaderboard, mode="test")
    channel = listen(layer, f"submission.{sub.pk}")
    run = sub.runs.get()
    with django_capture_on_commit_callbacks(execute=True):
        attempt = dispatch(run)
    event = receive(layer, channel)
    assert (event["type"], event["status"], event["attempt"], event["run"]) == (
        "submission.update", "dispatched", attempt, run.pk)


@pytest.mark.parametrize("backend", ["channels_redis.pubsub.RedisPubSubChannelLayer",
                                     "channels_redis.core.RedisChannelLayer"])
def test_sync_sends_share_one_loop_and_survive_a_fork(backend, settings, redis_url):
    """Workers send from sync code on one loop per process (one Redis connection, not one per send); a forked
    child (django-q's workers) starts its own and its sends arrive too."""
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": backend,
                                           "CONFIG": {"hosts": [redis_url], "prefix": "kernelbot-fork-test"}}}
    channel_layers.backends.clear()
    layer, subscribed, got = get_channel_layer(), threading.Event(), []

    async def listen_for_three() -> None:  # a consumer: its channel and group on its own loop
        channel = await layer.new_channel()
        await layer.group_add("fork-test", channel)
        subscribed.set()
        for _ in range(3):
            got.append(await asyncio.wait_for(layer.receive(channel), timeout=10))

    listener = threading.Thread(target=asyncio.run, args=(listen_for_three(),))
    listener.start()
    assert subscribed.wait(10)
    events.send("fork-test", "test.event", {"n": 1})
    events.send("fork-test", "test.event", {"n": 2})
    loop = events._sender_loop()
    child = multiprocessing.get_context("fork").Process(
        target=lambda: events.send("fork-test", "test.event", {"n": 3, "own": events._sender_loop() is not loop}))
    child.start()
    child.join(30)
    listener.join(15)
    channel_layers.backends.clear()
    assert child.exitcode == 0
    assert [(e["n"], e.get("own")) for e in got] == [(1, None), (2, None), (3, True)]
