"""Pool health checks through the normal run path on the real harness: pass, fail, recover; the check's board stays
internal."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leaderboards.health import CHECK_BOARD, CHECK_DIR, CHECK_HOOK, do_finish_pool_checks, do_start_pool_check, tick
from leaderboards.lifecycle import dispatch_run
from leaderboards.models import Leaderboard, Run, RunStatus
from runners.models import CheckOutcome, GpuPool, PoolCheck, PoolHealth

from ..agents import drain
from ..factories import UserFactory, submission

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def check(pool: GpuPool, capture) -> GpuPool:
    """A round on the real harness; its runs' `on_finish` hook records their outcome the moment they end."""
    with capture(execute=True):
        do_start_pool_check(pool)
    pool.refresh_from_db()
    return pool


def test_a_pool_passes_fails_and_recovers_and_queued_runs_go_once_it_does(
        cpu_pool, leaderboard, settings, sync_queue, django_capture_on_commit_callbacks, admin_client, client):
    pool = check(cpu_pool, django_capture_on_commit_callbacks)
    assert pool.health == PoolHealth.OK and pool.last_ok_at and pool.last_checked_at == pool.last_ok_at
    devices, run_check = sorted(PoolCheck.objects.filter(pool=pool), key=lambda c: c.run_id or 0)
    assert devices.outcome == run_check.outcome == CheckOutcome.OK and devices.run_id is None
    run = Run.objects.get(pk=run_check.run_id)
    assert run.status == RunStatus.SUCCEEDED and run.runner == f"{pool.name} / localhost"
    assert "(node localhost) passed on cpu" in run_check.detail
    assert run.submission.leaderboard.internal and run.submission.mode == "test"
    assert run.pool == pool and run.on_finish == CHECK_HOOK and run.attempts.get().pool == pool

    settings.HARNESS_PYTHON = "/bin/false"  # the machine's Python is broken: no probe, no harness
    first_ok = pool.last_ok_at
    pool = check(pool, django_capture_on_commit_callbacks)
    assert pool.health == PoolHealth.FAILING and pool.last_ok_at == first_ok  # its one node is out of service
    assert pool.health_detail.startswith("localhost is out of service: its health check failed: run ")
    assert "ended Error: remote runner: node localhost: RuntimeError: the harness template" in pool.health_detail
    failed_run = Run.objects.get(pk=PoolCheck.objects.filter(pool=pool, run_id__isnull=False).first().run_id)
    assert failed_run.is_terminal  # cancelled by the check, or given up: never left running
    listing = admin_client.get("/admin/runners/gpupool/").content.decode()
    assert "✖ Failing since" in listing

    waiting = submission(leaderboard, mode="test", code=(CHECK_DIR / "submission.py").read_text()).runs.get()
    dispatch_run(waiting.pk)
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.QUEUED and waiting.attempt == 0

    settings.HARNESS_PYTHON = ""
    pool = check(pool, django_capture_on_commit_callbacks)
    assert pool.health == PoolHealth.OK and pool.last_ok_at > first_ok and pool.health_detail == ""
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.DISPATCHED  # sent again as soon as its pool passed
    assert drain(pool) == 1  # where the node's agent takes it
    waiting.refresh_from_db()
    assert waiting.status == RunStatus.SUCCEEDED

    # the check's board is nobody's page, list or figure
    assert Leaderboard.objects.filter(name=CHECK_BOARD, internal=True).exists()
    staff = UserFactory(username="staffer", is_staff=True)
    assert not Leaderboard.objects.visible_to(staff).filter(internal=True).exists()
    client.force_login(staff)
    assert CHECK_BOARD not in client.get("/").content.decode()
    assert client.get(f"/lb/{CHECK_BOARD}/").status_code == 404
    assert CHECK_BOARD not in client.get("/api/v1/leaderboards").content.decode()
    assert CHECK_BOARD not in client.get("/u/kernelbot-health-check/").content.decode()


def test_a_check_without_a_result_fails_at_its_deadline_and_cancels_its_run(cpu_pool, settings,
                                                                            django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=False):  # no worker picks the run up
        do_start_pool_check(cpu_pool)
    assert do_start_pool_check(cpu_pool) == []  # one round at a time
    pending = PoolCheck.objects.get(pool=cpu_pool, outcome=CheckOutcome.PENDING)
    assert do_finish_pool_checks() == 0
    late = pending.started_at + timedelta(seconds=settings.POOL_CHECK_TIMEOUT + 1)
    with django_capture_on_commit_callbacks(execute=False):  # never taken: the platform's fault, not the node's
        assert do_finish_pool_checks(now=late) == 0
    assert Run.objects.get(pk=pending.run_id).status == RunStatus.CANCELLED
    again = PoolCheck.objects.get(pool=cpu_pool, outcome=CheckOutcome.PENDING)
    assert again.node_id == pending.node_id and again.run_id != pending.run_id  # its turn again, a new run
    cpu_pool.refresh_from_db()
    assert cpu_pool.health != PoolHealth.FAILING and cpu_pool.nodes.get().in_service

    Run.objects.filter(pk=again.run_id).update(status=RunStatus.RUNNING)  # its node took it and sends nothing
    late = Run.objects.get(pk=again.run_id).first_queued_at + timedelta(seconds=settings.POOL_CHECK_TIMEOUT + 1)
    assert do_finish_pool_checks(now=late) == 1
    cpu_pool.refresh_from_db()
    assert cpu_pool.health == PoolHealth.FAILING
    assert f"no result within {settings.POOL_CHECK_TIMEOUT} s (the run was Running)" in cpu_pool.health_detail
    assert Run.objects.get(pk=again.run_id).status == RunStatus.CANCELLED


def test_the_schedule_checks_pools_that_are_due(cpu_pool, settings, django_capture_on_commit_callbacks):
    settings.POOL_CHECK_INTERVAL = 0
    assert tick() == 0 and not PoolCheck.objects.exists()
    settings.POOL_CHECK_INTERVAL = 900
    with django_capture_on_commit_callbacks(execute=False):
        assert tick() == 1
        assert tick() == 0  # its round is still running
    GpuPool.objects.filter(pk=cpu_pool.pk).update(enabled=False)
    PoolCheck.objects.update(outcome=CheckOutcome.OK)
    with django_capture_on_commit_callbacks(execute=False):
        assert tick() == 0  # disabled pools are checked only on request


def test_check_health_now_starts_a_round_from_the_pool_page(cpu_pool, admin_client, sync_queue,
                                                            django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks() as callbacks:
        page = admin_client.post(f"/admin/runners/gpupool/{cpu_pool.pk}/check-health/", follow=True)
    assert "Health check started for local" in page.content.decode()
    assert len(callbacks) == 1 and not PoolCheck.objects.exists()
    callbacks[0]()  # the worker's task; its run's dispatch stays uncommitted, so the round stays running
    assert PoolCheck.objects.filter(pool=cpu_pool, outcome=CheckOutcome.PENDING, gpu_type=cpu_pool.cpu).exists()
    page = admin_client.post("/admin/runners/gpupool/", {"action": "check_health", "_selected_action": [cpu_pool.pk]},
                             follow=True)
    assert "Already being checked: local." in page.content.decode()
    history = admin_client.get(f"/admin/runners/poolcheck/?pool__id__exact={cpu_pool.pk}").content.decode()
    assert "a CPU run" in history and "Running" in history and "/admin/leaderboards/run/" in history
    assert admin_client.get("/admin/runners/gpupool/").status_code == 200
    assert admin_client.get(f"/admin/runners/gpupool/{cpu_pool.pk}/check-health/").status_code == 405
