"""What organisers do to a live board, as its competitors and the organisers see it (issue 26, items 8–13)."""

import pytest
from django.contrib.auth import get_user_model

from leaderboards import actions, lifecycle
from leaderboards.access.actions import do_create_token
from leaderboards.access.models import Ban, JobSwitch
from leaderboards.models import BoardEntry, Leaderboard, RankingRule, Run, RunStatus
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
        "ranking_by": "", "visibility": "public", "final_top_n": 10, "final_rounds": 3,
        "gpu_types": [leaderboard.gpu_types.get().pk]})
    assert response.status_code == 302, response.content.decode()[:3000]
    assert Leaderboard.objects.get(name="fresh").ranking_by == RankingRule.GEOM


def test_changing_the_rule_offers_the_rescore(admin_client, leaderboard):
    gpu = leaderboard.gpu_types.get()
    finish(submission(leaderboard), [1000.0, 4000.0])
    response = admin_client.post(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/", {
        "name": leaderboard.name, "problem": leaderboard.problem.pk, "deadline_0": "2030-01-01",
        "deadline_1": "00:00", "ranking_by": "mean", "visibility": "public", "final_top_n": 10, "final_rounds": 3,
        "gpu_types": [gpu.pk]}, follow=True)
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


def ranked_user(leaderboard, username: str):
    user = UserFactory(username=username)
    finish(submission(leaderboard, user=user), [1000.0])
    actions.do_recompute_ranks(leaderboard.pk, leaderboard.gpu_types.get().pk)
    return user


def test_a_banned_user_on_the_ranking_is_pointed_out_and_removed_on_request(admin_client, leaderboard):
    cheat, honest = ranked_user(leaderboard, "cheat"), ranked_user(leaderboard, "honest")
    assert BoardEntry.objects.filter(leaderboard=leaderboard).count() == 2
    form = admin_client.get("/admin/leaderboards/ban/add/").content.decode()
    assert "— every leaderboard —" in form and "Empty: banned from every leaderboard" in form
    Ban.objects.create(user=cheat)  # from everything
    page = admin_client.get(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/").content.decode()
    assert "Still ranked though they may not submit here: cheat (#1 on CPU, banned)" in page
    assert "Remove banned users from the rankings" in page
    assert "every leaderboard" in admin_client.get("/admin/leaderboards/ban/").content.decode()
    admin_client.post(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/do/remove-barred/")
    assert list(BoardEntry.objects.values_list("user__username", flat=True)) == ["honest"]
    assert honest.submissions.exists() and not cheat.submissions.exists()


def test_a_deactivated_user_is_pointed_out_and_the_user_list_deactivates(admin_client, leaderboard):
    gone = ranked_user(leaderboard, "gone")
    response = admin_client.post("/admin/auth/user/", {"action": "deactivate", "_selected_action": [gone.pk],
                                                       "confirmed": "yes"}, follow=True)
    assert "Deactivated 1 user" in response.content.decode()
    gone.refresh_from_db()
    assert not gone.is_active
    page = admin_client.get(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/").content.decode()
    assert "gone (#1 on CPU, deactivated)" in page


def test_admin_lists_search_and_filter_what_an_organiser_looks_for(admin_client, leaderboard):
    user = ranked_user(leaderboard, "findme")
    entries = admin_client.get("/admin/leaderboards/boardentry/?q=findme").content.decode()
    assert "findme" in entries and "search" in entries
    subs = admin_client.get(f"/admin/leaderboards/submission/?user__id__exact={user.pk}").content.decode()
    assert "column-status" in subs and "succeeded" in subs
    runs = admin_client.get(f"/admin/leaderboards/run/?submission__leaderboard__id__exact={leaderboard.pk}")
    assert runs.status_code == 200 and "?submission__leaderboard__id__exact=" in runs.content.decode()


def test_staff_find_closed_boards_in_every_list_and_internal_boards_nowhere(client, admin_client, leaderboard):
    from leaderboards.models import Visibility
    closed = LeaderboardFactory(name="invite-only", problem=leaderboard.problem, visibility=Visibility.CLOSED,
                                gpu_types=[leaderboard.gpu_types.get()])
    LeaderboardFactory(name="health-check", problem=leaderboard.problem, internal=True,
                       gpu_types=[leaderboard.gpu_types.get()])
    assert closed.name not in client.get("/").content.decode()
    assert closed.name in admin_client.get("/").content.decode()
    staff = get_user_model().objects.get(username="admin")
    assert closed.name in {b["name"] for b in api(client, staff, "/leaderboards")}
    for url in ["/admin/leaderboards/ban/add/", "/admin/leaderboards/invite/add/", "/admin/leaderboards/run/",
                "/admin/leaderboards/submission/", "/admin/leaderboards/boardentry/", "/"]:
        page = admin_client.get(url).content.decode()
        assert "health-check" not in page, url


def test_the_problem_page_shows_its_definition_indented(admin_client, leaderboard):
    page = admin_client.get(f"/admin/leaderboards/problem/{leaderboard.problem.pk}/change/").content.decode()
    assert '<pre style="white-space:pre-wrap' in page and '\n  &quot;ranking_by&quot;: &quot;geom&quot;' in page
