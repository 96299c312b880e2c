"""The runner HTTP API under /api/runner/v1/: how a remote agent (runners/harness/agent.py) fetches its job and
reports back. Authorised per attempt: Bearer HMAC-SHA256(pool's runner key, "run:attempt:nonce"), the token the
platform hands over with the dispatch or a node's claim (the key never leaves it), checked in constant time against
the stored nonce. A valid token of an attempt that is no longer current (retried, finished,
cancelled) gets 409 and changes nothing. Every bad request is a 4xx with a JSON {"detail": ...}, never a 500.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import io
import json
import logging
import math
import re
import tarfile
import time
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from kernelbot import dbhealth
from runners import wakeups
from runners.actions import NodeRejected, do_register_agent
from runners.backends.base import runner_key
from runners.harness.agent import runner_token
from runners.harness.node import node_token
from runners.models import Gpu, GpuPool, Node, NodeService, PoolHealth
from runners.reservations import allocator, keys
from runners.reservations.models import DeviceHold, HoldKind

from . import health, lifecycle
from .models import Run, RunAttempt, RunStatus

log = logging.getLogger(__name__)


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
            return handler(request, run, current)
        except Refused as exc:
            return _error(exc.status, exc.detail)
    view.__name__ = handler.__name__
    return csrf_exempt(view)


@require_GET
@_endpoint
def job(request: HttpRequest, run: Run, attempt: RunAttempt) -> HttpResponse:
    """The job (code and seed included): only for the current attempt's valid token. Fetching it marks the run
    running; `?host=H&gpus=0,1` names where a remote job's scheduler put it (those devices are held for the run)."""
    host, gpus = request.GET.get("host", ""), request.GET.get("gpus", "")
    if len(host) > 120 or "\x00" in host or not re.fullmatch(r"(\d{1,4}(,\d{1,4}){0,63})?", gpus):
        raise Refused(400, '"host" must be a hostname and "gpus" device indices, e.g. 0,1')
    placement = (host, [int(i) for i in gpus.split(",") if i]) if host else None
    if not lifecycle.do_mark_running(run.pk, attempt.number, remote=request.remote_runner, placement=placement,
                                     claimed=attempt.external_id.startswith("node:")):
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse(lifecycle.AttemptReporter(run.pk, attempt.number).job(attempt.pool))


@require_POST
@_endpoint
def progress(request: HttpRequest, run: Run, attempt: RunAttempt) -> HttpResponse:
    """A harness progress event (also a heartbeat: extends the running deadline); {"heartbeat": true} only beats."""
    body = _body(request)
    if body.get("heartbeat") is True:
        alive = lifecycle.do_heartbeat(run.pk, attempt.number, remote=request.remote_runner)
    else:
        if body.get("event") != "progress":
            raise Refused(400, 'a progress event needs "event": "progress"')
        alive = lifecycle.do_record_progress(run.pk, attempt.number, body, remote=request.remote_runner)
    if not alive:
        raise Refused(409, "the attempt is not running")
    return JsonResponse({"running": True})


@require_POST
@_endpoint
def result(request: HttpRequest, run: Run, attempt: RunAttempt) -> HttpResponse:
    body = _body(request)
    if body.get("event", "result") != "result" or "status" not in body:
        raise Refused(400, 'a result needs "status" (the harness result line)')
    accepted = lifecycle.do_ingest_result(run.pk, attempt.number, body)
    if not accepted:
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse({"accepted": True})


@require_POST
@_endpoint
def failure(request: HttpRequest, run: Run, attempt: RunAttempt) -> HttpResponse:
    reason = _body(request).get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise Refused(400, '{"reason": "..."} is required')
    if not lifecycle.do_report_failure(run.pk, attempt.number, f"remote runner: {reason.strip()[:2000]}"):
        raise Refused(409, "the attempt is no longer current")
    return JsonResponse({"accepted": True})


# --- node agents (runners/harness/node.py) --------------------------------------------------------------------------

def _node_auth(authorization: str, body: dict) -> tuple[GpuPool, str, Node | None]:
    """The local pool and hostname a node agent speaks for, authorised by Bearer HMAC(pool's key,
    "node:pool:hostname"), and the node when registered (one query for both when it is)."""
    pool_name, hostname = body.get("pool"), body.get("hostname")
    for name, value, limit in (("pool", pool_name, 60), ("hostname", hostname, 120)):
        if not isinstance(value, str) or not value.strip() or len(value) > limit or "\x00" in value:
            raise Refused(400, f'"{name}" must be a non-empty string of at most {limit} characters')
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Refused(401, "missing Bearer token")
    node = Node.objects.select_related("pool").filter(pool__name=pool_name, hostname=hostname).first()
    pool = node.pool if node is not None else GpuPool.objects.filter(name=pool_name).first()
    key = runner_key(pool) if pool is not None else ""
    expected = node_token(key, pool_name, hostname) if key else ""
    if not hmac.compare_digest(token.strip().encode(), (expected or "0" * 64).encode()) or not expected:
        raise Refused(403, f"invalid token for node {hostname} of pool {pool_name}")
    if not pool.is_local:
        raise Refused(409, f"pool {pool.name} runs on {pool.get_backend_display()}, not on node agents")
    return pool, hostname, node


def _node_request(request: HttpRequest) -> tuple[GpuPool, str, dict]:
    body = _body(request)
    pool, hostname, _ = _node_auth(request.headers.get("Authorization", ""), body)
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
    _types.pop(registration.node.pk, None)
    _known.pop((pool.name, hostname), None)
    retried = lifecycle.do_node_restarted(registration.node)
    if registration.back_in_service:
        lifecycle.node_back_in_service(registration.node)
    node = registration.node
    if pool.health == PoolHealth.FAILING or node.service == NodeService.FAILED_CHECK:
        health.do_start_node_check(node)  # it proves itself now, not at the next round
    gpus = node.gpus.select_related("gpu_type").order_by("index")
    return JsonResponse({"node": node.pk, "retried": retried, "out_of_service": node.service_detail, "devices": [
        {"index": g.index, "gpu_type": g.gpu_type.name, "enabled": g.enabled} for g in gpus]})


def _free(body: dict) -> list[int]:
    free = body.get("free", [])
    if not isinstance(free, list) or len(free) > 256 or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < 1024 for i in free):
        raise Refused(400, '"free" must be a list of device indices')
    return sorted(set(free))


def _samples(body: dict) -> list[dict] | None:
    """The agent's samples of its devices (nvidia-smi), kept for /metrics; None when it sent none. Finite,
    non-negative numbers: a utilisation (a fraction, 0..1 or a little over) and bytes (below 2**60)."""
    samples = body.get("samples")
    if samples is None:
        return None
    limits = {"index": (int, 1023), "utilization": (float, 10.0), "memory_used": (int, 1 << 60),
              "memory_total": (int, 1 << 60)}

    def number(value, kind, most):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                isinstance(value, float) and not math.isfinite(value)) or not 0 <= value <= most:
            raise ValueError
        return kind(value)

    try:
        if not isinstance(samples, list) or len(samples) > 256 or not all(isinstance(s, dict) for s in samples):
            raise ValueError
        return [{k: number(s.get(k), kind, most) for k, (kind, most) in limits.items()} for s in samples]
    except ValueError:
        raise Refused(400, '"samples" must be a list of {"index", "utilization", "memory_used", "memory_total"}: '
                           'finite, non-negative numbers (an index below 1024, bytes below 2**60)') from None


def _reservations(node_id: int) -> dict:
    """Which of the node's devices reservations hold now and which reservation holds each (the agent sweeps the
    others' leftover processes, and those of reservations no longer here), and their holders' SSH keys (an agent
    started with --authorized-keys places them); read only for a node reservations hold devices of (`_pool_state`)."""
    return {"reserved": allocator.reserved_indices(node_id), "reservations": allocator.reservations_on(node_id),
            "keys": keys.placed_on(node_id)}


def node_answer(authorization: str, body: dict, *, woken: tuple[str, int] | None = None,
                batched: bool = False, fresh: bool = True) -> tuple[dict, list[str], Node]:
    """One ask for work by a node's agent (also its heartbeat): its claims (`lifecycle.do_claim_runs`) and its
    reservations, the wake-up keys (runners.wakeups) to wait on when it got no claim, and the node. `woken`: the
    pool wake that woke this ask, handed on when it claims nothing while a run of that type still waits. `batched`:
    the caller records the heartbeat (runners.wakeups batches them).
    `fresh=False`: whether a run waits for the pool and which of its nodes reservations hold devices of may be this
    process's reading of up to POOL_TTL ago, taken since its last wake-up (an ask that was woken reads them anew;
    one that missed a wake-up that way waits at most a heartbeat). An idle node's ask then costs one query."""
    pool, hostname, node = _node_auth(authorization, body)
    free = _free(body)
    if node is None:
        raise Refused(404, f"{hostname} is not registered in pool {pool.name}: register first")
    if (samples := _samples(body)) is not None and not batched:  # every 15 s at most: one UPDATE then
        Node.objects.filter(pk=node.pk).update(samples=samples)
    claims: list[dict] = []
    waiting, reserved, read_now = _pool_state(pool.pk, fresh)
    if lifecycle.do_node_heartbeat(node, free, record=not batched) and (None in waiting or node.pk in waiting):
        gpus = lifecycle.free_gpus(node, free)
        when, cached = _node_types(node)
        _types[node.pk] = (when, cached | {g.index: g.gpu_type_id for g in gpus})  # what was just read wins
        claims = lifecycle.claim_on(node, gpus, waiting.get(None, set()) | waiting.get(node.pk, set())
                                    if read_now else None)
    if woken is not None and not claims and lifecycle.claimable(pool.pk, [int(woken[0].rsplit(":", 1)[1])],
                                                                unpinned=True):
        transaction.on_commit(lambda: wakeups.waiters.pass_on(woken))  # such a run still waits: the next one looks
    types = _node_types(node)[1]
    wait_on = [f"node:{node.pk}"] + [
        f"pool:{pool.pk}:{t}" for t in sorted({types[i] for i in free if i in types})]
    news = _reservations(node.pk) if node.pk in reserved else NONE
    if batched and not claims and node.enabled and node.service == NodeService.IN_SERVICE:
        _known[(pool.name, hostname)] = Known(authorization.partition(" ")[2].strip(), node.pk, pool.pk,
                                              time.monotonic())
    return {"claims": claims, **news}, wait_on, node


# pool → (when read, wake-ups seen then, who a waiting run is for and of which GPU types (`lifecycle.waiting_for`),
# nodes a reservation holds)
_pools: dict[int, tuple[float, int, dict[int | None, set[int]], set[int]]] = {}
POOL_TTL = 1.0
# asks queued on a web process's node lane past which a known node's ask is answered without it (`_idle_answer`):
# while runs wait every ask would look for work, and a fleet's heartbeats alone then outrun the lane; only woken asks
# (one per dispatched run, handed on) and unknown nodes' go the normal way, so the queue and a claim's wait stay short
LANE_SHED = 8
END_MARGIN_S = 0.05  # a held wait that a reservation's end cuts short is answered this long after it
NONE = {"reserved": [], "reservations": [], "keys": []}


def _pool_state(pool_id: int, fresh: bool) -> tuple[dict[int | None, set[int]], set[int], bool]:
    """Which node agents a run dispatched to the pool waits for (None: any; a node: a run pinned to it, such as its
    health check, so a round of checks leaves the other nodes' asks idle) with those runs' GPU types, the pool's
    nodes that reservations hold devices of, and whether they were read now: anew when `fresh`, older than POOL_TTL
    or older than this process's last wake-up (a reading from before a run was dispatched must not send the agent
    that re-asks for it back to wait)."""
    hit, seq = _pools.get(pool_id), wakeups.waiters.seq
    read_now = fresh or hit is None or hit[1] != seq or time.monotonic() - hit[0] > POOL_TTL
    if read_now:
        held = DeviceHold.objects.held().filter(kind=HoldKind.RESERVATION, pool_id=pool_id)
        hit = _pools[pool_id] = (time.monotonic(), seq, lifecycle.waiting_for(pool_id),
                                 set(held.values_list("node_id", flat=True)))
    return hit[2], hit[3], read_now


_types: dict[int, tuple[float, dict[int, int]]] = {}  # node → (when read, its enabled devices' GPU types by index)
TYPES_TTL = 600.0


def _node_types(node: Node) -> tuple[float, dict[int, int]]:
    """Which GPU type each enabled device of the node is, read at most every TYPES_TTL per process: which wake-ups
    its wait listens to (kept fresh for known nodes every KNOWN_CHECK_S by `_check_known`, and by each claim)."""
    hit = _types.get(node.pk)
    if hit is None or time.monotonic() - hit[0] > TYPES_TTL:
        hit = _types[node.pk] = (time.monotonic(), dict(node.gpus.filter(enabled=True).values_list("index",
                                                                                                  "gpu_type_id")))
    return hit


@dataclass(frozen=True)
class Known:
    """A node whose agent's last full ask (`node_answer` on the node lane) passed: authorised, enabled, in service,
    no claim. Its later asks without news are answered on the event loop (`_idle_answer`)."""
    token: str
    node_id: int
    pool_id: int
    when: float


_known: dict[tuple[str, str], Known] = {}  # (pool name, hostname) → what its last full ask found
KNOWN_TTL = 600.0  # a full ask at least this often per node and process (`_check_known` keeps them valid)
KNOWN_CHECK_S = 5.0  # how often the known nodes are checked against the database (refused within this)
_checker: asyncio.Task | None = None


def _known_node(authorization: str, body: object) -> Known | None:
    """The node of an ask whose pool, hostname and token match what its last full ask found (`_known`), else None."""
    if not isinstance(body, dict):
        return None
    pool_name, hostname = body.get("pool"), body.get("hostname")
    if not isinstance(pool_name, str) or not isinstance(hostname, str):
        return None
    known = _known.get((pool_name, hostname))
    scheme, _, token = authorization.partition(" ")
    if known is None or time.monotonic() - known.when > KNOWN_TTL or scheme.lower() != "bearer" or \
            not hmac.compare_digest(token.strip().encode(), known.token.encode()):
        return None
    return known


def _idle_answer(authorization: str, body: object, *, shed: bool = False
                 ) -> tuple[int, list[str], list[dict] | None] | None:
    """The node, the wake-up keys to wait on and its samples (valid) for an ask that needs no reading of the
    database: its node known (`_known`, with this token) and this process's fresh reading of the pool
    (`_pool_state`, since its last wake-up) says no run waits there and no reservation holds a device of the node.
    `shed`: the node lane is behind (`LANE_SHED`), so a known node's ask is answered so whatever the pool's state
    (its heartbeat still counts; a run for it wakes its wait, which then asks the normal way). None: ask the normal
    way."""
    known, now = _known_node(authorization, body), time.monotonic()
    if known is None:
        return None
    pool, types = _pools.get(known.pool_id), _types.get(known.node_id)
    if types is None or now - types[0] > TYPES_TTL:
        return None
    if not shed and (pool is None or pool[1] != wakeups.waiters.seq or now - pool[0] > POOL_TTL or None in pool[2]
                     or known.node_id in pool[2] or known.node_id in pool[3]):
        return None
    try:
        free, samples = _free(body), _samples(body)
    except Refused:
        return None
    return known.node_id, [f"node:{known.node_id}"] + [
        f"pool:{known.pool_id}:{t}" for t in sorted({types[1][i] for i in free if i in types[1]})], samples


def _known_still(known: dict[tuple[str, str], Known]) -> tuple[set[tuple[str, str]], dict[int, dict[int, int]]]:
    """Which of the known nodes are still what their full ask found: the row there, its pool local and its key
    unchanged (the token still valid), enabled and in service; and their enabled devices' GPU types now (a
    registration or an organiser may have changed them). Two queries."""
    ids = [k.node_id for k in known.values()]
    rows = Node.objects.filter(pk__in=ids).values_list(
        "pk", "enabled", "service", "pool_id", "pool__name", "hostname", "pool__backend", "pool__settings")
    keys_of: dict[int, str] = {}
    found = {}
    for pk, enabled, service, pool_id, pool_name, hostname, backend, pool_settings in rows:
        pool = GpuPool(pk=pool_id, name=pool_name, backend=backend, settings=pool_settings)
        key = keys_of.setdefault(pool_id, runner_key(pool) if pool.is_local else "")
        if enabled and service == NodeService.IN_SERVICE and key:
            found[pk] = (pool_name, hostname, node_token(key, pool_name, hostname))
    types: dict[int, dict[int, int]] = {node_id: {} for node_id in ids}
    for node_id, index, gpu_type in Gpu.objects.filter(node_id__in=ids, enabled=True).values_list(
            "node_id", "index", "gpu_type_id"):
        types[node_id][index] = gpu_type
    return {name for name, k in known.items() if found.get(k.node_id) == (*name, k.token)}, types


async def _check_known() -> None:
    """Every KNOWN_CHECK_S while nodes are known: forget those no longer valid (and those past KNOWN_TTL), so a
    removed, disabled or refused node, or a rotated key, goes the normal way (and is refused) within that; and read
    the valid ones' device types again (which wake-ups their waits listen to)."""
    while _known:
        await asyncio.sleep(KNOWN_CHECK_S)
        now = time.monotonic()
        snapshot = {name: k for name, k in _known.items() if now - k.when <= KNOWN_TTL}
        try:
            still, types = await wakeups.on_node_lane(_known_still)(snapshot) if snapshot else (
                set(), {})
        except Exception as exc:  # unchecked: forget them all (their next asks go the normal way)
            log.warning("nodes/wait: could not check the known nodes: %r", exc)
            still, types = set(), {}
        read = time.monotonic()
        for name in still:
            _types[snapshot[name].node_id] = (read, types[snapshot[name].node_id])
        for name, k in list(_known.items()):
            if _known.get(name) is k and (name not in still if name in snapshot else now - k.when > KNOWN_TTL):
                del _known[name]


def _watch_known() -> None:
    global _checker
    if _known and (_checker is None or _checker.done()):
        _checker = asyncio.get_running_loop().create_task(_check_known())


@csrf_exempt
@require_POST
def node_poll(request: HttpRequest) -> HttpResponse:
    """The node's heartbeat and its ask for work, answered at once (`node_answer`). `nodes/wait` is the same ask held
    by the ASGI server until there is news (`node_wait`); served by anything else it is answered at once too."""
    try:
        return JsonResponse(node_answer(request.headers.get("Authorization", ""), _body(request))[0])
    except Refused as exc:
        return _error(exc.status, exc.detail)


def _answer_sync(authorization: str, raw: bytes, woken: tuple[str, int] | None, fresh: bool
                 ) -> tuple[int, dict, list[str], int]:
    """`node_answer` as a request of its own on the node agents' lane, `wakeups.NODE_LANE` (its connection kept
    between asks, as between a sync worker's requests; one that broke is closed), a lost database connection a 503,
    anything unexpected a logged 500 in JSON. Also the node's id."""
    try:
        try:
            body = json.loads(raw or b"null")
        except (ValueError, RecursionError) as exc:
            raise Refused(400, f"the body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise Refused(400, "the body must be a JSON object")
        answer, wait_on, node = node_answer(authorization, body, woken=woken, batched=True, fresh=fresh)
        return 200, answer, wait_on, node.pk
    except Refused as exc:
        return exc.status, {"detail": exc.detail}, [], 0
    except DatabaseError as exc:
        log.warning("nodes/wait: database error %r", exc)
        dbhealth.close_broken_connections()
        return 503, {"detail": dbhealth.MESSAGE}, [], 0
    except Exception:
        log.exception("nodes/wait: the ask failed")
        return 500, {"detail": "internal error: the ask for work failed (logged)"}, [], 0


async def node_wait(scope, receive, send) -> None:
    """`POST nodes/wait` served by the ASGI app itself (kernelbot.handlers), without Django's middleware: the same
    ask as `nodes/poll`, held open for up to `{"wait": s}` seconds (NODE_WAIT at most, and the agent's next
    heartbeat is due by then) while it got no claim, until a wake-up (runners.wakeups) for its node, pool or a free
    device's GPU type; then it looks again and answers, `"again": true` telling the agent to ask again at once. A
    client gone while it waits is forgotten at once."""
    headers = dict(scope.get("headers", ()))
    authorization = headers.get(b"authorization", b"").decode("latin-1")
    chunks, size, disconnected = [], 0, asyncio.Event()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunks.append(message.get("body", b""))
        size += len(chunks[-1])
        if size > 65536:
            return await _send_json(send, 413, {"detail": "a node's ask for work is at most 64 KiB"})
        if not message.get("more_body"):
            break
    raw = b"".join(chunks)
    body: object = None
    try:
        body = json.loads(raw) if raw.strip().startswith(b"{") else None
        wait = float(body.get("wait", 0))
    except (ValueError, TypeError, AttributeError, RecursionError):
        wait = 0.0
    wait = max(0.0, min(wait, settings.NODE_WAIT, settings.AGENT_DEADLINE * 0.6))
    run = wakeups.on_node_lane(_answer_sync)
    if wait:
        await wakeups.waiters.ready()
    seen = wakeups.waiters.seq
    samples = None
    shed = wakeups.node_lane_backlog() >= LANE_SHED  # behind: a known node's heartbeat ask joins no queue
    if idle := _idle_answer(authorization, body, shed=shed):  # nothing new: no query, no hop to the node lane
        (node_id, wait_on, samples), status, answer = idle, 200, {"claims": [], **NONE}
    else:
        known = _known_node(authorization, body)  # heard now and while its ask waits for the lane
        with wakeups.waiters.on_lane(known.node_id) if known else contextlib.nullcontext():
            status, answer, wait_on, node_id = await run(authorization, raw, None, False)
        if status == 200:
            samples = _samples(body)  # valid: the ask passed
        _watch_known()
    if node_id:
        wakeups.waiters.beat(node_id, samples)  # its samples written with the heartbeats, within a second
    if status != 200 or answer["claims"] or not wait or wakeups.waiters.seq != seen:
        # news (claims, or a wake-up while it looked): a waiting agent asks again at once
        return await _send_json(send, status, {**answer, "again": bool(wait)} if status == 200 else answer)
    ends = min((float(r["ends_in"]) for r in answer["reservations"] if "ends_in" in r), default=wait)
    if ending := ends < wait:  # a reservation here ends first: answered afresh then, without it (its processes end)
        wait = max(ends, 0.0) + END_MARGIN_S
    waiter = wakeups.Waiter(wait_on)
    wakeups.waiters.add(waiter)

    async def gone():
        while (await receive())["type"] != "http.disconnect":
            pass
        disconnected.set()

    watch = asyncio.ensure_future(gone())
    woke = asyncio.ensure_future(waiter.event.wait())
    try:
        await asyncio.wait({watch, woke}, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
    finally:
        wakeups.waiters.remove(waiter)
        watch.cancel()
        woke.cancel()
    if disconnected.is_set():
        if waiter.baton is not None:  # woken for a run it will never claim: the next waiter looks
            wakeups.waiters.hand_on(*waiter.baton)
        return
    if waiter.event.is_set() or ending:
        with wakeups.waiters.on_lane(node_id):  # still connected: heard, however long the lane takes
            status, answer, _, _ = await run(authorization, raw, waiter.baton, True)
        if status != 200 and waiter.baton is not None:
            wakeups.waiters.hand_on(*waiter.baton)
    await _send_json(send, status, {**answer, "again": True} if status == 200 else answer)


async def _send_json(send, status: int, body: dict) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if status == 503:
        headers.append((b"retry-after", str(dbhealth.RETRY_AFTER).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


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
    path("nodes/wait", node_poll, name="runner-node-wait"),  # held open only by the ASGI server (node_wait)
    path("harness.tar.gz", harness, name="runner-harness"),
]
