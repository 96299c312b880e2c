"""Our own /api/v1: tokens, leaderboards, paged rankings, submissions."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from leaderboards.access.models import ApiToken, SubmissionQuota

from ..factories import UserFactory, ranked_result, submission
from .conftest import error_text

GOOD = b"#!POPCORN gpu CPU\ndef custom_kernel(data):\n    a, b = data\n    return a + b\n"
pytestmark = pytest.mark.django_db


def bearer(user) -> dict[str, str]:
    return {"Authorization": f"Bearer {user.raw_token}"}


def test_me_and_token_lifecycle(client, alice):
    assert client.get("/api/v1/me").status_code == 401
    assert client.get("/api/v1/me", headers=bearer(alice)).json()["username"] == "alice"
    created = client.post("/api/v1/tokens", {"name": "ci", "expires_days": 30}, content_type="application/json",
                          headers=bearer(alice))
    assert created.status_code == 201
    raw = created.json()["token"]
    token = ApiToken.objects.get(pk=created.json()["id"])
    assert token.digest != raw and raw not in token.digest and token.expires
    listed = client.get("/api/v1/tokens", headers={"Authorization": f"Bearer {raw}"}).json()
    assert {t["name"] for t in listed} == {"cli", "ci"} and all("token" not in t for t in listed)
    assert ApiToken.objects.get(pk=token.pk).last_used is not None
    assert client.delete(f"/api/v1/tokens/{token.pk}", headers=bearer(alice)).status_code == 204
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {raw}"}).status_code == 401


def test_password_login_issues_a_token(client):
    user = UserFactory(username="dave")
    user.set_password("correct horse")
    user.save()
    bad = client.post("/api/v1/auth/password", {"username": "dave", "password": "x"}, content_type="application/json")
    assert bad.status_code == 401 and error_text(bad) == "Wrong username or password."
    ok = client.post("/api/v1/auth/password", {"username": "dave", "password": "correct horse"},
                     content_type="application/json")
    assert client.get("/api/v1/me", headers={"Authorization": f"Bearer {ok.json()['token']}"}).status_code == 200


def test_leaderboards_and_paged_rankings(client, leaderboard, django_assert_max_num_queries):
    (item,) = [b for b in client.get("/api/v1/leaderboards").json() if b["name"] == leaderboard.name]
    assert item["gpu_types"] == ["CPU"] and item["templates"] and item["is_open"]
    assert "secret_seed" not in str(item)
    from leaderboards.actions import do_recompute_ranks
    from leaderboards.lifecycle import do_ingest_result
    for i in range(3):
        sub = submission(leaderboard, UserFactory(username=f"ranked{i}"))
        for run in sub.runs.all():
            run.status, run.attempt = "running", 1
            run.save()
            do_ingest_result(run.pk, 1, ranked_result([1000.0 * (i + 1)]))
    do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    with django_assert_max_num_queries(6):
        page = client.get(f"/api/v1/leaderboards/{leaderboard.name}/rankings/cpu?page=2&page_size=2").json()
    assert page["count"] == 3 and [e["user"] for e in page["results"]] == ["ranked2"]
    assert page["results"][0]["rank"] == 3
    assert client.get(f"/api/v1/leaderboards/{leaderboard.name}/rankings/H100").status_code == 404


def test_submission_create_status_list_delete(client, leaderboard, alice):
    upload = SimpleUploadedFile("add.py", GOOD)
    response = client.post("/api/v1/submissions", {"file": upload, "leaderboard": leaderboard.name,
                                                   "mode": "leaderboard"}, headers=bearer(alice))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["queue"]["position"] == 1 and body["queue"]["eta_seconds"] > 0
    assert [r["secret"] for r in body["runs"]] == [False, True]
    status = client.get(f"/api/v1/submissions/{body['id']}", headers=bearer(alice)).json()
    assert status["done"] is False and status["status"] == "pending"
    assert client.get("/api/v1/submissions", headers=bearer(alice)).json()["count"] == 1
    other = UserFactory()
    from leaderboards.access.actions import do_create_token
    other_headers = {"Authorization": f"Bearer {do_create_token(other)[1]}"}
    # a ranked submission is visible to whoever sees its leaderboard, as on the site: outcome only, no logs
    seen = client.get(f"/api/v1/submissions/{body['id']}", headers=other_headers)
    assert seen.status_code == 200 and all(r["error"] == r["stdout"] == "" for r in seen.json()["runs"])
    test_run = client.post("/api/v1/submissions", {"file": SimpleUploadedFile("add.py", GOOD), "mode": "test",
                                                   "leaderboard": leaderboard.name}, headers=bearer(alice)).json()
    assert client.get(f"/api/v1/submissions/{test_run['id']}", headers=other_headers).status_code == 404
    assert client.delete(f"/api/v1/submissions/{body['id']}", headers=other_headers).status_code == 404
    assert client.delete(f"/api/v1/submissions/{test_run['id']}", headers=bearer(alice)).status_code == 200
    assert client.delete(f"/api/v1/submissions/{body['id']}", headers=bearer(alice)).json()["status"] == "ok"
    assert client.get("/api/v1/submissions", headers=bearer(alice)).json()["count"] == 0


def test_a_file_past_the_limit_is_refused_with_its_own_size(client, leaderboard, alice):
    """Issue 43: a 2 MiB file was reported as 1048577 bytes (the part read to see that it is too large)."""
    form = {"file": SimpleUploadedFile("big.py", b"#" * (2 << 20)), "leaderboard": leaderboard.name, "gpu": "CPU"}
    response = client.post("/api/v1/submissions", form, headers=bearer(alice))
    assert response.status_code == 413
    assert error_text(response) == "'big.py' is 2097152 bytes; the limit is 1048576 bytes."


def test_rate_limit_in_v1(client, leaderboard, alice):
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="test", max_submissions=1, window_seconds=60)
    codes = [client.post("/api/v1/submissions", {"file": SimpleUploadedFile("a.py", GOOD), "mode": "test",
                                                 "leaderboard": leaderboard.name}, headers=bearer(alice))
             for _ in range(2)]
    assert [r.status_code for r in codes] == [201, 429]
    assert int(codes[1]["Retry-After"]) > 0 and "Rate limit" in error_text(codes[1])


def test_docs_are_served(client):
    assert client.get("/api/docs").status_code == 302
    assert client.get("/api/v1/openapi.json").json()["paths"]["/api/v1/submissions"]


def test_rankings_and_runs_carry_the_ratio_its_interval_and_ties(client, leaderboard, alice):
    from leaderboards.actions import do_recompute_ranks
    from leaderboards.lifecycle import do_ingest_result
    ratios = [(0.50, 0.48, 0.52), (0.51, 0.49, 0.53), (0.90, 0.88, 0.92)]  # the first two overlap: tied
    for i, (ratio, low, high) in enumerate(ratios):
        sub = submission(leaderboard, alice if i == 0 else UserFactory(username=f"r{i}"))
        result = ranked_result([1000.0])
        result["ranked"][-1].update(ratio=ratio, ratio_low=low, ratio_high=high, reference=2000.0)
        for run in sub.runs.all():
            run.status, run.attempt = "running", 1
            run.save()
            do_ingest_result(run.pk, 1, result)
    do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    rows = client.get(f"/api/v1/leaderboards/{leaderboard.name}/rankings/cpu").json()["results"]
    assert [(r["ratio"], r["ratio_low"], r["ratio_high"]) for r in rows] == ratios
    assert [r["tied"] for r in rows] == [False, True, False]
    mine = client.get(f"/api/v1/submissions/{rows[0]['submission_id']}", headers=bearer(alice)).json()
    public = next(r for r in mine["runs"] if not r["secret"])
    assert (public["ratio"], public["ratio_low"], public["ratio_high"]) == ratios[0]
    assert mine["standing"] == {"CPU": {"score": mine["scores"]["CPU"], "ratio": 0.5, "ratio_low": 0.48,
                                        "ratio_high": 0.52, "rank": 1, "tied": False}}
