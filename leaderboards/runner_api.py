"""The runner HTTP API under /api/runner/v1/: how a remote agent (runners/harness/agent.py) fetches its job and
reports back. Authorised per attempt: Bearer HMAC-SHA256(pool's runner key, "run:attempt:nonce"), checked in
constant time against the stored nonce. A valid token of an attempt that is no longer current (retried, finished,
cancelled) gets 409 and changes nothing. Every bad request is a 4xx with a JSON {"detail": ...}, never a 500.
"""

from __future__ import annotations

import hmac
import io
import json
import tarfile
from functools import cache
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from runners.backends.base import runner_key
from runners.harness.agent import runner_token

from . import lifecycle
from .models import Run, RunAttempt, RunStatus


class Refused(Exception):
    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


def _error(status: int, detail: str) -> JsonResponse:
    response = JsonResponse({"detail": detail}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = "Bearer"
    return response


def _authorise(request: HttpRequest, run_id: int, number: int) -> tuple[Run, RunAttempt]:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "missing Bearer token")
    if not (0 < run_id < 1 << 63 and 0 < number < 1 << 31):
        raise Refused(404, "no such run attempt")
    attempt = RunAttempt.objects.select_related("pool", "run").filter(run_id=run_id, number=number).first()
    key = runner_key(attempt.pool) if attempt is not None else ""
    expected = runner_token(key, run_id, number, attempt.nonce) if attempt is not None and attempt.nonce else ""
    # compare against something of the same length even when there is nothing to compare with
    if not hmac.compare_digest(token.strip().encode(), (expected or "0" * 64).encode()) or not expected or not key:
        raise Refused(403, "invalid token for this run attempt")
    run = attempt.run
    if run.attempt != number or run.status not in (RunStatus.DISPATCHED, RunStatus.RUNNING):
        raise Refused(409, f"attempt {number} of run {run_id} is no longer current (run is {run.status}, attempt "
                           f"{run.attempt})")
    return run, attempt


def _body(request: HttpRequest) -> dict:
    try:
        body = json.loads(request.body or b"null")
    except (ValueError, RecursionError) as exc:
        raise Refused(400, f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise Refused(400, "the body must be a JSON object")
    return body


def _endpoint(handler):
    def view(request: HttpRequest, run_id: int, attempt: int) -> HttpResponse:
        try:
            run, _ = _authorise(request, run_id, attempt)
            return handler(request, run, attempt)
        except Refused as exc:
            return _error(exc.status, exc.detail)
    view.__name__ = handler.__name__
    return csrf_exempt(view)


@require_GET
@_endpoint
def job(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    """The job (code and seed included): only for the current attempt's valid token. Fetching it marks the run
    running."""
    if not lifecycle.do_mark_running(run.pk, attempt, remote=True):
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse(lifecycle.AttemptReporter(run.pk, attempt).job())


@require_POST
@_endpoint
def progress(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    """A harness progress event (also a heartbeat: extends the running deadline); {"heartbeat": true} only beats."""
    body = _body(request)
    if body.get("heartbeat") is True:
        alive = lifecycle.do_heartbeat(run.pk, attempt, remote=True)
    else:
        if body.get("event") != "progress":
            raise Refused(400, 'a progress event needs "event": "progress"')
        alive = lifecycle.do_record_progress(run.pk, attempt, body, remote=True)
    if not alive:
        raise Refused(409, "the attempt is not running")
    return JsonResponse({"running": True})


@require_POST
@_endpoint
def result(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    body = _body(request)
    if body.get("event", "result") != "result" or "status" not in body:
        raise Refused(400, 'a result needs "status" (the harness result line)')
    accepted = lifecycle.do_ingest_result(run.pk, attempt, body)
    if not accepted:
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse({"accepted": True})


@require_POST
@_endpoint
def failure(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    reason = _body(request).get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise Refused(400, '{"reason": "..."} is required')
    if not lifecycle.do_report_failure(run.pk, attempt, f"remote runner: {reason.strip()[:2000]}"):
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse({"accepted": True})


@cache
def harness_tarball() -> bytes:
    """runners/harness (with the agent) as runners/harness/... plus an empty runners/__init__.py, so
    `python -m runners.harness.agent` works where it is unpacked."""
    root = Path(settings.BASE_DIR)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        init = tarfile.TarInfo("runners/__init__.py")
        tar.addfile(init, io.BytesIO(b""))
        for file in sorted((root / "runners" / "harness").rglob("*.py")):
            tar.add(file, arcname=str(file.relative_to(root)), recursive=False)
    return buffer.getvalue()


@require_GET
def harness(request: HttpRequest) -> HttpResponse:
    return HttpResponse(harness_tarball(), content_type="application/gzip",
                        headers={"Content-Disposition": 'attachment; filename="harness.tar.gz"'})


urlpatterns = [
    path("runs/<int:run_id>/<int:attempt>/job", job, name="runner-job"),
    path("runs/<int:run_id>/<int:attempt>/progress", progress, name="runner-progress"),
    path("runs/<int:run_id>/<int:attempt>/result", result, name="runner-result"),
    path("runs/<int:run_id>/<int:attempt>/failure", failure, name="runner-failure"),
    path("harness.tar.gz", harness, name="runner-harness"),
]
