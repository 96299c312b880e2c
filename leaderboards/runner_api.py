"""The runner HTTP API under /api/runner/v1/: how a remote agent (runners/harness/agent.py) fetches its job and
reports back. Authorised per attempt: Bearer HMAC-SHA256(pool's runner key, "run:attempt:nonce"), the token the
platform hands over with the dispatch or a node's claim (the key never leaves it), checked in constant time against
the stored nonce. A valid token of an attempt that is no longer current (retried, finished,
cancelled) gets 409 and changes nothing. Every bad request is a 4xx with a JSON {"detail": ...}, never a 500.
"""

from __future__ import annotations

import hmac
import io
import json
import re
import tarfile
from functools import cache
from pathlib import Path

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from runners.actions import NodeRejected, do_register_agent
from runners.backends.base import runner_key
from runners.harness.agent import runner_token
from runners.harness.node import node_token
from runners.models import GpuPool, Node
from runners.reservations import allocator, keys

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
            run, current = _authorise(request, run_id, attempt)
            request.remote_runner = not current.pool.is_local  # a node agent's run beats like a local one
            return handler(request, run, attempt)
        except Refused as exc:
            return _error(exc.status, exc.detail)
    view.__name__ = handler.__name__
    return csrf_exempt(view)


@require_GET
@_endpoint
def job(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    """The job (code and seed included): only for the current attempt's valid token. Fetching it marks the run
    running; `?host=H&gpus=0,1` names where a remote job's scheduler put it (those devices are held for the run)."""
    host, gpus = request.GET.get("host", ""), request.GET.get("gpus", "")
    if len(host) > 120 or "\x00" in host or not re.fullmatch(r"(\d{1,4}(,\d{1,4}){0,63})?", gpus):
        raise Refused(400, '"host" must be a hostname and "gpus" device indices, e.g. 0,1')
    placement = (host, [int(i) for i in gpus.split(",") if i]) if host else None
    if not lifecycle.do_mark_running(run.pk, attempt, remote=request.remote_runner, placement=placement):
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse(lifecycle.AttemptReporter(run.pk, attempt).job())


@require_POST
@_endpoint
def progress(request: HttpRequest, run: Run, attempt: int) -> HttpResponse:
    """A harness progress event (also a heartbeat: extends the running deadline); {"heartbeat": true} only beats."""
    body = _body(request)
    if body.get("heartbeat") is True:
        alive = lifecycle.do_heartbeat(run.pk, attempt, remote=request.remote_runner)
    else:
        if body.get("event") != "progress":
            raise Refused(400, 'a progress event needs "event": "progress"')
        alive = lifecycle.do_record_progress(run.pk, attempt, body, remote=request.remote_runner)
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


# --- node agents (runners/harness/node.py) --------------------------------------------------------------------------

def _node_request(request: HttpRequest) -> tuple[GpuPool, str, dict]:
    """The local pool and hostname a node agent speaks for, authorised by Bearer HMAC(pool's key,
    "node:pool:hostname")."""
    body = _body(request)
    pool_name, hostname = body.get("pool"), body.get("hostname")
    for name, value, limit in (("pool", pool_name, 60), ("hostname", hostname, 120)):
        if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
            raise Refused(400, f'"{name}" must be a non-empty string of at most {limit} characters')
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "missing Bearer token")
    pool = GpuPool.objects.filter(name=pool_name).first()
    key = runner_key(pool) if pool is not None else ""
    expected = node_token(key, pool_name, hostname) if key else ""
    if not hmac.compare_digest(token.strip().encode(), (expected or "0" * 64).encode()) or not expected:
        raise Refused(403, f"invalid token for node {hostname} of pool {pool_name}")
    if not pool.is_local:
        raise Refused(409, f"pool {pool.name} runs on {pool.get_backend_display()}, not on node agents")
    return pool, hostname, body


def _node_endpoint(handler):
    @csrf_exempt
    @require_POST
    def view(request: HttpRequest) -> HttpResponse:
        try:
            return handler(request, *_node_request(request))
        except Refused as exc:
            return _error(exc.status, exc.detail)
    view.__name__ = handler.__name__
    return view


@_node_endpoint
def node_register(request: HttpRequest, pool: GpuPool, hostname: str, body: dict) -> HttpResponse:
    """The agent's probe of its machine becomes the node's device rows (`runners.actions.do_register_agent`); runs
    an earlier agent there held are retried at once. A node whose sandbox cannot satisfy its mode is out of service
    (`out_of_service` says why) and gets no run."""
    report, info = body.get("probe"), body.get("agent") or {}
    if not isinstance(report, dict) or not isinstance(report.get("devices", []), list) or not isinstance(info, dict):
        raise Refused(400, '"probe" must be the JSON object `python -m runners.harness.probe` prints')
    try:
        registration = do_register_agent(pool, hostname, lifecycle.scrub(report), lifecycle.scrub(info))
    except NodeRejected as exc:
        raise Refused(409, str(exc)) from exc
    except (KeyError, TypeError, ValueError) as exc:
        raise Refused(400, f"the probe report is malformed: {type(exc).__name__}: {exc}") from exc
    retried = lifecycle.do_node_restarted(registration.node)
    if registration.back_in_service:
        lifecycle.node_back_in_service(registration.node)
    node = registration.node
    gpus = node.gpus.select_related("gpu_type").order_by("index")
    return JsonResponse({"node": node.pk, "retried": retried, "out_of_service": node.service_detail, "devices": [
        {"index": g.index, "gpu_type": g.gpu_type.name, "enabled": g.enabled} for g in gpus]})


@_node_endpoint
def node_poll(request: HttpRequest, pool: GpuPool, hostname: str, body: dict) -> HttpResponse:
    """The node's heartbeat and its ask for work: runs for its free devices (`lifecycle.do_claim_runs`), which of
    its devices reservations hold now and which reservation holds each (the agent sweeps the others' leftover
    processes, and those of reservations no longer here), and their holders' SSH keys (an agent started with
    --authorized-keys places them)."""
    free = body.get("free", [])
    if not isinstance(free, list) or len(free) > 256 or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024 for i in free):
        raise Refused(400, '"free" must be a list of device indices')
    node = Node.objects.select_related("pool").filter(pool=pool, hostname=hostname).first()
    if node is None:
        raise Refused(404, f"{hostname} is not registered in pool {pool.name}: register first")
    return JsonResponse({"claims": lifecycle.do_claim_runs(node, sorted(set(free))),
                         "reserved": allocator.reserved_indices(node.pk),
                         "reservations": allocator.reservations_on(node.pk), "keys": keys.placed_on(node.pk)})


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
    path("nodes/register", node_register, name="runner-node-register"),
    path("nodes/poll", node_poll, name="runner-node-poll"),
    path("harness.tar.gz", harness, name="runner-harness"),
]
