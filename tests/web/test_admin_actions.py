"""The organiser's verbs on the admin's detail pages (requeue, cancel, rescore), each behind a confirmation page,
the list actions that now ask first too, links to the public pages, and a run's page as readable tables."""

import re

import pytest

from leaderboards import actions
from leaderboards.models import Run, RunStatus

from ..factories import ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch

pytestmark = pytest.mark.django_db


def interleaved_result() -> dict:
    case = {"spec": "size: 4096", "status": "pass", "message": "", "time": 77500.0, "time_low": 76000.0,
            "time_high": 79000.0, "reference": 150000.0, "reference_low": 149000.0, "reference_high": 151000.0,
            "ratio": 0.517, "ratio_low": 0.5, "ratio_high": 0.53, "runs": 40, "stop_reason": "interval within 1 %"}
    return {**ranked_result([77500.0]), "tests": [{"spec": "size: 16", "status": "pass", "message": "ok"}],
            "benchmarks": [case], "ranked": [case],
            "system": {"device": "cpu", "sandbox": {"namespaces": True, "memory": "cgroup v2"}}}


@pytest.fixture
def finished(leaderboard):
    sub = submission(leaderboard)
    for run in sub.runs.all():
        assert actions.do_ingest_result(run.pk, dispatch(run), interleaved_result())
    return sub


def test_run_page_shows_tables_with_times_as_people_write_them(admin_client, finished):
    run = finished.runs.get(secret=False)
    page = admin_client.get(f"/admin/leaderboards/run/{run.pk}/change/").content.decode()
    assert "77.50 µs" in page and "76.00 µs – 79.00 µs" in page and "150.0 µs" in page
    assert "0.517× the reference (95 % interval 0.500–0.530)" in page
    assert "interval within 1 %" in page and "size: 16" in page
    assert "7.75e-05" not in page and "0.0000775" not in page  # never raw seconds
    assert "<td>sandbox</td>" in page and "namespaces: True" in page and "memory: cgroup v2" in page
    # the JSON is there only collapsed, and no header carries a unit the admin's CSS would uppercase (µs → ΜS)
    assert re.search(r"<details><summary>show the stored JSON</summary><pre>\{", page)
    headers = re.findall(r"<th[^>]*>(.*?)</th>", page, re.S)
    assert headers and not any("µ" in h for h in headers)
    assert f'href="/s/{finished.pk}/#run-{run.pk}"' in page  # to its public page


def test_requeue_from_the_run_page_asks_first_then_runs_again(admin_client, finished):
    run = finished.runs.get(secret=False)
    page = admin_client.get(f"/admin/leaderboards/run/{run.pk}/change/").content.decode()
    url = f"/admin/leaderboards/run/{run.pk}/do/requeue/"
    assert f'href="{url}"' in page
    assert "/do/cancel/" not in page  # a finished run cannot be cancelled, so it is not offered

    confirm = admin_client.get(url)
    assert confirm.status_code == 200
    assert "Requeue run" in confirm.content.decode() and "Yes, requeue" in confirm.content.decode()
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED  # looking at the question changes nothing

    response = admin_client.post(url)
    assert response.status_code == 302 and response["Location"] == f"/admin/leaderboards/run/{run.pk}/change/"
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.score is None and run.result == {} and run.stdout == ""
    assert "Requeued run" in admin_client.get(response["Location"]).content.decode()


def test_cancel_is_offered_while_the_run_is_active(admin_client, leaderboard):
    run = submission(leaderboard).runs.get(secret=False)
    url = f"/admin/leaderboards/run/{run.pk}/do/cancel/"
    assert f'href="{url}"' in admin_client.get(f"/admin/leaderboards/run/{run.pk}/change/").content.decode()
    assert "Yes, cancel run" in admin_client.get(url).content.decode()
    admin_client.post(url)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    response = admin_client.post(url)  # again, now that it has finished: refused with a message, nothing changes
    assert response.status_code == 302
    assert admin_client.get(f"/admin/leaderboards/run/{run.pk}/do/nonsense/").status_code == 404


def test_list_actions_ask_before_they_act(admin_client, finished):
    ids = [str(pk) for pk in finished.runs.values_list("pk", flat=True)]
    form = {"action": "requeue", "_selected_action": ids}
    first = admin_client.post("/admin/leaderboards/run/", form)
    assert first.status_code == 200 and "Yes, requeue" in first.content.decode()
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    admin_client.post("/admin/leaderboards/run/", {**form, "confirmed": "yes"})
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.QUEUED}


def test_rescore_from_the_leaderboard_page_even_without_runs(admin_client, leaderboard):
    change = admin_client.get(f"/admin/leaderboards/leaderboard/{leaderboard.pk}/change/").content.decode()
    url = f"/admin/leaderboards/leaderboard/{leaderboard.pk}/do/rescore/"
    assert f'href="{url}"' in change and f'href="/lb/{leaderboard.name}/"' in change
    assert "Nothing is run again" in admin_client.get(url).content.decode()
    response = admin_client.post(url)
    assert "0 scores changed" in admin_client.get(response["Location"]).content.decode()


def test_every_list_links_to_the_public_pages(admin_client, finished, leaderboard):
    runs = admin_client.get("/admin/leaderboards/run/").content.decode()
    for run in finished.runs.all():
        assert f'href="/s/{finished.pk}/#run-{run.pk}"' in runs
    assert "77.50 µs" in runs
    assert f'href="/s/{finished.pk}/"' in admin_client.get("/admin/leaderboards/submission/").content.decode()
    assert f'href="/lb/{leaderboard.name}/"' in admin_client.get("/admin/leaderboards/leaderboard/").content.decode()
    sub_page = admin_client.get(f"/admin/leaderboards/submission/{finished.pk}/change/").content.decode()
    assert f'href="/s/{finished.pk}/"' in sub_page and "77.50 µs" in sub_page
