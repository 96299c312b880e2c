"""popcorn-cli's admin requests exactly as it sends them (bodies from popcorn-cli's src/service/mod.rs) and
KernelBot's routes the CLI and its users call (issue 44, points 2 and 3)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.access.models import Invite, Membership, SubmissionQuota
from leaderboards.models import Leaderboard, Run, RunAttempt, RunStatus, Submission, Visibility

from ..conftest import REPO, free_port
from ..factories import LeaderboardFactory, UserFactory, submission
from ..fakes.huggingface import FakeHub
from .conftest import error_text, multipart

pytestmark = pytest.mark.django_db
GOOD = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
ADMIN = {"Authorization": "Bearer s3cret-admin"}


@pytest.fixture
def admin_token(settings):
    settings.ADMIN_TOKEN = "s3cret-admin"


def test_generate_invites_for_several_boards_and_a_count(client, admin_token, popcorn, leaderboard, alice):
    other = LeaderboardFactory(problem=leaderboard.problem, gpu_types=list(leaderboard.gpu_types.all()))
    Leaderboard.objects.filter(pk__in=[leaderboard.pk, other.pk]).update(visibility=Visibility.CLOSED)
    # admin_generate_invites: json!({"leaderboards": leaderboards, "count": count})
    body = {"leaderboards": [leaderboard.name, other.name], "count": 3}
    answer = client.post("/popcorn/admin/invites", json.dumps(body), content_type="application/json", headers=ADMIN)
    assert answer.status_code == 200, answer.content
    result = answer.json()
    assert result["leaderboards"] == [leaderboard.name, other.name] and len(set(result["codes"])) == 3
    assert Invite.objects.count() == 3

    joined = client.post("/popcorn/user/join", {"code": result["codes"][0]}, content_type="application/json",
                         headers=popcorn.headers())
    assert joined.status_code == 200 and joined.json()["leaderboards"] == [leaderboard.name, other.name]
    assert set(Membership.objects.filter(user=alice).values_list("leaderboard__name", flat=True)) == {
        leaderboard.name, other.name}

    # admin list-invites / revoke-invite read "invites" (user_id set once claimed) and "was_claimed"
    listed = client.get(f"/popcorn/admin/leaderboards/{other.name}/invites", headers=ADMIN).json()["invites"]
    assert sorted((i["code"], i["user_id"]) for i in listed) == sorted(
        (c, str(alice.pk) if c == result["codes"][0] else None) for c in result["codes"])
    revoked = client.delete(f"/popcorn/admin/invites/{result['codes'][0]}", headers=ADMIN).json()
    assert revoked["was_claimed"] is True
    unknown = client.post("/popcorn/admin/invites", json.dumps({"leaderboards": ["nope"], "count": 1}),
                          content_type="application/json", headers=ADMIN)
    assert unknown.status_code == 404 and "nope" in error_text(unknown)
    for bad in ({"leaderboards": [], "count": 1}, {"leaderboards": [leaderboard.name], "count": 0}):
        refused = client.post("/popcorn/admin/invites", json.dumps(bad), content_type="application/json",
                              headers=ADMIN)
        assert refused.status_code == 400, refused.content


METHODS = ("GET", "POST", "PUT", "DELETE", "PATCH")


@pytest.mark.parametrize("path,served", [
    ("/popcorn/", ()),  # the mount root, with and without its slash
    ("/popcorn", ()),
    ("/popcorn/no-such-route", ()),
    ("/popcorn/definitely/not/a/route/at/all", ()),
    ("/popcorn/user/submissions/1/extra", ()),
    ("/popcorn/health", ("GET",)),
    ("/popcorn/admin/leaderboards/some-board/visibility", ("POST",)),
    ("/popcorn/admin/ban/7", ("POST", "DELETE")),
    ("/popcorn/vectoradd/CPU/test", ("POST",)),  # the SSE submit route's shape
])
def test_a_path_or_method_not_served_is_json_never_html_or_a_csrf_page(path, served):
    """As KernelBot (FastAPI): a path it does not serve is a 404, a method a path does not serve a 405, both JSON,
    whatever the method and without any CSRF token."""
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    for method in METHODS:
        if method in served:
            continue
        answer = strict.generic(method, path, b"{}", content_type="application/json")
        expected = 405 if served else 404
        assert answer.status_code == expected and answer["Content-Type"] == "application/json", (method,
                                                                                                  answer.content)
        if served:
            assert set(answer["Allow"].replace(" ", "").split(",")) == set(served)
            assert answer.json()["detail"].startswith(f"{method} is not allowed on {path}")
        else:
            assert answer.json() == {"detail": "Not Found"}


def test_runner_queue_submissions_and_count_of_a_board(client, leaderboard, cpu_pool):
    alice, bob = UserFactory(username="alice"), UserFactory(username="bob")
    for user, ratio in ((alice, 2.0), (bob, 1.0)):
        sub = submission(leaderboard, user)
        Run.objects.filter(submission=sub).update(status=RunStatus.SUCCEEDED, passed=True, score=ratio * 1e-3,
                                                  ratio=ratio, ratio_low=ratio, ratio_high=ratio)
    from leaderboards import actions
    actions.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    submission(leaderboard, alice)  # queued: two runs waiting on CPU

    queue = client.get("/popcorn/runner_queue/CPU")
    assert queue.status_code == 200 and queue.json()["queued_jobs"] == 2 and queue.json()["gpu"] == "CPU"
    assert queue.json()["status"] == "available" and queue.json()["runner"] == cpu_pool.name
    unknown = client.get("/popcorn/runner_queue/NOPE")  # KernelBot: a 200 that says so
    assert unknown.status_code == 200 and unknown.json()["status"] == "unavailable", unknown.content

    rows = client.get(f"/popcorn/submissions/{leaderboard.name}/CPU").json()
    assert [(r["user_name"], r["rank"]) for r in rows] == [("bob", 1), ("alice", 2)]
    assert client.get(f"/popcorn/submissions/{leaderboard.name}/CPU?limit=1&offset=1").json()[0]["user_name"] == \
        "alice"
    assert client.get(f"/popcorn/submission_count/{leaderboard.name}/CPU").json() == {"count": 2}
    assert client.get(f"/popcorn/submission_count/{leaderboard.name}/CPU?user_id={bob.pk}").json() == {"count": 1}
    assert client.get(f"/popcorn/submissions/{leaderboard.name}/H100").status_code == 404

    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=Visibility.CLOSED)
    assert client.get(f"/popcorn/submissions/{leaderboard.name}/CPU").status_code == 404  # not a member


def test_update_problems_from_a_repository_as_popcorn_cli_sends_it(client, admin_token, cpu_pool,
                                                                   problems_repository):
    # admin_update_problems: json!({"repository", "branch", "force"}) + "problem_set" + "visibility": "closed"
    body = {"repository": "owner/problems", "branch": "main", "force": False, "problem_set": "demo",
            "visibility": "closed"}
    answer = client.post("/popcorn/admin/update-problems", json.dumps(body), content_type="application/json",
                         headers=ADMIN)
    assert answer.status_code == 200, answer.content
    result = answer.json()
    assert {"vectoradd", "softmax"} <= set(result["created"]) and result["errors"] == []
    assert set(Leaderboard.objects.filter(name__in=result["created"]).values_list("visibility", flat=True)) == {
        Visibility.CLOSED}

    again = client.post("/popcorn/admin/update-problems", json.dumps({**body, "force": True}),
                        content_type="application/json", headers=ADMIN).json()
    assert again["created"] == [] and {s["name"] for s in again["skipped"]} >= {"vectoradd", "softmax"}

    missing = client.post("/popcorn/admin/update-problems", json.dumps({**body, "problem_set": "nope"}),
                          content_type="application/json", headers=ADMIN)
    assert missing.status_code == 400 and "available: demo" in error_text(missing)
    wrong = client.post("/popcorn/admin/update-problems", json.dumps({**body, "visibility": "secret"}),
                        content_type="application/json", headers=ADMIN)
    assert wrong.status_code == 400 and "visibility" in error_text(wrong)


def test_update_problems_offline_is_a_clear_refusal(client, admin_token, settings):
    settings.PROBLEMS_ARCHIVE_URL = f"http://127.0.0.1:{free_port()}/{{repository}}/{{branch}}.zip"  # nobody there
    body = {"repository": "gpu-mode/reference-kernels", "branch": "main", "force": False}
    answer = client.post("/popcorn/admin/update-problems", json.dumps(body), content_type="application/json",
                         headers=ADMIN)
    assert answer.status_code == 503 and "could not download" in error_text(answer)
    assert "no internet access" in error_text(answer) and not Leaderboard.objects.exists()


def test_kernelbot_rate_limits_zero_freezes_and_this_platforms_zero_stays_unlimited(client, admin_token, popcorn,
                                                                                    leaderboard):
    url = f"/popcorn/admin/leaderboards/{leaderboard.name}/rate-limits"
    put = client.put(url, json.dumps({"mode_category": "test", "max_submissions_per_hour": 0}),
                     content_type="application/json", headers=ADMIN)
    assert put.status_code == 200 and put.json()["rate_limit"]["frozen"] is True, put.content
    frozen = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert frozen.status_code == 403 and "frozen" in error_text(frozen)

    client.put(url, json.dumps({"mode_category": "test", "max_submissions_per_hour": 1}),
               content_type="application/json", headers=ADMIN)
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 429
    limits = client.get(url, headers=ADMIN).json()["rate_limits"]
    quota = SubmissionQuota.objects.get()
    assert limits == [{"id": quota.pk, "leaderboard_id": leaderboard.pk, "leaderboard_name": leaderboard.name,
                       "leaderboard": leaderboard.name, "mode_category": "test", "max_submissions_per_hour": 1,
                       "max_submissions": 1, "window_seconds": 3600, "frozen": False}]

    # this platform's own 0 (admin, settings) still means unlimited, shown to KernelBot's clients as null
    SubmissionQuota.objects.filter(leaderboard=leaderboard).update(max_submissions=0)
    SubmissionQuota.objects.get(leaderboard=leaderboard).save()  # as the admin saves it: the cache is forgotten
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202
    assert client.get(url, headers=ADMIN).json()["rate_limits"][0]["max_submissions_per_hour"] is None

    assert client.delete(f"{url}/test", headers=ADMIN).status_code == 200
    assert not SubmissionQuota.objects.exists()
    assert client.delete(f"{url}/test", headers=ADMIN).status_code == 404
    assert client.delete(f"{url}/ranked", headers=ADMIN).status_code == 400
    bad = client.put(url, json.dumps({"mode_category": "test", "max_submissions_per_hour": -1}),
                     content_type="application/json", headers=ADMIN)
    assert bad.status_code == 400


def test_after_deadline_admin_submission_board_listing_and_bulk_delete(client, admin_token, popcorn, leaderboard,
                                                                       alice):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=timezone.now() - timedelta(minutes=1))
    late = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert late.status_code == 403 and "closed" in error_text(late)
    body, content_type = multipart(GOOD, "submission.py")
    path = f"/popcorn/admin/submission/{leaderboard.name}/CPU/test"
    assert client.generic("POST", path, body, content_type=content_type,
                          headers=popcorn.headers()).status_code == 401  # no admin token
    taken = client.generic("POST", path, body, content_type=content_type, headers={**popcorn.headers(), **ADMIN})
    assert taken.status_code == 202, taken.content
    first = taken.json()["details"]["id"]
    second = client.generic("POST", path, body, content_type=content_type,
                            headers={**popcorn.headers(), **ADMIN}).json()["details"]["id"]
    assert set(Submission.objects.values_list("user__username", flat=True)) == {alice.username}

    board_url = f"/popcorn/admin/leaderboards/{leaderboard.name}/submissions"
    assert client.get(board_url, headers=ADMIN).json()["submission_ids"] == [second, first]  # newest first
    listed = client.get(f"{board_url}?limit=1&offset=1", headers=ADMIN).json()
    assert listed["submission_ids"] == [first] and listed["leaderboard"] == leaderboard.name
    gone = client.delete(f"/popcorn/admin/submissions?leaderboard_id={leaderboard.pk}&user_name={alice.username}",
                         headers=ADMIN)
    assert gone.status_code == 200, gone.content
    assert {k: gone.json()[k] for k in ("deleted_submissions", "deleted_runs", "deleted_job_status")} == {
        "deleted_submissions": 2, "deleted_runs": 2, "deleted_job_status": 2}  # a test run each
    assert not Submission.objects.filter(pk__in=[first, second]).exists()
    nobody = client.delete(f"/popcorn/admin/submissions?leaderboard_id={leaderboard.pk}&user_name=nobody",
                           headers=ADMIN)  # KernelBot: an unknown user has nothing to delete
    assert nobody.status_code == 200 and nobody.json() == {
        "status": "ok", "leaderboard_id": leaderboard.pk, "user_name": "nobody", "deleted_submissions": 0,
        "deleted_runs": 0, "deleted_job_status": 0}
    assert client.delete("/popcorn/admin/submissions?leaderboard_id=999999&user_name=nobody",
                         headers=ADMIN).status_code == 404


def test_create_leaderboard_names_it_as_kernelbot_takes_its_visibility_and_never_wipes_submissions(
        client, admin_token, cpu_pool, alice):
    """popcorn-cli's `admin create-leaderboard` sends {"directory"}; KernelBot names the board "<directory>-dev" and
    takes "visibility" (public/closed). It deletes and recreates a board of that name; here the board is updated in
    place, so its competitors' submissions stay, and its visibility changes only when one is sent."""
    def create(**body) -> dict:
        answer = client.post("/popcorn/admin/leaderboards", json.dumps({"directory": "demo/softmax_py", **body}),
                             content_type="application/json", headers=ADMIN)
        return {"status_code": answer.status_code, **answer.json()}

    refused = create(visibility="closed")  # the demo task.yml lists no gpus: as KernelBot, a 400
    assert refused["status_code"] == 400 and "GPU" in refused["detail"] and not Leaderboard.objects.exists()
    made = create(gpus=["CPU"], visibility="closed")
    assert made["status_code"] == 200 and made["leaderboard"] == "softmax_py-dev" and made["visibility"] == "closed"
    board = Leaderboard.objects.get(name="softmax_py-dev")
    assert board.visibility == Visibility.CLOSED
    bad = create(gpus=["CPU"], visibility="secret")
    assert bad["status_code"] == 400 and "visibility" in bad["detail"]
    kept = submission(board, alice)
    again = create(gpus=["CPU"])  # no visibility sent: the board keeps its own
    assert again["status_code"] == 200 and again["visibility"] == "closed" and again["created"] == []
    assert Submission.objects.filter(pk=kept.pk).exists()
    assert create(gpus=["CPU"], visibility="public")["visibility"] == "public"
    assert Leaderboard.objects.get(pk=board.pk).visibility == Visibility.PUBLIC
    assert Submission.objects.filter(pk=kept.pk).exists()


def test_a_test_runs_result_is_in_its_detail_and_a_secret_runs_never(client, popcorn, leaderboard, alice):
    from ..factories import ranked_result
    tested = submission(leaderboard, alice, mode="test")
    ranked = submission(leaderboard, alice, mode="leaderboard")
    for sub in (tested, ranked):
        Run.objects.filter(submission=sub).update(status=RunStatus.SUCCEEDED, passed=True, score=1e-3,
                                                  stdout="public-out", result=ranked_result([1e6]))
    detail = popcorn.get(f"user/submissions/{tested.pk}").json()
    [run] = detail["runs"]
    assert run["result"]["passed"] is True and run["result"]["stdout"] == "public-out"
    assert run["result"]["benchmarks"], run["result"]
    runs = popcorn.get(f"user/submissions/{ranked.pk}").json()["runs"]
    assert [("result" in r) for r in runs] == [False, False]  # ranked runs, and the secret one above all


def test_admin_get_submission_holds_every_run_whole_and_the_author_never_sees_the_secret(client, admin_token,
                                                                                         popcorn, leaderboard, alice):
    ranked = submission(leaderboard, alice, mode="leaderboard")
    Run.objects.filter(submission=ranked, secret=False).update(status=RunStatus.SUCCEEDED, passed=True, score=1e-3)
    Run.objects.filter(submission=ranked, secret=True).update(status=RunStatus.FAILED, passed=False,
                                                              error="secret case 7 differs", stdout="secret-out")
    whole = client.get(f"/popcorn/admin/submissions/{ranked.pk}", headers=ADMIN).json()
    secret = next(r for r in whole["runs_json"] if r["secret"])
    assert secret["error"] == "secret case 7 differs" and secret["stdout"] == "secret-out"
    own = popcorn.get(f"user/submissions/{ranked.pk}")
    assert own.status_code == 200 and "secret case 7" not in own.content.decode()
    assert "secret-out" not in own.content.decode() and "runs_json" not in own.json()


@pytest.mark.django_db(transaction=True)
def test_update_problems_downloads_off_the_sync_thread_and_still_answers_with_its_outcome(
        admin_token, cpu_pool, problems_repository, monkeypatch):
    """The repository's download does not hold the web process's one sync thread: a health check sent meanwhile is
    answered before it ends, and the CLI still gets the import's outcome in the answer."""
    import asyncio
    import time

    from asgiref.testing import ApplicationCommunicator

    from kernelbot.handlers import SyncWorkerASGIHandler
    from leaderboards import repository

    fetch = repository.download

    def slow(url: str) -> bytes:
        time.sleep(2)
        return fetch(url)

    monkeypatch.setattr(repository, "download", slow)

    def request(method: str, path: str, body: bytes = b"", headers: dict | None = None) -> ApplicationCommunicator:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
                 "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "client": ("127.0.0.1", 5000), "server": ("testserver", 80),
                 "headers": [(b"host", b"testserver"), (b"content-length", str(len(body)).encode()),
                             *((k.lower().encode(), v.encode()) for k, v in (headers or {}).items())]}
        return ApplicationCommunicator(SyncWorkerASGIHandler(), scope)

    async def answer(comm: ApplicationCommunicator) -> tuple[int, dict]:
        start = await comm.receive_output(30)
        return start["status"], json.loads((await comm.receive_output(30))["body"])

    async def sent(comm: ApplicationCommunicator) -> ApplicationCommunicator:
        await comm.send_input({"type": "http.request", "body": b"", "more_body": False})
        return comm

    async def scenario():
        body = json.dumps({"repository": "owner/problems", "branch": "main", "problem_set": "demo"}).encode()
        await answer(await sent(request("GET", "/api/v1/health")))  # the process's first request sets it up
        update = request("POST", "/popcorn/admin/update-problems", body,
                         {**ADMIN, "Content-Type": "application/json"})
        await update.send_input({"type": "http.request", "body": body, "more_body": False})
        await asyncio.sleep(0.5)  # downloading now
        started = time.monotonic()
        status, _ = await answer(await sent(request("GET", "/api/v1/health")))
        return status, time.monotonic() - started, await answer(update)

    health_status, took, (status, result) = asyncio.run(scenario())
    assert health_status == 200 and took < 1.0, took  # not behind the 2 s download
    assert status == 200 and {"vectoradd", "softmax"} <= set(result["created"]) and result["errors"] == []


def test_every_route_kernelbot_declares_with_its_status_and_field_names(client, admin_token, popcorn, leaderboard,
                                                                        alice, cpu_pool, settings, monkeypatch):
    """gpu-mode/kernelbot's src/kernelbot/api/main.py, route by route (in its order): the statuses it answers and the
    fields it names; ours may add fields beside them."""
    def call(method: str, path: str, body: dict | None = None, headers: dict | None = None, status: int = 200):
        answer = client.generic(method, f"/popcorn/{path}", json.dumps(body) if body is not None else b"",
                                content_type="application/json", headers=headers or {})
        assert answer.status_code == status, (method, path, answer.content)
        assert answer["Content-Type"].startswith("application/json"), (method, path, answer.content)
        return answer.json()

    assert call("GET", "health") == {"status": "ok"}
    assert set(call("GET", "auth/init?provider=discord")) == {"state"}

    # bans, declared before the three-segment submission route: not parsed as a submission to board "admin"
    assert call("POST", f"admin/ban/{alice.pk}", headers=ADMIN) == {"status": "ok", "user_id": str(alice.pk),
                                                                    "banned": True}
    banned = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert banned.status_code == 403 and "banned" in error_text(banned)
    assert call("DELETE", f"admin/ban/{alice.pk}", headers=ADMIN) == {"status": "ok", "user_id": str(alice.pk),
                                                                      "banned": False}
    assert "not found" in call("POST", "admin/ban/999999", headers=ADMIN, status=404)["detail"]
    call("DELETE", "admin/ban/999999", headers=ADMIN, status=404)
    call("POST", f"admin/ban/{alice.pk}", status=401)  # the admin token, not a CLI id

    accepted = popcorn.submit(leaderboard.name, "CPU", "leaderboard", GOOD)
    assert accepted.status_code == 202, accepted.content
    sub_id = accepted.json()["details"]["id"]
    assert accepted.json()["status"] == "accepted"
    assert {"runner", "gpu", "queued_jobs", "status"} <= set(accepted.json()["runner_queue"])

    assert call("POST", "admin/stop", headers=ADMIN)["accepts_jobs"] is False
    assert call("POST", "admin/start", headers=ADMIN) == {"status": "ok", "accepts_jobs": True, "accepting_jobs": True}

    missing = call("POST", "admin/leaderboards", {"directory": "no/such/problem"}, ADMIN, status=400)
    assert "does not exist" in missing["detail"]
    created = call("POST", "admin/leaderboards", {"directory": "demo/softmax_py", "name": "softmax-dev",
                                                  "gpus": ["CPU"]}, ADMIN)
    assert created["status"] == "ok" and created["leaderboard"] == "softmax-dev" and created["visibility"] == "public"
    assert call("DELETE", "admin/leaderboards/softmax-dev?force=true", headers=ADMIN)["force"] is True
    listed = call("GET", f"admin/leaderboards/{leaderboard.name}/submissions", headers=ADMIN)
    assert listed["submission_ids"] == [sub_id] and {"status", "leaderboard", "limit", "offset"} <= set(listed)

    # stats: {"status": "ok", "stats": {...}} in KernelBot's names, with its two filters
    Run.objects.filter(submission_id=sub_id, secret=False).update(status=RunStatus.SUCCEEDED, passed=True, score=1e-3,
                                                                  started_at=timezone.now(), finished_at=timezone.now())
    old = submission(leaderboard, alice, created=timezone.now() - timedelta(days=3))
    stats = call("GET", "admin/stats", headers=ADMIN)
    assert stats["status"] == "ok" and stats["stats"]["num_submissions"] == 2, stats
    assert stats["stats"]["num_run.CPU"] == 4 and stats["stats"]["runs_passed.CPU"] == 1
    assert {"sub_waiting", "num_users", "num_unique_codes", "runs_scored.CPU", "total_runtime.CPU"} <= set(
        stats["stats"])
    recent = call("GET", "admin/stats?last_day_only=true", headers=ADMIN)["stats"]
    assert recent["num_submissions"] == 1 and "num_unique_codes" not in recent and f"total.{alice.pk}" in recent
    assert call("GET", "admin/stats?leaderboard_name=other", headers=ADMIN)["stats"]["num_submissions"] == 0

    whole = call("GET", f"admin/submissions/{sub_id}", headers=ADMIN)
    item = whole["submission"]  # KernelBot's SubmissionItem, beside ours
    assert whole["status"] == "ok" and item["id"] == item["submission_id"] == sub_id
    assert {"leaderboard_id", "leaderboard_name", "file_name", "user_id", "submission_time", "done", "code", "runs",
            "job_status", "job_error", "job_last_heartbeat"} <= set(item)
    assert (item["job_status"], item["job_error"]) == (whole["job"]["status"], "") and len(item["runs"]) == 2
    for run in item["runs"]:
        assert {"start_time", "end_time", "mode", "secret", "runner", "score", "passed", "compilation", "meta",
                "result", "system"} <= set(run), run
    call("GET", "admin/submissions/999999", headers=ADMIN, status=404)
    assert call("DELETE", f"admin/submissions/{old.pk}", headers=ADMIN) == {"status": "ok",
                                                                             "submission_id": old.pk}

    [board] = call("GET", "leaderboards")
    assert board["name"] == leaderboard.name and board["visibility"] == "public"
    assert board["creator_id"] is None and board["forum_id"] is None and "secret_seed" not in board
    assert call("GET", f"gpus/{leaderboard.name}") == ["CPU"]
    queue = call("GET", "runner_queue/CPU")
    assert {"runner", "gpu", "queued_jobs", "running_jobs", "available_runners", "status", "error"} <= set(queue)
    assert queue["status"] == "available" and queue["error"] is None
    assert isinstance(call("GET", f"submissions/{leaderboard.name}/CPU"), list)
    assert set(call("GET", f"submission_count/{leaderboard.name}/CPU")) == {"count"}

    mine = popcorn.get("user/submissions")
    assert mine.status_code == 200 and [s["id"] for s in mine.json()] == [sub_id]
    for limit in (0, 101):
        refused = popcorn.get(f"user/submissions?limit={limit}")
        assert refused.status_code == 400 and "limit must be between 1 and 100" in error_text(refused)
    detail = popcorn.get(f"user/submissions/{sub_id}").json()
    assert {"id", "leaderboard_id", "leaderboard_name", "file_name", "user_id", "submission_time", "done", "code",
            "runs", "job", "runner_queue"} <= set(detail)
    assert set(detail["job"]) >= {"status", "error", "last_heartbeat"} and detail["job"]["last_heartbeat"] is None
    beat = timezone.now()
    RunAttempt.objects.create(run=Run.objects.filter(submission_id=sub_id).first(), number=1,
                              dispatched_at=beat - timedelta(minutes=1), last_news_at=beat)
    assert popcorn.get(f"user/submissions/{sub_id}").json()["job"]["last_heartbeat"] == beat.isoformat()
    assert detail["runner_queue"]["gpu"] == "CPU" and detail["runner_queue"]["runner"] == cpu_pool.name
    Run.objects.filter(submission_id=sub_id).update(status=RunStatus.SUCCEEDED, passed=True)
    done = popcorn.get(f"user/submissions/{sub_id}").json()
    assert done["done"] is True and done["runner_queue"]["gpu"] == "CPU"  # as KernelBot: not null while it has runs

    # invites, visibility, rate limits, join
    codes = call("POST", "admin/invites", {"leaderboards": [leaderboard.name], "count": 1}, ADMIN)
    assert {"status", "leaderboards", "codes"} <= set(codes)
    assert call("POST", f"admin/leaderboards/{leaderboard.name}/visibility", {"visibility": "closed"}, ADMIN) == {
        "status": "ok", "leaderboard": leaderboard.name, "visibility": "closed"}
    assert Leaderboard.objects.get(pk=leaderboard.pk).visibility == Visibility.CLOSED
    call("POST", f"admin/leaderboards/{leaderboard.name}/visibility", {"visibility": "secret"}, ADMIN, status=400)
    call("POST", "admin/leaderboards/nope/visibility", {"visibility": "closed"}, ADMIN, status=404)
    other = UserFactory()
    from leaderboards.access.actions import do_create_token
    others = {"X-Popcorn-Cli-Id": do_create_token(other)[1]}
    assert call("POST", "user/join", {"code": codes["codes"][0]}, popcorn.headers()) == {
        "status": "ok", "leaderboard": leaderboard.name, "leaderboards": [leaderboard.name]}
    used_up = call("POST", "user/join", {"code": codes["codes"][0]}, others, status=400)
    assert "used up" in used_up["detail"]
    [invite] = call("GET", f"admin/leaderboards/{leaderboard.name}/invites", headers=ADMIN)["invites"]
    assert {"code", "user_id", "user_name", "claimed_at", "created_at"} <= set(invite) and invite["claimed_at"]
    assert call("DELETE", f"admin/invites/{codes['codes'][0]}", headers=ADMIN)["status"] == "ok"
    limits = f"admin/leaderboards/{leaderboard.name}/rate-limits"
    assert call("PUT", limits, {"mode_category": "test", "max_submissions_per_hour": 5}, ADMIN)["status"] == "ok"
    [limit] = call("GET", limits, headers=ADMIN)["rate_limits"]
    assert limit["max_submissions_per_hour"] == 5 and limit["mode_category"] == "test"
    assert (limit["leaderboard_id"], limit["leaderboard_name"]) == (leaderboard.pk, leaderboard.name)
    assert limit["id"] == SubmissionQuota.objects.get().pk
    assert call("DELETE", f"{limits}/test", headers=ADMIN)["mode_category"] == "test"

    bad_export = call("POST", "admin/export-hf", {"leaderboard_ids": [leaderboard.pk], "filename": "x.csv"}, ADMIN,
                      status=400)
    assert "filename" in bad_export["detail"]
    hub = FakeHub(token="hf_test_token").start()
    try:
        settings.HF_ENDPOINT, settings.HF_PRIVATE_DATASET = hub.url, "org/live-data"
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        exported = call("POST", "admin/export-hf", {"leaderboard_ids": [leaderboard.pk], "filename": "live.parquet"},
                        ADMIN)
    finally:
        hub.stop()
    assert {k: exported[k] for k in ("status", "rows", "repo_id", "filename")} == {
        "status": "ok", "rows": 1, "repo_id": "org/live-data", "filename": "live.parquet"}  # alice's ranked one
    call("POST", "admin/update-problems", {"repository": "x/y", "visibility": "secret"}, ADMIN, status=400)
    assert call("DELETE", f"user/submissions/{sub_id}", headers=popcorn.headers()) == {"status": "ok",
                                                                                      "submission_id": sub_id}
