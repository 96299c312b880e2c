"""popcorn-cli's streamed route `POST /{leaderboard}/{gpu}/{mode}` (used for profile): an async view, so an
open stream costs the server a coroutine, not a thread."""

from __future__ import annotations

import time

from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from kernelbot.api_errors import error_response
from leaderboards.access.authority import run_view
from leaderboards.progress import in_pool, run_snapshots, sse

from . import wire
from .api import accept, cli_user, read_upload

HEARTBEAT = 15.0


@csrf_exempt
async def stream_submit(request: HttpRequest, leaderboard: str, gpu: str, mode: str) -> HttpResponse:
    if request.method != "POST":  # as KernelBot: the path is served, the method is not (JSON: the middleware's)
        return HttpResponseNotAllowed(["POST"])
    try:
        user = await in_pool(cli_user, request)
        file_name, content = read_upload(request)
        submission = await in_pool(accept, user, leaderboard, gpu, mode, file_name, content)
    except Exception as exc:  # noqa: BLE001 - refusals become their answer, anything else is re-raised
        return error_response(exc)
    response = StreamingHttpResponse(events(submission.pk, user), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def events(submission_id: int, viewer, heartbeat: float = HEARTBEAT):
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
                view = run_view(viewer, submission)
                public = [r for r in runs if not r.secret]
                yield sse("result", {"status": "success", "submission_id": submission_id,
                                     "results": [wire.run_result(r, view) for r in public],
                                     "reports": [wire.report(r, view) for r in public]})
                return
            if time.monotonic() - last_status >= heartbeat:
                last_status = time.monotonic()
                yield sse("status", {"status": "processing", "elapsed_time": round(time.monotonic() - started, 1)})
    except Exception as exc:  # the client must always get a final event
        yield sse("error", {"status": "error", "detail": f"Stream failed: {type(exc).__name__}"})
