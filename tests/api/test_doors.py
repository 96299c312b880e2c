"""Doors that must hold under load: a quota against submissions sent at once (on PostgreSQL and SQLite, each thread
its own connection), and anonymous CLI logins, which write a row each."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.db import connection

from leaderboards import actions
from leaderboards.access.actions import CLI_LOGINS_PER_MINUTE
from leaderboards.access.models import PendingLogin, SubmissionQuota
from leaderboards.errors import SubmissionRejected
from leaderboards.models import Submission, SubmissionMode

from ..factories import UserFactory

GOOD = b"def custom_kernel(data):\n    a, b = data\n    return a + b\n"
THREADS = 16


@pytest.mark.django_db(transaction=True)
def test_sixteen_submissions_at_once_against_a_quota_of_three_accept_exactly_three(leaderboard):
    SubmissionQuota.objects.create(leaderboard=leaderboard, kind="test", max_submissions=3, window_seconds=600)
    user = UserFactory()
    start = threading.Barrier(THREADS)

    def submit(i: int) -> int:
        try:
            request = actions.check_submission(user, leaderboard.name, ["CPU"], SubmissionMode.TEST, "k.py",
                                               GOOD + f"# {i}\n".encode())
            start.wait(30)  # every thread has passed the first check before any writes
            actions.do_submit(user, request)
            return 201
        except SubmissionRejected as exc:
            return exc.status
        finally:
            connection.close()

    with ThreadPoolExecutor(THREADS) as pool:
        answers = list(pool.map(submit, range(THREADS)))
    assert sorted(answers) == [201] * 3 + [429] * (THREADS - 3), answers
    assert Submission.objects.filter(user=user).count() == 3


@pytest.mark.django_db
def test_anonymous_cli_logins_are_limited_per_address(client):
    answers = [client.post("/api/v1/auth/cli?provider=github") for _ in range(CLI_LOGINS_PER_MINUTE + 2)]
    assert [a.status_code for a in answers] == [201] * CLI_LOGINS_PER_MINUTE + [429, 429]
    assert "Too many CLI logins" in answers[-1].json()["detail"] and int(answers[-1]["Retry-After"]) > 0
    assert PendingLogin.objects.count() == CLI_LOGINS_PER_MINUTE
    other = client.post("/api/v1/auth/cli?provider=github", REMOTE_ADDR="203.0.113.7")
    assert other.status_code == 201  # another address has its own allowance


@pytest.mark.django_db
@pytest.mark.parametrize("start", ["/api/v1/auth/cli", "/popcorn/auth/init?provider=github"])
def test_behind_a_proxy_cli_logins_are_limited_per_forwarded_address(client, settings, start):
    """issue 35: the CLI-login allowance counted REMOTE_ADDR, which behind the TLS proxy is the proxy's for everyone:
    one client's burst refused every CLI login. It finds the client as the site's login limits do
    (KERNELBOT_TRUSTED_PROXY_COUNT entries from the end of X-Forwarded-For)."""
    settings.ALLAUTH_TRUSTED_PROXY_COUNT = 1
    method = client.post if start.startswith("/api/") else client.get
    answers = [method(start, HTTP_X_FORWARDED_FOR="203.0.113.7").status_code
               for _ in range(CLI_LOGINS_PER_MINUTE + 1)]
    assert answers == [201 if start.startswith("/api/") else 200] * CLI_LOGINS_PER_MINUTE + [429]
    other = method(start, HTTP_X_FORWARDED_FOR="spoofed, 198.51.100.9")  # the proxy's entry is the last one
    assert other.status_code in (200, 201)  # another client behind the same proxy (REMOTE_ADDR 127.0.0.1)
    assert PendingLogin.objects.filter(address="198.51.100.9").count() == 1
