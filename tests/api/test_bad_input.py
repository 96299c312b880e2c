"""Every refusal is {"detail": "<clear message>"} with the right status, through popcorn's exact requests."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.access.actions import do_ban, do_revoke_token, do_set_accepting_jobs
from leaderboards.access.models import ApiToken, SubmissionQuota
from leaderboards.models import Leaderboard, Submission

from .conftest import Popcorn, error_text, multipart

GOOD = b"def custom_kernel(data):\n    a, b = data\n    return a + b\n"
pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("path", "content", "status", "fragment"), [
    ("{lb}/CPU/test", b"", 400, "is empty"),
    ("{lb}/CPU/test", b"x" * (1024 * 1024 + 1), 413, "limit is 1048576 bytes"),
    ("{lb}/CPU/test", b"def f():\n    return '\xff\xfe'\n", 400, "not UTF-8"),
    ("{lb}/H100/test", GOOD, 400, "does not run on GPU 'H100'; available: CPU"),
    ("{lb}/CPU/fastest", GOOD, 400, "Unknown mode 'fastest'"),
    ("no-such-board/CPU/test", GOOD, 404, "Unknown leaderboard 'no-such-board'"),
])
def test_bad_submissions(popcorn, leaderboard, path, content, status, fragment):
    lb, gpu, mode = path.format(lb=leaderboard.name).split("/")
    response = popcorn.submit(lb, gpu, mode, content)
    assert response.status_code == status
    assert fragment in error_text(response)
    assert not Submission.objects.exists()


def test_missing_wrong_and_revoked_tokens(client, popcorn, leaderboard, alice):
    for cli_id, status, fragment in ((None, 400, "Missing X-Popcorn-Cli-Id"),  # KernelBot's codes
                                     ("kb_wrong", 401, "Invalid, expired or revoked")):
        response = Popcorn(client, cli_id).submit(leaderboard.name, "CPU", "test", GOOD)
        assert response.status_code == status and fragment in error_text(response)
    assert popcorn.get("user/submissions").status_code == 200  # the token is now in this process's cache
    do_revoke_token(alice, ApiToken.objects.get(user=alice).pk)
    assert popcorn.get("user/submissions").status_code == 401
    token = ApiToken.objects.get(user=alice)
    token.revoked, token.expires = None, timezone.now() + timedelta(seconds=1)
    token.save()
    assert popcorn.get("user/submissions").status_code == 200
    token.expires = timezone.now() - timedelta(seconds=1)
    token.save()
    assert popcorn.get("user/submissions").status_code == 401
    token.expires = None
    token.save()
    assert popcorn.get("user/submissions").status_code == 200
    alice.is_active = False
    alice.save()
    assert popcorn.get("user/submissions").status_code == 401


def test_missing_file_part(client, popcorn, leaderboard):
    body, content_type = multipart(GOOD)
    body = body.replace(b'name="file"', b'name="source"')
    response = client.generic("POST", f"/popcorn/submission/{leaderboard.name}/CPU/test", body,
                              content_type=content_type, headers=popcorn.headers())
    assert response.status_code == 400 and "multipart part named 'file'" in error_text(response)


def test_past_deadline_banned_and_stopped(popcorn, leaderboard, alice):
    Leaderboard.objects.filter(pk=leaderboard.pk).update(deadline=timezone.now() - timedelta(minutes=1))
    response = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert response.status_code == 403 and "no longer accepts submissions" in error_text(response)
    leaderboard.deadline = timezone.now() + timedelta(days=1)
    leaderboard.save()  # as the admin does: the save drops the cached board (update() would leave it ≤ 2 s)
    do_ban(alice, leaderboard, "copied code")
    response = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert response.status_code == 403 and error_text(response) == \
        f"You are banned from submitting to '{leaderboard.name}': copied code."
    alice.bans.all().delete()
    do_set_accepting_jobs(False, "maintenance")
    response = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    assert response.status_code == 503 and "maintenance" in error_text(response)


def test_quota_answers_429_with_retry_after_separately_for_test_and_ranked(popcorn, leaderboard):
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="test", max_submissions=2, window_seconds=600)
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="ranked", max_submissions=1, window_seconds=60)
    assert [popcorn.submit(leaderboard.name, "CPU", m, GOOD).status_code
            for m in ("test", "benchmark", "test")] == [202, 202, 429]
    response = popcorn.submit(leaderboard.name, "CPU", "profile", GOOD)
    assert response.status_code == 429 and 590 <= int(response["Retry-After"]) <= 601
    assert "at most 2 test submission(s) per 10 minutes" in error_text(response)
    assert popcorn.submit(leaderboard.name, "CPU", "leaderboard", GOOD).status_code == 202
    response = popcorn.submit(leaderboard.name, "CPU", "leaderboard", GOOD)
    assert response.status_code == 429 and int(response["Retry-After"]) <= 61


def test_unknown_submission_and_admin_without_token(client, popcorn, settings):
    assert "not found" in error_text(popcorn.get("user/submissions/999999"))
    settings.ADMIN_TOKEN = ""
    response = client.post("/popcorn/admin/start", headers={"Authorization": "Bearer x"})
    assert response.status_code == 403 and "no ADMIN_TOKEN" in error_text(response)
    response = popcorn.get("user/submissions?limit=abc")
    assert response.status_code == 400 and error_text(response).startswith("Invalid request")


def test_nul_bytes_in_names_are_a_400_not_a_500(popcorn, leaderboard):
    response = popcorn.submit(leaderboard.name, "CPU", "test", GOOD, "a\x00b.py")
    assert response.status_code in (202, 400)  # the multipart parser drops the NUL; never a 500
    response = popcorn.get("gpus/a%00b")
    assert response.status_code == 400 and "NUL" in error_text(response)
