"""Real concurrency on PostgreSQL: threads with their own connections, and worker processes killed mid-transaction."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import httpx
import pytest
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Sum
from django.utils import timezone

from leaderboards.access.actions import do_create_token
from runners.reservations import actions, allocator, tasks
from runners.reservations.actions import ReserveRequest
from runners.reservations.models import DeviceHold, Reservation, ReservationStatus
from tests import factories
from tests.conftest import REPO
from tests.servers import granian, production_env

from .conftest import gpu_pool

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def in_threads(n: int, work: Callable[[int], object]) -> list:
    barrier = threading.Barrier(n)

    def one(i: int):
        try:
            barrier.wait()
            return work(i)
        except Exception as exc:  # noqa: BLE001 - returned to the test, which asserts on it
            return exc
        finally:
            connection.close()

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def free(reservation: Reservation) -> None:
    """End a reservation behind the actions' back (as if it expired), leaving its queue to the next planning pass."""
    with transaction.atomic():
        allocator.release_reservation(reservation)
        Reservation.objects.filter(pk=reservation.pk).update(status=ReservationStatus.ENDED)


def assert_no_overlap() -> None:
    spans: dict[int, list] = {}
    for h in DeviceHold.objects.order_by("started", "pk"):
        spans.setdefault(h.gpu_id, []).append(h)
    for holds in spans.values():
        for a, b in zip(holds, holds[1:], strict=False):
            assert a.ended is not None and a.ended <= b.started, (a, b)


def test_fifty_concurrent_requests_for_ten_gpus(postgres):
    pool = gpu_pool(nodes=5, per_node=2)
    users = [factories.UserFactory(username=f"u{i}") for i in range(50)]
    results = in_threads(50, lambda i: actions.do_reserve(users[i], ReserveRequest("H100", 1, 60)))
    assert not [r for r in results if isinstance(r, Exception)]
    assert Reservation.objects.filter(status="active").count() == 10
    assert Reservation.objects.filter(status="pending").count() == 40
    held = list(DeviceHold.objects.held().values_list("gpu_id", flat=True))
    assert len(held) == len(set(held)) == 10
    # the stored queue start times are the planner's now, and availability's ETA is where a 51st would start
    placements, queue, *_ = allocator.plan_queue(pool, pool.gpu_type, timezone.now())
    for r in queue:
        assert abs(r.planned_start.timestamp() - placements[r.pk].start) < 1e-3
    starts = sorted(r.planned_start for r in queue)
    first_end = min(Reservation.objects.filter(status="active").values_list("ends_at", flat=True))
    assert abs((starts[0] - first_end).total_seconds()) < 1 and starts[-1] - starts[0] >= timedelta(minutes=180)
    [row] = actions.availability(minutes=60)
    late = actions.do_reserve(factories.UserFactory(username="late"), ReserveRequest("h100", 1, 60))
    assert abs((late.planned_start - row.eta[1]).total_seconds()) < 1


def test_cancel_racing_activation_never_resurrects(postgres):
    pool = gpu_pool(nodes=1, per_node=1)
    holder, waiter = factories.UserFactory(username="holder"), factories.UserFactory(username="waiter")
    outcomes = set()
    for _ in range(8):
        first = actions.do_reserve(holder, ReserveRequest("H100", 1, 60))
        queued = actions.do_reserve(waiter, ReserveRequest("H100", 1, 60))
        assert queued.status == "pending"
        free(first)
        results = in_threads(2, lambda i, pk=queued.pk: actions.do_plan(pool.pk, pool.gpu_type.pk) if i == 0
                             else actions.do_cancel(waiter, pk))
        assert not [r for r in results if isinstance(r, Exception)]
        queued.refresh_from_db()
        outcomes.add(queued.status)
        assert queued.status in ("cancelled", "ended")
        assert not DeviceHold.objects.held().exists()
        kinds = list(queued.events.values_list("kind", flat=True))
        assert "active" not in kinds[kinds.index(queued.status):]
    assert_no_overlap()


def killed_inside(target: str, call: str, reach: str) -> None:
    """Run `call` in a fresh worker process whose `target` pauses inside its transaction; kill it there."""
    db = settings.DATABASES["default"]
    url = f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    code = f"""
import django, sys, time
django.setup()
import {target.rsplit('.', 1)[0]} as mod
real = mod.{target.rsplit('.', 1)[1]}
def paused(*a, **k):
    out = real(*a, **k)
    print("{reach}", flush=True)
    time.sleep(60)
    return out
mod.{target.rsplit('.', 1)[1]} = paused
from leaderboards.access.actions import do_create_token
from runners.reservations import actions, tasks
{call}
"""
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tests.settings"}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == reach
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_worker_killed_during_activation_and_expiry_leaves_one_state(postgres, monkeypatch):
    pool = gpu_pool(nodes=1, per_node=2)
    user = factories.UserFactory(username="dev")
    blocker = actions.do_reserve(factories.UserFactory(username="b"), ReserveRequest("H100", 2, 60))
    queued = actions.do_reserve(user, ReserveRequest("H100", 2, 30))
    free(blocker)
    killed_inside("runners.reservations.allocator.activate", f"actions.do_plan({pool.pk}, {pool.gpu_type.pk})",
                  "activated")
    queued.refresh_from_db()
    assert queued.status == "pending" and not DeviceHold.objects.held().exists()
    assert tasks.tick()["started"] == 1
    queued.refresh_from_db()
    assert queued.status == "active" and DeviceHold.objects.held().count() == 2

    Reservation.objects.filter(pk=queued.pk).update(ends_at=timezone.now() - timedelta(seconds=1))
    killed_inside("runners.reservations.allocator.release_reservation", "tasks.tick()", "released")
    queued.refresh_from_db()
    assert queued.status == "active" and DeviceHold.objects.held().count() == 2
    assert tasks.tick()["expired"] == 1 and tasks.tick()["expired"] == 0
    queued.refresh_from_db()
    assert queued.status == "expired" and not DeviceHold.objects.held().exists()
    assert set(queued.holds.values_list("ended", flat=True)) == {queued.ends_at}


def test_runs_and_reservations_never_share_a_device(postgres):
    pool = gpu_pool(nodes=1, per_node=4)
    users = [factories.UserFactory(username=f"r{i}") for i in range(2)]
    got = {"runs": 0, "reservations": 0}

    def work(i: int) -> None:
        for k in range(12):
            if i < 4:
                hold = allocator.acquire_for_run(pool, pool.gpu_type, run_id=i * 100 + k, attempt=1, user_id=None,
                                                 leaderboard="lb", seconds=60, lease_seconds=60)
                if hold:
                    got["runs"] += 1
                    allocator.release_run_hold(hold.pk)
            else:
                r = actions.do_reserve(users[i - 4], ReserveRequest("H100", 2, 60))
                got["reservations"] += r.status == "active"
                actions.do_cancel(users[i - 4], r.pk)

    results = in_threads(6, work)
    assert not [r for r in results if isinstance(r, Exception)]
    assert got["runs"] > 0 and got["reservations"] > 0
    assert not DeviceHold.objects.held().exists()
    assert_no_overlap()


@pytest.fixture
def web(transactional_db, postgres, tmp_path):
    """The production layout's web server (granian, two workers, production settings) on the test database."""
    with granian(production_env(tmp_path), tmp_path / "granian.log") as url:
        yield url


def test_a_burst_of_fifty_reserves_over_http(web):
    """The issue's burst: 50 reservations at once from 10 users on 2 nodes × 4 devices, through the API of the
    production layout. No 5xx, no device held twice; every request is recorded at once and, after the planning pass
    it asked for, active or promised a start. The p95 is printed (bench/reserve.py measures it with workers running)."""
    gpu_pool(nodes=2, per_node=4)
    users = [factories.UserFactory(username=f"burst{i}") for i in range(10)]
    tokens = [do_create_token(u)[1] for u in users]
    clients = [httpx.Client(base_url=web, timeout=60, headers={"Authorization": f"Bearer {tokens[i % 10]}"})
               for i in range(50)]
    for c in clients:  # connected and used once: the burst times the server, not connecting or a worker's first use
        assert c.get("/api/v1/gpus/reservations").status_code == 200

    def reserve(i: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        response = clients[i].post("/api/v1/gpus/reservations",
                                   json={"gpu_type": "H100", "gpu_count": 1 + i % 2, "minutes": 30 + i})
        return response.status_code, time.perf_counter() - t0

    try:
        results = in_threads(50, reserve)
        assert not [r for r in results if isinstance(r, Exception)], results
        codes = sorted(code for code, _ in results)
        assert set(codes) <= {201, 409}, codes  # 409: a user's limit (8 GPUs at once), never a 5xx
        assert codes.count(201) == Reservation.objects.count() >= 40
        assert not DeviceHold.objects.exists()  # recorded only: no worker runs here to plan them
        latencies = sorted(t for _, t in results)
        print(f"\n50 reserves, 10 users, PostgreSQL, granian × 2 workers: p50 {latencies[24] * 1000:.0f} ms, "
              f"p95 {latencies[47] * 1000:.0f} ms, max {latencies[-1] * 1000:.0f} ms")
        Reservation.objects.filter(status="pending").update(minutes=30)  # room under the limits for ten more
        alone = sorted(reserve(i)[1] for i in range(10))  # the same requests one at a time: the service time
        print(f"the same one at a time: median {alone[5] * 1000:.0f} ms")
    finally:
        for c in clients:
            c.close()
    tasks.keep_time()  # what `manage.py workers` ticks every 2 s (and the passes the requests asked for do at once)
    assert not Reservation.objects.filter(status="pending", planned_start=None).exists()
    held = list(DeviceHold.objects.held().values_list("gpu_id", flat=True))
    assert len(held) == len(set(held)) == Reservation.objects.filter(status="active").aggregate(
        n=Sum("gpu_count"))["n"] == 8
    assert_no_overlap()


def test_reserves_racing_over_a_reservation_past_its_end(postgres):
    """The issue's 500: a reservation past its end (no tick yet) while many reserve at once; every planning pass
    expires it first, exactly one of them does, and nobody gets an error."""
    gpu_pool(nodes=1, per_node=4)
    old = actions.do_reserve(factories.UserFactory(username="old"), ReserveRequest("H100", 4, 30))
    Reservation.objects.filter(pk=old.pk).update(ends_at=timezone.now() - timedelta(seconds=5))
    DeviceHold.objects.filter(reservation=old).update(ends=timezone.now() - timedelta(seconds=5))
    users = [factories.UserFactory(username=f"racer{i}") for i in range(12)]
    results = in_threads(12, lambda i: actions.do_reserve(users[i], ReserveRequest("H100", 1, 30 + i)))
    assert not [r for r in results if isinstance(r, Exception)], results
    tasks.keep_time()  # the passes a burst left to it
    old.refresh_from_db()
    assert old.status == "expired" and list(old.events.filter(kind="expired").values_list("kind", flat=True)) == [
        "expired"]
    assert Reservation.objects.filter(status="active").count() == 4
    assert not Reservation.objects.filter(status="pending", planned_start=None).exists()
    assert DeviceHold.objects.held().count() == 4
    assert_no_overlap()
