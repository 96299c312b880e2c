"""The HTTP side of kernelbot.asgi: Django's ASGI handler run like a WSGI sync worker."""

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler


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
        await self.handle(scope, receive, send)  # no ThreadSensitiveContext: thread-sensitive code shares one thread

    async def get_response_async(self, request):
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)
