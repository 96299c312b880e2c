"""Every bad-input class sent to every route that takes it: each answer is a 4xx (a CommandError, a websocket
close code) whose message names the problem, and no row of the main tables is written. No harness runs."""

from __future__ import annotations

import hashlib
import hmac
import html
import io
import json
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command

from leaderboards.access.models import ApiToken, Ban, Invite, JobSwitch, Membership
from leaderboards.models import Code, Leaderboard, Problem, Run, Submission
from leaderboards.routing import websocket_urlpatterns

from .conftest import Popcorn, multipart

GOOD = b"def custom_kernel(data):\n    a, b = data\n    return a + b\n"
HUGE = 10**20
HUGER = 10**29
ADMIN = {"Authorization": "Bearer corpus-admin"}
TABLES = [Submission, Run, Code, Problem, Leaderboard, ApiToken, Invite, Ban, Membership, JobSwitch,
          get_user_model()]
pytestmark = pytest.mark.django_db


@dataclass
class Ctx:
    client: object
    popcorn: Popcorn
    board: str
    token: str
    tmp_path: object


def zip_of(members: dict[str, bytes], *, method: int = zipfile.ZIP_DEFLATED, flag_bits: int = 0) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    data = buffer.getvalue()
    if flag_bits:  # set the general-purpose flag in every local and central header (encryption: bit 0)
        data = bytearray(data)
        for signature, offset in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            start = 0
            while (at := data.find(signature, start)) >= 0:
                data[at + offset] |= flag_bits
                start = at + 4
        data = bytes(data)
    return data


def unsupported_method_zip() -> bytes:
    """A member compressed with method 99 (AES/other): zipfile cannot read it."""
    data = bytearray(zip_of({"task.yml": b"files: []\n"}, method=zipfile.ZIP_STORED))
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):
        at = data.find(signature)
        data[at + offset:at + offset + 2] = (99).to_bytes(2, "little")
    return bytes(data)


BAD_ZIPS = {
    "encrypted member": (zip_of({"task.yml": b"files: []\n"}, flag_bits=1), "is encrypted"),
    "unsupported compression": (unsupported_method_zip(), "cannot extract 'task.yml'"),
    "path traversal": (zip_of({"../evil/task.yml": b"x"}), "unsafe member path '../evil/task.yml'"),
    "absolute path": (zip_of({"/etc/task.yml": b"x"}), "unsafe member path '/etc/task.yml'"),
    "too many members": (zip_of({f"f{i}.txt": b"" for i in range(1001)}), "members; the limit is"),
    "not a zip": (b"this is not a zip archive", "not a valid zip archive"),
    "empty file": (b"", "not a valid zip archive"),
    "no task.yml": (zip_of({"readme.md": b"hi"}), "exactly one task.yml"),
    "non-UTF-8 task.yml": (zip_of({"task.yml": b"files: \xff\xfe\n"}), "UTF-8"),
}


def answer(response) -> tuple[int, str]:
    body = response.content.decode(errors="replace")
    if response.get("Content-Type", "").startswith("application/json"):
        parsed = json.loads(body)
        assert isinstance(parsed.get("detail"), str), f"detail must be one message: {parsed}"
        return response.status_code, parsed["detail"]
    return response.status_code, html.unescape(body)


def pop_submit(board: str, gpu: str, mode: str, content: bytes, filename: str = "k.py"):
    def send(c: Ctx):
        body, content_type = multipart(content, filename)
        return c.client.generic("POST", f"/popcorn/submission/{board.format(lb=c.board)}/{gpu}/{mode}", body,
                                content_type=content_type, headers=c.popcorn.headers())
    return send


def v1_submit(**fields):
    def send(c: Ctx):
        data = {"leaderboard": c.board, "gpu": "CPU", "mode": "test", **fields}
        data.setdefault("file", SimpleUploadedFile("k.py", GOOD))
        if isinstance(data["file"], bytes):
            data["file"] = SimpleUploadedFile("k.py", data["file"])
        data["leaderboard"] = data["leaderboard"].format(lb=c.board)
        return c.client.post("/api/v1/submissions", data, headers={"Authorization": f"Bearer {c.token}"})
    return send


def v1(method: str, path: str, body: dict | None = None):
    def send(c: Ctx):
        kwargs = {"data": json.dumps(body), "content_type": "application/json"} if body is not None else {}
        return getattr(c.client, method)(f"/api/v1/{path.format(lb=c.board)}",
                                         headers={"Authorization": f"Bearer {c.token}"}, **kwargs)
    return send


def pop(method: str, path: str, body: dict | None = None, headers: dict | None = None):
    def send(c: Ctx):
        kwargs = {"data": json.dumps(body).replace("{lb}", c.board), "content_type": "application/json"} \
            if body is not None else {}
        return getattr(c.client, method)(f"/popcorn/{path.format(lb=c.board)}",
                                         headers=headers or c.popcorn.headers(), **kwargs)
    return send


def pop_zip(data: bytes):
    def send(c: Ctx):
        return c.client.post("/popcorn/admin/update-problems", {"file": SimpleUploadedFile("p.zip", data)},
                             headers=ADMIN)
    return send


def site_submit(**fields):
    def send(c: Ctx):
        data = {"leaderboard": c.board, "gpu": "CPU", "mode": "test", "code": GOOD.decode(), **fields}
        if "file" in data:
            data["code"], data["file"] = "", SimpleUploadedFile("k.py", data["file"])
        return c.client.post("/submit/", data)
    return send


def v1_raw(path: str, body: bytes, content_type: str, token: bool = True):
    def send(c: Ctx):
        headers = {"Authorization": f"Bearer {c.token}"} if token else {}
        return c.client.generic("POST", f"/api/v1/{path}", body, content_type=content_type, headers=headers)
    return send


def v1_multipart(filename: str):
    def send(c: Ctx):
        body, content_type = multipart(GOOD, filename)
        return c.client.generic("POST", "/api/v1/submissions", body, content_type=content_type,
                                headers={"Authorization": f"Bearer {c.token}"})
    return send


def slack(text: str, stamp: str | None = None):
    def send(c: Ctx):
        from django.conf import settings

        settings.SLACK_SIGNING_SECRET = "s3cret"
        body = urlencode({"command": "/gpu-usage", "text": text})
        when = stamp or str(int(time.time()))
        signature = "v0=" + hmac.new(b"s3cret", f"v0:{when}:{body}".encode(), hashlib.sha256).hexdigest()
        return c.client.post("/gpus/slack", body, content_type="application/x-www-form-urlencoded",
                             headers={"X-Slack-Signature": signature, "X-Slack-Request-Timestamp": when})
    return send


def site(method: str, path: str, data: dict | None = None):
    def send(c: Ctx):
        return getattr(c.client, method)(path.format(lb=c.board), data or {})
    return send


def admin_upload(data: bytes, **fields):
    def send(c: Ctx):
        return c.client.post("/admin/leaderboards/problem/upload/",
                             {"archive": SimpleUploadedFile("p.zip", data), "harness": "auto", **fields})
    return send


NUL = "a\x00b"
SURROGATE = "a\ud800b"  # valid JSON ("a\\ud800b"), but no UTF-8 database can hold it
CASES: dict[str, tuple[Callable, int, str]] = {
    # popcorn: paths, query strings, JSON bodies, uploaded files
    "popcorn submit: NUL in leaderboard": (pop_submit("a%00b", "CPU", "test", GOOD), 400, "NUL byte"),
    "popcorn submit: NUL in gpu": (pop_submit("{lb}", "C%00PU", "test", GOOD), 400, "NUL byte"),
    "popcorn submit: NUL in mode": (pop_submit("{lb}", "CPU", "te%00st", GOOD), 400, "NUL byte"),
    "popcorn submit: over-long leaderboard": (pop_submit("a" * 300, "CPU", "test", GOOD), 404, "Unknown leaderboard"),
    "popcorn submit: non-slug leaderboard": (pop_submit("no%20such", "CPU", "test", GOOD), 404,
                                             "Unknown leaderboard 'no such'"),
    "popcorn submit: unknown mode": (pop_submit("{lb}", "CPU", "fastest", GOOD), 400, "Unknown mode 'fastest'"),
    "popcorn submit: empty file": (pop_submit("{lb}", "CPU", "test", b""), 400, "is empty"),
    "popcorn submit: non-UTF-8 file": (pop_submit("{lb}", "CPU", "test", b"x = '\xff'\n"), 400, "not UTF-8"),
    "popcorn submit: NUL in code": (pop_submit("{lb}", "CPU", "test", b"x = 1\x00\n"), 400, "NUL byte"),
    "popcorn list: huge offset": (pop("get", f"user/submissions?offset={HUGE}"), 400, "offset must be between"),
    "popcorn list: word as limit": (pop("get", "user/submissions?limit=abc"), 400, "limit"),
    "popcorn list: NUL in leaderboard": (pop("get", "user/submissions?leaderboard=a%00b"), 400, "NUL byte"),
    "popcorn get: huge id": (pop("get", f"user/submissions/{HUGE}"), 404, f"Submission {HUGE}"),
    "popcorn delete: huger id": (pop("delete", f"user/submissions/{HUGER}"), 404, f"Submission {HUGER}"),
    "popcorn gpus: NUL": (pop("get", "gpus/a%00b"), 400, "NUL byte"),
    "popcorn join: NUL in code": (pop("post", "user/join", {"code": NUL}), 400, "NUL byte"),
    "popcorn join: lone surrogate in code": (pop("post", "user/join", {"code": SURROGATE}), 400,
                                             "'code' holds a character that cannot be stored"),
    "popcorn join: wrong type": (pop("post", "user/join", {"code": ["x"]}), 400, "code"),
    "popcorn auth: NUL provider": (pop("get", "auth/cli/a%00b", headers={}), 400, "NUL byte"),
    "popcorn admin: NUL in directory": (pop("post", "admin/leaderboards", {"directory": NUL}, ADMIN), 400,
                                        "'directory' holds a NUL byte"),
    "popcorn admin: directory outside": (pop("post", "admin/leaderboards", {"directory": "../.."}, ADMIN), 400,
                                         "outside the problems directory"),
    **{f"popcorn admin: {kind} leaderboard name": (
        pop("post", "admin/leaderboards", {"directory": "demo/vectoradd_py", "name": name}, ADMIN), 400, fragment)
       for kind, name, fragment in [("NUL in", NUL, "is not a valid leaderboard name"),
                                    ("over-long", "a" * 101, "at most 100 characters"),
                                    ("non-slug", "Vector Add!", "Vector Add!")]},
    "popcorn admin: 3,000-character directory": (
        pop("post", "admin/update-problems?directory=" + "d" * 3000, headers=ADMIN), 400, "not a usable path"),
    "popcorn admin: leaderboard deadline in 1970": (
        pop("post", "admin/leaderboards", {"directory": "demo/vectoradd_py", "name": "old",
                                           "deadline": "1970-01-01T00:00:00Z"}, ADMIN), 400, "is in the past"),
    "popcorn submit: upper-case mode": (pop_submit("{lb}", "CPU", "LEADERBOARD", GOOD), 400,
                                        "Unknown mode 'LEADERBOARD'"),
    "popcorn admin: gpus wrong type": (pop("post", "admin/leaderboards", {"directory": "demo", "gpus": 3},
                                           ADMIN), 400, "gpus"),
    "popcorn admin: NUL in invite board": (pop("post", "admin/invites", {"leaderboard": NUL}, ADMIN), 400,
                                           "NUL byte"),
    "popcorn admin: max_uses as a string": (pop("post", "admin/invites", {"leaderboard": "{lb}", "max_uses": "5"},
                                                ADMIN), 400, "max_uses: Input should be a valid integer"),
    "popcorn admin: force as a string": (pop("post", "admin/leaderboards", {"directory": "demo", "force": "yes"},
                                             ADMIN), 400, "force: Input should be a valid boolean"),
    "popcorn admin: past_deadline 1": (pop("post", "admin/leaderboards", {"directory": "demo", "past_deadline": 1},
                                           ADMIN), 400, "past_deadline"),
    "popcorn admin: huge max_uses": (pop("post", "admin/invites", {"leaderboard": "{lb}", "max_uses": HUGER},
                                         ADMIN), 400, "max_uses"),
    "popcorn admin: NUL in ban user": (pop("post", "admin/bans", {"user": NUL}, ADMIN), 400, "NUL byte"),
    "popcorn admin: lone surrogate in ban board": (
        pop("post", "admin/bans", {"user": "alice", "leaderboard": SURROGATE}, ADMIN), 400,
        "'leaderboard' holds a character that cannot be stored"),
    "popcorn admin: huge submission id": (pop("get", f"admin/submissions/{HUGE}", headers=ADMIN), 404,
                                          f"Submission {HUGE}"),
    "popcorn admin: NUL update-problems directory": (pop("post", "admin/update-problems?directory=a%00b",
                                                         headers=ADMIN), 400, "NUL byte"),
    **{f"popcorn update-problems: {kind}": (pop_zip(data), 400, fragment)
       for kind, (data, fragment) in BAD_ZIPS.items()},
    # /api/v1
    "v1 submit: NUL in leaderboard": (v1_submit(leaderboard=NUL), 400, "NUL byte"),
    "v1 submit: NUL in gpu": (v1_submit(gpu=NUL), 400, "'gpu' holds a NUL byte"),
    "v1 submit: NUL in mode": (v1_submit(mode=NUL), 400, "'mode' holds a NUL byte"),
    "v1 submit: upper-case mode": (v1_submit(mode="TEST"), 400, "Unknown mode 'TEST'"),
    "v1 submit: over-long leaderboard": (v1_submit(leaderboard="a" * 300), 404, "Unknown leaderboard"),
    "v1 submit: empty file": (v1_submit(file=b""), 400, "is empty"),
    "v1 submit: non-UTF-8 file": (v1_submit(file=b"x = '\xff'\n"), 400, "not UTF-8"),
    "v1 submit: NUL in code": (v1_submit(file=b"x = 1\x00\n"), 400, "NUL byte"),
    "v1 submit: 100 kB file name": (v1_multipart("k" * 100_000 + ".py"), 400, "multipart body cannot be read"),
    "v1 submit: multipart without a boundary": (v1_raw("submissions", b"--x\r\n", "multipart/form-data"), 400,
                                                "multipart body cannot be read"),
    "v1 tokens: a JSON list as body": (v1("post", "tokens", []), 400, "JSON object"),
    "v1 list: huge offset": (v1("get", f"submissions?offset={HUGE}"), 400, "offset must be between"),
    "v1 list: word as limit": (v1("get", "submissions?limit=abc"), 422, "Invalid request: limit"),
    "v1 get: huge id": (v1("get", f"submissions/{HUGE}"), 404, f"Submission {HUGE}"),
    "v1 delete: huger id": (v1("delete", f"submissions/{HUGER}"), 404, f"Submission {HUGER}"),
    "v1 rankings: huge page": (v1("get", f"leaderboards/{{lb}}/rankings/CPU?page={HUGE}"), 400, "page"),
    "v1 leaderboard: NUL": (v1("get", "leaderboards/a%00b"), 400, "NUL byte"),
    "v1 tokens: NUL in name": (v1("post", "tokens", {"name": NUL}), 400, "NUL bytes"),
    "v1 tokens: over-long name": (v1("post", "tokens", {"name": "n" * 81}), 422, "name"),
    "v1 tokens: huge expiry": (v1("post", "tokens", {"expires_days": HUGER}), 422, "expires_days"),
    "v1 tokens: wrong type": (v1("post", "tokens", {"expires_days": "soon"}), 422, "expires_days"),
    "v1 tokens: revoke huge id": (v1("delete", f"tokens/{HUGE}"), 404, f"Token {HUGE} not found"),
    # strict JSON types (issue 35): a string or a boolean is not a number, a number is not a boolean
    "v1 reserve: GPU count as a string": (v1("post", "gpus/reservations", {"gpu_type": "CPU", "gpu_count": "2",
                                                                           "minutes": 60}), 422,
                                          "gpu_count: Input should be a valid integer"),
    "v1 reserve: GPU count true": (v1("post", "gpus/reservations", {"gpu_type": "CPU", "gpu_count": True,
                                                                    "minutes": 60}), 422, "gpu_count"),
    "v1 reserve: minutes as a string": (v1("post", "gpus/reservations", {"gpu_type": "CPU", "minutes": "60"}), 422,
                                        "minutes: Input should be a valid integer"),
    "v1 reserve: nodes 1.5": (v1("post", "gpus/reservations", {"gpu_type": "CPU", "minutes": 60, "nodes": 1.5}),
                              422, "nodes"),
    "v1 extend: minutes true": (v1("post", "gpus/reservations/1/extend", {"minutes": True}), 422, "minutes"),
    "v1 tokens: expiry true": (v1("post", "tokens", {"expires_days": True}), 422, "expires_days"),
    "v1 tokens: expiry as a string": (v1("post", "tokens", {"expires_days": "30"}), 422, "expires_days"),
    "v1 password login: expiry as a string": (v1("post", "auth/password", {"username": "a", "password": "b",
                                                                           "expires_days": "7"}), 422,
                                              "expires_days"),
    "v1 join: NUL in code": (v1("post", "join", {"code": NUL}), 400, "NUL byte"),
    "v1 join: lone surrogate in code": (v1("post", "join", {"code": SURROGATE}), 400, "cannot be stored"),
    "v1 password login: NUL in username": (v1("post", "auth/password", {"username": NUL, "password": "x"}),
                                           400, "NUL byte"),
    "v1 password login: lone surrogate in username": (
        v1("post", "auth/password", {"username": SURROGATE, "password": "x"}), 400, "cannot be stored"),
    # Slack's signed slash command (anyone can send the timestamp)
    "slack: 400-digit timestamp": (slack("project", stamp="9" * 400), 401, "invalid signature"),
    "slack: NUL in a signed command": (slack("project cluster=a\x00b"), 400, "NUL byte"),
    # the site's forms and pages (logged in)
    "site reserve: NUL in GPU type": (site("post", "/gpus/reserve", {"gpu_type": NUL, "gpu_count": "1",
                                                                     "minutes": "60"}), 400, "NUL byte"),
    "site reserve: NUL in project": (site("post", "/gpus/reserve", {"gpu_type": "CPU", "gpu_count": "1",
                                                                    "minutes": "60", "project": NUL}), 400, "NUL byte"),
    "site submit: NUL in leaderboard": (site_submit(leaderboard=NUL), 400, "Null characters are not allowed"),
    "site submit: NUL in code": (site_submit(code="x = 1\x00\n"), 400,
                                     "<li>Null characters are not allowed.</li></ul>"),  # that message alone
    "site submit: non-UTF-8 file": (site_submit(file=b"x = '\xff'\n"), 400, "not UTF-8"),
    "site submit: empty file": (site_submit(file=b""), 400, "empty"),
    "site submit: unknown mode": (site_submit(mode="TEST"), 400, "Select a valid choice"),
    "site submission: huge id": (site("get", f"/s/{HUGE}/"), 404, "Not Found"),
    "site leaderboard: NUL gpu": (site("get", "/lb/{lb}/?gpu=a%00b"), 400, "NUL byte"),
    "site leaderboard: over-long name": (site("get", "/lb/" + "a" * 300 + "/"), 404, "Not Found"),
    "site user: huge page": (site("get", f"/u/nobody-{HUGE}/"), 404, "Not Found"),
    "tokens: revoke a word": (site("post", "/tokens/", {"revoke": "abc"}), 400, "'revoke' must be a token id"),
    "tokens: revoke huge id": (site("post", "/tokens/", {"revoke": str(HUGER)}), 400, "'revoke' must be"),
    "tokens: NUL in name": (site("post", "/tokens/", {"name": NUL}), 400, "NUL bytes"),
    "tokens: over-long name": (site("post", "/tokens/", {"name": "n" * 81}), 400, "at most 80 characters"),
    "tokens: huge expiry": (site("post", "/tokens/", {"expires_days": str(HUGER)}), 400, "whole number of days"),
    "link-cli: NUL in id": (site("post", "/tokens/link-cli/", {"cli_id": NUL}), 404, "Unknown or expired CLI id"),
    # the admin's problem upload (staff)
    **{f"admin upload: {kind}": (admin_upload(data), 400, fragment) for kind, (data, fragment) in BAD_ZIPS.items()
       if kind != "empty file"},
    "admin upload: empty file": (admin_upload(b""), 400, "The submitted file is empty"),
    "admin upload: NUL in leaderboard": (admin_upload(BAD_ZIPS["no task.yml"][0], leaderboard=NUL), 400,
                                         "Enter a valid"),
}


@pytest.fixture
def ctx(client, leaderboard, alice, settings, tmp_path):
    settings.ADMIN_TOKEN = "corpus-admin"
    alice.is_staff = alice.is_superuser = True
    alice.save()
    client.force_login(alice)
    return Ctx(client, Popcorn(client, alice.raw_token), leaderboard.name, alice.raw_token, tmp_path)


def counts() -> dict[str, int]:
    return {model.__name__: model.objects.count() for model in TABLES}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_a_precise_4xx_and_writes_nothing(ctx, case):
    send, status, fragment = CASES[case]
    before = counts()
    got_status, message = answer(send(ctx))
    assert (got_status, fragment in message) == (status, True), f"{case}: {got_status} {message[:500]}"
    assert counts() == before


# --- the import command ----------------------------------------------------------------------------
def write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


IMPORTS = {
    "missing path": (lambda d: d / "nowhere", "nowhere: no such file or directory"),
    "NUL in path": (lambda d: f"{d}/a\x00b", "a\x00b: no such file or directory"),
    "non-UTF-8 competition": (lambda d: write(d / "c.yaml", b"name: \xff\n"), "UTF-8"),
    "empty competition": (lambda d: write(d / "c.yaml", b""), "expected a mapping"),
    "non-slug problem name": (lambda d: write(d / "c.yaml", b"name: c\nproblems:\n  - {name: 'a b', directory: x}\n"),
                              "a b"),
    "over-long problem name": (lambda d: write(d / "c.yaml", b"name: c\nproblems:\n  - {name: '" + b"a" * 300
                                               + b"', directory: x}\n"), "characters"),
    "NUL in task.yml": (lambda d: write(d / "t" / "task.yml", b"files: [\"a\x00b\"]\n").parent,
                        "unacceptable character #x0000"),
    "huge timeout": (lambda d: write(d / "t" / "task.yml", b"files: []\ntest_timeout: " + str(HUGER).encode()
                                     + b"\n").parent, "test_timeout"),
}


@pytest.mark.parametrize("case", list(IMPORTS))
def test_import_command_refuses_with_a_command_error(db, tmp_path, case):
    make, fragment = IMPORTS[case]
    before = counts()
    with pytest.raises(CommandError) as refused:
        call_command("import_problems", str(make(tmp_path)), stdout=io.StringIO())
    assert fragment in str(refused.value), str(refused.value)
    assert counts() == before


# --- websockets ------------------------------------------------------------------------------------
@pytest.fixture
def _keep_test_connection(monkeypatch):
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)


@pytest.mark.parametrize("path", ["/ws/nothing/", "/ws/submission/abc/", f"/ws/submission/{HUGE}/",
                                  f"/ws/leaderboard/{HUGER}/1/", "/ws/leaderboard/1/", "/ws/submission/1/%00/"])
def test_bad_websocket_paths_close_with_4404_and_log_no_error(_keep_test_connection, caplog, path):
    async def scenario():
        ws = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        ws.scope["user"] = AnonymousUser()
        connected, code = await ws.connect()
        return connected, code

    before = counts()
    assert async_to_sync(scenario)() == (False, 4404)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]
    assert counts() == before


def test_non_json_frames_get_an_error_frame(_keep_test_connection, leaderboard, cpu_pool):
    async def scenario():
        ws = WebsocketCommunicator(URLRouter(websocket_urlpatterns),
                                   f"/ws/leaderboard/{leaderboard.pk}/{cpu_pool.cpu.pk}/")
        ws.scope["user"] = AnonymousUser()
        assert (await ws.connect())[0]
        await ws.receive_json_from()  # the snapshot
        await ws.send_to(text_data="not json\x00")
        reply = await ws.receive_json_from()
        await ws.disconnect()
        return reply

    assert async_to_sync(scenario)() == {"type": "error", "detail": 'Frames must be JSON, e.g. {"type": "resync"}.'}
