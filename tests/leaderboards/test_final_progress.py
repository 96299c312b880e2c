"""A finished run's progress says where it really got to, and `manage.py submit --wait` shows the cause."""

import io

import pytest
from django.core.management import call_command

from leaderboards import lifecycle
from leaderboards.models import Run, RunStatus
from leaderboards.scoring import final_progress

from ..factories import ranked_result, submission

TOTALS = {"test": 4, "benchmark": 3, "ranked": 1}


def cases(*statuses: str) -> list[dict]:
    return [{"spec": f"size: {i}", "status": s} for i, s in enumerate(statuses)]


@pytest.mark.parametrize(("mode", "result", "expected"), [
    ("leaderboard", {"tests": cases(*"pppp"), "benchmarks": cases(*"ppp"), "ranked": cases("p")}, ("ranked", 1, 1)),
    ("leaderboard", {"tests": cases("p", "p")}, ("test", 2, 4)),  # crashed in the third test
    ("leaderboard", {"tests": cases("p", "fail", "p", "p")}, ("test", 3, 4)),  # wrong output in one test
    ("leaderboard", {"tests": cases(*"pppp"), "benchmarks": []}, ("benchmark", 0, 3)),  # crashed when timed
    ("leaderboard", {}, ("test", 0, 4)),  # compile error: nothing ran
    ("test", {"tests": cases(*"pppp")}, ("test", 4, 4)),
    ("benchmark", {"benchmarks": cases("p")}, ("benchmark", 1, 3)),
    ("leaderboard", {"protocol": "popcorn", "tests": cases(*"pppp"), "benchmarks": cases("p", "fail", "p")},
     ("benchmark", 2, 3)),
])
def test_final_progress_is_the_first_phase_that_did_not_finish(mode, result, expected):
    result = {k: [{**c, "status": "pass" if c["status"] == "p" else c["status"]} for c in v]
              if isinstance(v, list) else v for k, v in result.items()}
    progress = final_progress(result, mode, TOTALS)
    assert (progress["phase"], progress["done"], progress["total"]) == expected and progress["final"]


def test_profile_runs_have_no_phase_progress():
    assert final_progress({"tests": cases("pass")}, "profile", TOTALS) == {}


@pytest.mark.django_db
def test_ingest_replaces_live_progress_that_ran_ahead_of_a_crash(leaderboard):
    run = submission(leaderboard).runs.get(secret=False)
    run.update_status(RunStatus.DISPATCHED, attempt=1)
    lifecycle.do_mark_running(run.pk, 1)
    lifecycle.do_record_progress(run.pk, 1, {"event": "progress", "phase": "test", "done": 4, "total": 4})
    crashed = {**ranked_result([1.0], "crash"), "tests": cases(*["pass"] * 4), "benchmarks": [], "ranked": []}
    assert lifecycle.do_ingest_result(run.pk, 1, crashed)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.progress == {"phase": "benchmark", "done": 0, "total": 3, "final": True}  # the demo has 3


@pytest.mark.django_db(transaction=True)  # the command commits; the sync queue runs the dispatch on commit
@pytest.mark.slow
def test_submit_wait_prints_where_a_run_stopped_and_the_cause_in_full(leaderboard, sync_queue, tmp_path, settings):
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 100}
    noisy = tmp_path / "noisy.py"
    noisy.write_text("import warnings\n\ncalls = 0\n\n\n"
                     "def the_step_of_the_kernel_that_goes_wrong_on_the_third_call():\n"
                     "    raise ValueError('the real cause is here')\n\n\ndef custom_kernel(data):\n    global calls\n"
                     "    calls += 1\n    warnings.warn('noise ' * 80)\n    if calls == 3:\n"
                     "        the_step_of_the_kernel_that_goes_wrong_on_the_third_call()\n    a, b = data\n"
                     "    return a + b\n")
    out = io.StringIO()
    call_command("submit", str(noisy), user="carol", create_user=True, leaderboard=leaderboard.name,
                 gpus=["CPU"], mode="test", wait=True, timeout=240, stdout=out)
    text = out.getvalue()
    run = Run.objects.get()
    assert run.status == RunStatus.FAILED, run.error
    assert "test 2/4 passed" in text  # two tests passed before the third call raised
    assert "ValueError: the real cause is here" in text  # the last line of the traceback, past 200 characters
    assert len(run.error) > 200 and text.index("ValueError") > text.index(f"run {run.pk}")

