"""popcorn-cli's exact requests (paths, headers, raw multipart) and its way of reading the answers."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from leaderboards.access.models import ApiToken, Invite, Membership
from leaderboards.models import Leaderboard, Submission, Visibility

from ..conftest import REPO
from ..factories import UserFactory
from .conftest import Popcorn, error_text

SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"
GOOD = (SOLUTIONS / "correct.py").read_bytes()
pytestmark = pytest.mark.django_db


def test_leaderboards_and_gpus_are_what_the_client_parses_and_hold_no_secrets(popcorn, leaderboard):
    response = popcorn.get("leaderboards")
    assert response.status_code == 200
    items = json.loads(response.content)
    item = next(i for i in items if i["name"] == leaderboard.name)
    assert isinstance(item["name"], str) and isinstance(item["description"], str) and isinstance(item["task"], dict)
    assert "secret" not in response.content.decode().lower().replace("secret\":", "")
    assert str(leaderboard.secret_seed) not in response.content.decode()
    assert item["task"]["lang"] == "py" and "reference.py" in item["task"]["files"]
    assert json.loads(popcorn.get(f"gpus/{leaderboard.name}").content) == ["CPU"]
    assert "Unknown leaderboard" in error_text(popcorn.get("gpus/nope"))


def test_submission_is_accepted_polled_until_done_listed_and_deleted(popcorn, leaderboard, sync_queue, alice,
                                                                     django_capture_on_commit_callbacks, settings):
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 100}
    with django_capture_on_commit_callbacks(execute=True):
        response = popcorn.submit(leaderboard.name.upper(), "cpu", "Test", GOOD, "correct.py")
    assert response.status_code == 202, response.content
    body = json.loads(response.content)
    assert body["status"] == "accepted" and isinstance(body["details"]["id"], int)
    sub_id = body["details"]["id"]

    detail = json.loads(popcorn.get(f"user/submissions/{sub_id}").content)
    assert detail["done"] is True and detail["job"]["status"] == "succeeded", detail
    assert detail["id"] == sub_id and detail["leaderboard_name"] == leaderboard.name
    assert detail["user_id"] == str(alice.pk) and detail["file_name"] == "correct.py"
    assert datetime.fromisoformat(detail["submission_time"]) and detail["code"] == GOOD.decode()
    (run,) = detail["runs"]
    assert run["mode"] == "test" and run["secret"] is False and run["passed"] is True
    assert datetime.fromisoformat(run["start_time"]) <= datetime.fromisoformat(run["end_time"])

    listed = json.loads(popcorn.get(f"user/submissions?leaderboard={leaderboard.name}&limit=10").content)
    assert [s["id"] for s in listed] == [sub_id] and listed[0]["done"] is True
    assert {"id", "leaderboard_name", "file_name", "submission_time", "done", "runs"} <= set(listed[0])
    assert listed[0]["runs"][0]["gpu_type"] == "CPU"

    other = Popcorn(popcorn.client, None)
    other.cli_id = __import__("leaderboards.access.actions", fromlist=["x"]).do_create_token(UserFactory())[1]
    assert other.delete(f"user/submissions/{sub_id}").status_code == 404
    response = popcorn.delete(f"user/submissions/{sub_id}")
    assert json.loads(response.content) == {"status": "ok", "submission_id": sub_id}
    assert not Submission.objects.exists()


def test_queued_submission_reports_queue_and_is_not_done(popcorn, leaderboard):
    body = json.loads(popcorn.submit(leaderboard.name, "CPU", "leaderboard", GOOD).content)
    queue = body["runner_queue"]
    assert queue["gpu"] == "CPU" and queue["queued_jobs"] == 2 and queue["position"] == 1
    assert queue["eta_seconds"] > 0
    detail = json.loads(popcorn.get(f"user/submissions/{body['details']['id']}").content)
    assert detail["done"] is False and detail["job"]["status"] == "pending"
    assert [r["secret"] for r in detail["runs"]] == [False, True]


def test_directives_that_contradict_the_url_are_rejected(popcorn, leaderboard):
    code = b"#!POPCORN leaderboard other-board\n#!POPCORN gpu H100\n" + GOOD
    assert "#!POPCORN leaderboard is 'other-board'" in error_text(popcorn.submit(leaderboard.name, "CPU", "test",
                                                                                 code))
    code = f"#!POPCORN leaderboard {leaderboard.name}\n#!POPCORN gpu H100\n".encode() + GOOD
    response = popcorn.submit(leaderboard.name, "CPU", "test", code)
    assert response.status_code == 400 and "#!POPCORN gpu is 'H100'" in error_text(response)
    code = f"#!POPCORN leaderboard {leaderboard.name}\n#!POPCORN gpu cpu\n".encode() + GOOD
    assert popcorn.submit(leaderboard.name, "CPU", "test", code).status_code == 202


def test_registration_binds_a_pending_id_which_then_works_as_cli_id(client, leaderboard):
    state = json.loads(client.get("/popcorn/auth/init?provider=discord").content)["state"]
    pending = Popcorn(client, state)
    response = pending.submit(leaderboard.name, "CPU", "test", GOOD)
    assert response.status_code == 401 and "not linked to an account yet" in error_text(response)
    user = UserFactory(username="bob")
    client.force_login(user)
    assert client.get("/tokens/link-cli/").status_code == 200
    assert client.post("/tokens/link-cli/", {"cli_id": state, "confirm": "yes"}).status_code == 302
    client.logout()
    assert pending.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202
    assert ApiToken.objects.get(user=user).name.startswith("popcorn-cli")
    assert "Unknown provider" in error_text(client.get("/popcorn/auth/init?provider=gitlab"))
    assert client.get("/popcorn/auth/cli/discord?code=x&state=y").status_code == 501


def test_token_page_issues_a_token_shown_once(client, leaderboard):
    user = UserFactory(username="carol")
    client.force_login(user)
    page = client.post("/tokens/", {"name": "laptop"}).content.decode()
    raw = page.split("cli_id: ")[1].split("<")[0].strip()
    client.logout()
    assert Popcorn(client, raw).submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202
    assert raw not in client.get("/tokens/").content.decode()


ADMIN = {"Authorization": "Bearer s3cret-admin"}


@pytest.fixture
def admin_token(settings):
    settings.ADMIN_TOKEN = "s3cret-admin"


def test_admin_routes_need_the_admin_token(client, admin_token, popcorn, leaderboard):
    assert client.post("/popcorn/admin/stop").status_code == 401
    assert client.post("/popcorn/admin/stop", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert json.loads(client.post("/popcorn/admin/stop", headers=ADMIN).content)["accepts_jobs"] is False
    response = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert response.status_code == 503 and "paused" in error_text(response)
    client.post("/popcorn/admin/start", headers=ADMIN)
    sub_id = json.loads(popcorn.submit(leaderboard.name, "CPU", "test", GOOD).content)["details"]["id"]
    stats = json.loads(client.get("/popcorn/admin/stats", headers=ADMIN).content)["stats"]
    assert stats["num_submissions"] == 1 and stats["accepting_jobs"] is True
    assert json.loads(client.get(f"/popcorn/admin/submissions/{sub_id}", headers=ADMIN).content)["id"] == sub_id
    assert client.delete(f"/popcorn/admin/submissions/{sub_id}", headers=ADMIN).status_code == 200
    assert "has 0" not in client.delete(f"/popcorn/admin/leaderboards/{leaderboard.name}",
                                        headers=ADMIN).content.decode()
    assert not Leaderboard.objects.filter(name=leaderboard.name).exists()


def test_admin_creates_leaderboards_and_updates_problems_from_the_problems_tree(client, admin_token, cpu_pool):
    response = client.post("/popcorn/admin/leaderboards", {"directory": "demo/softmax_py", "name": "softmax-x",
                                                           "gpus": ["CPU"]}, content_type="application/json",
                           headers=ADMIN)
    assert response.status_code == 200, response.content
    assert Leaderboard.objects.filter(name="softmax-x").exists()
    bad = client.post("/popcorn/admin/leaderboards", {"directory": "../../etc"}, content_type="application/json",
                      headers=ADMIN)
    assert bad.status_code == 400 and "outside the problems directory" in error_text(bad)
    report = json.loads(client.post("/popcorn/admin/update-problems?directory=demo.yaml", headers=ADMIN).content)
    assert set(report) == {"created", "updated", "skipped", "errors"} and report["created"], report


def test_invites_admit_users_to_closed_leaderboards(client, admin_token, popcorn, leaderboard, alice):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(visibility=Visibility.CLOSED)
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 404
    code = json.loads(client.post("/popcorn/admin/invites", {"leaderboard": leaderboard.name},
                                  content_type="application/json", headers=ADMIN).content)["code"]
    listed = json.loads(client.get(f"/popcorn/admin/leaderboards/{leaderboard.name}/invites", headers=ADMIN).content)
    assert [(i["code"], i["user_id"]) for i in listed["invites"]] == [(code, None)]
    joined = client.post("/popcorn/user/join", {"code": code}, content_type="application/json",
                         headers=popcorn.headers())
    assert joined.status_code == 200 and Membership.objects.filter(user=alice).exists()
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202
    assert client.delete(f"/popcorn/admin/invites/{code}", headers=ADMIN).status_code == 200
    assert not Invite.objects.exists()
