"""kernelbot.asgi's HTTP handler: each process's sync request code on one thread, streams from the event loop."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from asgiref.sync import iscoroutinefunction, sync_to_async
from asgiref.testing import ApplicationCommunicator

from kernelbot import handlers
from kernelbot.handlers import SyncWorkerASGIHandler
from leaderboards.access.actions import do_create_token
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import RunStatus

from .factories import UserFactory


def http_scope(path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
            "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(b"host", b"testserver"), *headers], "client": ("127.0.0.1", 5000),
            "server": ("testserver", 80)}


async def get(app, path: str, headers: list[tuple[bytes, bytes]] = ()) -> tuple[int, bytes]:
    comm = ApplicationCommunicator(app, http_scope(path, list(headers)))
    await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await comm.receive_output(10)
    body = b""
    while True:
        message = await comm.receive_output(10)
        body += message.get("body", b"")
        if not message.get("more_body"):
            await comm.wait(10)  # the handler then closes the response: request_finished closes the connection
            return start["status"], body


def test_the_middleware_chain_is_loaded_sync():
    handler = SyncWorkerASGIHandler()
    assert not iscoroutinefunction(handler._middleware_chain)


@pytest.mark.django_db(transaction=True)
def test_a_sync_view_answers_through_the_handler():
    status, body = asyncio.run(get(SyncWorkerASGIHandler(), "/api/v1/health"))
    assert status == 200 and b"ok" in body


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_run_their_sync_code_one_at_a_time_on_one_thread():
    handler = SyncWorkerASGIHandler()
    inside, peak, threads, lock = 0, 0, set(), threading.Lock()
    original = handler.get_response

    def slow_get_response(request):
        nonlocal inside, peak
        with lock:
            inside += 1
            peak = max(peak, inside)
            threads.add(threading.get_ident())
        time.sleep(0.05)
        with lock:
            inside -= 1
        return original(request)

    handler.get_response = slow_get_response

    async def six():
        return await asyncio.gather(*(get(handler, "/api/v1/health") for _ in range(6)))

    results = asyncio.run(six())
    assert [status for status, _ in results] == [200] * 6
    assert peak == 1 and len(threads) == 1 and threading.get_ident() not in threads


@pytest.mark.django_db(transaction=True)
def test_a_runners_report_is_served_while_the_sync_thread_is_busy_and_a_users_request_waits_for_it():
    """A round of health checks or a burst of runs sends job fetches, progress and results: they run on their own
    lane, so users' requests do not queue behind them on the sync thread, nor a claimed run's job fetch behind
    users'."""
    handler = SyncWorkerASGIHandler()
    release = threading.Event()

    async def scenario():
        busy = asyncio.ensure_future(sync_to_async(release.wait, thread_sensitive=True)(30))  # the sync thread, held
        await asyncio.sleep(0.2)
        user = asyncio.ensure_future(get(handler, "/api/v1/health"))
        report = await asyncio.wait_for(get(handler, "/api/runner/v1/runs/1/1/job", [(b"authorization", b"Bearer x")]),
                                        10)
        user_waited = not user.done()
        release.set()
        await busy
        return report, user_waited, await user

    try:
        (status, _), user_waited, (user_status, _) = asyncio.run(scenario())
    finally:
        release.set()
    assert status == 403 and user_waited and user_status == 200  # the report answered (a bad token) while held


@pytest.mark.django_db(transaction=True)
def test_an_async_streaming_view_still_streams_through_the_sync_chain(leaderboard):
    """The SSE progress stream: an async generator behind the sync middleware chain, sent from the event loop."""
    user = UserFactory()
    token = do_create_token(user)[1]
    submission = do_submit(user, check_submission(user, leaderboard.name, ["CPU"], "test", "a.py", b"x = 1\n"))
    submission.runs.update(status=RunStatus.SUCCEEDED)
    headers = [(b"authorization", f"Bearer {token}".encode())]
    status, body = asyncio.run(get(SyncWorkerASGIHandler(), f"/api/v1/submissions/{submission.pk}/events", headers))
    assert status == 200
    assert body.startswith(b"event: submission\n") and body.endswith(b"event: done\ndata: {\"submission_id\":"
                                                                      + str(submission.pk).encode() + b"}\n\n")


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "kind"), [("/api/v1/submissions", b"application/json"), ("/submit/", b"text/plain")])
def test_a_body_larger_than_the_server_takes_is_refused_before_it_is_read(settings, path, kind):
    """Issue 35: a declared body past KERNELBOT_MAX_REQUEST_BYTES is a 413 at once; none of it is read."""
    settings.MAX_REQUEST_BYTES = 1 << 20

    async def post() -> tuple[dict, bytes, bool]:
        scope = {**http_scope(path, [(b"content-length", str(100 << 20).encode())]), "method": "POST"}
        comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)  # no input is ever sent: nothing to read
        start, body = await comm.receive_output(10), await comm.receive_output(10)
        await comm.wait(10)
        return start, body["body"], comm.input_queue.empty()

    start, body, unread = asyncio.run(post())
    assert start["status"] == 413 and dict(start["headers"])[b"content-type"].startswith(kind) and unread
    assert b"The request body is too large: 104857600 bytes, where this server takes at most 1048576" in body


@pytest.mark.django_db
def test_a_chunked_body_past_the_limit_is_dropped_not_kept(settings):
    """Past 1 MiB the handler stops reading (the rest stays unread) and answers 413 (issue 43: it sent no answer,
    which granian turned into a 500)."""
    settings.MAX_REQUEST_BYTES = 1 << 20

    async def post() -> tuple[dict, bytes, bool]:
        scope = {**http_scope("/api/v1/auth/password", []), "method": "POST"}
        comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
        for _ in range(3):
            await comm.send_input({"type": "http.request", "body": b"x" * (600 << 10), "more_body": True})
        start, body = await comm.receive_output(30), await comm.receive_output(30)
        await asyncio.wait_for(asyncio.shield(comm.future), 30)
        return start, body["body"], comm.input_queue.empty()

    start, body, unread = asyncio.run(post())
    assert start["status"] == 413 and not unread
    assert body == b'{"detail": "The request body is too large: it passed the limit, where this server takes at most ' \
                   b'1048576 (KERNELBOT_MAX_REQUEST_BYTES)."}'


@pytest.mark.parametrize(("host", "proxies", "warned"), [
    ("0.0.0.0", 1, True), ("10.0.0.5", 2, True), ("::", 1, True), ("127.0.0.1", 1, False), ("::1", 1, False),
    ("0.0.0.0", 0, False), ("/run/kernelbot.sock", 1, False)])
def test_granian_serving_past_its_proxy_is_warned_about_when_forwarded_addresses_are_trusted(settings, monkeypatch,
                                                                                            host, proxies, warned):
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = proxies  # KERNELBOT_TRUSTED_PROXY_COUNT
    monkeypatch.setattr(handlers, "_bound", set())
    assert handlers.past_the_proxy(host) is warned


@pytest.mark.django_db(transaction=True)
def test_the_handler_warns_once_per_address_that_granian_binds(settings, caplog, monkeypatch):
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1
    monkeypatch.setattr(handlers, "_bound", set())

    async def twice(server: tuple[str, int]) -> None:
        for _ in range(2):
            scope = {**http_scope("/api/v1/health", []), "server": server}
            comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
            await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
            assert (await comm.receive_output(10))["status"] == 200
            await comm.receive_output(10)
            await comm.wait(10)

    asyncio.run(twice(("127.0.0.1", 8000)))
    assert "X-Forwarded-For" not in caplog.text
    asyncio.run(twice(("0.0.0.0", 8000)))
    assert caplog.text.count("granian serves 0.0.0.0, not only loopback") == 1
