"""What every submission reads (API tokens, leaderboards, served GPU types, the jobs switch, quotas, bans) kept
≤ SETTINGS_TTL in Django's cache: per process (LocMemCache) by default, shared in Redis when REDIS_URL is set.

An edit deletes exactly the keys it affects (the receivers below, connected in `LeaderboardsConfig.ready`; the
`do_*` actions delete theirs too, since `update()` sends no signal). With Redis it so applies at once in every
process; with per-process caches at once in the process that made it and within SETTINGS_TTL in the others."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from django.core.cache import cache
from django_redis.exceptions import ConnectionInterrupted
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

log = logging.getLogger(__name__)
SETTINGS_TTL = 2.0  # seconds a process may act on a stale token, leaderboard, jobs switch, quota or ban


def key(kind: str, *parts: object) -> str:
    return ":".join(("kb", kind, *map(str, parts)))


def board_key(name: str) -> str:
    """Leaderboards are looked up by name, case-insensitively, from what requests send: hashed, so any text is a
    valid key."""
    return key("board", hashlib.sha256(name.lower().encode()).hexdigest()[:32])


def token_key(digest: str) -> str:
    return key("token", digest)


@contextmanager
def _unless_away(doing: str):
    """A cache that cannot be reached (Redis restarting, a network cut) is a cache that has nothing: every value is
    read from the database meanwhile, and requests go on."""
    try:
        yield
    except (ConnectionInterrupted, RedisConnectionError, RedisTimeoutError, OSError) as exc:
        log.warning("cache unreachable while %s (%r); reading the database", doing, exc)


def cached(name: str, compute: Callable[[], Any], timeout: float = SETTINGS_TTL) -> Any:
    """The cached value, or `compute()` stored for `timeout` seconds. None (nothing found) is not stored."""
    value = None
    with _unless_away("reading"):
        value = cache.get(name)
    if value is None:
        value = compute()
        if value is not None:
            remember(name, value, timeout)
    return value


def remember(name: str, value: Any, timeout: float = SETTINGS_TTL) -> None:
    with _unless_away("writing"):
        cache.set(name, value, timeout)


def cached_many(computes: dict[str, Callable[[], Any]], timeout: float = SETTINGS_TTL) -> dict[str, Any]:
    """`cached` for several keys in one round trip to the cache."""
    found: dict[str, Any] = {}
    with _unless_away("reading"):
        found = cache.get_many(list(computes))
    missing = {name: compute() for name, compute in computes.items() if name not in found}
    if fresh := {name: value for name, value in missing.items() if value is not None}:
        with _unless_away("writing"):
            cache.set_many(fresh, timeout)
    return found | missing


def forget(*names: str) -> None:
    if names:
        with _unless_away("forgetting"):
            cache.delete_many(list(names))


# --- targeted invalidation (signal receivers) -----------------------------------------------------------------
def leaderboard_changed(sender, instance, **kwargs) -> None:
    forget(board_key(instance.name), key("serving", instance.pk), key("quotas", instance.pk))


def leaderboard_gpu_types_changed(sender, instance, action: str, reverse: bool, pk_set, **kwargs) -> None:
    if action.startswith("post_"):
        boards = (pk_set or []) if reverse else [instance.pk]
        forget(*(key("serving", pk) for pk in boards))


def token_changed(sender, instance, **kwargs) -> None:
    forget(token_key(instance.digest))


def forget_user(user_id: int) -> None:
    from .models import ApiToken

    forget(key("bans", user_id), *(token_key(d) for d in ApiToken.objects.filter(user=user_id)
                                   .values_list("digest", flat=True)))


def user_changed(sender, instance, update_fields=None, **kwargs) -> None:
    """A user's tokens carry the user (active, staff, name): drop them, unless only the last log-in changed."""
    if update_fields is None or not set(update_fields) <= {"last_login"}:
        forget_user(instance.pk)


def profile_changed(sender, instance, **kwargs) -> None:
    """The cached tokens carry the profile too (display name; a new one spares each submission a lookup)."""
    forget_user(instance.user_id)


def quota_changed(sender, instance, **kwargs) -> None:
    forget(key("quotas", instance.leaderboard_id))


def ban_changed(sender, instance, **kwargs) -> None:
    forget(key("bans", instance.user_id))


def switch_changed(sender, instance, **kwargs) -> None:
    forget(key("switch"))
