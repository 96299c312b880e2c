"""The HTTP side of kernelbot.asgi: Django's ASGI handler run like a WSGI sync worker."""

import json

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIHandler

from leaderboards.runner_api import node_wait

NODE_WAIT_PATH = "/api/runner/v1/nodes/wait"


class SyncWorkerASGIHandler(ASGIHandler):
    """Runs every request's sync code (middleware chain, sync views, request signals) on the process's one
    sync thread, in one hop per step, as a WSGI sync worker would; the event loop keeps reading, writing and
    streaming (SSE progress streams, websockets) for all connections.

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
        if (size := declared_length(scope)) > settings.MAX_REQUEST_BYTES:
            await too_large(scope, send, size)  # before a byte of the body is read
            return
        if scope["path"] == NODE_WAIT_PATH and scope["method"] == "POST":
            await node_wait(scope, receive, send)  # a long-poll: held on the event loop, not the sync thread
            return
        await self.handle(scope, capped(receive), send)  # no ThreadSensitiveContext: one sync thread for all

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def declared_length(scope) -> int:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            return int(value) if value.isdigit() else 0
    return 0


async def too_large(scope, send, size: int) -> None:
    """413 in the API's JSON error format (the site's pages get the same sentence as text)."""
    text = (f"The request body is too large: {size} bytes, where this server takes at most "
            f"{settings.MAX_REQUEST_BYTES} (KERNELBOT_MAX_REQUEST_BYTES).")
    api = scope.get("path", "").startswith(("/api/", "/popcorn/"))
    body = json.dumps({"detail": text}).encode() if api else text.encode()
    await send({"type": "http.response.start", "status": 413, "headers": [
        (b"content-type", b"application/json" if api else b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def capped(receive):
    """`receive` that ends a body (chunked, or longer than it said) once it passes MAX_REQUEST_BYTES: the client is
    treated as gone, so no more of it is read or kept."""
    seen = 0

    async def receive_capped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > settings.MAX_REQUEST_BYTES:
                return {"type": "http.disconnect"}
        return message

    return receive_capped
