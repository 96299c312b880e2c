"""Server-sent progress of one submission, for the API streams. Runs on the event loop and re-reads the runs
every POLL_SECONDS through a small shared thread pool, one read per submission per process however many
streams watch it, so an open stream holds no thread and no database connection. (Waiting on the channel
layer instead was tried: hundreds of concurrent cancelled receives time out channels-redis.)"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from asgiref.sync import sync_to_async
from django.db import connection

from .models import Run, Submission


def sse(event: str, data: Any) -> bytes:
    """One SSE message: LF framing, single-line JSON data."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


async def in_pool(fn: Callable, *args, **kwargs):
    """Run blocking ORM code in the shared executor (not a per-request thread, which would pin a connection
    for the stream's lifetime). Its connection then follows CONN_MAX_AGE as a request's does: closed after the
    read by default, back to the pool with DB_POOL, dropped after an error."""

    def call():
        try:
            return fn(*args, **kwargs)
        finally:
            connection.close_if_unusable_or_obsolete()

    return await sync_to_async(call, thread_sensitive=False)()


def load_runs(submission_id: int) -> tuple[Submission | None, list[Run]]:
    submission = Submission.objects.select_related("leaderboard", "code", "final_entry").filter(
        pk=submission_id).first()
    if submission is None:
        return None, []
    return submission, list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))


POLL_SECONDS = 1.0
_reads: dict[int, tuple[float, asyncio.Future]] = {}


async def shared_read(submission_id: int) -> tuple[Submission | None, list[Run]]:
    """At most one database read per submission per POLL_SECONDS in this process, however many streams
    watch it; readers of the same submission share the result."""
    now = time.monotonic()
    hit = _reads.get(submission_id)
    if hit is None or now - hit[0] >= POLL_SECONDS:
        if len(_reads) > 1000:
            for key in [k for k, (at, _) in _reads.items() if now - at > 10 * POLL_SECONDS]:
                del _reads[key]
        hit = (now, asyncio.ensure_future(in_pool(load_runs, submission_id)))
        _reads[submission_id] = hit
    return await asyncio.shield(hit[1])


async def run_snapshots(submission_id: int, heartbeat: float) -> AsyncIterator[tuple[Submission | None,
                                                                                    list[Run], bool]]:
    """Yields (submission, runs, changed) after every change and at least every `heartbeat` seconds;
    stops after yielding a snapshot whose runs are all finished (or a deleted submission)."""
    last_state, last_beat = None, time.monotonic()
    while True:
        submission, runs = await shared_read(submission_id)
        state = [(r.pk, r.status, r.attempt, json.dumps(r.progress, sort_keys=True, default=str)) for r in runs]
        changed = state != last_state
        if changed or time.monotonic() - last_beat >= heartbeat:
            last_state, last_beat = state, time.monotonic()
            yield submission, runs, changed
        if submission is None or (runs and all(r.is_terminal for r in runs)):
            return
        await asyncio.sleep(min(POLL_SECONDS, max(0.05, heartbeat - (time.monotonic() - last_beat))))
