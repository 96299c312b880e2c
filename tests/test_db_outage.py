"""Requests survive a lost database connection (issue 24): a safe request is retried once on a fresh connection,
any other one is answered 503 with Retry-After, never 500, and a write that failed left nothing half stored.

In process (any database): each way a lost connection reaches kernelbot.dbhealth. Against a real server (granian,
as docs/operations.md runs it, on the test database in PostgreSQL): the server's connections are terminated twice
with `pg_terminate_backend` while threads keep loading pages, reading and submitting through the API and popcorn,
with pooled (DB_POOL) and with persistent connections."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import psycopg
import pytest
from django.contrib.sessions.backends.db import SessionStore
from django.db import InterfaceError, OperationalError, connection
from django.test import Client

from kernelbot import api as kernelbot_api
from kernelbot.dbhealth import RETRY_AFTER, connection_lost
from leaderboards import api as leaderboards_api
from leaderboards.access.actions import do_create_token
from leaderboards.models import Run, Submission

from .api.conftest import multipart
from .conftest import REPO
from .factories import LeaderboardFactory, UserFactory, local_cpu_pool, problem_from
from .servers import granian, production_env

CODE = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


def wrapped(error: psycopg.Error, kind: type[Exception] = OperationalError) -> Exception:
    """What Django raises for a psycopg error: its own class, the driver's error as the cause."""
    exc = kind(*error.args)
    exc.__cause__ = error
    return exc


def lost() -> Exception:
    return wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command"))


def test_what_counts_as_a_lost_connection():
    assert connection_lost(lost())
    assert connection_lost(wrapped(psycopg.OperationalError("consuming input failed: server closed the connection")))
    assert connection_lost(wrapped(psycopg.errors.CannotConnectNow("the database system is starting up")))
    assert connection_lost(wrapped(psycopg.errors.TooManyConnections("sorry, too many clients already")))
    assert connection_lost(wrapped(psycopg.InterfaceError("the connection is closed"), InterfaceError))
    assert connection_lost(InterfaceError("connection already closed"))
    # the query's fault, not the connection's: a 500 (or the caller's own handling) as before
    assert not connection_lost(wrapped(psycopg.errors.QueryCanceled("canceling statement due to statement timeout")))
    assert not connection_lost(wrapped(psycopg.errors.DeadlockDetected("deadlock detected")))
    assert not connection_lost(OperationalError("database is locked"))  # SQLite: no connection to lose
    assert not connection_lost(ValueError("no"))


class FailsOnce:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise lost()
        return self.real(*args, **kwargs)


@pytest.mark.django_db
def test_a_safe_request_is_retried_once_and_a_write_is_answered_503(client, leaderboard, monkeypatch):
    user = UserFactory()
    bearer = {"Authorization": f"Bearer {do_create_token(user)[1]}"}
    flaky = type("FlakyConnection", (), {"cursor": FailsOnce(connection.cursor)})
    monkeypatch.setattr(kernelbot_api, "connection", flaky)
    assert client.get("/api/v1/health").json() == {"status": "ok"}  # a NinjaAPI's GET, retried
    assert flaky.cursor.calls == 2

    submit = FailsOnce(leaderboards_api.actions.do_submit)
    monkeypatch.setattr(leaderboards_api.actions, "do_submit", submit)
    upload = {"file": ("k.py", CODE), "leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test"}
    response = client.post("/api/v1/submissions", upload_files(upload), headers=bearer)
    assert response.status_code == 503 and response["Retry-After"] == str(RETRY_AFTER)
    assert "connection was lost" in response.json()["detail"] and submit.calls == 1  # a write is not replayed
    assert not Submission.objects.exists()
    response = client.post("/api/v1/submissions", upload_files(upload), headers=bearer)  # the client's own retry
    assert response.status_code == 201 and Submission.objects.get().runs.count() == 1


def broken(*args, **kwargs):
    raise lost()


@pytest.mark.django_db
def test_a_page_that_fails_twice_is_a_503_page(leaderboard, monkeypatch):
    from leaderboards import views

    monkeypatch.setattr(views, "access_leaderboard", broken)
    page = Client().get(f"/lb/{leaderboard.name}/")
    assert page.status_code == 503 and page["Retry-After"] == str(RETRY_AFTER)
    assert page["Content-Type"].startswith("text/html") and b"Try again" in page.content


@pytest.mark.django_db
def test_an_inner_middlewares_failure_is_retried_or_a_503(leaderboard, monkeypatch):
    """Django turns an inner middleware's exception into a 500 inside the chain; it is still healed."""
    from django.contrib.messages.middleware import MessageMiddleware

    browser = Client(raise_request_exception=False)
    fails_once = FailsOnce(MessageMiddleware.process_response)
    monkeypatch.setattr(MessageMiddleware, "process_response", lambda *args: fails_once(*args))
    assert browser.get(f"/lb/{leaderboard.name}/").status_code == 200 and fails_once.calls == 2

    # the session a login creates is saved on the way out
    user = UserFactory(username="sam")
    user.set_password("a long enough password")
    user.save()
    monkeypatch.setattr(SessionStore, "save", broken)
    login = browser.post("/accounts/login/", {"login": "sam", "password": "a long enough password"})
    assert login.status_code == 503 and login["Retry-After"] == str(RETRY_AFTER)


@pytest.mark.django_db
def test_a_pool_whose_connections_all_died_hands_out_a_working_one_at_once(postgres):
    """DB_POOL's engine: psycopg_pool's own check would wait 1 + 2 + 4 s over the first three dead connections."""
    from kernelbot.postgresql.base import DatabaseWrapper

    name = f"kb-pool-{uuid.uuid4().hex[:8]}"
    pooled = DatabaseWrapper({**connection.settings_dict, "ENGINE": "kernelbot.postgresql", "CONN_MAX_AGE": 0,
                              "CONN_HEALTH_CHECKS": False, "OPTIONS": {
                                  **connection.settings_dict["OPTIONS"], "application_name": name,
                                  "pool": {"min_size": 4, "max_size": 4, "timeout": 10}}}, alias=name)
    try:
        pooled.pool.open(wait=True)
        assert terminate_server_connections(name) == 4  # every idle connection of the pool
        started = time.monotonic()
        with pooled.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        assert time.monotonic() - started < 1
    finally:
        pooled.close()
        pooled.close_pool()


def upload_files(fields: dict) -> dict:
    from django.core.files.uploadedfile import SimpleUploadedFile

    return {k: SimpleUploadedFile(*v) if isinstance(v, tuple) else v for k, v in fields.items()}


# --- a real server, its connections terminated twice under load ----------------------------------------------------

@dataclass
class Platform:
    url: str
    application_name: str  # the server's connections' name in pg_stat_activity
    board: str
    token: str
    log: str


@pytest.fixture(params=[{"DB_POOL": "1", "DB_POOL_SIZE": "4"}, {"DB_CONN_MAX_AGE": "60"}], ids=["pool", "persistent"])
def platform(request, transactional_db, postgres, demo_task, tmp_path):
    pool = local_cpu_pool()
    board = LeaderboardFactory(name="outage", problem=problem_from(demo_task), gpu_types=[pool.cpu])
    user = UserFactory(username="loader")
    application_name = f"kb-outage-{uuid.uuid4().hex[:8]}"
    env = production_env(tmp_path, KERNELBOT_KERNELGUARD="off", KERNELBOT_QUOTA_TEST="0", **request.param)
    env["DATABASE_URL"] += f"?application_name={application_name}"
    log = tmp_path / "granian.log"
    try:
        with granian(env, log) as url:
            yield Platform(url, application_name, board.name, do_create_token(user)[1], str(log))
    finally:
        print(f"--- {log.name} (tail) ---\n" + log.read_text(errors="replace")[-3000:])


@dataclass
class Answer:
    what: str
    status: int
    retry_after: str | None
    body: bytes


def requests_of(platform: Platform) -> list[tuple[str, str, str, dict]]:
    """(name, method, path, httpx keyword arguments): a browser's pages, the API's reads and submissions, popcorn's
    submission, and the runner API (a wrong token: 403 after its database lookup)."""
    bearer = {"Authorization": f"Bearer {platform.token}"}
    body, content_type = multipart(CODE, "k.py")
    return [
        ("home", "GET", "/", {}),
        ("board", "GET", f"/lb/{platform.board}/", {}),
        ("login", "GET", "/accounts/login/", {}),
        ("list", "GET", "/api/v1/submissions", {"headers": bearer}),
        ("submit", "POST", "/api/v1/submissions",
         {"headers": bearer, "files": {"file": ("k.py", CODE)},
          "data": {"leaderboard": platform.board, "gpu": "CPU", "mode": "test"}}),
        ("popcorn", "POST", f"/popcorn/submission/{platform.board}/CPU/test",
         {"headers": {"X-Popcorn-Cli-Id": platform.token, "Content-Type": content_type}, "content": body}),
        ("runner", "GET", "/api/runner/v1/runs/1/1/job", {"headers": {"Authorization": "Bearer " + "0" * 64}}),
    ]


EXPECTED = {"home": 200, "board": 200, "login": 200, "list": 200, "submit": 201, "popcorn": 202, "runner": 403}


def load(platform: Platform, stop: threading.Event, answers: list[Answer], offset: int) -> None:
    plan = requests_of(platform)
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        i = offset
        while not stop.is_set():
            what, method, path, kwargs = plan[i % len(plan)]
            i += 1
            try:
                response = client.request(method, path, **kwargs)
            except httpx.TransportError as exc:  # a refused or dropped HTTP connection would be a failure too
                answers.append(Answer(what, -1, None, repr(exc).encode()))
                continue
            answers.append(Answer(what, response.status_code, response.headers.get("Retry-After"), response.content))


def terminate_server_connections(application_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                       "WHERE application_name = %s AND pid <> pg_backend_pid()", [application_name])
        return cursor.fetchone()[0]


def submitted_id(answer: Answer) -> int | None:
    if answer.what == "submit" and answer.status == 201:
        return json.loads(answer.body)["id"]
    if answer.what == "popcorn" and answer.status == 200:
        return json.loads(answer.body)["details"]["id"]
    return None


@pytest.mark.timeout(120)
def test_terminated_connections_twice_under_load_give_no_500(platform, capsys):
    answers: list[Answer] = []
    stop = threading.Event()
    threads = [threading.Thread(target=load, args=(platform, stop, answers, n), daemon=True) for n in range(4)]
    for thread in threads:
        thread.start()
    killed = []
    try:
        deadline = time.monotonic() + 30
        while sum(a.status in (200, 201) for a in answers) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)  # warm: both workers hold connections
        for _ in range(2):
            killed.append(terminate_server_connections(platform.application_name))
            time.sleep(3)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)

    by_status = Counter((a.what, a.status) for a in answers)
    log = Path(platform.log).read_text(errors="replace")
    with capsys.disabled():
        print(f"\nterminated {killed} connections; answers: {dict(sorted(by_status.items()))}; the server retried "
              f"{log.count('retrying it once')} requests and answered {log.count('answered 503')} with 503")
    assert all(killed), "the server held no connection to terminate"
    unexpected = [(a.what, a.status, a.body[:300]) for a in answers if a.status not in (EXPECTED[a.what], 503)]
    assert not unexpected, unexpected
    for answer in answers:
        if answer.status == 503:
            assert answer.retry_after == str(RETRY_AFTER), answer
            if answer.what not in ("home", "board", "login"):
                assert "connection was lost" in json.loads(answer.body)["detail"]

    # healed: after both terminations every kind of request succeeds again
    with httpx.Client(base_url=platform.url, timeout=60) as client:
        for what, method, path, kwargs in requests_of(platform):
            response = client.request(method, path, **kwargs)
            assert response.status_code == EXPECTED[what], (what, response.status_code, response.text[:300])

    # nothing half written: every accepted submission is there with its run, and none is without one (a 503 may
    # have been committed just before its connection was lost: it is whole too)
    accepted = {i for a in answers if (i := submitted_id(a)) is not None}
    assert accepted and accepted <= set(Submission.objects.values_list("pk", flat=True))
    assert not Submission.objects.filter(runs__isnull=True).exists()
    assert Run.objects.filter(submission_id__in=accepted).count() == len(accepted)
