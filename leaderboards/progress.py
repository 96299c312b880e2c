"""Server-sent progress of one submission, for the API streams. Runs on the event loop: it waits on the
channel layer (`submission.<id>` events) with a timeout and re-reads the runs from the database through a
small shared thread pool, so an open stream holds no thread and no database connection."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection

from .models import Run, Submission


def sse(event: str, data: Any) -> bytes:
    """One SSE message: LF framing, single-line JSON data."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


async def in_pool(fn: Callable, *args, **kwargs):
    """Run blocking ORM code in the shared executor (not a per-request thread, which would pin a connection
    for the stream's lifetime); each of its few threads keeps one connection, dropped after an error."""

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            if connection.errors_occurred:
                connection.close()

    return await sync_to_async(call, thread_sensitive=False)()


def load_runs(submission_id: int) -> tuple[Submission | None, list[Run]]:
    submission = Submission.objects.select_related("leaderboard", "code").filter(pk=submission_id).first()
    if submission is None:
        return None, []
    return submission, list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))


def poll_seconds() -> float:
    return 10.0 if settings.REDIS_URL else 2.0


async def run_snapshots(submission_id: int, heartbeat: float) -> AsyncIterator[tuple[Submission | None,
                                                                                    list[Run], bool]]:
    """Yields (submission, runs, changed) after every change and at least every `heartbeat` seconds;
    stops after yielding a snapshot whose runs are all finished (or a deleted submission)."""
    layer = get_channel_layer()
    channel = await layer.new_channel() if layer else None
    group = f"submission.{submission_id}"
    if channel:
        await layer.group_add(group, channel)
    try:
        last_state, last_beat = None, time.monotonic()
        while True:
            submission, runs = await in_pool(load_runs, submission_id)
            state = [(r.pk, r.status, r.attempt, json.dumps(r.progress, sort_keys=True, default=str)) for r in runs]
            changed = state != last_state
            if changed or time.monotonic() - last_beat >= heartbeat:
                last_state, last_beat = state, time.monotonic()
                yield submission, runs, changed
            if submission is None or (runs and all(r.is_terminal for r in runs)):
                return
            wait = min(poll_seconds(), max(0.05, heartbeat - (time.monotonic() - last_beat)))
            try:
                if channel:
                    await asyncio.wait_for(layer.receive(channel), timeout=wait)
                else:
                    await asyncio.sleep(wait)
            except TimeoutError:
                pass
    finally:
        if channel:
            await layer.group_discard(group, channel)
