"""Websocket consumers: snapshots, versioned deltas, access rules, and delivery across processes."""

import asyncio
import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.utils import timezone

from leaderboards import actions, finals, lifecycle
from leaderboards.models import FinalStatus, Run
from leaderboards.routing import websocket_urlpatterns

from ..conftest import REPO
from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .test_views import ranked_board

app = URLRouter(websocket_urlpatterns)


@pytest.fixture(autouse=True)
def _keep_test_connection(monkeypatch):
    """database_sync_to_async closes stale connections between calls, which would end the test transaction."""
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)


def communicator(path: str, user) -> WebsocketCommunicator:
    ws = WebsocketCommunicator(app, path)
    ws.scope["user"] = user
    return ws


def run(coroutine_function):
    return async_to_sync(coroutine_function)()


@pytest.mark.django_db
def test_leaderboard_consumer_sends_snapshot_then_versioned_deltas(leaderboard, cpu_pool,
                                                                   django_capture_on_commit_callbacks):
    ranked_board(leaderboard, 2)
    gpu = cpu_pool.cpu

    async def scenario():
        ws = communicator(f"/ws/leaderboard/{leaderboard.pk}/{gpu.pk}/", AnonymousUser())
        assert (await ws.connect())[0]
        snapshot = await ws.receive_json_from()
        assert snapshot["type"] == "snapshot" and snapshot["version"] == 1
        assert [e["name"] for e in snapshot["entries"]] == ["racer0", "racer1"]

        def newcomer():
            sub = submission(leaderboard, user=UserFactory(username="speedy"))
            for r in sub.runs.all():
                lifecycle.do_ingest_result(r.pk, dispatch(r), ranked_result([500.0]))
            with django_capture_on_commit_callbacks(execute=True):
                actions.do_recompute_ranks(leaderboard.pk, gpu.pk)
        await database_sync_to_async(newcomer)()
        delta = await ws.receive_json_from(timeout=5)
        assert delta["type"] == "delta" and delta["version"] == 2 and delta["removed"] == []
        by_name = {e["name"]: e["rank"] for e in delta["entries"]}
        assert by_name == {"speedy": 1, "racer0": 2, "racer1": 3}  # only rows that changed travel
        # what the records' figures are travels with them: the page's chart labels its axis by it (the walk in
        # test_competition_walk.py found a live chart plotting ratios labelled as seconds)
        assert delta["records"] and delta["records_on_ratio"] is False
        await ws.send_json_to({"type": "resync"})
        assert (await ws.receive_json_from())["version"] == 2
        await ws.disconnect()
    run(scenario)


@pytest.mark.django_db
def test_leaderboard_consumer_refuses_unknown_or_closed_boards(leaderboard, cpu_pool):
    async def scenario():
        for path in (f"/ws/leaderboard/{leaderboard.pk}/999/", f"/ws/leaderboard/999/{cpu_pool.cpu.pk}/"):
            ws = communicator(path, AnonymousUser())
            connected, code = await ws.connect()
            assert not connected and code == 4404
    run(scenario)


@pytest.mark.django_db
def test_submission_consumer_streams_to_whoever_may_see_it(leaderboard, django_capture_on_commit_callbacks):
    sub = submission(leaderboard, mode="leaderboard")
    private = submission(leaderboard, user=sub.user, mode="test")
    staff, nosy = UserFactory(username="staff", is_staff=True), UserFactory(username="nosy")

    async def scenario():
        for path in (f"/ws/submission/{private.pk}/", "/ws/submission/999999/"):
            ws = communicator(path, nosy)
            assert (await ws.connect())[1] == 4404  # as if it did not exist, like the page and the API
        for user in (sub.user, staff, nosy):  # a ranked submission is as visible as its leaderboard
            ws = communicator(f"/ws/submission/{sub.pk}/", user)
            assert (await ws.connect())[0]
            snapshot = await ws.receive_json_from()
            assert {r["status"] for r in snapshot["runs"]} == {"queued"}
            await ws.disconnect()
        ws = communicator(f"/ws/submission/{sub.pk}/", sub.user)
        await ws.connect()
        await ws.receive_json_from()

        def finish():
            for r in sub.runs.all():
                with django_capture_on_commit_callbacks(execute=True):
                    lifecycle.do_ingest_result(r.pk, dispatch(r), ranked_result([800.0]))
        await database_sync_to_async(finish)()
        seen = {}
        while len(seen) < 2 or any(s["status"] != "succeeded" for s in seen.values()):
            msg = await ws.receive_json_from(timeout=5)
            seen[msg["run"]] = msg
        secret = [m for m in seen.values() if m["secret"]][0]
        public = [m for m in seen.values() if not m["secret"]][0]
        assert secret["score"] is None and public["score"] == pytest.approx(8e-7)
        await ws.disconnect()
    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_event_written_by_another_process_reaches_a_websocket_client(postgres, leaderboard, cpu_pool):
    """The embedded setup: per-process in-memory layers, bridged by the LiveEvent outbox."""
    db = connection.settings_dict
    url = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"} | {"DATABASE_URL": url}
    script = ("import django; django.setup(); from leaderboards import events; "
              f"events.board_changed({leaderboard.pk}, {cpu_pool.cpu.pk}, 1, "
              "[{'user': 1, 'submission': 7, 'score': 1e-6, 'rank': 1}])")
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"].endswith("InMemoryChannelLayer")

    async def scenario():
        ws = communicator(f"/ws/leaderboard/{leaderboard.pk}/{cpu_pool.cpu.pk}/", AnonymousUser())
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from())["version"] == 0
        await asyncio.sleep(0.5)  # the tailer has read its starting point
        worker = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=REPO, env=env)
        assert await worker.wait() == 0
        delta = await ws.receive_json_from(timeout=5)
        assert delta["type"] == "delta" and delta["version"] == 1 and delta["entries"][0]["submission"] == 7
        await ws.disconnect()
    run(scenario)


@pytest.mark.django_db(transaction=True)
def test_event_from_another_process_arrives_through_the_redis_layer(redis_url, postgres, leaderboard, cpu_pool,
                                                                    settings):
    """With REDIS_URL (the production default, channels-redis pubsub): no outbox, Redis carries it."""
    from channels.layers import channel_layers

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
                                           "CONFIG": {"hosts": [redis_url], "prefix": "kernelbot-web-test"}}}
    channel_layers.backends.clear()
    db = connection.settings_dict
    env = {**os.environ, "REDIS_URL": redis_url,
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"}
    script = ("import django; django.setup(); from django.conf import settings; "
              "settings.CHANNEL_LAYERS['default']['CONFIG']['prefix'] = 'kernelbot-web-test'; "
              "from leaderboards import events, models; "
              f"[events.board_changed({leaderboard.pk}, {cpu_pool.cpu.pk}, v, []) for v in (1, 2)]; "
              "assert not models.LiveEvent.objects.exists()")

    async def scenario():
        ws = communicator(f"/ws/leaderboard/{leaderboard.pk}/{cpu_pool.cpu.pk}/", AnonymousUser())
        assert (await ws.connect())[0]
        await ws.receive_json_from()
        worker = await asyncio.create_subprocess_exec(sys.executable, "-c", script, cwd=REPO, env=env)
        assert await worker.wait() == 0
        assert [(await ws.receive_json_from(timeout=5))["version"] for _ in range(2)] == [1, 2]
        await ws.disconnect()
    try:
        run(scenario)
    finally:
        channel_layers.backends.clear()


def deployment_layers(**environ: str) -> dict:
    """The channel layer and cache settings a deployment with this environment gets (a fresh interpreter)."""
    script = ("import json, django; django.setup(); from django.conf import settings; "
              "print(json.dumps([settings.CHANNEL_LAYERS['default'], settings.CACHES['default']]))")
    env = {k: v for k, v in os.environ.items() if k != "KERNELBOT_INSTANCE"} | environ
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_deployments_sharing_a_redis_server_do_not_hear_each_other(redis_url):
    """Redis pub/sub ignores the database number: each deployment's channels carry its own prefix."""
    from channels_redis.pubsub import RedisPubSubChannelLayer

    server = redis_url.rsplit("/", 1)[0]
    production, _ = deployment_layers(REDIS_URL=f"{server}/6", DATABASE_URL="postgres://db/kernelbot")
    staging, staging_cache = deployment_layers(REDIS_URL=f"{server}/7", DATABASE_URL="postgres://db/kernelbot")
    named, _ = deployment_layers(REDIS_URL=f"{server}/6", DATABASE_URL="postgres://db/kernelbot",
                                 KERNELBOT_INSTANCE="prod-eu")
    prefixes = {production["CONFIG"]["prefix"], staging["CONFIG"]["prefix"], named["CONFIG"]["prefix"]}
    assert len(prefixes) == 3 and staging_cache["KEY_PREFIX"] == staging["CONFIG"]["prefix"]

    def layer(config: dict) -> RedisPubSubChannelLayer:
        # the deployment's prefix on this test's Redis server and database, so nothing leaves it
        return RedisPubSubChannelLayer(hosts=[redis_url], prefix=config["CONFIG"]["prefix"] + ".test")

    async def scenario():
        listener, neighbour, colleague = layer(production), layer(staging), layer(production)
        channel = await listener.new_channel()
        await listener.group_add("leaderboard.1", channel)
        try:
            await neighbour.group_send("leaderboard.1", {"type": "leaderboard.ranks", "from": "staging"})
            await colleague.group_send("leaderboard.1", {"type": "leaderboard.ranks", "from": "production"})
            received = await asyncio.wait_for(listener.receive(channel), 5)
            assert received["from"] == "production"
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(listener.receive(channel), 0.5)
        finally:
            for each in (listener, neighbour, colleague):
                await each.flush()
    run(scenario)


@pytest.mark.django_db
def test_an_open_board_page_hears_its_final_standings_start_and_get_published(leaderboard, cpu_pool, monkeypatch,
                                                                            django_capture_on_commit_callbacks):
    """Issue 36, item 3: the board's socket says when its final standings start, move on and are published, and its
    snapshot names the standings shown, for a page that missed an event."""
    monkeypatch.setattr("leaderboards.tasks.dispatch_run", lambda run_id: None)
    ranked_board(leaderboard, 2)
    leaderboard.deadline, leaderboard.final_rounds = timezone.now() - timedelta(minutes=1), 1
    leaderboard.save(update_fields=["deadline", "final_rounds"])
    gpu = cpu_pool.cpu

    def start():
        with django_capture_on_commit_callbacks(execute=True):
            final = finals.do_start_final(leaderboard)
            finals.advance(final.pk, gpu.pk)
        return final

    def finish_next():
        run = Run.objects.filter(submission__final_entry__isnull=False, status="queued").order_by("pk").first()
        with django_capture_on_commit_callbacks(execute=True):
            lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([800.0]))
            finals.run_finished(run.pk)

    async def scenario():
        ws = communicator(f"/ws/leaderboard/{leaderboard.pk}/{gpu.pk}/", AnonymousUser())
        assert (await ws.connect())[0]
        assert (await ws.receive_json_from())["final"] == "/"  # no standings yet
        final = await database_sync_to_async(start)()
        assert await ws.receive_json_from(timeout=5) == {"type": "final", "final": final.pk, "status": "running"}
        await ws.send_json_to({"type": "resync"})
        assert (await ws.receive_json_from())["final"] == f"/{final.pk}"
        await database_sync_to_async(finish_next)()  # the first of two re-runs: the page's progress moves on
        assert await ws.receive_json_from(timeout=5) == {"type": "final", "final": final.pk, "status": "running"}
        await database_sync_to_async(finish_next)()  # the last: settled and published at once (the deadline's)
        assert await ws.receive_json_from(timeout=5) == {"type": "final", "final": final.pk, "status": "published"}
        assert await ws.receive_nothing(timeout=0.2)
        await ws.send_json_to({"type": "resync"})
        assert (await ws.receive_json_from())["final"] == f"{final.pk}/"
        await ws.disconnect()
        return final
    final = run(scenario)
    final.refresh_from_db()
    assert final.status == FinalStatus.PUBLISHED
