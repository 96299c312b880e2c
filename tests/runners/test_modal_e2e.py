"""End to end on a Modal-backed pool: the platform on a loopback port (its runner API), the unmodified modal client
against the loopback Modal fake, which runs the app module we ship (runners/modal_app.py); that downloads the
platform's harness and runs the real agent, which fetches the job, runs it sandboxed, posts live progress and the
result."""

from __future__ import annotations

import pytest

from leaderboards import lifecycle
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import BoardEntry, Run, RunAttempt, RunStatus
from runners.models import GpuType, GpuVendor
from tests.fakes.modal import FakeModal

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from, remote_pool

CORRECT = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()


@pytest.fixture
def modal_board(transactional_db, runner_platform, demo_task, settings, monkeypatch):
    """A board whose only pool is a Modal one. The fake has no GPUs, so the shipped function body runs deployed
    under the CPU type's name."""
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    remote_pool("modal", cpu, name="modal", settings={"functions": {"CPU": "run_cpu"}})
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu])
    with FakeModal(token_id="ak-e2e", token_secret="as-e2e") as fake:  # no Modal secret: calls carry their token
        fake.deploy("kernelbot", "run_cpu", "runners.modal_app:run_h100")
        monkeypatch.setenv("MODAL_SERVER_URL", fake.url)
        monkeypatch.setenv("MODAL_TOKEN_ID", "ak-e2e")
        monkeypatch.setenv("MODAL_TOKEN_SECRET", "as-e2e")
        yield board, fake


def submit(board, mode: str, capture):
    user = UserFactory()
    with capture(execute=True):  # dispatch runs inline (sync queue): it only spawns
        return do_submit(user, check_submission(user, board.name, ["CPU"], mode, "submission.py", CORRECT))


@pytest.mark.slow
def test_a_submission_on_a_modal_pool_runs_there_with_live_progress_and_lands_on_the_board(
        modal_board, sync_queue, django_capture_on_commit_callbacks, monkeypatch):
    board, fake = modal_board
    record, seen = lifecycle.do_record_progress, []

    def watch_progress(run_id, attempt, progress, **kwargs):  # the runner API's call, on the live server's thread
        accepted = record(run_id, attempt, progress, **kwargs)
        seen.append((run_id, accepted, Run.objects.get(pk=run_id).status))
        return accepted

    monkeypatch.setattr(lifecycle, "do_record_progress", watch_progress)
    submission = submit(board, "leaderboard", django_capture_on_commit_callbacks)
    attempts = list(RunAttempt.objects.filter(run__submission=submission))
    assert len(attempts) == 2 and all(a.external_id in fake.calls for a in attempts)
    for attempt in attempts:  # the function returns once the agent has posted its verdict
        assert fake.wait(attempt.external_id, timeout=240).exception == ""

    runs = list(submission.runs.all())
    assert [r.status for r in runs] == [RunStatus.SUCCEEDED] * 2, [(r.error, r.stderr) for r in runs]
    for run in runs:
        assert run.result["system"]["device"] == "cpu" and run.progress["final"] and run.infra_failures == 0
        # progress arrived while the run was running, through the runner API, before the result
        assert (run.pk, True, RunStatus.RUNNING) in seen
    entry = BoardEntry.objects.with_rank().get(leaderboard=board)
    assert entry.submission == submission and entry.rank == 1 and entry.score > 0

    assert lifecycle.poll_remote_runs() == 0  # finished runs are not polled again
    assert BoardEntry.objects.count() == 1


@pytest.mark.slow
def test_a_lost_result_post_is_read_back_from_the_function_call(
        modal_board, sync_queue, django_capture_on_commit_callbacks, monkeypatch, settings):
    board, fake = modal_board
    ingest, refused = lifecycle.do_ingest_result, []

    def lose_the_agents_post(run_id, attempt, result):
        if not refused:
            refused.append(run_id)
            return False  # the runner API answers 409: the agent gives up, its function still returns the result
        return ingest(run_id, attempt, result)

    monkeypatch.setattr(lifecycle, "do_ingest_result", lose_the_agents_post)
    submission = submit(board, "test", django_capture_on_commit_callbacks)
    (run,) = submission.runs.all()
    attempt = RunAttempt.objects.get(run=run)
    assert fake.wait(attempt.external_id, timeout=240).exception == ""
    run.refresh_from_db()
    assert refused == [run.pk] and run.status == RunStatus.RUNNING

    settings.RUN_POLL_AFTER = 0
    assert lifecycle.poll_remote_runs() == 1
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempt == 1 and run.infra_failures == 0  # not retried
    assert run.attempts.get().outcome == "succeeded"
