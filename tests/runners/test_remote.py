"""The remote protocol end to end: a backend whose dispatch starts the real agent (a subprocess) against the platform
on a loopback port, the runner API's checks, polling, deadlines, retries on another pool, cancellation and the
GPU-type check of results."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from datetime import timedelta

import httpx
import pytest
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.actions import check_submission, do_delete_submission, do_submit
from leaderboards.models import BoardEntry, Run, RunAttempt, RunStatus
from runners.backends.base import BACKENDS, Poll, RemoteState, RunnerBackend, available_backends
from runners.harness.agent import Refused, runner_token
from runners.models import Gpu, GpuPool, GpuType, GpuVendor, Node
from runners.reservations.models import DeviceHold, HoldKind
from taskspec import jobspec

from ..agents import in_process_agent
from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, problem_from, remote_pool, submission
from ..remote_backend import AGENT_BACKEND, SCRIPTED_BACKEND, AgentBackend, ScriptedBackend

SOLUTIONS = REPO / "problems" / "demo" / "vectoradd_py" / "solutions"


@pytest.fixture(autouse=True)
def test_backends(monkeypatch, settings):
    monkeypatch.setitem(BACKENDS, "agent", AGENT_BACKEND)
    monkeypatch.setitem(BACKENDS, "scripted", SCRIPTED_BACKEND)
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    ScriptedBackend.reset()
    yield
    AgentBackend.stop_all()


def submit(board, solution: str, mode: str, capture, gpu: str = "CPU"):
    user = UserFactory()
    code = (SOLUTIONS / f"{solution}.py").read_bytes()
    request = check_submission(user, board.name, [gpu], mode, "submission.py", code)
    with capture(execute=True):
        return do_submit(user, request)


@pytest.fixture
def agent_board(transactional_db, runner_platform, demo_task):
    cpu, _ = GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})
    pool = remote_pool("agent", cpu, name="agents")
    return LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu]), pool


def wait_for_status(run: Run, *statuses: str, timeout: float = 60) -> Run:
    """Until another process moved the run into one of `statuses` (the agent reports through the live server)."""
    deadline = timezone.now() + timedelta(seconds=timeout)
    while timezone.now() < deadline:
        run.refresh_from_db()
        if run.status in statuses:
            return run
        time.sleep(0.05)
    raise AssertionError(f"run {run.pk} stayed {run.status}")


@pytest.mark.slow
def test_a_remote_run_is_dispatched_run_by_the_agent_reported_and_ranked(agent_board, sync_queue,
                                                                         django_capture_on_commit_callbacks):
    board, pool = agent_board
    sub = submit(board, "fast", "leaderboard", django_capture_on_commit_callbacks)
    # dispatch returned at once: the worker holds nothing while the agents run
    assert all(run.status in (RunStatus.DISPATCHED, RunStatus.RUNNING) for run in sub.runs.all())
    assert AgentBackend.wait_all() == [0, 0]
    for run in sub.runs.all():
        assert run.status == RunStatus.SUCCEEDED, (run.error, run.stderr)
        attempt = run.attempts.get()
        assert (attempt.pool, attempt.external_id) == (pool, str(attempt.external_id)) and attempt.nonce
        assert attempt.last_news_at and run.started_at and run.score > 0 and run.infra_failures == 0
        assert run.progress["final"] and run.result["ranked"]
    assert BoardEntry.objects.get(leaderboard=board).submission == sub  # the run's on_finish hook ranked it


@pytest.mark.slow
def test_an_agent_killed_mid_run_is_retried_never_charged_never_counted_twice(
        agent_board, sync_queue, django_capture_on_commit_callbacks):
    board, _ = agent_board
    sub = submit(board, "correct", "test", django_capture_on_commit_callbacks)
    run = wait_for_status(sub.runs.get(), RunStatus.RUNNING)
    (first,) = AgentBackend.processes.values()
    AgentBackend.cancel(AgentBackend.__new__(AgentBackend), str(first.pid))  # SIGKILL the agent and its harness
    assert lifecycle.poll_remote_runs(now=timezone.now() + timedelta(minutes=1)) == 1  # no news: polled → FAILED
    assert AgentBackend.wait_all()[-1] == 0  # the retry's agent delivered the verdict
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempt == 2 and run.infra_failures == 1
    attempts = list(run.attempts.values_list("number", "outcome"))
    assert attempts == [(1, "retried"), (2, "succeeded")]
    assert "agent exit code -9" in run.attempts.get(number=1).reason


@pytest.mark.slow
def test_runner_api_refuses_forged_stale_and_replayed_reports(agent_board, runner_platform, sync_queue,
                                                              django_capture_on_commit_callbacks):
    board, _ = agent_board
    sub = submit(board, "correct", "test", django_capture_on_commit_callbacks)
    assert AgentBackend.wait_all() == [0]
    run = sub.runs.get()
    attempt = run.attempts.get()
    base = f"{runner_platform.url}/api/runner/v1/runs/{run.pk}/{attempt.number}"
    good = {"Authorization": f"Bearer {runner_token(runner_platform.key, run.pk, 1, attempt.nonce)}"}
    forged = {"Authorization": f"Bearer {runner_token('another key', run.pk, 1, attempt.nonce)}"}
    assert httpx.get(f"{base}/job").status_code == 401
    assert httpx.get(f"{base}/job", headers=forged).status_code == 403
    assert httpx.post(f"{base}/result", headers=forged, json=run.result).status_code == 403
    # the run is finished: even its own attempt's token gets no job (no code, no seed) and cannot report again
    replay = httpx.post(f"{base}/result", headers=good, json={**run.result, "verdict": "fail", "passed": False})
    assert replay.status_code == 409 and "no longer current" in replay.json()["detail"]
    assert httpx.get(f"{base}/job", headers=good).status_code == 409
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempts.count() == 1


def _scripted_run(leaderboard, **pool_settings) -> tuple[Run, RunAttempt]:
    cpu = leaderboard.gpu_types.get()
    Gpu.objects.filter(gpu_type=cpu).update(enabled=False)  # only the scripted pool serves
    remote_pool("scripted", cpu, name="scripted", settings=pool_settings)
    run = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_run(run.pk)
    run.refresh_from_db()
    return run, run.attempts.get()


@pytest.mark.django_db
def test_runner_api_serves_the_job_only_to_the_current_attempts_token(client, settings, leaderboard):
    settings.RUNNER_KEY = "k"
    run, attempt = _scripted_run(leaderboard)
    assert run.status == RunStatus.DISPATCHED and attempt.external_id == f"scripted/job-{run.pk}-1"
    (job,) = ScriptedBackend.dispatched
    assert (job.run_id, job.attempt, job.nonce, job.gpu_count) == (run.pk, 1, attempt.nonce, 0)
    assert "def custom_kernel" not in repr(job)  # dispatch inputs carry no code and no seed
    assert job.token == runner_token("k", run.pk, 1, attempt.nonce) and job.token not in repr(job)  # never logged
    auth = {"HTTP_AUTHORIZATION": f"Bearer {job.token}"}
    base = f"/api/runner/v1/runs/{run.pk}/1"
    assert client.get(f"{base}/job", HTTP_AUTHORIZATION="Bearer " + "0" * 64).status_code == 403
    response = client.get(f"{base}/job", **auth)
    assert response.status_code == 200
    payload = response.json()
    assert payload["files"]["submission.py"] == "def custom_kernel(data): ..." and "seed" in payload["job"]
    assert not set(payload["job"]) & {"workdir", "gpus", "sandbox_uid", "nonce"}
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING

    before = run.status_deadline
    event = {"event": "progress", "phase": "test", "done": 1, "total": 4}
    assert client.post(f"{base}/progress", event, content_type="application/json", **auth).status_code == 200
    run.refresh_from_db()
    assert run.progress == event and run.status_deadline >= before  # live, and a heartbeat
    for body, status in [(b"{", 400), (b"[1]", 400), (b'{"event": "other"}', 400), (b'"x\\u0000"', 400)]:
        assert client.post(f"{base}/progress", body, content_type="application/json", **auth).status_code == status
    assert client.post(f"{base}/failure", {}, content_type="application/json", **auth).status_code == 400
    assert client.post(f"{base}/result", {"verdict": "pass"}, content_type="application/json",
                       **auth).status_code == 400
    assert client.get(f"{base}/result", **auth).status_code == 405
    assert client.get(f"/api/runner/v1/runs/{1 << 64}/1/job", **auth).status_code == 404
    assert client.get(f"/api/runner/v1/runs/{run.pk}/2/job", **auth).status_code == 403  # no such attempt
    nul = {"event": "result", "status": "ok", "verdict": "pass", "passed": True, "stdout": "a\x00b",
           "system": {"device": "cpu"}, "tests": []}
    assert client.post(f"{base}/result", nul, content_type="application/json", **auth).json() == {"accepted": True}
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.stdout == "a\ufffdb"


@pytest.mark.django_db
def test_a_stale_attempts_token_is_refused_after_a_retry(client, settings, leaderboard, sync_queue,
                                                         django_capture_on_commit_callbacks):
    settings.RUNNER_KEY = "k"
    run, first = _scripted_run(leaderboard)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_report_failure(run.pk, 1, "preempted")
    run.refresh_from_db()
    assert run.attempt == 2 and run.status == RunStatus.DISPATCHED
    stale = {"HTTP_AUTHORIZATION": f"Bearer {runner_token('k', run.pk, 1, first.nonce)}"}
    assert client.get(f"/api/runner/v1/runs/{run.pk}/1/job", **stale).status_code == 409
    # the first attempt's token does not open the second attempt either
    assert client.get(f"/api/runner/v1/runs/{run.pk}/2/job", **stale).status_code == 403


@pytest.mark.django_db
def test_polls_deadlines_extension_and_cancel(settings, leaderboard, sync_queue, django_capture_on_commit_callbacks):
    run, attempt = _scripted_run(leaderboard, queue_timeout=60)
    assert run.status_deadline > timezone.now() + timedelta(seconds=50)  # the pool's queue timeout
    ScriptedBackend.polls = [Poll(RemoteState.QUEUED)]
    assert lifecycle.poll_remote_runs() == 0  # news is recent: not polled yet
    assert lifecycle.poll_remote_runs(now=timezone.now() + timedelta(seconds=30)) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED
    ScriptedBackend.polls = [Poll(RemoteState.RUNNING)]
    lifecycle.poll_remote_runs(now=timezone.now() + timedelta(seconds=30))
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # the service says so: its agent has REMOTE_SILENCE s to be heard from
    since = run.status_deadline - run.started_at
    assert timedelta(seconds=settings.RUN_REMOTE_SILENCE) <= since < timedelta(seconds=settings.RUN_REMOTE_SILENCE + 1)

    late = run.status_deadline + timedelta(seconds=1)
    ScriptedBackend.polls = [Poll(RemoteState.RUNNING)]
    assert lifecycle.do_reap_overdue_runs(now=late) == 0  # nothing heard since it started: extended once
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.status_deadline == late + timedelta(
        seconds=settings.RUN_REMOTE_SILENCE)
    ScriptedBackend.polls = [Poll(RemoteState.RUNNING)]
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_reap_overdue_runs(now=run.status_deadline + timedelta(seconds=1)) == 1  # not twice
    run.refresh_from_db()
    assert ScriptedBackend.cancelled == [attempt.external_id]  # the remote job is cancelled before the retry
    assert run.attempt == 2 and run.infra_failures == 1 and run.status == RunStatus.DISPATCHED
    assert "did not report back while running" in run.attempts.get(number=1).reason

    second = run.attempts.get(number=2)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_cancel_run(run, "cancelled by an organiser")
    assert ScriptedBackend.cancelled[-1] == second.external_id


@pytest.fixture
def clock(monkeypatch):
    """timezone.now() as the test moves it (the lifecycle and the models read it): `clock(seconds)` moves it on."""
    now = [timezone.now()]
    monkeypatch.setattr(timezone, "now", lambda: now[0])

    def advance(seconds: float = 0):
        now[0] += timedelta(seconds=seconds)
        return now[0]
    return advance


def _agent_started(leaderboard) -> tuple[Run, RunAttempt]:
    """A scripted run whose agent fetched its job (through the runner API: `remote=True`)."""
    run, attempt = _scripted_run(leaderboard)
    assert lifecycle.do_mark_running(run.pk, attempt.number, remote=True)
    run.refresh_from_db()
    return run, attempt


@pytest.mark.django_db
def test_a_beating_remote_run_runs_its_whole_budget_and_no_longer(settings, leaderboard, clock, sync_queue,
                                                                  django_capture_on_commit_callbacks):
    settings.RUN_REMOTE_SILENCE = 90
    run, attempt = _agent_started(leaderboard)
    budget = lifecycle.remote_budget(run)  # the run's time budget + RUN_REMOTE_MARGIN
    assert budget > 2 * settings.RUN_REMOTE_SILENCE
    start = run.started_at
    while clock() < start + timedelta(seconds=budget - 20):
        clock(20)  # the agent's heartbeat interval; every other beat is a progress post
        if (clock() - start).total_seconds() % 40:
            assert lifecycle.do_heartbeat(run.pk, attempt.number, remote=True)
        else:
            assert lifecycle.do_record_progress(run.pk, attempt.number, {"event": "progress"}, remote=True)
        assert lifecycle.do_reap_overdue_runs(now=clock() + timedelta(seconds=19)) == 0
        run.refresh_from_db()
        assert run.status == RunStatus.RUNNING and run.status_deadline == min(
            clock() + timedelta(seconds=settings.RUN_REMOTE_SILENCE), start + timedelta(seconds=budget))
    assert not ScriptedBackend.cancelled

    clock(30)  # still beating, past its budget + margin; the service says it runs
    assert lifecycle.do_heartbeat(run.pk, attempt.number, remote=True)
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_reap_overdue_runs(now=clock()) == 1  # no extension
    run.refresh_from_db()
    assert run.attempt == 2 and run.infra_failures == 1 and ScriptedBackend.cancelled == [attempt.external_id]
    reason = run.attempts.get(number=1).reason
    assert f"past its budget of {budget - settings.RUN_REMOTE_MARGIN} s + {settings.RUN_REMOTE_MARGIN} s" in reason
    assert "the service says running" in reason


@pytest.mark.django_db
def test_a_silent_remote_run_is_retried_while_its_service_still_says_running(settings, leaderboard, clock, sync_queue,
                                                                            django_capture_on_commit_callbacks):
    settings.RUN_REMOTE_SILENCE = 90
    run, attempt = _agent_started(leaderboard)
    clock(20)
    assert lifecycle.do_heartbeat(run.pk, attempt.number, remote=True)
    last_word = clock()
    ScriptedBackend.polls = [Poll(RemoteState.RUNNING, "RUNNING")] * 10  # a dead node's job, still listed
    clock(30)
    assert lifecycle.poll_remote_runs() == 1  # the poll is no word from the agent: the deadline stays
    assert lifecycle.do_reap_overdue_runs(now=last_word + timedelta(seconds=89)) == 0
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_reap_overdue_runs(now=last_word + timedelta(seconds=91)) == 1  # no extension
    run.refresh_from_db()
    assert run.attempt == 2 and run.infra_failures == 1 and run.status == RunStatus.DISPATCHED
    assert ScriptedBackend.cancelled == [attempt.external_id]  # its job is cancelled before the retry
    assert run.attempts.get(number=1).reason == ("the runner did not report back while running (its agent was "
                                                 "silent for 91 s); the service says running (RUNNING)")
    assert run.passed is None  # never charged


@pytest.mark.django_db
def test_a_failed_or_lost_remote_job_is_retried_on_another_pool_of_the_same_gpu_type(
        leaderboard, sync_queue, django_capture_on_commit_callbacks):
    run, first = _scripted_run(leaderboard)
    other = remote_pool("scripted", leaderboard.gpu_types.get(), name="scripted-2")
    ScriptedBackend.polls = [Poll(RemoteState.LOST, "runner offline")]
    with django_capture_on_commit_callbacks(execute=True):
        lifecycle.poll_remote_runs(now=timezone.now() + timedelta(minutes=1))
    run.refresh_from_db()
    assert run.attempt == 2 and run.infra_failures == 1
    assert [a.pool for a in run.attempts.order_by("number")] == [first.pool, other]
    assert "runner offline" in run.attempts.get(number=1).reason


@pytest.mark.django_db
def test_a_pinned_run_goes_only_to_its_pool_and_a_failed_dispatch_is_not_charged(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 1
    cpu = leaderboard.gpu_types.get()
    pinned = remote_pool("scripted", cpu, name="pinned")
    run = submission(leaderboard, mode="test").runs.get()
    Run.objects.filter(pk=run.pk).update(pool=pinned)
    ScriptedBackend.fail_dispatch = "422 workflow not found"
    lifecycle.dispatch_run(run.pk)
    run.refresh_from_db()
    assert run.attempts.get().pool == pinned and run.status == RunStatus.ERROR
    assert "422 workflow not found" in run.attempts.get().reason and run.passed is None


@pytest.mark.django_db
def test_deleting_a_submission_cancels_its_remote_jobs(leaderboard, sync_queue, django_capture_on_commit_callbacks):
    run, attempt = _scripted_run(leaderboard)
    with django_capture_on_commit_callbacks(execute=True):
        do_delete_submission(run.submission)
    assert ScriptedBackend.cancelled == [attempt.external_id]


class Unavailable(RunnerBackend):
    @classmethod
    def available(cls) -> str | None:
        return "the modal client is not installed"

    def dispatch(self, job, reporter) -> str:
        raise AssertionError("never dispatched")


def test_only_available_backends_are_offered(monkeypatch):
    monkeypatch.setitem(BACKENDS, "modal", "tests.runners.test_remote.Unavailable")
    monkeypatch.setitem(BACKENDS, "github", "runners.backends.not_installed.GithubBackend")
    offered = available_backends()
    assert "local" in offered and "modal" not in offered and "github" not in offered


@pytest.mark.parametrize(("name", "vendor", "device", "ok"), [
    ("H100", GpuVendor.NVIDIA, "NVIDIA H100 80GB HBM3", True),
    ("L4", GpuVendor.NVIDIA, "NVIDIA L4", True),
    ("L4", GpuVendor.NVIDIA, "NVIDIA L40S", False),
    ("H100", GpuVendor.NVIDIA, "NVIDIA L4", False),
    ("A100", GpuVendor.NVIDIA, "NVIDIA A100-SXM4-80GB", True),
    ("MI300", GpuVendor.AMD, "AMD Instinct MI300X", True),
    ("MI300", GpuVendor.NVIDIA, "AMD Instinct MI300X", False),
    ("H100", GpuVendor.NVIDIA, "cpu", False),
    ("H100", GpuVendor.NVIDIA, "", False),
    ("CPU", GpuVendor.CPU, "NVIDIA H100", True),
    ("RTX 4090", GpuVendor.NVIDIA, "NVIDIA GeForce RTX 4090", True),
    ("A10", GpuVendor.NVIDIA, "NVIDIA A100-SXM4-80GB", False),
])
def test_gpu_type_check_of_a_results_system_info(name, vendor, device, ok):
    assert (lifecycle.gpu_mismatch(GpuType(name=name, vendor=vendor), {"device": device}) == "") is ok


@pytest.mark.slow
@pytest.mark.django_db
def test_a_cpu_pool_claiming_an_l4_never_shows_l4_succeeded(demo_task, settings, sync_queue,
                                                            django_capture_on_commit_callbacks):
    """The issue's case: a local pool on this CPU-only machine registered an L4. Its agent's probe says otherwise:
    the registration is refused with the reason, no agent serves the L4, and the run never runs, let alone
    succeeds. (A result from the wrong hardware is refused at ingest: `gpu_mismatch`, tested above.)"""
    l4 = GpuType.objects.create(name="L4", vendor=GpuVendor.NVIDIA, architecture="sm_89")
    pool = GpuPool.objects.create(name="this-machine")
    node = Node.objects.create(pool=pool, hostname="localhost")
    Gpu.objects.create(node=node, gpu_type=l4, index=0)
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[l4])
    run = submit(board, "correct", "test", django_capture_on_commit_callbacks, gpu="L4").runs.get()
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.passed is None and not run.result
    with pytest.raises(Refused, match="no CPU GPU type to register it as"):
        in_process_agent(node)
    node.refresh_from_db()
    assert node.agent_seen_at is None


def test_the_harness_tarball_runs_the_agent_without_django(client, tmp_path):
    response = client.get("/api/runner/v1/harness.tar.gz")
    assert response.status_code == 200
    with tarfile.open(fileobj=io.BytesIO(response.content)) as tar:
        names = tar.getnames()
    jobspec.extract_tarball(response.content, tmp_path)
    assert "runners/harness/agent.py" in names and "runners/__init__.py" in names
    # -S: no site-packages, so no Django: the shipped package runs on a bare python3
    done = subprocess.run([sys.executable, "-S", "-E", "-m", "runners.harness.agent", "--help"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "--attempt" in done.stdout


@pytest.mark.django_db
def test_a_result_handed_back_by_the_service_is_ingested_once(leaderboard, sync_queue,
                                                              django_capture_on_commit_callbacks):
    """Modal's return value or a GitHub artifact: the poll delivers it when the agent's own post was lost."""
    run, _ = _scripted_run(leaderboard)
    result = {"event": "result", "status": "ok", "verdict": "pass", "passed": True, "tests": [],
              "system": {"device": "cpu"}}
    ScriptedBackend.polls = [Poll(RemoteState.FINISHED, result=result), Poll(RemoteState.FINISHED, result=result)]
    later = timezone.now() + timedelta(minutes=1)
    assert lifecycle.poll_remote_runs(now=later) == 1
    assert lifecycle.poll_remote_runs(now=later) == 0  # finished: nothing left to poll
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.attempts.get().outcome == RunStatus.SUCCEEDED


@pytest.mark.django_db
def test_a_service_that_finished_without_a_result_is_an_infrastructure_failure(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 1
    run, _ = _scripted_run(leaderboard)
    ScriptedBackend.polls = [Poll(RemoteState.FINISHED, "exit code 0")]
    lifecycle.poll_remote_runs(now=timezone.now() + timedelta(minutes=1))
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR
    assert "finished without reporting a result (exit code 0)" in run.attempts.get().reason


@pytest.mark.django_db
def test_one_attempts_credentials_open_no_other_attempts_routes(client, settings, leaderboard):
    """A runner holds only what the dispatch gave it: its attempt's token, which opens nothing of any other run."""
    settings.RUNNER_KEY = "the-platforms-runner-key-4f1c2a9e"
    mine, _ = _scripted_run(leaderboard)
    other = submission(leaderboard, mode="test").runs.get()
    lifecycle.dispatch_run(other.pk)
    mine_job, other_job = ScriptedBackend.dispatched[-2:]
    assert mine_job.run_id == mine.pk and other_job.run_id == other.pk and mine_job.token != other_job.token
    auth = {"HTTP_AUTHORIZATION": f"Bearer {mine_job.token}"}
    base = f"/api/runner/v1/runs/{other.pk}/1"
    result = {"event": "result", "status": "ok", "verdict": "pass", "passed": True, "system": {}, "tests": []}
    assert client.get(f"{base}/job", **auth).status_code == 403
    for route, body in (("progress", {"event": "progress", "phase": "test", "done": 1, "total": 1}),
                        ("result", result), ("failure", {"reason": "forged"})):
        assert client.post(f"{base}/{route}", body, content_type="application/json", **auth).status_code == 403
    other.refresh_from_db()
    assert (other.status, other.verdict, other.infra_failures, other.progress) == (RunStatus.DISPATCHED, "", 0, {})
    # the platform's key never travels with a dispatch: a runner could not derive another attempt's token
    assert settings.RUNNER_KEY not in repr(ScriptedBackend.dispatched) + mine_job.token


def test_a_remote_agent_refuses_to_hold_the_runner_key(tmp_path):
    env = {"PATH": os.environ["PATH"], "KERNELBOT_RUNNER_KEY": "the-platforms-key", "KERNELBOT_ATTEMPT_TOKEN": "t"}
    done = subprocess.run([sys.executable, "-m", "runners.harness.agent", "--platform", "http://127.0.0.1:9",
                           "--run", "1", "--attempt", "1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "must not hold the platform's key" in done.stderr
    del env["KERNELBOT_RUNNER_KEY"], env["KERNELBOT_ATTEMPT_TOKEN"]
    done = subprocess.run([sys.executable, "-m", "runners.harness.agent", "--platform", "http://127.0.0.1:9",
                           "--run", "1", "--attempt", "1"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "KERNELBOT_ATTEMPT_TOKEN is not set" in done.stderr


@pytest.mark.django_db
def test_a_remote_job_holds_the_devices_its_scheduler_gave_it_until_the_run_ends(client, settings, leaderboard):
    """Remote runs are holds like any other: where the pool's inventory names the job's host and devices, the
    planner sees them busy while the run uses them (a reservation is never planned onto them)."""
    settings.RUNNER_KEY = "k"
    run, attempt = _scripted_run(leaderboard)
    node = Node.objects.create(pool=attempt.pool, hostname="gpu-node-3")
    cpu = leaderboard.gpu_types.get()
    for index in (0, 1):
        Gpu.objects.create(node=node, gpu_type=cpu, index=index)
    (job,) = ScriptedBackend.dispatched
    auth = {"HTTP_AUTHORIZATION": f"Bearer {job.token}"}
    base = f"/api/runner/v1/runs/{run.pk}/1"
    for bad in ("host=x&gpus=a", "host=x&gpus=1,,2", "host=" + "h" * 121):
        assert client.get(f"{base}/job?{bad}", **auth).status_code == 400
    assert client.get(f"{base}/job?host=gpu-node-3&gpus=1", **auth).status_code == 200
    (hold,) = DeviceHold.objects.held()
    assert (hold.gpu.node.hostname, hold.gpu.index, hold.kind, hold.run_id) == ("gpu-node-3", 1, HoldKind.RUN, run.pk)
    assert client.get(f"{base}/job?host=gpu-node-3&gpus=0,1", **auth).status_code == 200  # a repeat holds no more
    assert DeviceHold.objects.held().count() == 1
    result = {"event": "result", "status": "ok", "verdict": "pass", "passed": True, "system": {"device": "cpu"},
              "tests": []}
    assert client.post(f"{base}/result", result, content_type="application/json", **auth).status_code == 200
    assert not DeviceHold.objects.held().exists()  # the run ended: so did its hold
