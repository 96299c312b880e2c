"""Node agents take a run's device from the allocator that reservations use: while a reservation holds the pool's
only device, the run waits dispatched and the agent is never given it; it runs once the reservation ends, and its
hold is recorded for the usage reports under its user and leaderboard."""

from __future__ import annotations

import pytest

from leaderboards.actions import check_submission, do_submit
from leaderboards.models import RunStatus
from runners.reservations.actions import ReserveRequest, do_cancel, do_reserve
from runners.reservations.models import DeviceHold, HoldKind, PoolPolicy, ReservationStatus

from ..agents import drain
from ..conftest import REPO
from ..factories import UserFactory

pytestmark = [pytest.mark.django_db, pytest.mark.slow]
FAST = (REPO / "problems" / "demo" / "vectoradd_py" / "solutions" / "fast.py").read_bytes()


def test_a_run_waits_for_a_reserved_device_and_runs_when_it_is_freed(
        leaderboard, cpu_pool, sync_queue, django_capture_on_commit_callbacks, settings):
    settings.HARNESS_TIMING = {**settings.HARNESS_TIMING, "rel_ci": 0.05, "case_budget_s": 1, "max_samples": 200}
    PoolPolicy.objects.create(pool=cpu_pool, competition_share=0)
    developer, competitor = UserFactory(username="dev"), UserFactory(username="competitor")
    reservation = do_reserve(developer, ReserveRequest(gpu_type="cpu", gpu_count=1, minutes=30))
    assert reservation.status == ReservationStatus.ACTIVE

    request = check_submission(competitor, leaderboard.name, ["CPU"], "test", "fast.py", FAST)
    with django_capture_on_commit_callbacks(execute=True):
        submission = do_submit(competitor, request)  # dispatched; the node's agent asks for work and gets none
    run = submission.runs.get()
    assert run.status == RunStatus.DISPATCHED and not DeviceHold.objects.filter(kind=HoldKind.RUN).exists()
    assert drain(cpu_pool) == 0  # asked again: still reserved

    with django_capture_on_commit_callbacks(execute=True):
        do_cancel(developer, reservation.pk)
        assert drain(cpu_pool) == 1
    run.refresh_from_db()
    assert run.status == RunStatus.SUCCEEDED, (run.verdict, run.error)
    reserved = DeviceHold.objects.get(kind=HoldKind.RESERVATION, reservation=reservation)
    held = DeviceHold.objects.get(kind=HoldKind.RUN, run_id=run.pk)
    assert held.gpu_id == reserved.gpu_id and reserved.ended is not None and held.ended is not None
    assert held.started >= reserved.ended  # never both at once
    # it was queued for the pool while the device was reserved, and given its device once it was freed: it waited
    assert run.first_queued_at < reserved.ended <= run.dispatched_at
    assert (held.user_id, held.leaderboard) == (competitor.pk, leaderboard.name)
