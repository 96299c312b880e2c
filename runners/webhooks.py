"""Webhooks from runner services. GitHub: a signed `workflow_run` event makes the lifecycle poll the run at once,
so a finished run is noticed in well under a second instead of at the next scheduled poll."""

from __future__ import annotations

import hashlib
import hmac
import json
import logging

from django.core.cache import cache
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from .backends.base import BackendUnavailable
from .backends.github import PENDING, TITLE, GithubBackend
from .models import GpuPool, RunnerBackendName
from .signals import remote_news

log = logging.getLogger(__name__)
DELIVERY_TTL = 7 * 86400  # GitHub redelivers on request for up to 3 days


def _answer(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def signature_ok(secret: str, body: bytes, header: str) -> bool:
    expected = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected.encode(), header.encode())


@csrf_exempt
@require_POST
def github_webhook(request: HttpRequest, pool_id: int) -> JsonResponse:
    pool = GpuPool.objects.filter(pk=pool_id, backend=RunnerBackendName.GITHUB).first() if pool_id < 2**31 else None
    if pool is None:
        return _answer(404, f"no GitHub Actions pool has id {pool_id}")
    try:
        backend = GithubBackend(pool)
        secret = backend.webhook_secret()
    except BackendUnavailable as exc:  # never accept what we cannot verify
        return _answer(503, str(exc))
    if not signature_ok(secret, request.body, request.headers.get("X-Hub-Signature-256", "")):
        return _answer(401, "X-Hub-Signature-256 is missing or does not match the pool's webhook secret")
    event = request.headers.get("X-GitHub-Event", "")
    try:
        payload = json.loads(request.body)
    except ValueError:
        return _answer(400, "the body is not JSON")
    if event == "ping":
        return _answer(200, "pong")
    if event != "workflow_run":
        return _answer(202, f"ignored: {event or 'no'} event")
    run = payload.get("workflow_run") if isinstance(payload, dict) else None
    if not isinstance(run, dict) or not isinstance(run.get("id"), int) or isinstance(run.get("id"), bool):
        return _answer(400, "a workflow_run event needs workflow_run.id (an integer)")
    repository = payload.get("repository")
    repository = repository.get("full_name") if isinstance(repository, dict) else None
    if not isinstance(repository, str) or repository.lower() != backend.settings["repository"].lower():
        return _answer(202, f"ignored: repository {repository!r} is not this pool's")
    if payload.get("action") != "completed":
        return _answer(202, f"ignored: action {payload.get('action')!r}")
    delivery = request.headers.get("X-GitHub-Delivery", "")
    if delivery and not cache.add(f"github-delivery:{pool.pk}:{delivery[:100]}", 1, DELIVERY_TTL):
        return _answer(200, "already received")
    external_ids = [str(run["id"])]
    title = TITLE.search(run.get("display_title") or "") if isinstance(run.get("display_title"), str) else None
    if title:
        external_ids.append(PENDING + title["nonce"])  # dispatched without return_run_details
    for receiver, error in remote_news.send_robust(sender=pool, external_ids=external_ids):
        if isinstance(error, Exception):  # the scheduled poll still finds the run; GitHub must not see a 500
            log.error("remote_news receiver %s failed for %s", receiver, external_ids, exc_info=error)
    return _answer(202, "accepted")
