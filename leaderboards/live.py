"""Live updates across processes.

With channels-redis every process shares one layer. With the embedded InMemoryChannelLayer each process
has its own, so `events.send` also writes a `LiveEvent` row (an outbox) and every ASGI process tails that
table with one cheap indexed query per `LIVE_OUTBOX_POLL` seconds and re-sends what other processes wrote
on its own layer. Consumers start the tailer on first connect; versioned deltas let clients detect a gap
and ask for a fresh snapshot."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.utils import timezone

log = logging.getLogger(__name__)
ORIGIN = f"{socket.gethostname()}:{os.getpid()}"
RETENTION = timedelta(minutes=10)
_tailers: dict[int, asyncio.Task] = {}


def uses_outbox() -> bool:
    """True when the configured layer cannot reach other processes by itself."""
    backend = settings.CHANNEL_LAYERS.get("default", {}).get("BACKEND", "")
    return backend.endswith("InMemoryChannelLayer")


def write_outbox(group: str, message: dict[str, Any]) -> None:
    from .models import LiveEvent

    LiveEvent.objects.create(group=group, payload=message, origin=ORIGIN)


def _latest_id() -> int:
    from .models import LiveEvent

    return LiveEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


def _fetch(after: int, prune: bool) -> list[tuple[int, str, dict, str]]:
    from .models import LiveEvent

    if prune:
        LiveEvent.objects.filter(created__lt=timezone.now() - RETENTION).delete()
    return list(LiveEvent.objects.filter(pk__gt=after).order_by("pk")
                .values_list("pk", "group", "payload", "origin")[:500])


async def tail_outbox(poll: float | None = None) -> None:
    """Forward other processes' events to this process's layer, forever."""
    poll = poll or settings.LIVE_OUTBOX_POLL
    layer = get_channel_layer()
    last = await database_sync_to_async(_latest_id)()
    loops = 0
    while True:
        try:
            rows = await database_sync_to_async(_fetch)(last, loops % 600 == 599)
            for pk, group, payload, origin in rows:
                last = pk
                if origin != ORIGIN:
                    await layer.group_send(group, payload)
        except asyncio.CancelledError:
            raise
        except Exception:  # the database may be briefly unavailable; keep tailing
            log.exception("live outbox poll failed")
        loops += 1
        await asyncio.sleep(poll)


def ensure_tailer() -> None:
    """Start this event loop's outbox tailer once (no-op with a shared layer such as Redis)."""
    if not uses_outbox():
        return
    loop = asyncio.get_running_loop()
    task = _tailers.get(id(loop))
    if task is None or task.done():
        _tailers[id(loop)] = loop.create_task(tail_outbox())
