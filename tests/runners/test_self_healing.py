"""Fault tests of the supervised worker cluster (`manage.py workers`, `manage.py serve`) on PostgreSQL with Redis
and DB_POOL=1: SIGKILLed busy and idle workers and a SIGKILLed cluster are recovered from without an operator,
no run is lost or counted twice, and SIGTERM stops everything within seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.db.models import Count
from django_q.tasks import async_task
from redis import Redis

from kernelbot import redis_clients
from leaderboards.actions import check_submission, do_submit
from leaderboards.lifecycle import do_ingest_result
from leaderboards.models import TERMINAL_STATUSES, BoardEntry, Run, RunStatus, Submission
from runners import queue

from ..agents import start_agent
from ..conftest import REPO
from ..factories import LeaderboardFactory, UserFactory, ranked_result

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
CODE = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "correct.py").read_bytes()
# what two processes sharing one PostgreSQL session produce (issue 11)
SHARED_SESSION_ERRORS = ("the last operation didn't produce records", "can't change 'autocommit'",
                         "duplicate key value")


# --- processes, seen from outside through /proc -----------------------------------------------------------------

def parents() -> dict[int, int]:
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                found[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
    return found


def descendants(pid: int) -> set[int]:
    tree, found, todo = parents(), set(), [pid]
    while todo:
        parent = todo.pop()
        children = {child for child, ppid in tree.items() if ppid == parent}
        todo.extend(children - found)
        found |= children
    return found


def proc(pid: int, name: str) -> str:
    try:
        return (Path("/proc") / str(pid) / name).read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int) -> bool:
    state = proc(pid, "stat").rsplit(")", 1)[-1].split()[:1]
    return bool(state) and state[0] != "Z"  # a zombie holds nothing


def shared_database_sockets(root: int) -> dict[str, list[int]]:
    """PostgreSQL sockets that more than one process under `root` holds (what `ss -tnp | grep 5432` showed)."""
    port = f":{int(settings.DATABASES['default']['PORT'] or 5432):04X}"
    database = {line.split()[9] for name in ("tcp", "tcp6") for line in
                Path(f"/proc/net/{name}").read_text().splitlines()[1:] if line.split()[2].endswith(port)}
    holders: dict[str, list[int]] = {}
    for pid in descendants(root):
        with contextlib.suppress(OSError):
            for fd in (Path("/proc") / str(pid) / "fd").iterdir():
                with contextlib.suppress(OSError):
                    target = os.readlink(fd)
                    if target.startswith("socket:[") and target[8:-1] in database:
                        holders.setdefault(target[8:-1], []).append(pid)
    return {inode: pids for inode, pids in holders.items() if len(set(pids)) > 1}


def cluster_of(root: int) -> tuple[int, Path] | None:
    """The supervised qcluster under `root`: its pid (= process group) and its workers' heartbeat directory."""
    for pid in descendants(root):
        if "qcluster" in proc(pid, "cmdline") and alive(pid):
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) == pid:
                    environ = (Path("/proc") / str(pid) / "environ").read_bytes().decode(errors="replace")
                    env = dict(item.split("=", 1) for item in environ.split("\0") if "=" in item)
                    return pid, Path(env["KERNELBOT_CLUSTER_HEARTBEATS"])
    return None


def workers(cluster: tuple[int, Path]) -> list[int]:
    pgid, heartbeats = cluster
    found = []
    for path in heartbeats.iterdir() if heartbeats.is_dir() else []:
        if path.name.isdigit() and alive(int(path.name)):
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(int(path.name)) == pgid:
                    found.append(int(path.name))
    return found


def queue_lock_holder(cluster, expected_workers: int) -> int | None:
    """The idle worker blocked reading the task queue's pipe, i.e. holding the queue's reader lock, while every
    other worker waits for that lock on a futex."""
    pool = workers(cluster)
    if len(pool) != expected_workers:
        return None
    reading = [pid for pid in pool if "pipe" in proc(pid, "wchan")]
    waiting = [pid for pid in pool if "futex" in proc(pid, "wchan")]
    return reading[0] if len(reading) == 1 and len(waiting) == expected_workers - 1 else None


# --- the platform under test ----------------------------------------------------------------------------------------

def start(tmp_path: Path, *command: str, redis_url: str = "") -> tuple[subprocess.Popen, Path]:
    db = settings.DATABASES["default"]
    env = {**os.environ, "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
           "REDIS_URL": redis_url or settings.REDIS_URL, "DB_POOL": "1", "Q_WORKERS": "2", "Q_RECYCLE": "4",
           "KERNELBOT_RUNS_DIR": str(tmp_path / "runs"), "KERNELBOT_CASE_BUDGET_S": "0.5",
           "KERNELBOT_HEARTBEAT_DEADLINE": "8", "KERNELBOT_CLUSTER_STALL_SECONDS": "10"}
    log = tmp_path / f"{command[0]}.log"
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "manage.py", *command], cwd=REPO, env=env, stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    return process, log


@contextlib.contextmanager
def running(tmp_path: Path, *command: str, redis_url: str = ""):
    process, log = start(tmp_path, *command, redis_url=redis_url)
    try:
        yield process, log
    finally:
        family = descendants(process.pid)
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for pid in family:  # whatever outlived it (a failing test): nothing may keep the test database open
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        print(f"--- {log.name} (tail) ---\n" + log.read_text(errors="replace")[-3000:])


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}: "
                         f"{dict(Run.objects.values_list('status').annotate(n=Count('pk')))}")


def submit(leaderboard, count: int, mode: str = "test") -> list[int]:
    """`count` submissions' runs. A node agents' run is dispatched by its submission, not sent to the workers; a ranked
    one ("leaderboard") sends them its rank task when it ends."""
    ids = []
    for _ in range(count):
        user = UserFactory()
        request = check_submission(user, leaderboard.name, ["CPU"], mode, "kernel.py",
                                   CODE + f"\n# {user.username}\n".encode())
        ids.extend(run.pk for run in do_submit(user, request).new_runs)
    return ids


def all_terminal(run_ids: list[int]) -> bool:
    return not Run.objects.filter(pk__in=run_ids).exclude(status__in=TERMINAL_STATUSES).exists()


def assert_each_run_done_once(run_ids: list[int]) -> int:
    """Every run passed exactly once; each earlier attempt was retried with its reason kept. Returns the retries."""
    retried = 0
    for run in Run.objects.filter(pk__in=run_ids).prefetch_related("attempts"):
        attempts = list(run.attempts.all())
        assert (run.status, run.passed) == (RunStatus.SUCCEEDED, True), (run.pk, run.status, run.error)
        assert [a.number for a in attempts] == list(range(1, run.attempt + 1)), (run.pk, attempts)
        assert [a.outcome for a in attempts] == ["retried"] * (run.attempt - 1) + ["succeeded"], (run.pk, attempts)
        assert all(a.reason for a in attempts[:-1]), [(a.number, a.reason) for a in attempts]
        assert run.infra_failures == run.attempt - 1
        retried += run.attempt - 1
    return retried


def busy_agent(agents: dict[str, subprocess.Popen]) -> tuple[str, int] | None:
    """A live node agent holding a run right now (its host, the run): the platform has the run RUNNING on its host.
    (Its processes cannot tell: a warm agent always has its template and spares under it.)"""
    for host, agent in agents.items():
        run = Run.objects.filter(status=RunStatus.RUNNING, runner__endswith=f"/ {host}").values_list("pk", flat=True)
        if agent.poll() is None and run:
            return host, run[0]
    return None


def kill_current_cluster(supervisor: int) -> int:
    """SIGKILL the cluster the supervisor runs now (its process group); returns its group id."""
    while True:
        cluster = wait_for(lambda: cluster_of(supervisor), 120, "a supervised cluster")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cluster[0], signal.SIGKILL)
            return cluster[0]


@pytest.mark.timeout(900)
@pytest.mark.slow(seconds=200)
def test_platform_heals_itself_from_a_killed_agent_a_wedged_queue_and_a_killed_cluster(
        capsys, postgres, redis_url, leaderboard, cpu_pool, runner_platform, tmp_path):
    hosts = ["localhost", "second-node"]  # two machines of the pool, each with its agent (both this CPU)
    agents = {host: start_agent(runner_platform.url, cpu_pool.name, host) for host in hosts}
    with running(tmp_path, "workers") as (supervisor, log):
        first = wait_for(lambda: cluster_of(supervisor.pid), 120, "the supervised cluster")
        try:
            # 1. a node agent SIGKILLed while it runs a harness: its run is retried, then systemd restarts it
            runs = submit(leaderboard, 20)
            host, killed_run = wait_for(lambda: busy_agent(agents), 180, "an agent running a harness")
            victim = agents[host]
            os.killpg(victim.pid, signal.SIGKILL)
            victim.wait()
            wait_for(lambda: Run.objects.filter(pk=killed_run, infra_failures=1).exists(), 30,
                     "the killed agent's run to be retried")
            agents[host] = start_agent(runner_platform.url, cpu_pool.name, host)
            wait_for(lambda: all_terminal(runs), 400, "the first batch")
            assert not shared_database_sockets(supervisor.pid)  # workers were re-forked every 4 tasks (Q_RECYCLE)

            # 2. an idle worker holding the task queue's reader lock: the others block on it until the supervisor
            # acts
            os.kill(wait_for(lambda: queue_lock_holder(first, 2), 120, "the idle worker holding the queue lock"),
                    signal.SIGKILL)
            runs += submit(leaderboard, 10, "leaderboard")  # 20 runs, whose rank tasks go to the wedged cluster
            second = wait_for(lambda: (c := cluster_of(supervisor.pid)) and c[0] != first[0] and c, 300,
                              "the wedged cluster to be replaced")
            wait_for(lambda: all_terminal(runs), 400, "the second batch")
            wait_for(lambda: BoardEntry.objects.filter(leaderboard=leaderboard).count() == 10, 120,
                     "the new cluster to rank the second batch")
            assert not shared_database_sockets(supervisor.pid)

            # 3. the whole cluster, with runs in flight: the agents go on; what the cluster had pulled from the broker
            # is dispatched by the supervisor, and the runs' rank tasks by the new cluster
            runs += submit(leaderboard, 20)
            killed = kill_current_cluster(supervisor.pid)  # the supervisor may have replaced `second` since
            last_kill = time.time()
            wait_for(lambda: all_terminal(runs), 600, "every run to reach a terminal state")
            finished = max(Run.objects.filter(pk__in=runs).values_list("finished_at", flat=True)).timestamp()
            with capsys.disabled():  # the figure the issue asks for, shown in the CI log
                print(f"\nlast kill → last terminal state: {finished - last_kill:.1f} s (target ≤ 90 s)")
            assert wait_for(lambda: (c := cluster_of(supervisor.pid)) and c[0] not in (first[0], second[0], killed), 60,
                            "the killed cluster to be replaced")
        finally:
            for agent in agents.values():
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()

    assert len(runs) == 60 and Submission.objects.count() == 50
    retried = assert_each_run_done_once(runs)
    assert retried >= 1 and Run.objects.get(pk=killed_run).attempts.filter(
        reason__contains="did not report back").exists(), "a run whose agent died is retried once its heartbeats stop"
    output = log.read_text(errors="replace")
    assert "restarting it" in output
    assert not [error for error in SHARED_SESSION_ERRORS if error in output], output[-5000:]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)
def test_serve_recovers_a_wedged_queue_and_stops_everything_on_sigterm(capsys, postgres, redis_url, leaderboard,
                                                                        tmp_path):
    with running(tmp_path, "serve", "--no-demo", "--port", str(free_port())) as (serve, log):
        cluster = wait_for(lambda: cluster_of(serve.pid), 180, "the supervised cluster")
        os.kill(wait_for(lambda: queue_lock_holder(cluster, 2), 120, "the idle worker holding the queue lock"),
                signal.SIGKILL)
        runs = submit(leaderboard, 1, "leaderboard")
        wait_for(lambda: all_terminal(runs), 240, "the runs, dispatched by their submission")
        # their rank task waits in the wedged cluster's queue: the supervisor replaces it, and the new one ranks them
        wait_for(lambda: (now := cluster_of(serve.pid)) and now[0] != cluster[0], 120,
                 "the supervisor replacing the wedged cluster")
        wait_for(lambda: BoardEntry.objects.filter(leaderboard=leaderboard).exists(), 120, "the rank")
        assert_each_run_done_once(runs)

        family = descendants(serve.pid)
        assert len(family) >= 7  # daphne, the node agent, the supervisor, qcluster, its sentinel, workers, monitor…
        stopped = time.monotonic()
        serve.send_signal(signal.SIGTERM)
        serve.wait(timeout=60)
        wait_for(lambda: not any(alive(pid) for pid in family), 60, "every process to exit")
        with capsys.disabled():
            print(f"\nSIGTERM → every process gone: {time.monotonic() - stopped:.1f} s")
    output = log.read_text(errors="replace")
    assert "runs sent to it waited; restarting it" in output


@pytest.mark.timeout(600)
def test_a_busy_pool_never_delays_a_rank_and_the_broker_holds_no_copies(capsys, postgres, redis_url, leaderboard,
                                                                        cpu_pool, tmp_path):
    """Every device busy and 50 runs waiting for one: ranked results still reach the board within moments (rank
    tasks are not queued behind runs: no task waits for a device), and the broker never holds more messages than
    waiting runs plus schedules, restarts included."""
    queue_key = f"django_q:{settings.Q_CLUSTER['name']}:q"  # the suite's deployment: this process's and the workers'
    redis = Redis.from_url(settings.REDIS_URL)
    redis.delete(queue_key)
    ranked = LeaderboardFactory(problem=leaderboard.problem, gpu_types=[cpu_pool.cpu])
    with running(tmp_path, "workers") as (supervisor, log):
        wait_for(lambda: cluster_of(supervisor.pid), 120, "the supervised cluster")
        waiting = submit(leaderboard, 50)  # the pool's one device is taken by nobody's agent: they all wait
        most = 0
        deadline = time.monotonic() + 120
        while Run.objects.filter(pk__in=waiting, status=RunStatus.QUEUED).exists() and time.monotonic() < deadline:
            most = max(most, redis.llen(queue_key))
            time.sleep(0.05)
        assert not Run.objects.filter(pk__in=waiting, status=RunStatus.QUEUED).exists(), "every run was dispatched"
        assert most <= len(waiting) + 2  # schedules: the check and the tick
        # what the broker still holds: first messages of runs the reaper dispatched itself after 5 s (each a no-op
        # now); a restart adds no copy of them
        before = redis.llen(queue_key)
        os.killpg(cluster_of(supervisor.pid)[0], signal.SIGKILL)  # a restart re-sends nothing
        wait_for(lambda: cluster_of(supervisor.pid), 120, "the restarted cluster")
        assert redis.llen(queue_key) <= before + 2

        delays = []
        for i in range(6):
            user = UserFactory()
            submission = do_submit(user, check_submission(user, ranked.name, ["CPU"], "leaderboard", "k.py",
                                                          CODE + f"\n# ranked {i}\n".encode()))
            wait_for(lambda s=submission: not s.runs.filter(status=RunStatus.QUEUED).exists(), 60, "its dispatch")
            for run in submission.runs.all():  # its results come in (from a runner elsewhere): it is ranked now
                assert do_ingest_result(run.pk, run.attempt, ranked_result([1000.0 + i]))
            finished = time.monotonic()
            wait_for(lambda u=user: BoardEntry.objects.filter(user=u).exists(), 60, "the board entry")
            delays.append(time.monotonic() - finished)
        with capsys.disabled():
            delays.sort()
            print(f"\nwith 50 runs waiting for a device: result → on the board p50 {delays[len(delays) // 2]:.2f} s, "
                  f"max {delays[-1]:.2f} s (target ≤ 2 s); broker held at most {most} messages for 50 runs")
    assert Run.objects.filter(pk__in=waiting, status=RunStatus.DISPATCHED).count() == 50  # still waiting their turn


@pytest.mark.timeout(600)
def test_runs_queued_while_redis_hung_are_dispatched_within_seconds_while_later_ones_go_ahead(
        postgres, redis_server, leaderboard, cpu_pool, tmp_path, settings, monkeypatch):
    """Redis SIGSTOPped while runs are submitted (issue 35): their enqueues give up after the client's timeout (the
    first one's message may still arrive when Redis resumes, the next ones are never sent), later runs' messages go
    through once it is back, and a busy worker keeps the stall check quiet. The lost runs are dispatched by the
    supervisor's reaper within seconds, not at the queued deadline (300 s)."""
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": redis_server.url}
    broker = redis_clients.Broker()  # this process sends where the workers read: the suite's deployment's queue
    monkeypatch.setattr(queue, "broker", lambda: broker)
    with running(tmp_path, "workers", redis_url=redis_server.url) as (supervisor, log):
        cluster = wait_for(lambda: cluster_of(supervisor.pid), 120, "the supervised cluster")
        async_task("time.sleep", 120, broker=broker)  # one worker stays busy: the stall check never fires
        wait_for(lambda: any(path.read_text().startswith("busy") for path in cluster[1].glob("[0-9]*")), 60,
                 "a busy worker")
        redis_server.hang()
        lost = submit(leaderboard, 2)
        redis_server.resume()
        redis_clients.forget_failures()  # this process's window: the next send tries Redis again
        later = submit(leaderboard, 2)
        assert Run.objects.filter(pk__in=lost + later).count() == 4
        wait_for(lambda: not Run.objects.filter(pk__in=lost + later, status=RunStatus.QUEUED).exists(), 60,
                 "every run, those whose messages were lost too, to be dispatched")
    assert Run.objects.filter(pk__in=lost, attempt=1, infra_failures=0).count() == 2
