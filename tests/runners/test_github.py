"""The GitHub Actions backend against a loopback fake of GitHub's REST API (tests/fakes/github.py), PyGithub
unmodified. The fake runs the workflow we ship step by step: it downloads the platform's real harness tarball and
runs the real agent, which runs the submission in the real sandboxed harness and reports to the platform on a
loopback port (the `runner_platform` fixture); the sealed result artifact and the signed webhook come back the way
GitHub sends them."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import subprocess
import sys
import threading
import uuid
import zipfile
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from io import BytesIO
from typing import Any

import httpx
import pytest
import yaml
from django.urls import reverse
from django.utils import timezone

from leaderboards import events, lifecycle
from leaderboards.actions import check_submission, do_submit
from leaderboards.models import BoardEntry, Run, RunStatus
from runners.backends.base import BackendUnavailable, Dispatch, RemoteState, attempt_token
from runners.backends.github import PENDING, SEALED, WORKFLOW, GithubBackend, GithubOptions, unseal
from runners.models import GpuPool, GpuType, GpuVendor, RunnerBackendName
from runners.signals import remote_news

from ..conftest import REPO as SOURCE
from ..conftest import RUNNER_KEY
from ..factories import LeaderboardFactory, UserFactory, problem_from, remote_pool, submission
from ..fakes.github import FakeGithub

REPO = "org/gpu-runners"
SOLUTIONS = SOURCE / "problems" / "demo" / "vectoradd_py" / "solutions"
LABELS = {"CPU": ["self-hosted", "cpu"], "H100": ["self-hosted", "h100"], "L4": ["self-hosted", "l4"]}


@pytest.fixture
def fake(monkeypatch):
    fake = FakeGithub()
    fake.add_repo(REPO)
    fake.vars["KERNELBOT_PYTHON"] = sys.executable  # the runner image's python with torch
    fake.runner_labels.append({"self-hosted", "cpu"})  # one CPU runner online; none for H100 or L4
    for name in ("KERNELBOT_SANDBOX", "KERNELBOT_CGROUP"):  # the runner machine's own sandbox configuration
        if name in os.environ:
            fake.env[name] = os.environ[name]
    monkeypatch.setenv("GITHUB_TOKEN", fake.token)
    monkeypatch.setenv("KB_GH_HOOK", "hook-secret")
    monkeypatch.setenv("KERNELBOT_RUNNER_KEY", RUNNER_KEY)
    yield fake
    fake.close()
    assert fake.violations == []  # the token never reached blob storage


def pool_settings(fake: FakeGithub, **extra: Any) -> dict:
    return {"repository": REPO, "api_url": fake.api_url, "webhook_secret_env": "KB_GH_HOOK", "runner_labels": LABELS,
            **extra}


@pytest.fixture
def pool(db, fake):
    return GpuPool.objects.create(name="gh", backend=RunnerBackendName.GITHUB, settings=pool_settings(fake))


@pytest.fixture
def cpu(db) -> GpuType:
    return GpuType.objects.get_or_create(name="CPU", defaults={"vendor": GpuVendor.CPU})[0]


def job(gpu: GpuType, run_id: int = 42, attempt: int = 1, url: str = "http://127.0.0.1:9") -> Dispatch:
    return Dispatch(run_id=run_id, attempt=attempt, nonce=f"n{run_id}x{attempt}", platform_url=url, gpu_type=gpu,
                    gpu_count=0, timeout_s=120, label=f"kernelbot run {run_id} attempt {attempt}", token="f" * 64)


class NoReporter:
    def __getattr__(self, name: str):
        raise AssertionError(f"dispatch must not report ({name}): it only submits")


def submit(board, solution: str, mode: str, capture) -> Any:
    user = UserFactory()
    request = check_submission(user, board.name, ["CPU"], mode, "submission.py",
                               (SOLUTIONS / f"{solution}.py").read_bytes())
    with capture(execute=True):
        return do_submit(user, request)


def fake_run(fake: FakeGithub, run: Run) -> dict:
    run.refresh_from_db()
    return fake.runs[int(run.attempts.get(number=run.attempt).external_id)]


def sign(body: bytes, secret: str = "hook-secret") -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


# --- the workflow and the backend's GitHub layer ------------------------------------------------------------------

def test_shipped_workflow_is_a_valid_github_workflow():
    check = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                            str(WORKFLOW)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    workflow = yaml.safe_load(WORKFLOW.read_text())
    inputs = workflow[True]["workflow_dispatch"]["inputs"]
    assert len(inputs) <= 25 and all(spec["type"] == "string" for spec in inputs.values())
    assert "${{ inputs.nonce }}" in workflow["run-name"]  # the correlation id for servers without run details
    text = WORKFLOW.read_text()
    # the runner holds no long-lived secret, only the attempt's token, and never runs submitted code unsandboxed
    assert "secrets." not in text and "KERNELBOT_RUNNER_KEY" not in text
    assert workflow["jobs"]["run"]["env"]["KERNELBOT_SANDBOX"] == "require"
    first = workflow["jobs"]["run"]["steps"][0]["run"]
    assert first.startswith('echo "::add-mask::$KERNELBOT_ATTEMPT_TOKEN"')  # before anything could print it


@pytest.mark.parametrize(("status", "setup"), [
    (401, lambda fake, mp: mp.setenv("GITHUB_TOKEN", "wrong")),
    (404, lambda fake, mp: fake.repos.pop(REPO)),
    (422, lambda fake, mp: setattr(fake, "dispatch_status", 422)),
])
def test_refused_dispatch_is_a_configuration_error(fake, pool, cpu, monkeypatch, status, setup):
    setup(fake, monkeypatch)
    with pytest.raises(BackendUnavailable, match=f"GitHub refused to dispatch kernelbot-run.yml on {REPO}@main "
                                                 f"\\({status}: "):
        GithubBackend(pool).dispatch(job(cpu), NoReporter())
    assert fake.runs == {}


def test_missing_token_labels_or_runner_key_are_configuration_errors(fake, pool, cpu, monkeypatch):
    with pytest.raises(BackendUnavailable, match="names no runner labels for A100"):
        GithubBackend(pool).dispatch(job(GpuType.objects.create(name="A100")), NoReporter())
    monkeypatch.delenv("GITHUB_TOKEN")
    with pytest.raises(BackendUnavailable, match="GITHUB_TOKEN is not set"):
        GithubBackend(pool).dispatch(job(cpu), NoReporter())
    pool.settings = {**pool.settings, "runner_key_env": "KB_NO_SUCH_KEY"}
    with pytest.raises(BackendUnavailable, match=r"runner key \(KB_NO_SUCH_KEY\) is not set"):
        GithubBackend(pool).key()


def test_run_never_picked_up_stays_queued_until_cancelled(fake, pool):
    backend = GithubBackend(pool)
    external_id = backend.dispatch(job(GpuType.objects.create(name="L4")), NoReporter())  # no l4 runner online
    for _ in range(3):
        assert backend.poll(external_id).state == RemoteState.QUEUED
    backend.cancel(external_id)
    assert fake.wait(int(external_id))["log"] == []  # no step ran
    assert backend.poll(external_id).state == RemoteState.CANCELLED
    backend.cancel(external_id)  # already completed (409): nothing to do, no error
    assert backend.poll("999999").state == RemoteState.LOST


def test_server_without_run_details_falls_back_to_the_correlation_id(fake, pool):
    fake.run_details = False
    backend, h100 = GithubBackend(pool), GpuType.objects.create(name="H100")  # no h100 runner: both stay queued
    other = backend.dispatch(job(h100, run_id=8), NoReporter())
    external_id = backend.dispatch(job(h100, run_id=9), NoReporter())
    assert (other, external_id) == (f"{PENDING}n8x1", f"{PENDING}n9x1")
    backend.cancel(external_id)  # resolved by the nonce in the run name: the right run, not the newest
    (cancelled,) = [run for run in fake.runs.values() if run["cancelled"]]
    assert cancelled["title"] == "kernelbot run 9 attempt 1 [n9x1]"
    fake.wait(cancelled["id"])
    assert backend.poll(external_id).state == RemoteState.CANCELLED
    assert backend.poll(other).state == RemoteState.QUEUED
    assert backend.poll(f"{PENDING}never-dispatched").state == RemoteState.QUEUED


def test_a_job_that_cannot_run_is_a_failure_with_a_reason(fake, cpu, transactional_db, runner_platform):
    """The real harness tarball and agent, for an attempt the platform does not know: the agent is refused its job
    (403), so there is no result and no artifact."""
    pool = GpuPool.objects.create(name="gh", backend=RunnerBackendName.GITHUB, settings=pool_settings(fake))
    backend = GithubBackend(pool)
    external_id = backend.dispatch(job(cpu, run_id=10**9, url=runner_platform.url), NoReporter())
    run = fake.wait(int(external_id))
    assert run["conclusion"] == "failure" and "HTTP 403" in run["log"][1][2], run["log"]
    poll = backend.poll(external_id)
    assert poll.state == RemoteState.FAILED and "no result artifact" in poll.detail and poll.result is None


# --- the webhook --------------------------------------------------------------------------------------------------

def test_webhook_refuses_bad_signatures_and_junk_and_ignores_redeliveries(client, pool, monkeypatch):
    url = reverse("github-webhook", args=[pool.pk])
    news: list[list[str]] = []
    remote_news.connect(lambda sender, external_ids, **kw: news.append(external_ids), weak=False,
                        dispatch_uid="test-webhook")

    def post(body: bytes, signature: str | None = None, event: str = "workflow_run", delivery: str = "d-1"):
        return client.post(url, body, content_type="application/json", headers={
            "X-GitHub-Event": event, "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sign(body) if signature is None else signature})

    completed = json.dumps({"action": "completed", "repository": {"full_name": REPO},
                            "workflow_run": {"id": 77, "display_title": "kernelbot run 3 attempt 1 [abc]"}}).encode()
    try:
        assert post(completed, signature="sha256=" + "0" * 64).status_code == 401
        assert post(completed, signature="").status_code == 401
        assert post(completed, signature=sign(completed, "other-secret")).status_code == 401
        assert post(b"not json{").status_code == 400
        assert post(b'{"action": "completed", "workflow_run": {"id": "x"}}').status_code == 400
        assert post(b"[1, 2]").status_code == 400
        assert post(b'{"zen": "hi"}', event="ping").status_code == 200
        assert post(b'{"action": "in_progress", "workflow_run": {"id": 1}, "repository": {"full_name": "'
                    + REPO.encode() + b'"}}').status_code == 202
        assert news == []
        assert post(completed).status_code == 202
        assert post(completed).status_code == 200  # the same delivery again
        assert news == [["77", f"{PENDING}abc"]]
        foreign = completed.replace(REPO.encode(), b"someone/else")
        assert post(foreign, delivery="d-2").status_code == 202 and len(news) == 1
        for pool_id in (pool.pk + 1000, 10**20):
            assert client.post(f"/api/runner/v1/github/webhook/{pool_id}", completed,
                               content_type="application/json").status_code == 404
        assert client.get(url).status_code == 405
        monkeypatch.delenv("KB_GH_HOOK")
        assert post(completed, delivery="d-3").status_code == 503 and len(news) == 1
    finally:
        remote_news.disconnect(dispatch_uid="test-webhook")


def test_the_runner_api_and_the_webhook_share_their_prefix(client, pool):
    """Both route sets are mounted under /api/runner/v1/; neither shadows the other."""
    assert reverse("github-webhook", args=[pool.pk]) == f"/api/runner/v1/github/webhook/{pool.pk}"
    assert client.get("/api/runner/v1/harness.tar.gz").status_code == 200
    assert client.post(reverse("github-webhook", args=[pool.pk]), b"{}", content_type="application/json",
                       headers={"X-Hub-Signature-256": sign(b"{}")}).status_code == 202


def test_pool_options_validate_and_fill_defaults():
    form = GithubOptions(data={"repository": "org/runners", "runner_labels": {"H100": "gpu-h100", "L4": ["a", "b"]},
                               "queue_timeout": 600})
    assert form.is_valid(), form.errors
    assert {k: v for k, v in form.cleaned_data.items() if v not in (None, "")} == {
        "repository": "org/runners", "workflow": "kernelbot-run.yml", "ref": "main", "queue_timeout": 600,
        "api_url": "https://api.github.com", "token_env": "GITHUB_TOKEN", "webhook_secret_env": "GITHUB_WEBHOOK_SECRET",
        "runner_labels": {"H100": ["gpu-h100"], "L4": ["a", "b"]}}
    bad = GithubOptions(data={"repository": "not a repo", "runner_labels": {"H100": []}, "token_env": "no-dash",
                              "api_url": "ftp:/x", "runner_key_env": "lower"})
    assert not bad.is_valid()
    assert set(bad.errors) == {"repository", "runner_labels", "token_env", "api_url", "runner_key_env"}


def test_unseal_reads_what_openssl_sealed(tmp_path):
    plain = tmp_path / "result.json"
    plain.write_text('{"verdict": "pass"}')
    sealed = tmp_path / SEALED
    subprocess.run(["openssl", "enc", "-aes-256-cbc", "-pbkdf2", "-iter", "100000", "-salt", "-pass", "pass:tok",
                    "-in", str(plain), "-out", str(sealed)], check=True)
    assert json.loads(unseal(sealed.read_bytes(), "tok")) == {"verdict": "pass"}
    with pytest.raises(ValueError):  # a bad padding, or (1 in 256) garbage that is not JSON
        json.loads(unseal(sealed.read_bytes(), "other"))


# --- submissions through the run lifecycle ------------------------------------------------------------------------

@pytest.fixture
def gh_board(transactional_db, runner_platform, demo_task, fake, cpu, settings):
    """A board whose only pool is the GitHub runner repository; GitHub's webhook reaches the platform."""
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    pool = remote_pool(RunnerBackendName.GITHUB, cpu, name="github", settings=pool_settings(fake))
    fake.webhook = (runner_platform.url + reverse("github-webhook", args=[pool.pk]), "hook-secret")
    return LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu]), pool


@pytest.mark.slow
def test_a_leaderboard_submission_runs_on_github_and_lands_on_the_board(
        gh_board, fake, sync_queue, monkeypatch, django_capture_on_commit_callbacks):
    board, pool = gh_board
    live: list[dict] = []
    send = events.send
    monkeypatch.setattr(events, "send", lambda group, kind, payload: (live.append(payload), send(group, kind, payload)))
    sub = submit(board, "fast", "leaderboard", django_capture_on_commit_callbacks)
    runs = list(sub.runs.order_by("secret"))
    assert [r.status for r in runs] == [RunStatus.DISPATCHED] * 2  # dispatch only submitted the workflow runs
    workflow_runs = [fake.wait(int(r.attempts.get().external_id), timeout=300) for r in runs]
    for run, workflow_run in zip(runs, workflow_runs, strict=True):
        run.refresh_from_db()
        assert run.status == RunStatus.SUCCEEDED, (run.error, workflow_run["log"])
        assert workflow_run["conclusion"] == "success" and run.score > 0 and run.infra_failures == 0
        assert workflow_run["title"] == f"kernelbot run {run.pk} attempt 1 [{run.attempts.get().nonce}]"
        assert set(workflow_run["inputs"]) == {"run_id", "attempt", "nonce", "token", "platform_url",
                                               "runner_labels", "timeout_minutes"}
        token = workflow_run["inputs"]["token"]
        assert token == attempt_token(pool, run.pk, 1, run.attempts.get().nonce)
        assert all(RUNNER_KEY not in out and token not in out for _, _, out in workflow_run["log"])
    assert fake.webhook_answers == [202, 202]
    assert BoardEntry.objects.get(leaderboard=board).submission == sub
    public = runs[0]
    assert not public.secret
    ticks = [m for m in live if m.get("run") == public.pk and m["status"] == RunStatus.RUNNING and m["progress"]]
    assert ticks and not any(m["progress"].get("final") for m in ticks)  # live progress while it ran
    # the artifact holds the same result, sealed: nothing readable in it, and only this attempt's token opens it
    backend = GithubBackend(pool)
    external_id = public.attempts.get().external_id
    (artifact,) = [a for a in fake.artifacts.values() if a["run"] == int(external_id)]
    sealed = zipfile.ZipFile(BytesIO(artifact["data"])).read(SEALED)
    assert b"verdict" not in sealed and b"custom_kernel" not in sealed
    assert backend.poll(external_id).result == public.result
    fake.runs[int(external_id)]["title"] = f"kernelbot run {public.pk} attempt 2 [{uuid.uuid4().hex}]"
    poll = backend.poll(external_id)
    assert poll.state == RemoteState.FAILED and "unreadable result artifact" in poll.detail


class CallbackCutter:
    """Between the runner and the platform: passes the harness download, the job and progress posts, and drops the
    connection on result and failure posts (the runner lost the platform at the end of its job)."""

    def __init__(self, target: str):
        self.cut: list[str] = []
        cutter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def forward(self, method: str) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith(("/result", "/failure")):
                    cutter.cut.append(self.path)
                    self.close_connection = True
                    return  # no answer at all
                headers = {k: v for k, v in self.headers.items() if k.lower() in ("authorization", "content-type")}
                answer = httpx.request(method, target + self.path, content=body, headers=headers, timeout=60)
                self.send_response(answer.status_code)
                self.send_header("Content-Type", answer.headers.get("content-type", "application/json"))
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            def do_GET(self) -> None:  # noqa: N802
                self.forward("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.forward("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.mark.slow
def test_a_lost_callback_is_read_from_the_artifact_and_counted_once(
        gh_board, fake, runner_platform, sync_queue, django_capture_on_commit_callbacks):
    board, pool = gh_board
    cutter = CallbackCutter(runner_platform.url)
    pool.settings = {**pool.settings, "platform_url": cutter.url}
    pool.save()
    try:
        sub = submit(board, "correct", "test", django_capture_on_commit_callbacks)
        run = sub.runs.get()
        workflow_run = fake.wait(int(run.attempts.get().external_id), timeout=300)
    finally:
        cutter.server.shutdown()
    assert workflow_run["conclusion"] == "failure"  # the agent could not deliver its result ...
    assert [path.rsplit("/", 1)[1] for path in cutter.cut].count("result") == 5 and cutter.cut[-1].endswith("failure")
    assert fake.webhook_answers == [202]  # ... GitHub's webhook made the platform poll and read the artifact
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.passed and run.infra_failures == 0, run.error
    assert list(run.attempts.values_list("number", "outcome")) == [(1, RunStatus.SUCCEEDED)]
    finished = run.finished_at
    # a redelivered webhook, the scheduled poll and a late poll of the attempt change nothing
    body = json.dumps({"action": "completed", "workflow_run": fake._run_json(workflow_run),
                       "repository": {"full_name": REPO}}).encode()
    answer = httpx.post(fake.webhook[0], content=body, headers={
        "Content-Type": "application/json", "X-GitHub-Event": "workflow_run", "X-GitHub-Delivery": "again",
        "X-Hub-Signature-256": sign(body)})
    assert answer.status_code == 202
    assert lifecycle.poll_remote_runs(now=timezone.now() + timedelta(minutes=5)) == 0
    attempt = run.attempts.get()
    assert lifecycle.poll_attempt(attempt.pk) is False
    lifecycle.apply_poll(attempt, GithubBackend(pool).poll(attempt.external_id))
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED and run.finished_at == finished and run.attempts.count() == 1


@pytest.mark.slow
def test_cancelling_a_running_submission_cancels_its_workflow_run(
        gh_board, fake, sync_queue, django_capture_on_commit_callbacks):
    board, _ = gh_board
    run = submit(board, "slow", "benchmark", django_capture_on_commit_callbacks).runs.get()
    deadline = timezone.now() + timedelta(seconds=120)
    while run.status != RunStatus.RUNNING and timezone.now() < deadline:  # the agent fetched its job
        run.refresh_from_db()
    assert run.status == RunStatus.RUNNING
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_cancel_run(run)
    workflow_run = fake_run(fake, run)
    assert fake.wait(workflow_run["id"], timeout=120)["conclusion"] == "cancelled"
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.attempts.count() == 1


@pytest.mark.django_db
def test_a_run_no_runner_picks_up_is_retried_after_the_queue_deadline(
        fake, demo_task, sync_queue, settings, django_capture_on_commit_callbacks):
    h100 = GpuType.objects.create(name="H100", vendor=GpuVendor.NVIDIA)  # labels set, but no h100 runner online
    remote_pool(RunnerBackendName.GITHUB, h100, name="github",
                settings=pool_settings(fake, queue_timeout=60, platform_url="https://kb.example.org"))
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[h100])
    user = UserFactory()
    request = check_submission(user, board.name, ["H100"], "test", "submission.py",
                               (SOLUTIONS / "correct.py").read_bytes())
    with django_capture_on_commit_callbacks(execute=True):
        run = do_submit(user, request).runs.get()
    first = fake_run(fake, run)
    assert first["status"] == "queued" and first["inputs"]["platform_url"] == "https://kb.example.org"
    with django_capture_on_commit_callbacks(execute=True):
        assert lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(seconds=61)) == 1
    assert fake.wait(first["id"])["conclusion"] == "cancelled"  # GitHub is told, the job does not linger
    run.refresh_from_db()
    assert run.status == RunStatus.DISPATCHED and run.attempt == 2 and run.infra_failures == 1
    assert "the service says queued" in run.attempts.get(number=1).reason
    assert fake_run(fake, run)["id"] != first["id"] and fake_run(fake, run)["status"] == "queued"


@pytest.mark.django_db
def test_a_dispatch_github_refuses_fails_the_pool_with_its_message(
        fake, demo_task, cpu, sync_queue, django_capture_on_commit_callbacks):
    remote_pool(RunnerBackendName.GITHUB, cpu, name="github", settings=pool_settings(fake))
    fake.dispatch_status = 404
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu])
    run = submit(board, "correct", "test", django_capture_on_commit_callbacks).runs.get()
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and run.infra_failures == 0, run.error  # it waits for a pool to take it
    reason = run.attempts.get().reason  # the organisers'; the competitor reads that the runners are misconfigured
    assert f"GitHub refused to dispatch kernelbot-run.yml on {REPO}@main (404: fake refusal 404)" in reason
    assert REPO not in run.error
    assert run.attempts.count() == 1 and fake.runs == {}
    assert reason in GpuPool.objects.get(name="github").health_detail  # the pool fails, saying what is wrong


@pytest.mark.django_db
def test_remote_news_polls_only_current_unfinished_attempts_of_that_pool(fake, pool, cpu, demo_task, monkeypatch):
    board = LeaderboardFactory(problem=problem_from(demo_task), gpu_types=[cpu])
    runs = [submission(board, mode="test").runs.get() for _ in range(3)]
    for index, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING if index < 2 else RunStatus.SUCCEEDED,
                                             attempt=1)
        run.attempts.create(number=1, pool=pool, nonce="n", external_id=str(100 + index), dispatched_at=timezone.now())
    polled: list[tuple[str, int]] = []
    monkeypatch.setattr(lifecycle, "enqueue_on_commit", lambda task, attempt_id: polled.append((task, attempt_id)))
    other = GpuPool.objects.create(name="other", backend=RunnerBackendName.GITHUB, settings=pool.settings)
    assert lifecycle.remote_news_received(other, ["100"]) == 0
    assert lifecycle.remote_news_received(pool, ["100", "102", "pending:x"]) == 1  # 102 has finished
    assert polled == [(lifecycle.POLL_TASK, runs[0].attempts.get().pk)]
