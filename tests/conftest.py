"""Root fixtures. Services come from DATABASE_URL / REDIS_URL; under CI=true a test that needs a missing
service fails instead of skipping."""

from __future__ import annotations

import contextlib
import http.server
import io
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from django.conf import settings
from django.core.cache import cache
from django.db import connections
from django.utils import timezone
from django_q import worker as django_q_worker
from django_q.conf import Conf
from django_q.timeout import TimeoutHandler

from kernelbot import handlers, redis_clients
from leaderboards import lifecycle, runner_api, tasks
from runners import wakeups
from taskspec.loader import load_task

from . import agents, factories

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() == "true"


def pytest_sessionstart(session):
    if IN_CI and settings.DATABASES["default"]["ENGINE"] != "django.db.backends.postgresql":
        pytest.exit("CI=true needs DATABASE_URL pointing at PostgreSQL", returncode=3)
    if IN_CI and not settings.REDIS_URL:
        pytest.exit("CI=true needs REDIS_URL pointing at Redis", returncode=3)


def pytest_xdist_make_scheduler(config, log):
    """Under xdist (`./dev test` runs `-n auto`) every test is its own unit of work, except the tests of the one
    Slurm test cluster a machine can run (fixed ports, one state directory), which all go to the same worker. (Not
    `--dist loadgroup`: xdist 3.8 renames an item's nodeid, which pytest 9.2 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class SlurmOnOneWorker(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return "tests/slurm/" if nodeid.startswith("tests/slurm/") else nodeid

    return SlurmOnOneWorker(config, log)


def pytest_collection_modifyitems(config, items):
    """Longest first, so that no worker starts a four-minute test while the others run out of work: the slow tests
    (by their `slow(seconds=…)` estimate, from CI's --durations) ahead of the rest, collection order kept otherwise."""
    def expected_seconds(item) -> float:
        slow = item.get_closest_marker("slow")
        return slow.kwargs.get("seconds", 1.0) if slow else 0.0

    items.sort(key=expected_seconds, reverse=True)


def require(what: str, missing: str) -> None:
    """A test that needs `what` skips where it is missing here (`missing` says why; "" when it is not), and under
    CI=true fails instead, so CI never passes by skipping."""
    if not missing:
        return
    if IN_CI:
        pytest.fail(f"{what} is required under CI=true but {missing}")
    pytest.skip(f"{what} {missing}; it is required under CI=true")


def require_service(name: str, available: bool) -> None:
    require(name, "" if available else "is not configured (set it to run this test)")


def missing_tool(name: str) -> str:
    """Why the command `name` cannot be used on this machine, "" when it can; bubblewrap must also be able to build
    the sandbox's namespaces (a container may forbid them)."""
    path = shutil.which(name)
    if path is None:
        return "is not on PATH"
    if name == "bwrap":
        from runners.harness import sandbox

        if why := sandbox._bwrap_error(path, sandbox._privileged()):
            return f"is unusable here: {why}"
    return ""


def require_tool(name: str) -> None:
    """For a test that runs the command `name` (bwrap, sbatch): skips with the reason where it is missing, fails
    under CI=true."""
    require(name, missing_tool(name))


def reap_group(pgid: int, timeout: float = 10) -> None:
    """Wait until every process of the group (the cluster's workers too) is gone, so none holds the test DB
    or waits on a queue."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.killpg(pgid, signal.SIGKILL)


def stop_groups(*processes: subprocess.Popen, grace: float = 15) -> None:
    """Stop processes started with start_new_session as systemd's KillMode=mixed does: SIGTERM to each group's leader
    only, all at once, then, once a leader has exited (or `grace` seconds after the SIGTERM), SIGKILL to whatever of
    its group is left. Not SIGTERM to a whole group: django-q2's cluster then never stops (its main process, stopping,
    blocks for ever notifying an event that its already exited sentinel was waiting on)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        reap_group(process.pid)


@pytest.fixture
def redis_url() -> str:
    require_service("REDIS_URL", bool(settings.REDIS_URL))
    return settings.REDIS_URL


@pytest.fixture
def postgres(settings) -> None:
    require_service("PostgreSQL (DATABASE_URL)",
                    settings.DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql")


@pytest.fixture(autouse=True)
def _isolated_runtime(settings, tmp_path):
    """Each test gets its own runs directory, an empty local-memory cache and an in-memory channel layer unless
    it asks for Redis."""
    settings.RUNS_DIR = tmp_path / "runs"
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    cache.clear()  # the cached settings (tokens, boards, jobs switch, quotas, bans, served GPUs) start empty
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    redis_clients.forget_failures()  # no Redis is away for this process yet
    for known in (runner_api._known, runner_api._pools, runner_api._types):  # node asks' readings: another test's rows
        known.clear()


@pytest.fixture(autouse=True, scope="session")
def _test_timeout_wins():
    """django-q2 runs a sync task (Conf.SYNC) through its worker in this process, where its TimeoutHandler would arm
    SIGALRM for the cluster's timeout (1800 s) over pytest-timeout's alarm, then disarm it: a hung task would hang
    the run for half an hour and every test after a sync task would have no timeout. In this process the test's
    timeout governs; a cluster's own worker processes keep django-q's."""
    pytest_pid = os.getpid()

    class TestTimeoutWins(TimeoutHandler):
        def __init__(self, timeout: int):
            super().__init__(-1 if os.getpid() == pytest_pid else timeout)  # -1: django-q sets no alarm

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(django_q_worker, "TimeoutHandler", TestTimeoutWins)
        yield


@pytest.fixture
def sync_queue(monkeypatch):
    """django-q2 runs tasks inline; combine with django_capture_on_commit_callbacks(execute=True). A run dispatched
    to a local pool is then taken at once by its nodes' agents, run in this process through the runner API
    (tests/agents.py), as if their agents had been polling."""
    monkeypatch.setattr(Conf, "SYNC", True)
    dispatch = tasks.dispatch_run

    def dispatch_and_drain(run_id: int) -> None:
        dispatch(run_id)
        agents.drain_local_pools()

    monkeypatch.setattr(tasks, "dispatch_run", dispatch_and_drain)
    here = lifecycle.dispatch_here  # a run for a local pool is dispatched by the submitting process itself

    def here_and_drain(run_id: int) -> None:
        here(run_id)
        agents.drain_local_pools()

    monkeypatch.setattr(lifecycle, "dispatch_here", here_and_drain)


# as tests/settings.py: each xdist worker its own installation
RUNNER_KEY = "test-runner-key-0123456789abcdef" + (f"@{w}" if (w := os.environ.get("PYTEST_XDIST_WORKER")) else "")


@dataclass(frozen=True)
class RunnerPlatform:
    url: str  # where a remote agent reaches the platform (the runner API is under /api/runner/v1/)
    key: str  # KERNELBOT_RUNNER_KEY, also set in this process's environment for agents it starts


@pytest.fixture
def runner_platform(live_server, settings, monkeypatch) -> RunnerPlatform:
    """The platform on a real loopback port (pytest-django's live server: this process, the test database) with
    the runner API reachable and a runner key set, so remote agents started by a test can fetch jobs and report.
    Needs a transactional database (the server thread sees only committed rows)."""
    settings.RUNNER_KEY = RUNNER_KEY
    settings.PUBLIC_URL = live_server.url
    monkeypatch.setenv("KERNELBOT_RUNNER_KEY", RUNNER_KEY)
    return RunnerPlatform(live_server.url, RUNNER_KEY)


@pytest.fixture(autouse=True, scope="session")
def _node_lane_lets_go_of_the_test_database(django_db_setup):
    """The node agents' lanes (`wakeups.NODE_LANE`, `BEAT_LANE`) and the runners' reports' lane keep their own
    connections, as in a web process: closed before the test database is dropped, which PostgreSQL refuses while a
    session uses it."""
    yield
    for lane in (wakeups.NODE_LANE, wakeups.BEAT_LANE, handlers.RUN_REPORTS_LANE):
        lane.submit(connections.close_all).result(timeout=60)


@pytest.fixture(scope="session")
def demo_task():
    return load_task(REPO / "problems" / "demo" / "vectoradd_py")


@pytest.fixture
def cpu_pool(db):
    """This machine as a local pool whose node agent is live (the in-process one `sync_queue` drains with)."""
    pool = factories.local_cpu_pool()
    pool.nodes.update(agent_seen_at=timezone.now())
    return pool


@pytest.fixture
def leaderboard(db, cpu_pool, demo_task):
    return factories.LeaderboardFactory(problem=factories.problem_from(demo_task), gpu_types=[cpu_pool.cpu])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dead_redis_url() -> str:
    """A Redis URL on a port nothing listens on: every connection is refused at once."""
    return f"redis://127.0.0.1:{free_port()}/0"


@dataclass
class RedisServer:
    process: subprocess.Popen
    url: str

    def hang(self) -> None:
        """SIGSTOP: the kernel still accepts connections and takes what is sent; nothing is ever answered."""
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    """A redis-server of this test's own on a free port (the shared one is never stopped), empty, not persisted."""
    binary = shutil.which("redis-server")
    require_service("redis-server (Debian redis-server)", binary is not None)
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                "no", "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    server = RedisServer(process, f"redis://127.0.0.1:{port}/0")
    client = redis.Redis(port=port, socket_timeout=5)
    deadline = time.monotonic() + 20
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            assert process.poll() is None and time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.05)
    client.close()
    yield server
    process.kill()  # also when stopped
    process.wait(10)


@pytest.fixture
def problems_repository(settings):
    """A loopback server for a repository's branch zips: owner/problems@main holds this project's problems/."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w") as z:
        for path in sorted((REPO / "problems").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                z.write(path, "problems-main/" + str(path.relative_to(REPO)))
    zips = {"/owner/problems/main.zip": archive.getvalue()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = zips.get(self.path)
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body or b"Not Found")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.PROBLEMS_ARCHIVE_URL = f"http://127.0.0.1:{server.server_port}/{{repository}}/{{branch}}.zip"
    yield
    server.shutdown()
