"""A live view shows what a reload shows: a rank delta carries the rows, pager and records exactly as the page
renders them; the submission page's progress line and score box exist for live updates to fill; final views show
final state (the CLI's table too)."""

import re

import pytest
from channels.db import database_sync_to_async
from django.contrib.auth.models import AnonymousUser
from rich.console import Console

from kernelbot.cli.main import status_table
from leaderboards import actions, events, ranks
from leaderboards.models import RunStatus

from ..factories import UserFactory, ranked_result, submission
from ..leaderboards.test_lifecycle import dispatch
from .test_consumers import _keep_test_connection, communicator, run  # noqa: F401
from .test_views import ranked_board

pytestmark = pytest.mark.django_db


def interleaved(time_ns: float) -> dict:
    case = {"spec": "size: 4096", "status": "pass", "message": "", "time": time_ns, "time_low": time_ns * 0.98,
            "time_high": time_ns * 1.02, "reference": 2 * time_ns, "ratio": 0.5, "ratio_low": 0.49, "ratio_high": 0.51,
            "runs": 30}
    return {**ranked_result([time_ns]), "benchmarks": [case], "ranked": [case]}


def test_a_live_delta_carries_the_rows_pager_and_records_a_reload_renders(client, leaderboard, cpu_pool,
                                                                          django_capture_on_commit_callbacks):
    ranked_board(leaderboard, 2)
    gpu = cpu_pool.cpu

    async def scenario():
        ws = communicator(f"/ws/leaderboard/{leaderboard.pk}/{gpu.pk}/", AnonymousUser())
        assert (await ws.connect())[0]
        await ws.receive_json_from()  # the snapshot

        def newcomer():
            sub = submission(leaderboard, user=UserFactory(username="speedy"))
            for r in sub.runs.all():
                actions.do_ingest_result(r.pk, dispatch(r), interleaved(500.0))
            with django_capture_on_commit_callbacks(execute=True):
                actions.do_recompute_ranks(leaderboard.pk, gpu.pk)
        await database_sync_to_async(newcomer)()
        delta = await ws.receive_json_from(timeout=5)
        await ws.disconnect()
        return delta

    delta = run(scenario)
    assert delta["entrants"] == 3 and len(delta["rows"]) == 3
    page = client.get(f"/lb/{leaderboard.name}/").content.decode()
    for html in delta["rows"].values():
        assert html in page  # byte for byte the reloaded row
    speedy = next(html for html in delta["rows"].values() if "speedy" in html)
    assert "0.500× (0.490–0.510)" in speedy and "just now" not in speedy
    assert re.search(r"<time datetime=\"[^\"]+\">\d{4}-\d\d-\d\d \d\d:\d\d</time>", speedy)
    assert delta["pager"] in page and "3 entrants" in delta["pager"]
    assert delta["records_html"] in page and "Records (" in delta["records_html"]
    assert len(delta["records"]) == int(re.search(r"Records \((\d+)\)", page).group(1)) >= 1


def test_a_new_record_travels_alone_and_appended_gives_the_list_a_reload_shows(client, leaderboard, cpu_pool,
                                                                             monkeypatch,
                                                                             django_capture_on_commit_callbacks):
    ranked_board(leaderboard, 2)
    records = lambda: re.search(r'<details id="records">.*?</details>',  # noqa: E731
                                client.get(f"/lb/{leaderboard.name}/").content.decode(), re.S).group(0)
    before = records()
    sent = []
    monkeypatch.setattr(events, "send", lambda group, kind, payload: sent.append((group, payload)))
    monkeypatch.setattr("leaderboards.actions.enqueue_on_commit", lambda *args, **kwargs: None)
    speedy = UserFactory(username="speedy")
    sub = submission(leaderboard, user=speedy)
    for r in sub.runs.all():
        actions.do_ingest_result(r.pk, dispatch(r), interleaved(500.0))
    with django_capture_on_commit_callbacks(execute=True):
        assert ranks.do_rank_result(sub.runs.get(secret=True).pk)
    (_, delta), = [(group, payload) for group, payload in sent if group.startswith("leaderboard.")]
    assert "records" not in delta and "records_html" not in delta  # not the whole progression again
    assert delta["record_added"][1:] == [pytest.approx(5e-7), speedy.pk]
    assert delta["record_names"] == {str(speedy.pk): "speedy"}
    count = before.count("<li>")
    appended = before.replace("</ul>", delta["record_html"] + "</ul>").replace(f"Records ({count})",
                                                                              f"Records ({count + 1})")
    assert appended == records()  # what the page's script makes of it (site.js) is what a reload shows


def test_the_submission_page_has_a_progress_line_and_a_score_box_for_live_updates(client, leaderboard):
    sub = submission(leaderboard)
    public = sub.runs.get(secret=False)
    dispatch(public)
    assert actions.do_mark_running(public.pk, 1)
    actions.do_record_progress(public.pk, 1, {"phase": "benchmark", "done": 3, "total": 12})
    page = client.get(f"/s/{sub.pk}/").content.decode()
    assert '<progress max="12" value="3"></progress> <span>benchmarks 3/12</span>' in page
    assert '<p id="scores" hidden>' in page  # filled in when the runs finish, without a reload

    for run_ in sub.runs.all():  # finished: the final view shows no progress, and the score
        run_.refresh_from_db()
        attempt = run_.attempt if run_.status == RunStatus.RUNNING else dispatch(run_)
        actions.do_ingest_result(run_.pk, attempt, interleaved(77500.0))
    page = client.get(f"/s/{sub.pk}/").content.decode()
    assert re.search(r'<p class="progress-line" data-field="progress" hidden>', page)
    assert '<p id="scores">' in page and "77.50 µs" in page


def test_a_requeued_run_shows_none_of_the_previous_attempts_results(client, leaderboard):
    sub = submission(leaderboard)
    for run_ in sub.runs.all():
        actions.do_ingest_result(run_.pk, dispatch(run_), interleaved(77500.0))
    public = sub.runs.get(secret=False)
    actions.do_requeue_run(public)
    actions.do_cancel_run(public)
    section = re.search(rf'<section[^>]*data-run="{public.pk}".*?</section>', client.get(f"/s/{sub.pk}/")
                        .content.decode(), re.S).group(0)
    assert "Cancelled" in section and "size: 4096" not in section and "77.50" not in section


def test_submitting_from_the_site_marks_the_queued_note_for_the_live_view_to_remove(client, leaderboard):
    user = UserFactory(username="ada")
    client.force_login(user)
    response = client.post("/submit/", {"leaderboard": leaderboard.name, "gpu": "CPU", "mode": "test",
                                        "code": "def custom_kernel(data):\n    return data\n"}, follow=True)
    assert re.search(r'<p class="flash queued-note success">Submission #\d+ is queued.</p>', response.content.decode())


def test_the_cli_table_shows_final_state_not_the_last_progress():
    run_ = {"gpu": "CPU", "secret": False, "status": "succeeded", "outcome": "passed", "error": "", "score": 7.75e-5,
            "tests": [{"status": "pass"}] * 4, "progress": {"phase": "test", "done": 1, "total": 4}}
    sub = {"id": 1, "file_name": "k.py", "leaderboard": "va", "mode": "test", "status": "succeeded", "done": True,
           "runs": [run_]}
    console = Console(record=True, width=120)
    console.print(status_table(sub))
    text = console.export_text()
    assert "4/4" in text and "77.50 µs" in text and "test 1/4" not in text
    console.print(status_table({**sub, "status": "running", "done": False,
                                "runs": [{**run_, "status": "running", "outcome": None}]}))
    assert "test 1/4" in console.export_text()  # while it runs, the progress is the detail
