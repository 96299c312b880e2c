"""What organisers do to a live board, as its competitors and the organisers see it (issue 26, items 8–13)."""

import pytest

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.models import Run, RunStatus

from ..factories import UserFactory, submission

pytestmark = pytest.mark.django_db


def api(client, user, path: str) -> dict:
    _, raw = do_create_token(user)
    return client.get(f"/api/v1{path}", headers={"Authorization": f"Bearer {raw}"}).json()


def test_an_organisers_cancel_reads_as_cancelled_not_as_a_failure(client, leaderboard):
    author = UserFactory()
    sub = submission(leaderboard, user=author)
    for run in sub.runs.all():
        assert lifecycle.do_cancel_run(run)
    client.force_login(author)
    page = client.get(f"/s/{sub.pk}/").content.decode()
    assert page.count("Cancelled by an organiser: this run was stopped and is never scored") == 2
    assert "v-fail" not in page and "Not evaluated" not in page and 'class="flash error"' not in page
    assert 'class="stopped"' in page and 'class="bad"' not in page
    shown = api(client, author, f"/submissions/{sub.pk}")
    assert {run["outcome"] for run in shown["runs"]} == {"cancelled"}


def test_a_requeued_run_shows_no_error_while_it_waits(client, leaderboard):
    author = UserFactory()
    sub = submission(leaderboard, user=author)
    run = sub.runs.get(secret=False)
    lifecycle.do_cancel_run(run)
    lifecycle.do_requeue_run(Run.objects.get(pk=run.pk))
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED
    client.force_login(author)
    shown = next(r for r in api(client, author, f"/submissions/{sub.pk}")["runs"] if r["id"] == run.pk)
    assert shown["error"] == ""
    assert "requeued by an organiser" not in client.get(f"/s/{sub.pk}/").content.decode()


@pytest.mark.parametrize(("count", "message"), [(1, "Cancelled 1 run."), (2, "Cancelled 2 runs.")])
def test_cancelled_runs_are_counted_in_english(admin_client, leaderboard, count, message):
    runs = list(submission(leaderboard).runs.all())[:count]
    response = admin_client.post("/admin/leaderboards/run/", {
        "action": "cancel", "_selected_action": [r.pk for r in runs], "confirmed": "yes"}, follow=True)
    assert message in response.content.decode()
