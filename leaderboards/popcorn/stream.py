"""popcorn-cli's streamed route `POST /{leaderboard}/{gpu}/{mode}` (used for profile): an async view, so an
open stream costs the server a coroutine, not a thread."""

from __future__ import annotations

import time

from django.db import DataError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from ninja.errors import HttpError

from leaderboards.access.actions import AccessDenied
from leaderboards.actions import SubmissionRejected
from leaderboards.progress import in_pool, run_snapshots, sse

from . import wire
from .api import accept, cli_user, read_upload

HEARTBEAT = 15.0


def error(message: str, status: int, retry_after: int | None = None) -> JsonResponse:
    response = JsonResponse({"detail": message}, status=status)
    if retry_after:
        response["Retry-After"] = str(retry_after)
    return response


@csrf_exempt
async def stream_submit(request: HttpRequest, leaderboard: str, gpu: str, mode: str) -> HttpResponse:
    if request.method != "POST":
        return error("Use POST with a multipart 'file' part.", 405)
    try:
        user = await in_pool(cli_user, request)
        file_name, content = read_upload(request)
        submission = await in_pool(accept, user, leaderboard, gpu, mode, file_name, content)
    except HttpError as exc:
        return error(str(exc.message), exc.status_code)
    except SubmissionRejected as exc:
        return error(exc.message, exc.status, exc.retry_after)
    except AccessDenied as exc:
        return error(exc.message, exc.status)
    except DataError:
        return error("The request holds characters that cannot be stored or looked up (such as NUL bytes).", 400)
    response = StreamingHttpResponse(events(submission.pk), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def events(submission_id: int, heartbeat: float = HEARTBEAT):
    started = time.monotonic()
    yield sse("status", {"status": "processing", "elapsed_time": 0.0})
    last_status = time.monotonic()
    try:
        async for submission, runs, _ in run_snapshots(submission_id, heartbeat):
            done = submission is not None and runs and all(r.is_terminal for r in runs)
            if submission is None:
                yield sse("error", {"status": "error", "detail": "The submission was deleted."})
                return
            if done:
                payload = {"status": "success", "submission_id": submission_id,
                           "results": [wire.run_result(r) for r in runs if not r.secret],
                           "reports": [wire.report(r) for r in runs if not r.secret]}
                yield sse("result", payload)
                return
            if time.monotonic() - last_status >= heartbeat:
                last_status = time.monotonic()
                yield sse("status", {"status": "processing", "elapsed_time": round(time.monotonic() - started, 1)})
    except Exception as exc:  # the client must always get a final event
        yield sse("error", {"status": "error", "detail": f"Stream failed: {type(exc).__name__}"})
