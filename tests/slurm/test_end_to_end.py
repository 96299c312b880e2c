"""A demo submission on a GPU pool backed by the real Slurm cluster: queued, submitted with sbatch, run by Slurm
through the real agent (which fetches its job from the platform on a loopback port and reports back), checked,
scored and ranked; cancelling a run cancels its job; a killed job is retried, never charged; a job that never starts
is cancelled and retried by the reaper."""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.actions import check_submission, do_delete_submission, do_submit
from leaderboards.models import BoardEntry, Run, RunStatus
from runners.backends.base import attempt_token
from runners.models import GpuType, GpuVendor

from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from, remote_pool

SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"
pytestmark = pytest.mark.slow


@pytest.fixture
def slurm_board(transactional_db, runner_platform, demo_task, slurm_cluster, tmp_path, settings):
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    tmp_path.chmod(0o755)
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu])

    def pool(**options):
        return remote_pool("slurm", cpu, name="slurm", settings={
            "python": sys.executable, "workdir": str(tmp_path / "work"), "key_file": str(tmp_path / "key.env"),
            "sandbox": "require", **options})

    return board, pool


def submit(board, solution: str, mode: str, capture):
    user = UserFactory()
    request = check_submission(user, board.name, ["CPU"], mode, "submission.py",
                               (SOLUTIONS / f"{solution}.py").read_bytes())
    with capture(execute=True):
        return do_submit(user, request)


def wait_for_status(run: Run, *statuses: str, timeout: float = 180) -> Run:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status in statuses:
            return run
        time.sleep(0.1)
    raise AssertionError(f"run {run.pk} stayed {run.status} ({run.error})")


def slurm_job(run: Run, attempt: int | None = None) -> tuple[str, str]:
    """The run's Slurm job id and the state Slurm reports for it."""
    job_id = run.attempts.get(number=attempt or run.attempt).external_id.split(":")[0]
    return job_id, job_state(job_id)


def wait_for_job(job_id: str, state: str, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while job_state(job_id) != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"Slurm job {job_id} stayed {job_state(job_id)}, not {state}")
        time.sleep(0.1)
    return True


def scratch_left(tmp_path) -> list[Path]:
    """The jobs' scratch directories in the pool's work directory."""
    return sorted((tmp_path / "work").glob("attempt-*"))


def wait_until_no_scratch(tmp_path, timeout: float = 30, but: list[Path] = ()) -> None:
    deadline = time.monotonic() + timeout
    while scratch_left(tmp_path) != list(but):
        if time.monotonic() > deadline:
            raise AssertionError(f"the jobs left their scratch: {scratch_left(tmp_path)}")
        time.sleep(0.1)


def job_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True).stdout.strip()


def test_a_demo_submission_runs_on_slurm_and_is_ranked(slurm_board, sync_queue, django_capture_on_commit_callbacks,
                                                       tmp_path):
    board, pool = slurm_board
    pool()  # no checkout: each job downloads the platform's harness.tar.gz with curl
    sub = submit(board, "fast", "leaderboard", django_capture_on_commit_callbacks)
    runs = list(sub.runs.order_by("secret"))
    assert [run.secret for run in runs] == [False, True]
    assert all(run.status in (RunStatus.DISPATCHED, RunStatus.RUNNING) for run in runs)  # sbatch returned at once
    for run in runs:
        job_id, _ = slurm_job(run)
        script = subprocess.run(["scontrol", "write", "batch_script", job_id, "-"], capture_output=True,
                                text=True).stdout
        assert f"--run {run.pk} --attempt 1 --workdir" in script and "harness.tar.gz" in script
        assert "custom_kernel" not in script and str(board.secret_seed) not in script  # no code, no seed
        token = attempt_token(run.attempts.get().pool, run.pk, 1, run.attempts.get().nonce)
        assert token not in script and settings.RUNNER_KEY not in script  # nor a credential
    for run in runs:
        run = wait_for_status(run, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.ERROR)
        assert run.status == RunStatus.SUCCEEDED, (run.error, run.stderr[-2000:])
        assert run.score > 0 and run.result["ranked"] and run.infra_failures == 0 and run.progress["final"]
        assert run.result["system"]["device"] == "cpu" and run.result["system"]["sandbox"]
        job_id, _ = slurm_job(run)
        assert wait_for_job(job_id, "COMPLETED")  # the agent exits once it posted the result
        name = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%j"], capture_output=True,
                              text=True).stdout.strip()
        assert name == f"kernelbot run {run.pk} attempt 1"
    assert not scratch_left(tmp_path)  # removed before each job wrote its exit marker
    wait = time.monotonic() + 30
    while not BoardEntry.objects.filter(leaderboard=board).exists() and time.monotonic() < wait:
        time.sleep(0.1)
    assert BoardEntry.objects.get(leaderboard=board).submission == sub


def test_cancelling_a_running_run_cancels_its_slurm_job(slurm_board, sync_queue,
                                                        django_capture_on_commit_callbacks, tmp_path):
    board, pool = slurm_board
    pool(checkout=str(REPO))
    sub = submit(board, "slow", "benchmark", django_capture_on_commit_callbacks)
    run = wait_for_status(sub.runs.get(), RunStatus.RUNNING)
    job_id, state = slurm_job(run)
    assert state == "RUNNING" and len(scratch_left(tmp_path)) == 1  # the agent is running the kernel in it
    with django_capture_on_commit_callbacks(execute=True):
        do_delete_submission(sub)  # the owner deletes it: the run is cancelled, and its job with it (scancel)
    assert wait_for_job(job_id, "CANCELLED") and not Run.objects.filter(pk=run.pk).exists()
    wait_until_no_scratch(tmp_path)  # the batch shell's SIGTERM trap stopped the agent and removed it


def test_a_silent_node_is_noticed_while_slurm_still_says_running(slurm_board, sync_queue, settings,
                                                                 django_capture_on_commit_callbacks, tmp_path):
    settings.RUN_REMOTE_SILENCE = 25  # the agent beats every 20 s
    board, pool = slurm_board
    pool(checkout=str(REPO))
    sub = submit(board, "slow", "benchmark", django_capture_on_commit_callbacks)
    run = wait_for_status(sub.runs.get(), RunStatus.RUNNING)
    deadline = time.monotonic() + 120
    while not run.progress:  # heard from since it started
        assert time.monotonic() < deadline, "the agent posted no progress"
        time.sleep(0.1)
        run.refresh_from_db()
    job_id, _ = slurm_job(run)
    subprocess.run(["scontrol", "suspend", job_id], check=True)  # the node stops; Slurm lists the job SUSPENDED
    stopped = time.monotonic()
    try:
        (stuck,) = scratch_left(tmp_path)
        while run.attempt == 1:  # the reaper's ticks
            waited = time.monotonic() - stopped
            assert waited < settings.RUN_REMOTE_SILENCE + settings.CLUSTER_REAP_INTERVAL + 10, (
                waited, run.status_deadline)
            time.sleep(settings.CLUSTER_REAP_INTERVAL)
            with django_capture_on_commit_callbacks(execute=True):
                lifecycle.do_reap_overdue_runs()
            run.refresh_from_db()
    finally:  # a suspended step takes SIGKILL only (after KillWait): a stopped job must not outlive the cluster
        subprocess.run(["scancel", "--signal=KILL", "--full", job_id], capture_output=True)
    reason = run.attempts.get(number=1).reason
    assert "its agent was silent for" in reason and "the service says running (SUSPENDED)" in reason, reason
    assert wait_for_job(job_id, "CANCELLED") and run.infra_failures == 1 and run.passed is None
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_cancel_run(run)  # the retry is not needed here
    assert wait_for_job(slurm_job(run, 2)[0], "CANCELLED")
    # a suspended step takes only SIGKILL (as a dead node runs no trap): its scratch stays for the 7-day sweep
    wait_until_no_scratch(tmp_path, but=[stuck])


def test_a_killed_job_is_retried_and_not_charged(slurm_board, sync_queue, django_capture_on_commit_callbacks):
    board, pool = slurm_board
    pool(checkout=str(REPO))
    sub = submit(board, "correct", "test", django_capture_on_commit_callbacks)
    run = wait_for_status(sub.runs.get(), RunStatus.RUNNING)
    first_job, _ = slurm_job(run)
    subprocess.run(["scancel", "--signal=KILL", "--full", first_job], check=True)  # the agent gets no word out
    assert wait_for_job(first_job, "CANCELLED")
    with django_capture_on_commit_callbacks(execute=True):  # the scheduled poll finds the job gone: retried
        assert lifecycle.poll_remote_runs(now=timezone.now() + timedelta(minutes=1)) == 1
    run = wait_for_status(run, RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.ERROR)
    assert run.status == RunStatus.SUCCEEDED and run.attempt == 2 and run.infra_failures == 1, run.error
    assert list(run.attempts.values_list("number", "outcome")) == [(1, "retried"), (2, "succeeded")]
    assert run.attempts.get(number=1).reason.startswith(("the remote job cancelled", "the remote job failed"))
    assert slurm_job(run, 2)[0] != first_job


def test_a_job_that_never_starts_is_cancelled_and_retried_by_the_reaper(slurm_board, sync_queue,
                                                                        django_capture_on_commit_callbacks):
    board, pool = slurm_board
    pool(checkout=str(REPO), extra_args="--begin=now+1hour", queue_timeout=60)
    sub = submit(board, "correct", "test", django_capture_on_commit_callbacks)
    run = sub.runs.get()
    assert run.status == RunStatus.DISPATCHED
    first_job, state = slurm_job(run)
    assert state == "PENDING"
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(minutes=2)) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.attempt == 2 and run.infra_failures == 1
    assert "the service says queued" in run.attempts.get(number=1).reason
    assert slurm_job(run, 1) == (first_job, "CANCELLED")
    assert slurm_job(run, 2)[1] == "PENDING"
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_cancel_run(run)
    assert slurm_job(run, 2)[1] == "CANCELLED"
