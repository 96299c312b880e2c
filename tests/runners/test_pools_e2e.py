"""Pool health end to end on a remote pool: the platform on a loopback port, a backend whose jobs are the real agent
(tests/remote_backend.py). A failing pool holds its GPU type's runs queued; its health check still runs there
(pinned), passes through the agent, is recorded by the run's own hook, and the waiting runs then go, with live
progress, onto the board."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.actions import check_submission
from leaderboards.health import CHECK_HOOK, do_start_pool_check
from leaderboards.models import BoardEntry, Leaderboard, Run, RunStatus
from runners.backends.base import BACKENDS
from runners.models import CheckOutcome, GpuPool, GpuType, GpuVendor, PoolCheck, PoolHealth

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from, remote_pool, submission
from ..remote_backend import AGENT_BACKEND, AgentBackend

FAST = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "fast.py").read_text()


@pytest.fixture
def agent_pool(transactional_db, runner_platform, demo_task, monkeypatch, settings):
    monkeypatch.setitem(BACKENDS, "agent", AGENT_BACKEND)
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    pool = remote_pool("agent", cpu, name="agents")
    yield LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu]), pool
    AgentBackend.stop_all()


def wait_until(check: Callable[[], bool], what: str, timeout: float = 120) -> None:
    """Until another process (the agent, through the live server) made `check` true."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_failing_remote_pool_recovers_through_its_check_and_sends_the_waiting_runs_to_the_board(
        agent_pool, sync_queue, django_capture_on_commit_callbacks, monkeypatch):
    board, pool = agent_pool
    GpuPool.objects.filter(pk=pool.pk).update(health=PoolHealth.FAILING, last_checked_at=timezone.now(),
                                              health_detail="CPU: the last check's run was lost")
    record, seen = lifecycle.do_record_progress, []

    def watch_progress(run_id, attempt, progress, **kwargs):  # the runner API's call, on the live server's thread
        accepted = record(run_id, attempt, progress, **kwargs)
        seen.append((run_id, accepted, Run.objects.get(pk=run_id).status))
        return accepted

    monkeypatch.setattr(lifecycle, "do_record_progress", watch_progress)
    waiting = submission(board, code=FAST)  # accepted before the pool failed; ranked mode: two runs
    for run in waiting.runs.all():
        lifecycle.dispatch_run(run.pk)
        run.refresh_from_db()
        assert run.status == RunStatus.QUEUED and run.attempt == 0  # its only pool is failing: it waits

    with django_capture_on_commit_callbacks(execute=True):
        (check,) = [c for c in do_start_pool_check(pool) if c.run_id]
    check_run = Run.objects.get(pk=check.run_id)
    assert check_run.pool == pool and check_run.on_finish == CHECK_HOOK  # pinned: a failing pool is still checked

    # the agent runs the check; the run's on_finish hook records it and the recovered pool sends the waiting runs
    wait_until(lambda: GpuPool.objects.get(pk=pool.pk).health == PoolHealth.OK, "the pool to pass its check")
    check.refresh_from_db()
    assert check.outcome == CheckOutcome.OK and "passed on cpu" in check.detail
    check_run.refresh_from_db()
    assert check_run.status == RunStatus.SUCCEEDED and check_run.attempts.get().pool == pool
    wait_until(lambda: all(r.status in (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.ERROR)
                           for r in waiting.runs.all()), "the waiting runs to finish")
    for run in waiting.runs.all():
        assert run.status == RunStatus.SUCCEEDED, (run.error, run.stderr)
        assert run.attempts.get().pool == pool and run.infra_failures == 0 and run.progress["final"]
        assert (run.pk, True, RunStatus.RUNNING) in seen  # live progress through the runner API, before the result
    assert (check_run.pk, True, RunStatus.RUNNING) in seen
    wait_until(lambda: BoardEntry.objects.filter(leaderboard=board).exists(), "the ranking hook to enter it")
    entry = BoardEntry.objects.with_rank().get(leaderboard=board)
    assert entry.submission == waiting and entry.rank == 1 and entry.score > 0
    # the check's board ranks nothing and the door is open again
    assert not BoardEntry.objects.filter(leaderboard__internal=True).exists()
    assert Leaderboard.objects.filter(internal=True).count() == 1
    assert check_submission(UserFactory(), board.name, ["CPU"], "test", "submission.py", FAST.encode())
    assert PoolCheck.objects.filter(pool=pool, outcome=CheckOutcome.PENDING).count() == 0
