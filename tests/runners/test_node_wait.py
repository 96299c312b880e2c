"""Node agents wait for work instead of polling (issue 42): `nodes/wait` is held open by the ASGI server and woken
when a run is dispatched to the node's pool (runners.wakeups), so an idle fleet costs one cheap ask per node per
heartbeat and a queued run is claimed at once; claims stay exactly-once with several web workers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from asgiref.testing import ApplicationCommunicator
from django.db import connection
from django.utils import timezone

from kernelbot.handlers import SyncWorkerASGIHandler
from leaderboards import lifecycle, runner_api
from leaderboards.models import Run, RunAttempt, RunStatus
from leaderboards.runner_api import node_answer
from runners import wakeups
from runners.harness import node as node_module
from runners.harness.node import NodeAgent, node_token
from runners.models import Gpu, GpuType, Node
from runners.reservations.models import Reservation

from ..conftest import RUNNER_KEY
from ..factories import UserFactory
from ..servers import granian, production_env
from .test_node_agent import dispatch_all, new_key, reservation_hold, submit


def wait_scope(body: bytes) -> tuple[dict, bytes]:
    token = node_token(RUNNER_KEY, "local", "localhost")
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/api/runner/v1/nodes/wait", "raw_path": b"/api/runner/v1/nodes/wait", "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
            "headers": [(b"host", b"testserver"), (b"content-type", b"application/json"),
                        (b"authorization", f"Bearer {token}".encode())]}, body


async def ask(body: dict, *, during=None) -> tuple[int, dict, float]:
    """POST nodes/wait through the ASGI handler in this process; `during` (sync) runs on another thread once the
    ask waits. Returns the status, the answer and how long it took."""
    scope, raw = wait_scope(json.dumps(body).encode())
    comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
    started = time.monotonic()
    await comm.send_input({"type": "http.request", "body": raw, "more_body": False})
    if during is not None:
        await asyncio.sleep(1.0)
        await sync_to_async(during, thread_sensitive=False)()
    start = await comm.receive_output(30)
    message = await comm.receive_output(30)
    return start["status"], json.loads(message["body"]), time.monotonic() - started


@pytest.mark.django_db(transaction=True)
def test_an_idle_nodes_wait_is_held_until_its_heartbeat_and_marks_its_agent_live(cpu_pool, settings):
    settings.NODE_WAIT = 1.5
    node = cpu_pool.nodes.get()
    Node.objects.filter(pk=node.pk).update(agent_seen_at=None)
    status, answer, took = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [0], "wait": 60}))
    assert status == 200, answer
    assert answer == {"claims": [], "reserved": [], "reservations": [], "keys": [], "again": True}
    assert 1.4 <= took < 5  # held for NODE_WAIT, not the 60 s asked
    node.refresh_from_db()
    assert node.agent_live()


@pytest.mark.django_db(transaction=True)
def test_a_waiting_node_is_woken_by_a_dispatched_run_and_claims_it_at_once(leaderboard, cpu_pool, settings):
    settings.NODE_WAIT = 20
    submission = submit(leaderboard)
    status, answer, took = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [0], "wait": 20},
                                           during=dispatch_all))
    assert status == 200, answer
    run = submission.runs.get()
    assert [c["run"] for c in answer["claims"]] == [run.pk] and answer["claims"][0]["devices"] == [0]
    assert took < 10  # woken, not at its heartbeat 20 s on
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


@pytest.mark.django_db(transaction=True)
def test_a_held_wait_is_answered_afresh_when_a_reservation_on_the_node_ends(cpu_pool, settings):
    """Nothing wakes the node at a reservation's expiry (the reaper has not run): its held wait ends then by itself
    and answers without the reservation, so the agent kills its processes at once, not at its heartbeat."""
    settings.NODE_WAIT = 20
    hold = reservation_hold(cpu_pool.nodes.get(), UserFactory())
    ends_at = timezone.now() + timedelta(seconds=1.5)
    Reservation.objects.filter(pk=hold.reservation_id).update(ends_at=ends_at)
    status, answer, took = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [], "wait": 20}))
    assert status == 200, answer
    assert answer["reservations"] == [] and answer["reserved"] == [] and answer["again"] is True
    assert timezone.now() >= ends_at and took < 10  # at its end, not at the heartbeat 15 s on
    assert Reservation.objects.get(pk=hold.reservation_id).status == "active"


@pytest.mark.django_db(transaction=True)
def test_a_lost_wake_up_is_caught_by_the_next_heartbeat(leaderboard, cpu_pool, settings, monkeypatch):
    settings.NODE_WAIT = 1.5
    monkeypatch.setattr("runners.wakeups.publish", lambda keys: None)  # Redis away: every message lost
    monkeypatch.setattr(lifecycle, "dispatch_here", lambda run_id: None)  # dispatched below, while the agent waits
    submission = submit(leaderboard)
    body = {"pool": "local", "hostname": "localhost", "free": [0], "wait": 20}
    status, answer, took = asyncio.run(ask(body, during=dispatch_all))
    assert (status, answer["claims"], answer["again"]) == (200, [], True) and took >= 1.4  # its heartbeat came
    status, answer, took = asyncio.run(ask(body))  # the agent asks again at once
    assert [c["run"] for c in answer["claims"]] == [submission.runs.get().pk] and took < 1


@pytest.mark.django_db(transaction=True)
def test_without_redis_a_run_dispatched_by_another_process_wakes_the_wait_through_the_wake_file(
        leaderboard, cpu_pool, settings, monkeypatch, tmp_path):
    settings.NODE_WAIT, settings.REDIS_URL, settings.DATA_DIR = 20, "", tmp_path
    published = []
    monkeypatch.setattr("runners.wakeups.publish", published.append)  # not this process's waiters: another's

    def another_process_dispatches():
        dispatch_all()
        wakeups.wake_file().write_text(" ".join(published[0]))  # what publish writes there without Redis

    submission = submit(leaderboard)
    status, answer, took = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [0], "wait": 20},
                                           during=another_process_dispatches))
    assert [c["run"] for c in answer["claims"]] == [submission.runs.get().pk] and took < 5, answer


@pytest.mark.django_db(transaction=True)
def test_a_waiting_node_learns_at_once_of_a_new_key_of_a_reservation_on_it(cpu_pool, settings, tmp_path):
    settings.NODE_WAIT = 20
    node, holder = cpu_pool.nodes.get(), UserFactory()
    Gpu.objects.create(node=node, gpu_type=cpu_pool.cpu, index=1)
    reservation_hold(node, holder, index=1)
    status, answer, took = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [0], "wait": 20},
                                           during=lambda: new_key(holder, tmp_path)))
    assert status == 200 and took < 10, answer
    assert answer["reserved"] == [1] and [len(entry["keys"]) for entry in answer["keys"]] == [1]


@pytest.mark.django_db(transaction=True)
def test_bad_asks_to_wait_get_the_precise_refusals_of_poll(cpu_pool):
    for body, expected in (({"pool": "local", "hostname": "localhost", "free": ["x"], "wait": 5}, 400),
                           ({"pool": "local", "hostname": "nowhere", "free": [0], "wait": 5}, 403),
                           ({"pool": "local\x00", "hostname": "localhost"}, 400)):
        status, answer, took = asyncio.run(ask(body))
        assert (status, took < 3) == (expected, True), answer
        assert answer["detail"]
    scope, _ = wait_scope(b"[1, 2")

    async def broken():
        comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
        await comm.send_input({"type": "http.request", "body": b"[1, 2", "more_body": False})
        return (await comm.receive_output(10))["status"], json.loads((await comm.receive_output(10))["body"])

    status, answer = asyncio.run(broken())
    assert status == 400 and "not JSON" in answer["detail"]


class Recorder(NodeAgent):
    """The real agent's wire protocol (`poll(wait)` over HTTP); claimed runs are recorded, not run."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, warm=False, **kwargs)
        self.claimed: list[int] = []

    def start(self, claim: dict, *, wait: bool = False) -> None:
        self.claimed.append(claim["run"])
        with self.lock:
            for index in claim["devices"]:
                self.busy[index] = (claim["run"], claim["attempt"])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_several_web_workers_and_many_waiting_agents_claim_every_run_once_and_at_once(
        leaderboard, cpu_pool, tmp_path, postgres, redis_url):
    """Three granian workers on PostgreSQL + Redis, twelve waiting agents of two devices: 20 runs dispatched from
    another process are each claimed by exactly one agent, within seconds (the waits are 20 s)."""
    nodes = []
    for n in range(12):
        node = Node.objects.create(pool=cpu_pool, hostname=f"n{n}")
        Gpu.objects.bulk_create(Gpu(node=node, gpu_type=cpu_pool.cpu, index=i) for i in range(2))
        nodes.append(node)
    Node.objects.filter(hostname="localhost").update(enabled=False)
    env = production_env(tmp_path, REDIS_URL=redis_url, KERNELBOT_RUNNER_KEY=RUNNER_KEY, KERNELBOT_NODE_WAIT="20")
    connection.close()
    with granian(env, tmp_path / "granian.log", workers=3) as url:
        agents = [Recorder(url, "local", node.hostname, node_token(RUNNER_KEY, "local", node.hostname))
                  for node in nodes]
        for agent in agents:
            agent.devices = [0, 1]
        stop = threading.Event()

        def serve(agent: Recorder) -> None:
            with contextlib.suppress(Exception):  # the server stops under the last waits
                while not stop.is_set():
                    agent.poll(20)

        threads = [threading.Thread(target=serve, args=(agent,), daemon=True) for agent in agents]
        for thread in threads:
            thread.start()
        time.sleep(3)  # every agent waits
        runs = [submit(leaderboard).runs.get().pk for _ in range(20)]
        started = time.monotonic()
        dispatch_all()
        while sum(len(a.claimed) for a in agents) < 20 and time.monotonic() - started < 15:
            time.sleep(0.05)
        took = time.monotonic() - started
        stop.set()
    claimed = [run for agent in agents for run in agent.claimed]
    assert sorted(claimed) == sorted(runs), claimed  # every run, none twice
    assert took < 10
    assert set(Run.objects.filter(pk__in=runs).values_list("status", flat=True)) == {RunStatus.RUNNING}
    for run in runs:
        attempts = RunAttempt.objects.filter(run_id=run)
        assert attempts.count() == 1 and attempts.get().external_id.startswith("node:")


def test_an_agent_polls_a_platform_older_than_nodes_wait():
    asked = []

    def older_platform(method, url, data, headers):
        route = url.rsplit("/", 1)[1]
        asked.append(route)
        if route == "wait":
            return 404, b'{"detail": "Not Found"}'
        return 200, json.dumps({"claims": [], "reserved": []}).encode()

    agent = NodeAgent("http://old", "local", "h", "t", transport=older_platform, warm=False)
    agent.devices = [0]
    agent.poll(agent.wait_s)
    agent.poll(agent.wait_s)
    assert asked == ["wait", "poll", "poll"] and agent.wait_s == 0


def node_auth() -> str:
    return f"Bearer {node_token(RUNNER_KEY, 'local', 'localhost')}"


@pytest.mark.django_db(transaction=True)
def test_samples_are_written_only_when_the_agent_sends_new_ones(cpu_pool, settings):
    """The agent sends its devices' samples every 15 s at most (the agent test below); an ask with them writes them
    with the heartbeats (within `SEEN_EVERY`), one without them leaves them as they were (an idle ask stays one
    query)."""
    settings.NODE_WAIT = 20
    node = cpu_pool.nodes.get()
    sample = {"index": 0, "utilization": 0.25, "memory_used": 1 << 30, "memory_total": 80 << 30}
    read = sync_to_async(lambda: Node.objects.get(pk=node.pk).samples)

    async def scenario():
        status, answer, _ = await ask({"pool": "local", "hostname": "localhost", "free": [0], "samples": [sample]})
        assert status == 200, answer
        deadline = time.monotonic() + 10 * wakeups.SEEN_EVERY
        while not (sent := await read()) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        status, answer, _ = await ask({"pool": "local", "hostname": "localhost", "free": [0]})
        assert status == 200, answer
        await asyncio.sleep(2 * wakeups.SEEN_EVERY)  # the heartbeats of the second ask written
        return sent, await read()

    assert asyncio.run(scenario()) == ([sample], [sample])


@pytest.mark.django_db(transaction=True)
def test_a_woken_ask_that_cannot_claim_hands_the_wake_on_while_the_run_waits(leaderboard, cpu_pool):
    """A woken node that claims nothing (here: disabled meanwhile) passes the wake to the next waiter, whatever
    kept it from claiming; the run is not left to the heartbeats."""
    submission = submit(leaderboard)
    dispatch_all()
    Node.objects.filter(hostname="localhost").update(enabled=False)
    key = f"pool:{cpu_pool.pk}:{cpu_pool.cpu.pk}"

    async def scenario():
        await wakeups.waiters.ready()
        other = wakeups.Waiter([key])
        wakeups.waiters.add(other)
        body = {"pool": "local", "hostname": "localhost", "free": [0]}
        answer = await sync_to_async(node_answer)(node_auth(), body, woken=(key, 1))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(other.event.wait(), 3)
        wakeups.waiters.remove(other)
        return answer[0], other

    answer, other = asyncio.run(scenario())
    assert answer["claims"] == [] and submission.runs.get().status == RunStatus.DISPATCHED
    assert other.event.is_set() and other.baton == (key, 0)


@pytest.mark.django_db
def test_the_pools_cached_reading_is_stale_once_a_wake_up_came(leaderboard, cpu_pool, monkeypatch):
    """An ask told to ask again (a wake-up came while it looked) must not be answered from the reading before it."""
    monkeypatch.setattr(runner_api, "_pools", {})
    assert runner_api._pool_state(cpu_pool.pk, False)[0] == {}
    submit(leaderboard)
    dispatch_all()
    wakeups.waiters.seq += 1  # what the dispatch's wake-up does in this process
    assert runner_api._pool_state(cpu_pool.pk, False)[0] == {None: {cpu_pool.cpu.pk}}  # a run any node may claim


@pytest.mark.django_db
def test_the_cached_device_types_give_way_to_what_a_claim_reads_and_still_expire(leaderboard, cpu_pool, monkeypatch):
    node = cpu_pool.nodes.get()
    submit(leaderboard)
    dispatch_all()
    read = time.monotonic() - 50
    monkeypatch.setitem(runner_api._types, node.pk, (read, {0: 999999}))  # stale: device 0 is another type now
    answer = runner_api.node_answer(node_auth(), {"pool": "local", "hostname": "localhost", "free": [0]})[0]
    assert len(answer["claims"]) == 1
    assert runner_api._types[node.pk] == (read, {0: cpu_pool.cpu.pk})  # the fresh type, the old reading's time


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_error_in_a_wait_is_a_logged_json_500(cpu_pool, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(runner_api, "node_answer", broken)
    status, answer, _ = asyncio.run(ask({"pool": "local", "hostname": "localhost", "free": [0], "wait": 5}))
    assert status == 500 and "internal error" in answer["detail"]
    assert any("a bug" in (record.exc_text or "") or record.exc_info for record in caplog.records)


@pytest.mark.django_db(transaction=True)
def test_without_redis_the_wake_file_is_watched_for_a_waiter_added_after_a_slow_look(settings, tmp_path):
    settings.REDIS_URL, settings.DATA_DIR = "", tmp_path

    async def scenario():
        await wakeups.waiters.ready()  # as a wait does before it looks
        await asyncio.sleep(wakeups.FILE_CHECK_S * 3)  # a slow look, no one waiting meanwhile
        waiter = wakeups.Waiter(["node:1"])
        wakeups.waiters.add(waiter)
        wakeups.wake_file().write_text("pool:1:1")  # another process dispatched a run
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(waiter.event.wait(), wakeups.FILE_CHECK_S * 6)
        wakeups.waiters.remove(waiter)
        return waiter.event.is_set()

    assert asyncio.run(scenario())


def test_the_agent_samples_its_devices_at_most_every_15_seconds_and_sends_only_new_samples(monkeypatch):
    bodies, taken = [], []

    def platform(method, url, data, headers):
        bodies.append(json.loads(data))
        return 200, json.dumps({"claims": [], "reserved": []}).encode()

    def sample():
        taken.append(time.monotonic())
        return [{"index": 0, "utilization": 0.1, "memory_used": 1, "memory_total": 2}]

    monkeypatch.setattr(node_module, "gpu_samples", sample)
    agent = NodeAgent("http://p", "local", "h", "t", transport=platform, warm=False)
    agent.devices = [0]
    for _ in range(3):
        agent.poll()
    assert len(taken) == 1 and ["samples" in body for body in bodies] == [True, False, False]
    agent.sampled -= node_module.SAMPLE_S  # 15 s on
    agent.poll()
    assert len(taken) == 2 and "samples" in bodies[-1]


@pytest.mark.django_db(transaction=True)
def test_a_wait_woken_as_its_client_leaves_hands_the_wake_on(cpu_pool, settings):
    settings.NODE_WAIT = 20
    key = f"pool:{cpu_pool.pk}:{cpu_pool.cpu.pk}"

    async def scenario():
        scope, raw = wait_scope(json.dumps({"pool": "local", "hostname": "localhost", "free": [0], "wait": 20}
                                           ).encode())
        comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
        await comm.send_input({"type": "http.request", "body": raw, "more_body": False})
        await asyncio.sleep(1.0)  # it waits, the oldest waiter for the key
        other = wakeups.Waiter([key])
        wakeups.waiters.add(other)
        wakeups.waiters.hand_on(key, 2)  # woken by a dispatched run ...
        await comm.send_input({"type": "http.disconnect"})  # ... as its client goes
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(other.event.wait(), 3)
        wakeups.waiters.remove(other)
        await comm.wait(5)
        return other

    other = asyncio.run(scenario())
    assert other.event.is_set() and other.baton == (key, 0)


def test_a_pool_wake_published_with_redis_wakes_one_waiter_not_one_more_for_its_echo(settings, redis_url):
    settings.REDIS_URL = redis_url

    async def scenario() -> list[bool]:
        await wakeups.waiters.ready()  # subscribed: this process hears its own message back
        first, second = wakeups.Waiter(["pool:1:1"]), wakeups.Waiter(["pool:1:1"])
        wakeups.waiters.add(first)
        wakeups.waiters.add(second)
        await asyncio.to_thread(wakeups.publish, ["pool:1:1"])
        await asyncio.sleep(0.5)  # the echo has come back by now
        for waiter in (first, second):
            wakeups.waiters.remove(waiter)
        return [first.event.is_set(), second.event.is_set()]

    assert asyncio.run(scenario()) == [True, False]
    assert wakeups.received(f"{wakeups.origin()} pool:1:1") == []
    assert wakeups.received("@another pool:1:1 node:2") == ["pool:1:1", "node:2"]
    assert wakeups.received("node:2") == ["node:2"]  # an older release's untagged message


def spy_full_asks(monkeypatch) -> list[int]:
    """Counts the asks answered the normal way (on the sync thread, with the database)."""
    calls, full = [], runner_api._answer_sync

    def counted(*args):
        calls.append(1)
        return full(*args)

    monkeypatch.setattr(runner_api, "_answer_sync", counted)
    return calls


@pytest.mark.django_db(transaction=True)
def test_an_idle_known_nodes_ask_is_answered_without_reading_the_database_and_still_marks_its_agent_live(
        cpu_pool, settings, monkeypatch):
    settings.NODE_WAIT = 1.5
    monkeypatch.setattr(runner_api, "POOL_TTL", 60.0)  # the pool's reading still fresh after the held wait
    node = cpu_pool.nodes.get()
    body = {"pool": "local", "hostname": "localhost", "free": [0]}
    full = spy_full_asks(monkeypatch)

    async def scenario():
        first = await ask(body)  # first sight: the normal way
        await sync_to_async(lambda: Node.objects.filter(pk=node.pk).update(agent_seen_at=None))()
        answers = first, await ask({**body, "wait": 60}), await ask({**body, "samples": [sample]})
        await asyncio.sleep(wakeups.SEEN_EVERY + 0.5)  # its samples are written with the heartbeats
        return answers

    sample = {"index": 0, "utilization": 0.5, "memory_used": 1 << 30, "memory_total": 80 << 30}
    first, idle, sampled = asyncio.run(scenario())
    assert first[:2] == (200, {"claims": [], "reserved": [], "reservations": [], "keys": [], "again": False})
    assert idle[0] == 200 and idle[1] == {"claims": [], "reserved": [], "reservations": [], "keys": [], "again": True}
    assert 1.4 <= idle[2] < 5  # held as a normal wait
    assert sampled[0] == 200 and len(full) == 1  # the first ask only: the others had no node to read
    node.refresh_from_db()
    assert node.agent_live() and node.samples == [sample]  # its heartbeat and its samples recorded all the same


@pytest.mark.django_db(transaction=True)
def test_a_run_pinned_to_another_node_leaves_a_known_nodes_ask_idle_and_its_own_node_claims_it(
        leaderboard, cpu_pool, monkeypatch):
    """A health round keeps a run pinned to some node waiting nearly all the time: the other nodes' asks stay idle
    (on the event loop, no query), as when nothing waits, while the node it is pinned to asks the normal way and
    claims it."""
    monkeypatch.setattr(runner_api, "POOL_TTL", 60.0)
    node = cpu_pool.nodes.get()
    other = Node.objects.create(pool=cpu_pool, hostname="node-b")
    Gpu.objects.create(node=other, gpu_type=cpu_pool.cpu, index=0)
    body = {"pool": "local", "hostname": "localhost", "free": [0]}
    full = spy_full_asks(monkeypatch)

    def pin_and_dispatch(to: Node) -> int:
        run = submit(leaderboard).runs.first()
        Run.objects.filter(pk=run.pk).update(node=to, pool=cpu_pool)
        dispatch_all()
        wakeups.waiters.seq += 1  # what the dispatch's wake-up does in each web process
        return run.pk

    async def scenario():
        await ask(body)  # first sight: the normal way
        elsewhere = await sync_to_async(pin_and_dispatch)(other)
        answers = [await ask(body) for _ in range(3)]  # the first reads the pool anew after the wake-up
        calls = len(full)
        here = await sync_to_async(pin_and_dispatch)(node)
        return elsewhere, answers, calls, here, await ask(body)

    elsewhere, answers, calls, here, claimed = asyncio.run(scenario())
    assert all(a[0] == 200 and a[1]["claims"] == [] for a in answers)
    assert calls == 2  # the first sight and one reading after the wake-up: the others idle
    assert [c["run"] for c in claimed[1]["claims"]] == [here]
    assert Run.objects.get(pk=elsewhere).status == RunStatus.DISPATCHED  # still node-b's


@pytest.mark.django_db(transaction=True)
def test_a_behind_node_lane_answers_a_known_nodes_heartbeat_without_it_and_a_woken_ask_still_claims(
        leaderboard, cpu_pool, settings, monkeypatch):
    """While runs wait every ask would look for work; with the node lane behind (LANE_SHED asks queued), a known
    node's plain ask is answered on the event loop (its heartbeat counted), so a fleet's heartbeats cannot grow the
    queue without bound; the ask a dispatch wakes still claims."""
    settings.NODE_WAIT = 20
    backlog = {"n": 0}
    monkeypatch.setattr(wakeups, "node_lane_backlog", lambda: backlog["n"])
    node = cpu_pool.nodes.get()
    body = {"pool": "local", "hostname": "localhost", "free": [0]}
    full = spy_full_asks(monkeypatch)

    async def scenario():
        await ask(body)  # first sight: known from now on
        waiting = await sync_to_async(lambda: submit(leaderboard).runs.first().pk)()
        await sync_to_async(dispatch_all)()
        wakeups.waiters.seq += 1  # what the dispatch's wake-up does in each web process
        backlog["n"] = runner_api.LANE_SHED
        await sync_to_async(lambda: Node.objects.filter(pk=node.pk).update(agent_seen_at=None))()
        shed = await ask(body)
        await asyncio.sleep(wakeups.SEEN_EVERY + 0.5)
        seen = await sync_to_async(lambda: Node.objects.get(pk=node.pk).agent_live())()
        calls = len(full)
        woken = await ask({**body, "wait": 20}, during=lambda: wakeups.publish([f"node:{node.pk}"]))
        return waiting, shed, seen, calls, woken

    waiting, shed, seen, calls, woken = asyncio.run(scenario())
    assert shed[0] == 200 and shed[1]["claims"] == [] and calls == 1 and seen  # shed, yet its heartbeat written
    assert [c["run"] for c in woken[1]["claims"]] == [waiting]  # the woken ask went the normal way and claimed


@pytest.mark.django_db(transaction=True)
def test_a_known_nodes_heartbeat_is_written_while_its_ask_waits_for_a_busy_node_lane(leaderboard, cpu_pool, settings,
                                                                                    monkeypatch):
    """A run waits, so a known node's ask goes the normal way, to the node lane; the lane is busy with another ask.
    The agent was heard when its ask arrived and is heard every second while the ask waits there (its connection
    open): its heartbeat is written within a second and again while it waits, not when the lane gets to it (after a
    burst, a round of health checks found nodes "not heard from for 25 s" whose asks sat in the lane; in a burst of
    200, a lane 300 asks behind put 600 live nodes out of service and retried the runs they held)."""
    settings.NODE_WAIT = 20
    monkeypatch.setattr(wakeups, "node_lane_backlog", lambda: 0)  # behind, but not shedding
    node = cpu_pool.nodes.get()
    body = {"pool": "local", "hostname": "localhost", "free": [0]}
    lane_free = threading.Event()

    async def scenario():
        await ask(body)  # first sight: known from now on
        await sync_to_async(lambda: submit(leaderboard))()
        await sync_to_async(dispatch_all)()
        wakeups.waiters.seq += 1  # what the dispatch's wake-up does in each web process
        await asyncio.sleep(wakeups.SEEN_EVERY + 0.5)  # the first ask's heartbeat written
        await sync_to_async(lambda: Node.objects.filter(pk=node.pk).update(agent_seen_at=None))()
        wakeups.NODE_LANE.submit(lane_free.wait, 30)  # another ask holds the lane
        asking = asyncio.ensure_future(ask(body))
        await asyncio.sleep(wakeups.SEEN_EVERY + 1.0)
        seen_while_queued = await sync_to_async(lambda: Node.objects.get(pk=node.pk).agent_live())()
        await sync_to_async(lambda: Node.objects.filter(pk=node.pk).update(agent_seen_at=None))()
        await asyncio.sleep(wakeups.SEEN_EVERY + 1.0)  # still queued: heard again, not only when it arrived
        seen_still = await sync_to_async(lambda: Node.objects.get(pk=node.pk).agent_live())()
        lane_free.set()
        return seen_while_queued, seen_still, await asking

    try:
        seen_while_queued, seen_still, (status, answer, _) = asyncio.run(scenario())
    finally:
        lane_free.set()
    assert seen_while_queued and seen_still
    assert status == 200 and [c["run"] for c in answer["claims"]] != []  # then the lane answered it: a claim


@pytest.mark.parametrize("change", ["key rotated", "node disabled", "node removed"])
@pytest.mark.django_db(transaction=True)
def test_a_known_node_goes_the_normal_way_again_within_the_check_interval_once_it_changed(
        cpu_pool, settings, monkeypatch, change):
    monkeypatch.setattr(runner_api, "KNOWN_CHECK_S", 0.2)
    monkeypatch.setattr(runner_api, "POOL_TTL", 60.0)  # the pool's reading stays fresh: only the check forgets
    body = {"pool": "local", "hostname": "localhost", "free": [0]}
    full = spy_full_asks(monkeypatch)

    def make_change():
        if change == "key rotated":
            settings.RUNNER_KEY = "another-runner-key-0123456789abcdef"
        elif change == "node disabled":
            Node.objects.filter(hostname="localhost").update(enabled=False)
        else:
            Node.objects.filter(hostname="localhost").delete()

    async def scenario():
        await ask(body)
        assert (await ask(body))[0] == 200 and len(full) == 1  # known: answered on the event loop
        await sync_to_async(make_change)()
        await asyncio.sleep(runner_api.KNOWN_CHECK_S * 4)
        return await ask(body)

    status, answer, _ = asyncio.run(scenario())
    assert len(full) == 2  # the normal way again
    assert status == {"key rotated": 403, "node disabled": 200, "node removed": 404}[change], answer


@pytest.mark.django_db(transaction=True)
def test_a_known_nodes_device_types_follow_an_organisers_change_within_the_check_interval(cpu_pool, monkeypatch):
    """The devices' GPU types decide which wake-ups a known node's idle ask waits on; they are read again with each
    check of the known nodes, so a change never waits for a full ask (every KNOWN_TTL)."""
    monkeypatch.setattr(runner_api, "KNOWN_CHECK_S", 0.2)
    monkeypatch.setattr(runner_api, "POOL_TTL", 60.0)
    node = cpu_pool.nodes.get()
    other = GpuType.objects.create(name="Other")
    body = {"pool": "local", "hostname": "localhost", "free": [0]}

    async def scenario():
        await ask(body)
        before = runner_api._idle_answer(node_auth(), body)
        await sync_to_async(lambda: Gpu.objects.filter(node=node, index=0).update(gpu_type=other))()
        await asyncio.sleep(runner_api.KNOWN_CHECK_S * 4)
        return before, runner_api._idle_answer(node_auth(), body)

    before, after = asyncio.run(scenario())
    assert before[1] == [f"node:{node.pk}", f"pool:{cpu_pool.pk}:{cpu_pool.cpu.pk}"]
    assert after[1] == [f"node:{node.pk}", f"pool:{cpu_pool.pk}:{other.pk}"]


@pytest.mark.django_db
def test_the_heartbeats_write_carries_new_samples_and_keeps_the_others(cpu_pool):
    old = [{"index": 0, "utilization": 0.1, "memory_used": 1, "memory_total": 2}]
    new = [{"index": 0, "utilization": 0.9, "memory_used": 3, "memory_total": 4}]
    kept = Node.objects.create(pool=cpu_pool, hostname="kept", samples=old)
    sampled = Node.objects.create(pool=cpu_pool, hostname="sampled", samples=old)
    wakeups.mark_seen([kept.pk, sampled.pk], {sampled.pk: new})
    rows = {n.hostname: n for n in Node.objects.filter(pk__in=[kept.pk, sampled.pk])}
    assert (rows["kept"].samples, rows["sampled"].samples) == (old, new)
    assert rows["kept"].agent_live() and rows["sampled"].agent_live()


@pytest.mark.django_db
def test_a_run_pinned_to_a_node_wakes_that_nodes_agent_and_no_woken_ask_passes_it_on(
        leaderboard, cpu_pool, monkeypatch, django_capture_on_commit_callbacks):
    """A node's health check (or A/A run) only its node can claim: its dispatch wakes `node:N`, not the pool's longest
    waiter, and a woken node that cannot take it hands no wake on for it (a round of pinned checks is no chain of
    asks across the fleet)."""
    published: list[list[str]] = []
    monkeypatch.setattr(wakeups, "publish", lambda keys: published.append(list(keys)))
    node = cpu_pool.nodes.get()
    other = Node.objects.create(pool=cpu_pool, hostname="node-b")
    Gpu.objects.create(node=other, gpu_type=cpu_pool.cpu, index=0)
    pinned = submit(leaderboard).runs.first()
    Run.objects.filter(submission=pinned.submission).update(node=other, pool=cpu_pool)
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_all()
    assert published and all(keys == [f"node:{other.pk}"] for keys in published)

    key = f"pool:{cpu_pool.pk}:{cpu_pool.cpu.pk}"
    passed_on = []
    monkeypatch.setattr(wakeups.waiters, "pass_on", passed_on.append)
    with django_capture_on_commit_callbacks(execute=True):
        answer = node_answer(node_auth(), {"pool": "local", "hostname": node.hostname, "free": [0]}, woken=(key, 2))
    assert answer[0]["claims"] == [] and passed_on == []

    published.clear()
    free = submit(leaderboard).runs.first()  # any node may take this one: the pool's waiter is woken
    with django_capture_on_commit_callbacks(execute=True):
        dispatch_all()
    assert [key] in published and Run.objects.get(pk=free.pk).status == RunStatus.DISPATCHED
