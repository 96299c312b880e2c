"""One jobs switch, effective at once on every front-end and visible on the site; the admin offers only the "add"
pages that can work."""

from __future__ import annotations

import importlib

import pytest
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils import timezone

from leaderboards.access.actions import do_set_accepting_jobs
from leaderboards.access.models import JobSwitch
from leaderboards.models import Problem, Run, Submission

GOOD = b"def custom_kernel(data):\n    a, b = data\n    return a + b\n"
pytestmark = pytest.mark.django_db
PAUSED = "Submissions are paused by the organisers: maintenance"


def submit_everywhere(client, popcorn, leaderboard, user) -> list[tuple[int, str]]:
    """The site form, /api/v1 and popcorn, each once: (status, message or '')."""
    client.force_login(user)
    site = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                    "code": GOOD.decode()})
    v1 = client.post("/api/v1/submissions", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                             "file": SimpleUploadedFile("k.py", GOOD)},
                     headers={"Authorization": f"Bearer {user.raw_token}"})
    pop = popcorn.submit(leaderboard.name, "CPU", "test", GOOD)
    return [(site.status_code, site.content.decode()), (v1.status_code, v1.content.decode()),
            (pop.status_code, pop.content.decode())]


def test_pausing_refuses_every_front_end_at_once_and_shows_a_banner(client, popcorn, leaderboard, alice):
    assert "Submissions are paused" not in client.get("/").content.decode()  # cached: accepting
    do_set_accepting_jobs(False, "maintenance")
    answers = submit_everywhere(client, popcorn, leaderboard, alice)
    assert [status for status, _ in answers] == [503, 503, 503]
    assert all(PAUSED in body for _, body in answers)
    assert not Submission.objects.exists()
    for page in ("/", f"/lb/{leaderboard.name}/", "/submit/"):
        assert PAUSED in client.get(page).content.decode()
    do_set_accepting_jobs(True)
    assert [status for status, _ in submit_everywhere(client, popcorn, leaderboard, alice)] == [302, 201, 202]
    assert "Submissions are paused" not in client.get("/").content.decode()


def test_the_admin_edits_the_one_switch_in_place(admin_client, client, popcorn, leaderboard):
    do_set_accepting_jobs(False, "maintenance")
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 503
    assert admin_client.get("/admin/leaderboards/jobswitch/add/").status_code == 403  # no second row
    response = admin_client.post("/admin/leaderboards/jobswitch/1/change/", {"accepting": "on", "reason": ""})
    assert response.status_code == 302
    assert popcorn.submit(leaderboard.name, "CPU", "test", GOOD).status_code == 202  # at once: cache forgotten
    assert list(JobSwitch.objects.values_list("pk", "accepting")) == [(1, True)]
    assert admin_client.post("/admin/leaderboards/jobswitch/1/delete/", {"post": "yes"}).status_code == 403
    JobSwitch(accepting=False, reason="again").save()  # any save writes the one row
    assert list(JobSwitch.objects.values_list("pk", "accepting")) == [(1, False)]


def test_migration_keeps_the_newest_switch_only():
    JobSwitch.objects.bulk_create([JobSwitch(pk=1, accepting=False, reason="old"),
                                   JobSwitch(pk=2, accepting=True, reason="")])
    JobSwitch.objects.filter(pk=1).update(changed=timezone.now() - timezone.timedelta(minutes=5))
    migration = importlib.import_module("leaderboards.migrations.0007_one_job_switch")
    migration.keep_newest_switch(apps, None)
    assert list(JobSwitch.objects.values_list("pk", "accepting", "reason")) == [(1, True, "")]


@pytest.mark.parametrize("model", ["submission", "run", "problem", "boardentry", "board", "code"])
def test_no_add_page_where_rows_come_only_from_actions_or_imports(admin_client, model):
    assert admin_client.get(f"/admin/leaderboards/{model}/add/").status_code == 403
    changelist = admin_client.get(f"/admin/leaderboards/{model}/").content.decode()
    assert f"/admin/leaderboards/{model}/add/" not in changelist


def test_problem_list_offers_the_zip_import_only(admin_client):
    page = admin_client.get("/admin/leaderboards/problem/").content.decode()
    assert "Import problem (zip)" in page and "Add problem" not in page
    before = Problem.objects.count(), Submission.objects.count(), Run.objects.count()
    assert admin_client.post("/admin/leaderboards/problem/add/", {"name": "x"}).status_code == 403
    assert admin_client.post("/admin/leaderboards/submission/add/", {"file_name": "x"}).status_code == 403
    assert (Problem.objects.count(), Submission.objects.count(), Run.objects.count()) == before


def test_organisers_still_add_what_they_define_by_hand(admin_client):
    for page in ("leaderboards/leaderboard", "leaderboards/competition", "runners/gputype", "runners/gpupool"):
        assert admin_client.get(f"/admin/{page}/add/").status_code == 200
