"""Node agents learn of work without polling: an agent's `nodes/wait` is held by the web process (an ASGI long-poll,
`leaderboards.runner_api.node_wait`) until something for it happens or its heartbeat is due, and what happens is
published here after commit:

- `pool:P:T`: a run of GPU type T was dispatched to local pool P. Each web process wakes ONE agent waiting with a
  free device of that type (the oldest waiting); one that then claims nothing while such a run still waits hands
  the wake to the next, so a queued run costs a claim or two, not one per node.
- `node:N`: a hold on node N ended (a run of it finished: a device is free again; or a reservation), a reservation
  started on it or its holders' keys changed, or a run pinned to it (its health check, an A/A run) was dispatched:
  its agent asks again with what it has free now.
- `all`: every agent asks again (a process that subscribed again after losing Redis, or the file without it).

With `REDIS_URL` the message goes over Redis pub/sub (one subscription per web process); without it (SQLite,
`./dev serve`) the waiters of this process are woken at once and the others through a file's modification time,
checked twice a second (every agent of those processes asks again). A lost message (Redis away) costs at most the
agent's heartbeat interval: every wait ends by then and the agent asks again, so no run is stuck for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor

import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, JSONField, Value, When
from django.utils import timezone

from kernelbot import redis_clients
from runners.models import Node

log = logging.getLogger(__name__)
FILE_CHECK_S = 0.5
SEEN_EVERY = 1.0
_client: redis.Redis | None = None
_ORIGIN = uuid.uuid4().hex[:12]
# The node agents' lane: a web process's one thread for the agents' asks and its checks of known nodes (its own
# database connection), beside the sync thread that serves every other request. A round of health checks or a burst
# of claims then queues no user's request behind the agents', nor an agent's ask behind users'.
NODE_LANE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelbot-nodes")
# the agents' heartbeats are written on a thread of their own: a backlog of asks must not make live agents look dead
BEAT_LANE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelbot-beats")
_lane = {"queued": 0}  # calls on the node lane not finished yet (counted on the event loop)


def on_node_lane(func: Callable) -> Callable:
    """`func` as a coroutine run on the node agents' lane (`NODE_LANE`), counted in `node_lane_backlog`."""
    call = sync_to_async(func, thread_sensitive=False, executor=NODE_LANE)

    async def counted(*args, **kwargs):
        _lane["queued"] += 1
        try:
            return await call(*args, **kwargs)
        finally:
            _lane["queued"] -= 1
    return counted


def node_lane_backlog() -> int:
    """How many calls wait on (or run in) this process's node lane."""
    return _lane["queued"]


def origin() -> str:
    """Tags this process's messages: its listener skips its own echo (the pid too: a forked process is another)."""
    return f"@{_ORIGIN}-{os.getpid()}"


def channel() -> str:
    return f"{settings.DEPLOYMENT}:node-wake"


def wake_file():
    """Without Redis: the file whose change wakes this deployment's waits (named like its Redis channel, so two
    deployments sharing a data directory never wake each other's)."""
    return settings.DATA_DIR / f"{settings.DEPLOYMENT}.node-wake"


def run_dispatched(pool_id: int, gpu_type_id: int) -> None:
    wake(f"pool:{pool_id}:{gpu_type_id}")


def node_changed(node_id: int) -> None:
    wake(f"node:{node_id}")


def wake(*keys: str) -> None:
    """Publish `keys` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: publish(keys))


def publish(keys: Iterable[str]) -> None:
    message = " ".join(keys)
    waiters.dispatch(message.split())  # this process's own waiters
    if not settings.REDIS_URL:
        with contextlib.suppress(OSError):
            path = wake_file()
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(message)
        return
    global _client
    name = redis_clients.server(settings.REDIS_URL)
    if redis_clients.is_away(name):
        return
    try:
        if _client is None:
            _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=settings.REDIS_TIMEOUT,
                                           socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT)
        _client.publish(channel(), f"{origin()} {message}")
    except redis.RedisError as exc:  # lost: every waiting agent asks again within its heartbeat interval
        redis_clients.mark_away(name, exc)


def received(message: str) -> list[str]:
    """The keys of a message from Redis; none for this process's own (its waiters were woken as it published)."""
    keys = message.split()
    if keys and keys[0].startswith("@"):
        return [] if keys[0] == origin() else keys[1:]
    return keys  # untagged: an older release's process


def mark_seen(node_ids: list[int], samples: dict[int, list[dict]] | None = None) -> None:
    """The agents' heartbeats and the new samples some of them sent: one UPDATE (a row lock per node, once)."""
    update: dict = {"agent_seen_at": timezone.now()}
    if samples:
        update["samples"] = Case(*(When(pk=pk, then=Value(value, output_field=JSONField()))
                                   for pk, value in sorted(samples.items())), default=F("samples"))
    Node.objects.filter(pk__in=node_ids).update(**update)


class Waiter:
    def __init__(self, keys: list[str]):
        self.keys, self.event, self.baton = keys, asyncio.Event(), None


class Waiters:
    """This process's waiting agents by key; `dispatch` runs on the event loop's thread (or hops there)."""

    def __init__(self):
        self.by_key: dict[str, dict[Waiter, None]] = {}  # insertion-ordered: the oldest waiter first
        self.loop: asyncio.AbstractEventLoop | None = None
        self.listener: asyncio.Task | None = None
        self.listening = asyncio.Event()
        self.seq = 0  # messages seen: a wait that saw one arrive while it looked for work looks again
        self.seen: set[int] = set()  # nodes whose agent asked since the last write of their agent_seen_at
        # nodes whose ask waits for (or runs on) the node lane: their agent asked and holds its connection open for
        # the answer, so it is heard every SEEN_EVERY while the platform is behind, not charged for the wait
        self.asking: Counter[int] = Counter()
        self.samples: dict[int, list[dict]] = {}  # and the new samples some of them sent
        self.writer: asyncio.Task | None = None

    async def ready(self) -> None:
        """Listening (subscribed, with Redis) before a wait looks for work, so nothing published after it looked is
        missed; at most the Redis connect timeout (a wait that misses a wake-up still ends at its heartbeat)."""
        self.loop = asyncio.get_running_loop()
        if self.listener is None or self.listener.done():
            self.listening = asyncio.Event()
            self.listener = self.loop.create_task(self.listen())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.listening.wait(), settings.REDIS_CONNECT_TIMEOUT)

    def beat(self, node_id: int, samples: list[dict] | None = None) -> None:
        """The node's agent asked: its agent_seen_at (and its new samples) are written with the others' within
        SEEN_EVERY: one UPDATE a second per web process, not one per ask (nearly every idle ask carries samples: a
        thousand nodes' would be 67 writes a second on the sync thread, users' requests queued behind them)."""
        self.seen.add(node_id)
        if samples is not None:
            self.samples[node_id] = samples
        if self.writer is None or self.writer.done():
            self.writer = asyncio.get_running_loop().create_task(self.write_seen())

    @contextlib.contextmanager
    def on_lane(self, node_id: int):
        """The node's ask is queued on (or runs on) the node lane meanwhile: it is heard every second until then."""
        self.asking[node_id] += 1
        self.beat(node_id)
        try:
            yield
        finally:
            self.asking[node_id] -= 1
            if not self.asking[node_id]:
                del self.asking[node_id]

    async def write_seen(self) -> None:
        while self.seen or self.asking:
            await asyncio.sleep(SEEN_EVERY)
            ids, self.seen = self.seen | set(self.asking), set()
            samples, self.samples = self.samples, {}
            try:
                await sync_to_async(mark_seen, thread_sensitive=False, executor=BEAT_LANE)(sorted(ids), samples)
            except Exception as exc:  # the next ask writes it again, well within the agent deadline
                log.warning("node wake-ups: could not record %d agents as seen: %r", len(ids), exc)

    def add(self, waiter: Waiter) -> None:
        for key in waiter.keys:
            self.by_key.setdefault(key, {})[waiter] = None

    def remove(self, waiter: Waiter) -> None:
        for key in waiter.keys:
            group = self.by_key.get(key)
            if group is not None:
                group.pop(waiter, None)
                if not group:
                    del self.by_key[key]

    def _wake(self, waiter: Waiter, baton: tuple[str, int] | None = None) -> None:
        self.remove(waiter)
        waiter.baton = baton
        waiter.event.set()

    def dispatch(self, keys: list[str]) -> None:
        loop = self.loop
        if loop is None:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is not loop:
            with contextlib.suppress(RuntimeError):  # the loop closed
                loop.call_soon_threadsafe(self.dispatch, keys)
            return
        self.seq += 1
        for key in keys:
            if key == "all":
                for waiter in {w for group in self.by_key.values() for w in group}:
                    self._wake(waiter)
            elif key.count(":") == 2:  # pool:P:T: one waiter, the baton passed on while it claims nothing
                self.hand_on(key, len(self.by_key.get(key, ())))
            else:
                for waiter in list(self.by_key.get(key, ())):
                    self._wake(waiter)

    def pass_on(self, baton: tuple[str, int]) -> None:
        """`hand_on` from any thread (a woken ask that claimed nothing while such a run still waits)."""
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed
                self.loop.call_soon_threadsafe(self.hand_on, *baton)

    def hand_on(self, key: str, hops: int) -> None:
        """Wake the oldest waiter for `key`, which passes the wake on (`hops` - 1 more times at most) when it
        claims nothing while such a run still waits."""
        group = self.by_key.get(key)
        if group and hops > 0:
            self._wake(next(iter(group)), (key, hops - 1))

    async def listen(self) -> None:
        """Feed this process's waiters from Redis pub/sub, or from the wake file without Redis (checked for the life
        of the loop: a waiter added after a slow look must not find it stopped)."""
        if not settings.REDIS_URL:
            self.listening.set()
            path, seen = wake_file(), None
            with contextlib.suppress(OSError):
                seen = os.stat(path).st_mtime_ns
            while True:
                await asyncio.sleep(FILE_CHECK_S)
                try:
                    mtime = os.stat(path).st_mtime_ns
                except OSError:
                    mtime = 0
                if seen is not None and mtime != seen:
                    self.dispatch(["all"])
                seen = mtime
        import redis.asyncio as aioredis

        while True:
            client = aioredis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT)
            try:
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel())
                    if self.listening.is_set():  # subscribed again: what was published meanwhile is lost
                        self.dispatch(["all"])
                    self.listening.set()
                    async for message in pubsub.listen():
                        if message.get("type") == "message" and (keys := received(message["data"].decode())):
                            self.dispatch(keys)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis away: waits end at their heartbeat; subscribe again shortly
                log.warning("node wake-ups: Redis subscription lost (%r); waits end at their heartbeat", exc)
                await asyncio.sleep(2)
            finally:
                with contextlib.suppress(Exception):
                    await client.aclose()


waiters = Waiters()
