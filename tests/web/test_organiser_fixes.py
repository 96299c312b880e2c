"""What organisers do to a live board, as its competitors and the organisers see it (issue 26, items 8–13)."""

import pytest

from leaderboards import lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.access.models import JobSwitch
from leaderboards.models import Leaderboard, RankingRule, Run, RunStatus
from runners.models import GpuType

from ..factories import LeaderboardFactory, UserFactory, submission
from ..leaderboards.test_lifecycle import finish

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


def test_a_new_leaderboards_rule_defaults_to_its_tasks(admin_client, leaderboard):
    problem = leaderboard.problem
    assert problem.definition["ranking_by"] == "geom"
    page = admin_client.get("/admin/leaderboards/leaderboard/add/").content.decode()
    assert "The problem&#x27;s own rule" in page or "The problem's own rule" in page
    response = admin_client.post("/admin/leaderboards/leaderboard/add/", {
        "name": "fresh", "problem": problem.pk, "deadline_0": "2030-01-01", "deadline_1": "00:00",
        "ranking_by": "", "visibility": "public", "gpu_types": [leaderboard.gpu_types.get().pk]})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Leaderboard.objects.get(name="fresh").ranking_by == RankingRule.GEOM


def test_changing_the_rule_offers_the_rescore(admin_client, leaderboard):
    gpu = leaderboard.gpu_types.get()
    finish(submission(leaderboard), [1000.0, 4000.0])
    response = admin_client.post(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/", {
        "name": leaderboard.name, "problem": leaderboard.problem.pk, "deadline_0": "2030-01-01",
        "deadline_1": "00:00", "ranking_by": "mean", "visibility": "public", "gpu_types": [gpu.pk]}, follow=True)
    page = response.content.decode()
    assert response.redirect_chain[-1][0] == f"/admin/leaderboards/leaderboard/{leaderboard.pk}/do/rescore/"
    assert "its scores still follow the old rule until you rescore" in page and "Yes, rescore" in page
    assert set(Run.objects.values_list("score", flat=True)) == {4e-6}  # the last benchmark's, until the rescore
    assert admin_client.post(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/do/rescore/").status_code == 302
    assert set(Run.objects.values_list("score", flat=True)) == {2.5e-6}


def test_the_jobs_switch_opens_itself_with_a_pause_and_a_resume_button(admin_client, client, leaderboard):
    response = admin_client.get("/admin/leaderboards/jobswitch/", follow=True)
    assert response.redirect_chain[-1][0] == "/admin/leaderboards/jobswitch/1/change/"
    assert "Pause submissions" in response.content.decode() and "Resume submissions" not in response.content.decode()
    admin_client.post("/admin/leaderboards/jobswitch/1/do/pause/")
    assert not JobSwitch.objects.get().accepting
    page = admin_client.get("/admin/leaderboards/jobswitch/1/change/").content.decode()
    assert "Resume submissions" in page

    author = UserFactory()
    client.force_login(author)
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": leaderboard.gpu_types.get().name,
                                        "mode": "test", "code": "def custom_kernel(data): ..."})
    page = response.content.decode()
    assert response.status_code == 503
    assert page.count("Submissions are paused by the organisers") == 1  # the banner says why, once
    assert "Nothing was submitted" in page and "try again later" not in page

    admin_client.post("/admin/leaderboards/jobswitch/1/do/resume/")
    assert JobSwitch.objects.get().accepting


def test_the_submit_form_offers_the_chosen_boards_gpu_types_only(client, leaderboard):
    other_gpu = GpuType.objects.create(name="H100", vendor="nvidia")
    LeaderboardFactory(name="other", problem=leaderboard.problem, gpu_types=[other_gpu])
    client.force_login(UserFactory())
    page = client.get(f"/submit/?leaderboard={leaderboard.name}").content.decode()
    gpu_select = page.split('name="gpu"')[1].split("</select>")[0]
    assert ">CPU<" in gpu_select and "H100" not in gpu_select
    assert "H100" in client.get("/submit/?leaderboard=other").content.decode().split('name="gpu"')[1]
