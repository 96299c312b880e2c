"""The HTTP side of kernelbot.asgi: Django's ASGI handler run like a WSGI sync worker."""

import ipaddress
import json
import logging
import tempfile
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix

from leaderboards.popcorn.api import UPDATE_PROBLEMS_PATH, prefetch
from leaderboards.runner_api import node_wait

NODE_WAIT_PATH = "/api/runner/v1/nodes/wait"
RUN_REPORTS_PATH = "/api/runner/v1/runs/"
# The runners' per-attempt requests (job fetches, progress, heartbeats, results) have a thread of their own, beside the
# sync thread that serves users: a burst of runs or a round of health checks queues no user's request behind its
# reports, nor a run's job fetch (its claim waits for it) behind users' requests.
RUN_REPORTS_LANE = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernelbot-runs")
log = logging.getLogger(__name__)
_bound: set[str] = set()  # the server addresses this process has checked


class BodyTooLarge(Exception):
    """A body without a (true) Content-Length that passed MAX_REQUEST_BYTES while it was read."""


class SyncWorkerASGIHandler(ASGIHandler):
    """Runs every request's sync code (middleware chain, sync views, request signals) on the process's one
    sync thread, in one hop per step, as a WSGI sync worker would; the event loop keeps reading, writing and
    streaming (SSE progress streams, websockets) for all connections. The runners' reports run their middleware
    chain and view on a thread of their own (`RUN_REPORTS_LANE`), and node agents' asks are held on the event loop.

    Django's stock handler gives each request a new thread (`ThreadSensitiveContext`) and, with an async
    chain, a thread hop per hook of each sync-style middleware (about 17 with our stack). With 32 requests in
    flight those threads fight over the GIL: a health check cost 2.7x the CPU, an accepted submission a quarter
    more (bench/RESULTS.md). As with sync workers, a slow request delays the others of its process: run two or
    more worker processes per core (docs/operations.md)."""

    def load_middleware(self, is_async: bool = False) -> None:
        super().load_middleware(is_async=False)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        if (server := scope.get("server")) and server[0] not in _bound:
            past_the_proxy(str(server[0]))
        if (size := declared_length(scope)) > settings.MAX_REQUEST_BYTES:
            await too_large(scope, send, size)  # before a byte of the body is read
            return
        if scope["path"] == NODE_WAIT_PATH and scope["method"] == "POST":
            await node_wait(scope, receive, send)  # a long-poll: held on the event loop, not the sync thread
            return
        if scope["path"] == UPDATE_PROBLEMS_PATH and scope["method"] == "POST":
            scope, receive = await prefetch(scope, receive)  # its download off the sync thread
        try:
            if scope["path"].startswith(RUN_REPORTS_PATH):
                await self.handle_on_lane(scope, receive, send)
            else:
                await self.handle(scope, receive, send)  # no ThreadSensitiveContext: one sync thread for all
        except BodyTooLarge:  # raised by read_body, before anything was sent
            await too_large(scope, send, None)

    async def read_body(self, receive):
        """Django's, stopped once the body (chunked, or longer than it said) passes MAX_REQUEST_BYTES: no more of it
        is read or kept, and the client gets a 413 rather than no answer (a 500 from granian)."""
        body_file = tempfile.SpooledTemporaryFile(max_size=settings.FILE_UPLOAD_MAX_MEMORY_SIZE, mode="w+b")  # noqa: SIM115
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                body_file.close()
                raise RequestAborted()
            body_file.write(message.get("body", b""))
            if body_file.tell() > settings.MAX_REQUEST_BYTES:
                body_file.close()
                raise BodyTooLarge()
            if not message.get("more_body", False):
                break
        body_file.seek(0)
        return body_file

    def create_request(self, scope, body_file):
        """A chunked body's length is known once it is read: Django's multipart parser reads nothing without it."""
        if not any(name == b"content-length" for name, _ in scope.get("headers", ())):
            size = body_file.seek(0, 2)
            body_file.seek(0)
            if size:
                scope = {**scope, "headers": [*scope.get("headers", ()), (b"content-length", str(size).encode())]}
        return super().create_request(scope, body_file)

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)

    async def handle_on_lane(self, scope, receive, send) -> None:
        """A runner's report, served as a WSGI worker would on `RUN_REPORTS_LANE`: its request signals (the lane's
        own database connection checked, closed when broken or old), middleware chain and view there; its body read
        and its (JSON) answer written by the event loop."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))

        def respond():
            signals.request_started.send(sender=self.__class__, scope=scope)
            request, response = self.create_request(scope, body_file)
            if request is not None:
                response = self.get_response(request)
            response.close()  # request_finished, on this thread: its connection
            return response
        try:
            response = await sync_to_async(respond, thread_sensitive=False, executor=RUN_REPORTS_LANE)()
            await self.send_response(response, send)
        finally:
            body_file.close()


def past_the_proxy(host: str) -> bool:
    """With KERNELBOT_TRUSTED_PROXY_COUNT set, X-Forwarded-For names the client the login limits count, so granian must
    be reachable only through the proxy: warn, once per process and address, when it serves one that is not loopback
    (granian's ASGI scope names the address it binds, 0.0.0.0 included)."""
    _bound.add(host)
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a unix socket: only what can open it reaches it
    if loopback or not settings.ALLAUTH_TRUSTED_PROXY_COUNT:
        return False
    log.warning("KERNELBOT_TRUSTED_PROXY_COUNT=%s trusts X-Forwarded-For, but granian serves %s, not only loopback: "
                "a client that reaches it without the proxy chooses the address the login limits count. Bind it to "
                "127.0.0.1 (deploy/systemd/kernelbot-web.service) or firewall it to the proxy "
                "(docs/operations.md)", settings.ALLAUTH_TRUSTED_PROXY_COUNT, host)
    return True


def declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


async def too_large(scope, send, size: int | None) -> None:
    """413 in the API's JSON error format (the site's pages get the same sentence as text); `size`: the declared
    length, None for a body that passed the limit while it was read."""
    text = (f"The request body is too large: {f'{size} bytes' if size else 'it passed the limit'}, where this server "
            f"takes at most {settings.MAX_REQUEST_BYTES} (KERNELBOT_MAX_REQUEST_BYTES).")
    api = scope.get("path", "").startswith(("/api/", "/popcorn/"))
    body = json.dumps({"detail": text}).encode() if api else text.encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json" if api else b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})

