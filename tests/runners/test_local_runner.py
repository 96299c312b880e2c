"""Submissions through the queue, the local backend and the real harness, end to end."""

import pytest

from leaderboards.actions import check_submission, do_submit
from leaderboards.models import BoardEntry, RunStatus
from taskspec.loader import load_task

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from

SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"
pytestmark = [pytest.mark.django_db, pytest.mark.slow]


@pytest.fixture(autouse=True)
def quick_timing(settings):
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}


def run_submission(leaderboard, solution: str, mode: str, capture, user=None):
    user = user or UserFactory()
    request = check_submission(user, leaderboard.name, ["CPU"], mode, f"{solution}.py",
                               (SOLUTIONS / f"{solution}.py").read_bytes())
    with capture(execute=True):
        submission = do_submit(user, request)
    return submission, list(submission.runs.order_by("secret"))


def test_correct_kernel_is_tested_timed_scored_and_ranked(leaderboard, sync_queue,
                                                          django_capture_on_commit_callbacks):
    submission, runs = run_submission(leaderboard, "fast", "leaderboard", django_capture_on_commit_callbacks)
    for run in runs:
        assert run.status == RunStatus.SUCCEEDED, (run.verdict, run.error)
        assert run.passed and run.score > 0 and run.attempt == 1
        assert run.started_at and run.dispatched_at <= run.started_at <= run.finished_at
        assert run.result["tests"] and all(t["status"] == "pass" for t in run.result["tests"])
        assert run.result["ranked"][-1]["runs"] >= 2
        assert run.system_info["sandbox"]
    entry = BoardEntry.objects.with_rank().get(leaderboard=leaderboard)
    assert entry.rank == 1 and entry.submission == submission
    slower = max(runs, key=lambda run: run.ratio)  # both runs were timed against the reference
    assert (entry.score, entry.ratio) == pytest.approx((slower.score, slower.ratio))


def test_wrong_kernel_fails_with_the_checkers_message_and_is_not_ranked(leaderboard, sync_queue,
                                                                        django_capture_on_commit_callbacks):
    _, runs = run_submission(leaderboard, "wrong", "test", django_capture_on_commit_callbacks)
    (run,) = runs
    assert run.status == RunStatus.FAILED and run.passed is False and run.score is None
    failed = [t for t in run.result["tests"] if t["status"] == "fail"]
    assert failed and failed[0]["message"]
    assert not BoardEntry.objects.exists()


def test_run_working_directories_are_removed(leaderboard, sync_queue, settings,
                                             django_capture_on_commit_callbacks):
    run_submission(leaderboard, "correct", "test", django_capture_on_commit_callbacks)
    assert not [p for p in settings.RUNS_DIR.iterdir() if p.name.startswith("run-")]


def test_problem_with_its_own_eval_py_runs_under_the_popcorn_protocol(db, cpu_pool, sync_queue,
                                                                     django_capture_on_commit_callbacks):
    task = load_task(REPO / "problems" / "demo" / "vectoradd_eval_py")
    board = LeaderboardFactory(problem=problem_from(task, harness="popcorn"), gpu_types=[cpu_pool.cpu])
    _, runs = run_submission(board, "correct", "leaderboard", django_capture_on_commit_callbacks)
    assert [run.status for run in runs] == [RunStatus.SUCCEEDED] * 2, [(r.verdict, r.error) for r in runs]
    assert all(run.result["protocol"] == "popcorn" and run.score > 0 for run in runs)
    _, (wrong,) = run_submission(board, "wrong", "test", django_capture_on_commit_callbacks)
    assert wrong.status == RunStatus.FAILED and wrong.result["tests"][0]["status"] == "fail"
