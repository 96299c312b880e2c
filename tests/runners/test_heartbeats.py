"""Runner heartbeats (a lost run is known in seconds), the attempt history, and forked children's connections."""

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from leaderboards import lifecycle
from leaderboards.lifecycle import dispatch_run
from leaderboards.models import Run, RunAttempt, RunStatus
from runners.backends.base import BACKENDS
from runners.models import GpuPool, PoolHealth

from ..conftest import REPO
from ..factories import ranked_result, submission

pytestmark = pytest.mark.django_db


def dispatched(run: Run, heartbeat: int | None = None) -> int:
    run.refresh_from_db()
    run.update_status(RunStatus.DISPATCHED, attempt=run.attempt + 1, runner="local", deadline_seconds=heartbeat)
    return run.attempt


def test_heartbeats_keep_a_live_run_and_stop_a_moved_on_runner(leaderboard, settings):
    settings.RUN_HEARTBEAT_DEADLINE = 15
    run = submission(leaderboard, mode="test").runs.get()
    attempt = dispatched(run, heartbeat=15)
    assert lifecycle.do_mark_running(run.pk, attempt, deadline_seconds=15)
    Run.objects.filter(pk=run.pk).update(status_deadline=timezone.now() + timedelta(seconds=1))
    assert lifecycle.do_heartbeat(run.pk, attempt, RunStatus.RUNNING)
    run.refresh_from_db()
    assert timedelta(seconds=14) < run.status_deadline - timezone.now() <= timedelta(seconds=15)
    assert not lifecycle.do_heartbeat(run.pk, attempt - 1, RunStatus.RUNNING)  # a stale attempt's runner
    assert not lifecycle.do_heartbeat(run.pk, attempt, RunStatus.DISPATCHED)  # the state it beat for is gone
    lifecycle.do_cancel_run(run)
    assert not lifecycle.do_heartbeat(run.pk, attempt, RunStatus.RUNNING)  # cancelled: the runner stops


def test_a_silent_runner_is_retried_after_its_heartbeat_deadline_and_every_reason_is_kept(leaderboard, settings):
    settings.RUN_HEARTBEAT_DEADLINE = 15
    run = submission(leaderboard, mode="test").runs.get()
    first = dispatched(run, heartbeat=15)
    lifecycle.do_mark_running(run.pk, first, deadline_seconds=15)
    assert lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(seconds=5)) == 0  # still beating
    assert lifecycle.do_reap_overdue_runs(now=timezone.now() + timedelta(seconds=16)) == 1  # not the 30 min cap
    run.refresh_from_db()
    assert (run.status, run.infra_failures) == (RunStatus.QUEUED, 1)
    assert not lifecycle.do_ingest_result(run.pk, first, ranked_result([1.0]))  # the lost runner's late report
    second = dispatched(run)
    assert lifecycle.do_report_failure(run.pk, second, "device vanished")
    third = dispatched(run)
    assert lifecycle.do_ingest_result(run.pk, third, ranked_result([1000.0]))
    run.refresh_from_db()
    assert (run.status, run.error, run.attempt, run.infra_failures) == (RunStatus.SUCCEEDED, "", 3, 2)
    attempts = list(run.attempts.values_list("number", "runner", "outcome", "reason"))
    assert attempts == [(1, "local", "retried", "the runner did not report back while running"),
                        (2, "local", "retried", "device vanished"),
                        (3, "local", "succeeded", "")]
    assert all(a.finished_at and a.dispatched_at <= a.finished_at for a in run.attempts.all())


def test_the_last_attempt_keeps_the_reason_it_failed_with(leaderboard, settings):
    settings.RUN_MAX_ATTEMPTS = 1
    run = submission(leaderboard, mode="test").runs.get()
    lifecycle.do_report_failure(run.pk, dispatched(run), "node lost")
    assert list(RunAttempt.objects.filter(run=run).values_list("outcome", "reason")) == [("error", "node lost")]


def test_a_pool_whose_backend_is_missing_fails_the_pool_and_its_runs_wait(leaderboard, cpu_pool, monkeypatch):
    monkeypatch.setitem(BACKENDS, "slurm", "runners.backends.not_installed.SlurmBackend")
    GpuPool.objects.filter(pk=cpu_pool.pk).update(backend="slurm")
    run = submission(leaderboard, mode="test").runs.get()
    dispatch_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.QUEUED and not run.attempts.exists()  # not the run's fault: it waits, uncharged
    cpu_pool.refresh_from_db()
    assert cpu_pool.health == PoolHealth.FAILING and "does not provide" in cpu_pool.health_detail
    Run.objects.filter(pk=run.pk).update(pool=cpu_pool)  # a health check's run: its check fails with the reason
    dispatch_run(run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.ERROR and "does not provide" in run.error


@pytest.mark.postgres
def test_a_forked_child_never_uses_its_parents_pooled_connection(postgres):
    """DB_POOL=1: a child forked after the parent used the pool (as django-q2 forks workers) opens its own session,
    and the parent's keeps working."""
    db = settings.DATABASES["default"]
    script = """
import os, django
django.setup()
from django.db import connection, connections
def backend():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]
def db_sockets():  # what `ss -tnp | grep 5432` lists for this process
    remote = {line.split()[9] for name in ("tcp", "tcp6") for line in open(f"/proc/self/net/{name}").readlines()[1:]
              if line.split()[2].endswith(os.environ["DB_PORT_HEX"])}
    mine = {os.readlink(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")
            if os.path.exists(f"/proc/self/fd/{fd}")}
    return " ".join(sorted(inode for inode in remote if f"socket:[{inode}]" in mine)) or "-"
parent = backend()
connections.close_all()  # as django-q2's sentinel does before it forks: back into the pool, still open
child = os.fork()
if child == 0:
    print("inherited", db_sockets(), flush=True)
    print("child", backend(), flush=True)
    connections.close_all()
    os._exit(0)
os.waitpid(child, 0)
print("sockets", db_sockets(), flush=True)
with connection.cursor() as cursor:  # the pool holds 2 sessions and may hand out the other one: ask the server
    cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [parent])
    print("parent", parent, cursor.fetchone()[0], flush=True)
"""
    env = {**os.environ, "DB_POOL": "1", "DJANGO_SETTINGS_MODULE": "kernelbot.settings",
           "DB_PORT_HEX": f":{int(db['PORT'] or 5432):04X}",
           "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"}
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    child, (parent, alive) = int(lines["child"]), map(int, lines["parent"].split())
    assert alive == 1, "the parent's pooled session must survive the child"
    assert child != parent, "the child must open its own PostgreSQL session"
    assert lines["sockets"] != "-" and not set(lines["inherited"].split()) & set(lines["sockets"].split()), \
        "the child must not even hold the parent's sockets"
