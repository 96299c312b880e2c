"""Issue 43, point 4: request bodies sent chunked (no Content-Length, as HTTP clients stream uploads of unknown size)
are read like any other, and one past KERNELBOT_MAX_REQUEST_BYTES is a 413 in the API's JSON error format on every
route (API v1, popcorn, reservations): through the ASGI handler in process, and over real HTTP under granian (the
production server) and daphne (the browser tests' server)."""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time

import httpx
import pytest
from asgiref.testing import ApplicationCommunicator

from kernelbot.handlers import SyncWorkerASGIHandler
from leaderboards.access.actions import do_create_token
from leaderboards.models import Submission
from runners.reservations.models import Reservation

from ..conftest import REPO, free_port
from ..factories import UserFactory
from ..reservations.conftest import gpu_pool
from ..servers import granian, production_env
from .conftest import multipart

BIG = 40 << 20


def requests_for(board: str, size: int) -> list[tuple[str, bytes, str]]:
    """(path, body, content type) of the three routes; each body `size` bytes or the small valid one when 0."""
    code = f"#!POPCORN leaderboard {board}\n#!POPCORN gpu CPU\nx = 1\n".encode()
    form, form_type = multipart(code + b"#" * max(0, size - len(multipart(code, "k.py")[0]) - 1) + b"\n", "k.py")
    reserve = json.dumps({"gpu_type": "H100", "gpu_count": 1, "minutes": 30})
    reserve += " " * max(0, size - len(reserve))
    return [("/api/v1/submissions", form, form_type),
            (f"/popcorn/submission/{board}/CPU/test", form, form_type),
            ("/api/v1/gpus/reservations", reserve.encode(), "application/json")]


@pytest.fixture
def setup(transactional_db, leaderboard, settings):
    settings.KERNELGUARD_ENABLED = False
    gpu_pool("lab", nodes=1, per_node=2)
    return leaderboard.name, do_create_token(UserFactory())[1]


async def asgi_post(path: str, body: bytes, content_type: str, token: str) -> tuple[int, bytes]:
    """A chunked POST through the handler: the body in 64 KiB messages, no Content-Length."""
    path, _, query = path.partition("?")
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", content_type.encode()),
                         (b"transfer-encoding", b"chunked"), (b"authorization", f"Bearer {token}".encode()),
                         (b"x-popcorn-cli-id", token.encode())],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
    step = 64 << 10
    for i in range(0, len(body), step):
        await comm.send_input({"type": "http.request", "body": body[i:i + step], "more_body": i + step < len(body)})
    start = await comm.receive_output(30)
    answer = b""
    while True:
        message = await comm.receive_output(30)
        answer += message.get("body", b"")
        if not message.get("more_body"):
            break
    await comm.wait(30)
    return start["status"], answer


def check_small(answers: list[tuple[int, bytes]]) -> None:
    (v1, v1_body), (popcorn, popcorn_body), (reserve, reserve_body) = answers
    assert v1 == 201 and json.loads(v1_body)["file_name"] == "k.py", v1_body
    assert popcorn == 202 and json.loads(popcorn_body)["status"] == "accepted", popcorn_body
    assert reserve == 201 and json.loads(reserve_body)["gpus"] is not None, reserve_body
    assert Submission.objects.count() == 2 and Reservation.objects.count() == 1
    assert {s.file_name for s in Submission.objects.all()} == {"k.py"}


def check_big(answers: list[tuple[int, bytes]], limit: int) -> None:
    for status, body in answers:
        assert status == 413, body
        assert json.loads(body) == {"detail": "The request body is too large: it passed the limit, where this server "
                                              f"takes at most {limit} (KERNELBOT_MAX_REQUEST_BYTES)."}
    assert not Submission.objects.exists() and not Reservation.objects.exists()


def test_small_chunked_bodies_are_read_like_any_other(setup):
    board, token = setup
    requests = requests_for(board, 200)
    assert [len(body) for _, body, _ in requests] == [200, 200, 200]
    check_small([asyncio.run(asgi_post(path, body, kind, token)) for path, body, kind in requests])


def test_a_chunked_body_past_the_limit_is_a_413_on_every_route(setup, settings):
    board, token = setup
    settings.MAX_REQUEST_BYTES = 32 << 20
    check_big([asyncio.run(asgi_post(path, body, kind, token)) for path, body, kind in requests_for(board, BIG)],
              32 << 20)


def http_post(url: str, path: str, body: bytes, content_type: str, token: str) -> tuple[int, bytes]:
    """A chunked POST over a real connection (http.client, 64 KiB chunks); a server that answers before the body is
    all sent may close the connection under the sender: the answer is read all the same."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.putrequest("POST", path)
    for name, value in (("Transfer-Encoding", "chunked"), ("Content-Type", content_type),
                        ("Authorization", f"Bearer {token}"), ("X-Popcorn-Cli-Id", token)):
        conn.putheader(name, value)
    conn.endheaders()
    step = 64 << 10
    try:
        for i in range(0, len(body), step):
            conn.send(b"%x\r\n%s\r\n" % (len(body[i:i + step]), body[i:i + step]))
        conn.send(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    response = conn.getresponse()
    try:
        return response.status, response.read()
    finally:
        conn.close()


def daphne(env: dict[str, str], log) -> tuple[subprocess.Popen, str]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port),
                               "kernelbot.asgi:application"], cwd=REPO, env=env, stdout=log.open("w"),
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/api/v1/health").status_code == 200:
                return server, url
        except httpx.HTTPError:
            assert server.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
    server.kill()
    raise AssertionError(log.read_text()[-3000:])


@pytest.mark.slow
@pytest.mark.parametrize("server", ["granian", "daphne"])
def test_chunked_bodies_over_real_http(setup, postgres, tmp_path, server):
    """200 bytes: accepted on the three routes; 40 MiB: 413 in JSON, where granian answered 500 "Internal server
    error" (the application ended without a response) and a small multipart body was refused as empty."""
    board, token = setup
    env = production_env(tmp_path, KERNELBOT_KERNELGUARD="off", KERNELBOT_QUOTA_TEST="0",
                         KERNELBOT_MAX_REQUEST_BYTES=str(32 << 20))
    log = tmp_path / f"{server}.log"
    if server == "granian":
        with granian(env, log, workers=1) as url:
            small = [http_post(url, path, body, kind, token) for path, body, kind in requests_for(board, 200)]
            big = [http_post(url, path, body, kind, token) for path, body, kind in requests_for(board, BIG)]
    else:
        process, url = daphne(env, log)
        try:
            small = [http_post(url, path, body, kind, token) for path, body, kind in requests_for(board, 200)]
            big = [http_post(url, path, body, kind, token) for path, body, kind in requests_for(board, BIG)]
        finally:
            process.terminate()
            process.wait(15)
    print(log.read_text(errors="replace")[-3000:])
    assert [s for s, _ in small] == [201, 202, 201], small
    assert all(status == 413 and "it passed the limit" in json.loads(body)["detail"] for status, body in big), big
