"""Issue 11: one access authority and one run serialiser, checked through every front-end.

Secret-run details reach staff only (the owner sees the outcome class), public runs' logs are as private as the
code, and a closed leaderboard's member is treated alike by the site, /api/v1, popcorn and the websockets."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from asgiref.sync import async_to_sync
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import AnonymousUser
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.access.models import Membership
from leaderboards.api import progress_stream
from leaderboards.models import Leaderboard, Submission, Visibility
from leaderboards.popcorn.stream import events as popcorn_events
from leaderboards.routing import websocket_urlpatterns

from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .conftest import Popcorn, error_text

GOOD = b"def custom_kernel(data):\n    a, b = data\n    return a + b\n"
SECRET = "SECRET-INPUT-0.7315"  # what a hostile kernel prints about the secret inputs it was given
PUBLIC_LOG = "public-run-log-line"


def finish(sub, secret_verdict: str = "fail", secret_error: str = f"test 2 failed: got {SECRET}") -> None:
    """The public run passes and prints to its logs; the secret run fails and its error and logs hold SECRET."""
    for run in sub.runs.all():
        result = ranked_result([1000.0])
        if run.secret:
            result.update(verdict=secret_verdict, passed=False, error=secret_error, stderr=f"leak {SECRET}",
                          stdout=f"leak {SECRET}", tests=[{"spec": "size: 2", "status": "fail",
                                                           "message": f"mismatch {SECRET}"}])
        else:
            result.update(stdout=PUBLIC_LOG, stderr=PUBLIC_LOG)
        lifecycle.do_ingest_result(run.pk, dispatch(run), result)


def bearer(user) -> dict[str, str]:
    return {"Authorization": f"Bearer {do_create_token(user)[1]}"}


@pytest.fixture
def owner(db):
    return UserFactory(username="owner")


@pytest.fixture
def failed_secret(leaderboard, owner):
    sub = submission(leaderboard, user=owner, code="def custom_kernel(data): return 'sauce'")
    finish(sub)
    return sub


# --- item 5: secret-run details --------------------------------------------------------------------------
@pytest.mark.django_db
def test_api_shows_the_owner_a_secret_runs_outcome_class_only(client, failed_secret, owner):
    body = client.get(f"/api/v1/submissions/{failed_secret.pk}", headers=bearer(owner))
    assert body.status_code == 200
    assert SECRET not in body.content.decode()
    runs = {r["secret"]: r for r in body.json()["runs"]}
    assert runs[True]["outcome"] == "wrong_output" and runs[True]["error"] == "" and runs[True]["tests"] == []
    assert runs[False]["outcome"] == "passed" and runs[False]["stdout"] == PUBLIC_LOG
    staff = client.get(f"/api/v1/submissions/{failed_secret.pk}", headers=bearer(UserFactory(is_staff=True)))
    assert SECRET in {r["secret"]: r for r in staff.json()["runs"]}[True]["error"]


@pytest.mark.django_db
def test_popcorn_job_error_names_the_outcome_not_the_secret_detail(client, failed_secret, owner):
    popcorn = Popcorn(client, do_create_token(owner)[1])
    detail = json.loads(popcorn.get(f"user/submissions/{failed_secret.pk}").content)
    assert detail["done"] is True and detail["job"]["status"] == "failed"
    assert SECRET not in json.dumps(detail)
    assert "wrong output" in detail["job"]["error"] and "secret" in detail["job"]["error"]


@pytest.mark.parametrize(("verdict", "error", "outcome"), [
    ("timeout", "timed out in the ranked phase", "timed_out"),
    ("crash", f"the submission's process ended during the test phase (exit code 1):\n{SECRET}", "crashed"),
    ("crash", f"the submission's process ended during the test phase (killed (SIGKILL: CPU hard limit, OOM "
              f"killer or kill())):\n{SECRET}", "limit_exceeded"),
    ("fail", f"test 1 failed: {SECRET}", "wrong_output"),
])
@pytest.mark.django_db
def test_every_outcome_class_hides_the_detail(client, leaderboard, owner, verdict, error, outcome):
    sub = submission(leaderboard, user=owner)
    finish(sub, verdict, error)
    body = client.get(f"/api/v1/submissions/{sub.pk}", headers=bearer(owner))
    assert SECRET not in body.content.decode()
    assert {r["secret"]: r for r in body.json()["runs"]}[True]["outcome"] == outcome


def collect(stream) -> list[tuple[str, dict]]:
    async def read():
        return [chunk async for chunk in stream]
    out = []
    for chunk in async_to_sync(read)():
        lines = dict(line.split(": ", 1) for line in chunk.decode().strip().splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


@pytest.mark.django_db(transaction=True)
def test_event_streams_carry_no_secret_detail(postgres, leaderboard, owner):
    sub = submission(leaderboard, user=owner)
    finish(sub)
    api_events = collect(progress_stream(sub.pk, owner))
    assert [e for e, _ in api_events] == ["submission", "done"]
    popcorn = collect(popcorn_events(sub.pk, owner))
    assert popcorn[-1][0] == "result"
    for _, data in api_events + popcorn:
        assert SECRET not in json.dumps(data)
    assert PUBLIC_LOG in json.dumps(popcorn[-1][1])  # the owner still gets the public run's logs


@pytest.mark.django_db(transaction=True)
def test_a_ranked_submissions_event_stream_carries_its_standing(postgres, leaderboard, owner, sync_queue):
    """The stream's snapshots read the board's ranks (the submission page's standing) off the event loop."""
    sub = submission(leaderboard, user=owner)
    for run in sub.runs.all():  # both runs pass: ranked
        lifecycle.do_ingest_result(run.pk, dispatch(run), ranked_result([1000.0]))
    events = collect(progress_stream(sub.pk, owner))
    assert [e for e, _ in events] == ["submission", "done"]
    standing = events[0][1]["standing"][leaderboard.gpu_types.get().name]
    assert standing["rank"] == 1 and standing["tied"] is False and standing["score"] is not None, standing


@pytest.mark.django_db
def test_websocket_snapshot_and_page_show_the_outcome_only(client, failed_secret, owner, monkeypatch):
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)

    async def snapshot():
        ws = WebsocketCommunicator(URLRouter(websocket_urlpatterns), f"/ws/submission/{failed_secret.pk}/")
        ws.scope["user"] = owner
        assert (await ws.connect())[0]
        message = await ws.receive_json_from()
        await ws.disconnect()
        return message
    message = async_to_sync(snapshot)()
    assert SECRET not in json.dumps(message)
    assert {r["secret"]: r["outcome"] for r in message["runs"]} == {True: "wrong_output", False: "passed"}
    client.force_login(owner)
    page = client.get(f"/s/{failed_secret.pk}/").content.decode()
    assert SECRET not in page and PUBLIC_LOG in page


# --- item 7: public runs' logs are as private as the code ---------------------------------------------------
@pytest.mark.django_db
def test_public_run_logs_follow_the_code_rule(client, failed_secret, owner, leaderboard):
    public = failed_secret.runs.get(secret=False)
    log = f"/s/{failed_secret.pk}/runs/{public.pk}/stdout.txt"
    assert client.get(log).status_code == 404  # anonymous, before the deadline
    page = client.get(f"/s/{failed_secret.pk}/").content.decode()
    assert page.count("Ranked benchmarks") == 1 and PUBLIC_LOG not in page  # timings yes, logs no
    client.force_login(UserFactory(username="stranger"))
    assert client.get(log).status_code == 404
    client.force_login(owner)
    assert client.get(log).content.decode() == PUBLIC_LOG
    client.logout()
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=timezone.now() - timedelta(days=1),
                                                         code_public_after_deadline=True)
    assert client.get(log).content.decode() == PUBLIC_LOG  # the code is public now, and so are the logs
    secret_log = f"/s/{failed_secret.pk}/runs/{failed_secret.runs.get(secret=True).pk}/stderr.txt"
    assert client.get(secret_log).status_code == 404
    client.force_login(UserFactory(username="boss", is_staff=True))
    assert SECRET in client.get(secret_log).content.decode()


@pytest.mark.django_db
def test_strangers_see_a_ranked_submission_without_logs_or_code_everywhere(client, failed_secret):
    stranger = UserFactory(username="stranger")
    body = client.get(f"/api/v1/submissions/{failed_secret.pk}", headers=bearer(stranger))
    assert body.status_code == 200
    text = body.content.decode()
    assert SECRET not in text and PUBLIC_LOG not in text and "sauce" not in text
    popcorn = Popcorn(client, do_create_token(stranger)[1])
    response = popcorn.get(f"user/submissions/{failed_secret.pk}")
    assert response.status_code == 403 and "author and staff" in error_text(response)
    assert popcorn.delete(f"user/submissions/{failed_secret.pk}").status_code == 404
    assert Submission.objects.filter(pk=failed_secret.pk).exists()


# --- item 15: one rule for who sees a leaderboard or a submission ---------------------------------------------
@pytest.fixture
def closed(leaderboard):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=Visibility.CLOSED)
    leaderboard.refresh_from_db()
    return leaderboard


@pytest.mark.django_db
def test_a_member_of_a_closed_leaderboard_sees_it_everywhere(client, closed, monkeypatch):
    member = UserFactory(username="member")
    Membership.objects.create(leaderboard=closed, user=member)
    client.force_login(member)
    assert client.get(f"/lb/{closed.name}/").status_code == 200
    assert closed.name in client.get("/submit/").content.decode()
    assert client.get(f"/lb/{closed.name}/template/Python").status_code == 200
    response = client.post("/submit/", {"leaderboard": closed.name, "gpu": "CPU", "mode": "test",
                                        "code": GOOD.decode()})
    assert response.status_code == 302
    headers = bearer(member)
    assert client.get(f"/api/v1/leaderboards/{closed.name}", headers=headers).status_code == 200
    assert closed.name in [b["name"] for b in client.get("/api/v1/leaderboards", headers=headers).json()]
    popcorn = Popcorn(client, do_create_token(member)[1])
    assert json.loads(popcorn.get(f"gpus/{closed.name}").content) == ["CPU"]
    assert popcorn.submit(closed.name, "CPU", "test", GOOD).status_code == 202
    ranked = submission(closed, user=UserFactory(username="rival"))
    finish(ranked)
    client.force_login(member)
    assert client.get(f"/s/{ranked.pk}/").status_code == 200
    monkeypatch.setattr("channels.db.close_old_connections", lambda: None)

    async def connects(path: str, user) -> tuple[bool, int | None]:
        ws = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
        ws.scope["user"] = user
        connected, code = await ws.connect()
        if connected:
            await ws.disconnect()
        return connected, code
    board = f"/ws/leaderboard/{closed.pk}/{closed.gpu_types.get().pk}/"
    assert async_to_sync(connects)(board, member) == (True, None)
    assert async_to_sync(connects)(board, AnonymousUser()) == (False, 4404)


@pytest.mark.django_db
def test_an_outsider_gets_the_same_404_from_every_front_end(client, closed):
    outsider = UserFactory(username="outsider")
    ranked = submission(closed, user=UserFactory(username="insider"))
    finish(ranked)
    client.force_login(outsider)
    assert client.get(f"/lb/{closed.name}/").status_code == 404
    assert closed.name not in client.get("/submit/").content.decode()
    assert client.get(f"/s/{ranked.pk}/").status_code == 404
    headers = bearer(outsider)
    for path in (f"/api/v1/leaderboards/{closed.name}", f"/api/v1/leaderboards/{closed.name}/rankings/CPU",
                 f"/api/v1/submissions/{ranked.pk}"):
        response = client.get(path, headers=headers)
        assert response.status_code == 404, path
    assert closed.name not in [b["name"] for b in client.get("/api/v1/leaderboards", headers=headers).json()]
    popcorn = Popcorn(client, do_create_token(outsider)[1])
    assert "Unknown leaderboard" in error_text(popcorn.get(f"gpus/{closed.name}"))
    assert popcorn.submit(closed.name, "CPU", "test", GOOD).status_code == 404
    assert popcorn.get(f"user/submissions/{ranked.pk}").status_code == 404


@pytest.mark.django_db
def test_optional_tokens_on_public_reads_still_refuse_a_bad_one(client, leaderboard, settings, failed_secret):
    assert client.get("/api/v1/leaderboards").status_code == 200
    response = client.get("/api/v1/leaderboards", headers={"Authorization": "Bearer kb_wrong"})
    assert response.status_code == 401 and "Invalid, expired or revoked token" in error_text(response)
    response = client.get("/popcorn/leaderboards", headers={"X-Popcorn-Cli-Id": "kb_wrong"})
    assert response.status_code == 401 and "Invalid, expired or revoked CLI id" in error_text(response)
    settings.ADMIN_TOKEN = "s3cret-admin"
    detail = client.get(f"/popcorn/admin/submissions/{failed_secret.pk}",
                        headers={"Authorization": "Bearer s3cret-admin"}).json()
    assert SECRET in detail["job"]["error"]  # the organisers' view keeps the detail
