"""A malformed multipart body, on every route of both APIs that reads a body (/api/v1 and popcorn's under /popcorn),
is a 4xx in the APIs' error format, {"detail": "<message>"}, naming what is wrong (issue 35: popcorn-cli printed
"Server returned status 400: " for an empty answer). Sent through the production ASGI handler, as granian serves it,
by a user who may use every route (staff, the admin and node-agent tokens), with path parameters that name real
things, so each body is read."""

from __future__ import annotations

import asyncio
import json

import pytest
from asgiref.testing import ApplicationCommunicator

from kernelbot.api import api as v1_api
from kernelbot.handlers import SyncWorkerASGIHandler
from leaderboards.popcorn.api import api as popcorn_api

pytestmark = pytest.mark.django_db(transaction=True)
ADMIN_TOKEN = "malformed-admin"
AGENT_TOKEN = "malformed-agent"
FILE_PART = b'Content-Disposition: form-data; name="file"; filename="k.py"\r\n'
MALFORMED = {  # (Content-Type, body)
    "no boundary": (b"multipart/form-data", b"--x\r\n" + FILE_PART + b"\r\nx = 1\r\n--x--\r\n"),
    "empty boundary": (b"multipart/form-data; boundary=", b"--\r\n" + FILE_PART + b"\r\nx = 1\r\n----\r\n"),
    "non-ASCII boundary": (b"multipart/form-data; boundary=\xff\xfe", b"--\xff\xfe\r\n" + FILE_PART + b"\r\nx\r\n"),
    "part headers over 10 kB": (b"multipart/form-data; boundary=b",
                                b"--b\r\n" + FILE_PART + b"X-Pad: " + b"a" * 20_000 + b"\r\n\r\nx = 1\r\n--b--\r\n"),
    "undecodable base64 part": (b"multipart/form-data; boundary=b", b"--b\r\n" + FILE_PART +
                                b"Content-Transfer-Encoding: base64\r\n\r\n!!!\r\n--b--\r\n"),
    "cut short": (b"multipart/form-data; boundary=b", b"--b\r\n" + FILE_PART + b"\r\nx = 1"),
    "no parts": (b"multipart/form-data; boundary=b", b"--b--\r\n"),
}
MULTIPART_ROUTES = {"/api/v1/submissions", "/popcorn/submission/{leaderboard}/{gpu}/{mode}",
                    "/popcorn/admin/update-problems", "/popcorn/{leaderboard}/{gpu}/{mode}"}


def body_routes() -> list[tuple[str, str]]:
    """Every operation of both APIs that reads a body (JSON or multipart), and popcorn's streamed route: (path,
    method)."""
    found = {(route, "POST") for route in MULTIPART_ROUTES}
    for api, prefix in ((v1_api, "/api/v1"), (popcorn_api, "/popcorn")):
        for path, operations in api.get_openapi_schema(path_prefix="")["paths"].items():
            found |= {(prefix + path, method.upper()) for method, op in operations.items() if op.get("requestBody")}
    return sorted(found)


async def post(path: str, content_type: bytes, body: bytes, headers: list[tuple[bytes, bytes]], method: str = "POST"):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", content_type),
                         (b"content-length", str(len(body)).encode()), *headers],
             "client": ("127.0.0.1", 5000), "server": ("testserver", 80)}
    comm = ApplicationCommunicator(SyncWorkerASGIHandler(), scope)
    await comm.send_input({"type": "http.request", "body": body, "more_body": False})
    start = await comm.receive_output(20)
    answer = b""
    while True:
        message = await comm.receive_output(20)
        answer += message.get("body", b"")
        if not message.get("more_body"):
            await comm.wait(20)
            return start["status"], {name.lower(): value for name, value in start["headers"]}, answer


def test_every_route_that_reads_a_body_answers_a_malformed_multipart_one_in_the_api_format(
        leaderboard, alice, settings):
    settings.ADMIN_TOKEN, settings.NODE_AGENT_TOKEN = ADMIN_TOKEN, AGENT_TOKEN
    alice.is_staff = alice.is_superuser = True
    alice.save()
    names = {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test", "reservation_id": "1"}
    token = alice.raw_token.encode()
    headers = [(b"authorization", b"Bearer " + token), (b"x-popcorn-cli-id", token)]
    routes = body_routes()
    assert {"/api/v1/tokens", "/api/v1/gpus/reservations", "/popcorn/user/join"} < {r for r, _ in routes}
    wrong = []
    for route, method in routes:
        path = route.format(**names)
        special = ADMIN_TOKEN if "/admin/" in path else AGENT_TOKEN if path.endswith("/samples") else None
        auth = [(b"authorization", f"Bearer {special}".encode())] if special else headers
        for case, (content_type, body) in MALFORMED.items():
            if route == "/popcorn/admin/update-problems" and case in ("cut short", "no parts"):
                continue  # no part read: as a request without a zip, it imports from the problems directory
            status, got, answer = asyncio.run(post(path, content_type, body, auth, method))
            detail = json.loads(answer).get("detail") if got.get(b"content-type", b"").startswith(
                b"application/json") else None
            expected = ("multipart", "file") if route in MULTIPART_ROUTES else ("JSON",)
            if not (400 <= status < 500 and isinstance(detail, str) and any(w in detail for w in expected)):
                wrong.append((route, case, status, got.get(b"content-type"), answer[:200]))
    assert not wrong, "\n".join(map(str, wrong))
