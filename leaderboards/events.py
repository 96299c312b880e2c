"""Channel-layer events, sent only after the transaction that caused them commits.

Groups: `leaderboard.<id>` (ranking changes) and `submission.<id>` (run progress)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from redis.exceptions import RedisError

from kernelbot import redis_clients
from runners.models import GpuType

from . import live

log = logging.getLogger(__name__)


_sender: asyncio.AbstractEventLoop | None = None
_sender_lock = threading.Lock()


def _sender_loop() -> asyncio.AbstractEventLoop:
    """This process's one event loop for sends on a shared (Redis) layer, from sync code. `async_to_sync` runs each
    call on a new loop and channels-redis connects once per loop: 5 ms a send, three sends per ranked result."""
    global _sender
    with _sender_lock:
        if _sender is None:
            _sender = asyncio.new_event_loop()
            threading.Thread(target=_sender.run_forever, name="channel-layer-sends", daemon=True).start()
        return _sender


def _forget_sender() -> None:  # a forked child (django-q's workers) has the loop but not its thread
    global _sender, _sender_lock
    _sender, _sender_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_sender)


def send(group: str, event_type: str, payload: dict[str, Any]) -> None:
    """Deliver on this process's layer; with a per-process layer also write the outbox (see live.py). A Redis that
    does not answer loses the live update, not the work that caused it, and is left alone for a while
    (kernelbot/redis_clients.py)."""
    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": event_type, **payload}
    server = None
    try:
        if live.uses_outbox():
            async_to_sync(layer.group_send)(group, message)
            live.write_outbox(group, message)
            return
        if (server := redis_clients.layer_server()) and redis_clients.is_away(server):
            log.debug("%s to %s not sent: Redis at %s is away", event_type, group, server)
            return
        sent = asyncio.run_coroutine_threadsafe(layer.group_send(group, message), _sender_loop())
        try:
            sent.result(settings.REDIS_CONNECT_TIMEOUT + settings.REDIS_TIMEOUT + 1)  # (the sockets time out first)
        finally:
            sent.cancel()  # (a no-op once it is done)
    except (TimeoutError, RedisError, OSError) as exc:  # a lost live update must never fail the work that caused it
        if server:
            redis_clients.mark_away(server, exc)  # (says so once)
        else:
            log.warning("could not send %s to %s (%r)", event_type, group, exc)
    except Exception:
        log.exception("could not send %s to %s", event_type, group)


def send_on_commit(group: str, event_type: str, payload: dict[str, Any]) -> None:
    transaction.on_commit(lambda: send(group, event_type, payload))


def run_changed(run) -> None:
    from .serializers import live_run  # imported here: models imports this module, the serialiser imports models

    send(f"submission.{run.submission_id}", "submission.update", live_run(run))


def board_changed(leaderboard_id: int, gpu_type_id: int, version: int, entries: list[dict],
                  removed: list[int] | None = None, shift: list | None = None, *, entrants: bool = True,
                  records: bool = True, record_added: list | None = None, gpu_name: str | None = None,
                  on_ratio: bool = False) -> None:
    """A delta: the entries that were added or changed and the users who left, with display names. `shift`
    [first, last, by] (last null: to the end): every other entry ranked first..last moved by `by` (an entry moved
    up past them, or one above them left), so a client applies it to the rows it holds instead of receiving each.
    The pager (`entrants`) and the records are rendered only when they may have changed, and a record appended to
    the progression travels alone (`record_added`); clients keep theirs. `on_ratio`: what the records' figures are
    (the board ranks on the ratio to the reference, else on time)."""
    send(f"leaderboard.{leaderboard_id}", "leaderboard.ranks", {
        "gpu_type": gpu_type_id, "version": version, "entries": entries, "removed": removed or [], "shift": shift,
        **_rendered(leaderboard_id, gpu_type_id, gpu_name, {e["user"]: e["rank"] for e in entries}, entrants=entrants,
                    records=records, record_added=record_added, on_ratio=on_ratio),
    })


def _rendered(leaderboard_id: int, gpu_type_id: int, gpu_name: str | None, ranks: dict[int, int],
              **parts: Any) -> dict[str, Any]:
    """The rows (and the entries' display names), pager and records as a reload shows them; without them (a failure
    here) clients fetch the page."""
    from .board_rows import live_board  # imported here like live_run: it reaches the models

    try:
        if gpu_name is None:
            gpu_name = GpuType.objects.filter(pk=gpu_type_id).values_list("name", flat=True).first() or ""
        return live_board(leaderboard_id, gpu_type_id, gpu_name, ranks, **parts)
    except Exception:
        log.exception("could not render the rows of board %s/%s", leaderboard_id, gpu_type_id)
        return {}
