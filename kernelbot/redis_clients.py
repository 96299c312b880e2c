"""Every Redis client of a process (the cache, the task broker, the channel layer) waits at most
`REDIS_CONNECT_TIMEOUT` to connect and `REDIS_TIMEOUT` for an answer. A server that gave none (stopped, hanging, a
network cut) is then away for this process for `REDIS_RETRY_AFTER` seconds: the cache's and the broker's calls fail at
once and live updates are not sent, so a hanging Redis costs one call its timeout, not every call of every request.
Callers take a failure as Redis being away: the cache reads the database, a task whose message was lost is picked up
by the supervisor, a live update is dropped (clients re-read on a version gap)."""

from __future__ import annotations

import logging
import time
from urllib.parse import urlparse

import redis
from django.conf import settings
from django.core.cache.backends.locmem import LocMemCache
from django_q.brokers.redis_broker import Redis as DjangoQRedis
from django_redis.cache import RedisCache as DjangoRedisCache
from django_redis.exceptions import ConnectionInterrupted
from django_redis.pool import ConnectionFactory
from redis.backoff import NoBackoff
from redis.connection import Connection, ConnectionPool, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

log = logging.getLogger(__name__)
_failed_at: dict[str, float] = {}  # server → when (monotonic) it last failed to answer this process


def server(url: str) -> str:
    """A server's name as its connections give it (redis-py's `_host_error`): host:port, or the socket's path."""
    parsed = urlparse(url)
    return parsed.path if parsed.scheme == "unix" else f"{parsed.hostname or 'localhost'}:{parsed.port or 6379}"


def is_away(name: str) -> bool:
    return name in _failed_at and time.monotonic() - _failed_at[name] < settings.REDIS_RETRY_AFTER


def mark_away(name: str, error: BaseException) -> None:
    if not is_away(name):
        log.warning("Redis at %s did not answer (%r); not asked again for %.0f s", name, error,
                    settings.REDIS_RETRY_AFTER)
    _failed_at[name] = time.monotonic()


def forget_failures() -> None:
    _failed_at.clear()


def _check(name: str) -> None:
    if is_away(name):
        raise RedisConnectionError(f"Redis at {name} is away: it did not answer a moment ago")


class _Guarded:
    """Gives up at once while its server is away; marks it away when it cannot connect or gets no answer in time.
    A connection the server closed (a restart) is not that: redis-py retries it once on a new one."""

    def connect_check_health(self, *args, **kwargs):
        if self._sock is None:
            _check(self._host_error())
        try:
            return super().connect_check_health(*args, **kwargs)
        except (RedisConnectionError, RedisTimeoutError) as exc:
            mark_away(self._host_error(), exc)
            raise

    def send_packed_command(self, command, check_health: bool = True):
        _check(self._host_error())
        try:
            return super().send_packed_command(command, check_health)
        except RedisTimeoutError as exc:
            mark_away(self._host_error(), exc)
            raise

    def read_response(self, *args, **kwargs):
        try:
            return super().read_response(*args, **kwargs)
        except RedisTimeoutError as exc:
            mark_away(self._host_error(), exc)
            raise


class GuardedConnection(_Guarded, Connection):
    pass


class GuardedSSLConnection(_Guarded, SSLConnection):
    pass


class GuardedUnixConnection(_Guarded, UnixDomainSocketConnection):
    pass


def pool_kwargs(url: str, timeout: float | None = None) -> dict:
    """What a connection pool for `url` needs (django-redis's CONNECTION_POOL_KWARGS too)."""
    scheme = urlparse(url).scheme
    return {"connection_class": {"rediss": GuardedSSLConnection, "unix": GuardedUnixConnection}.get(
                scheme, GuardedConnection),
            "socket_connect_timeout": settings.REDIS_CONNECT_TIMEOUT,
            "socket_timeout": settings.REDIS_TIMEOUT if timeout is None else timeout,
            "retry": Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))}


def client(url: str, timeout: float | None = None) -> redis.Redis:
    return redis.Redis(connection_pool=ConnectionPool.from_url(url, **pool_kwargs(url, timeout)))


class CacheConnectionFactory(ConnectionFactory):
    """django-redis's pools (the cache's `CONNECTION_FACTORY`) of guarded connections."""

    def get_connection_pool(self, params: dict) -> ConnectionPool:
        return super().get_connection_pool({**params, **pool_kwargs(params["url"])})


class RedisCache(DjangoRedisCache):
    """django-redis's cache, except that allauth's keys (its rate limits and their locks) are kept in a cache of this
    process while Redis is away: allauth expects its cache to answer, and its pages (log in, sign up, reset a password)
    would be 500s. Our own code reads and writes the cache through guards of its own (leaderboards/access/cache.py)."""

    local = LocMemCache("kernelbot-allauth-fallback", {"OPTIONS": {"MAX_ENTRIES": 10_000}})

    def _call(self, name: str, key, *args, **kwargs):
        if not str(key).startswith("allauth:"):
            return getattr(super(), name)(key, *args, **kwargs)
        try:
            return getattr(super(), name)(key, *args, **kwargs)
        except (ConnectionInterrupted, redis.RedisError, OSError):
            return getattr(self.local, name)(key, *args, **kwargs)

    def get(self, key, *args, **kwargs):
        return self._call("get", key, *args, **kwargs)

    def set(self, key, *args, **kwargs):
        return self._call("set", key, *args, **kwargs)

    def add(self, key, *args, **kwargs):
        return self._call("add", key, *args, **kwargs)

    def delete(self, key, *args, **kwargs):
        return self._call("delete", key, *args, **kwargs)


def layer_server() -> str | None:
    """The server of the default channel layer, when it is a Redis one."""
    hosts = settings.CHANNEL_LAYERS.get("default", {}).get("CONFIG", {}).get("hosts") or []
    if not hosts:
        return None
    host = hosts[0]
    return server(host["address"] if isinstance(host, dict) else host)


class Broker(DjangoQRedis):
    """django-q2's Redis broker (`Q_CLUSTER["broker_class"]`) on guarded clients: an enqueue gives up after the
    timeouts. The cluster's wait for a task (BLPOP, 1 s on the server) reads that second longer."""

    @staticmethod
    def get_connection(list_key: str | None = None) -> redis.Redis:
        return client(settings.Q_CLUSTER["redis"])

    def dequeue(self):
        if not hasattr(self, "_waiting"):
            self._waiting = client(settings.Q_CLUSTER["redis"], settings.REDIS_TIMEOUT + 1)
        task = self._waiting.blpop(self.list_key, 1)
        return [(None, task[1])] if task else None
