"""Reserve, queue, cancel, extend, expire, warn, hooks: the service layer on the test database."""

from __future__ import annotations

import json
import socket
import stat
from datetime import timedelta

import pytest
from django.utils import timezone

from leaderboards.errors import Refused
from runners.reservations import actions, allocator, tasks
from runners.reservations.actions import ReserveRequest
from runners.reservations.models import DeviceHold, Reservation
from tests import factories

from .conftest import gpu_pool


def reserve(user, count=2, minutes=60, gpu="h100", plan=True, **kw) -> Reservation:
    return actions.do_reserve(user, ReserveRequest(gpu, count, minutes, **kw), plan=plan)


REAL_NOW = timezone.now


def later(monkeypatch, minutes: float) -> None:
    moved = REAL_NOW() + timedelta(minutes=minutes)
    monkeypatch.setattr(timezone, "now", lambda: moved)


@pytest.mark.django_db
def test_reserve_activates_queues_and_starts_when_freed(user, other, django_capture_on_commit_callbacks,
                                                        sync_queue):
    gpu_pool(nodes=1, per_node=4)
    first = reserve(user, 4, 60)
    assert first.status == "active" and first.holds.held().count() == 4
    waiting = reserve(other, 2, 30)
    assert waiting.status == "pending"
    assert abs((waiting.planned_start - first.ends_at).total_seconds()) < 1
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_cancel(user, first.pk)
    waiting.refresh_from_db()
    assert waiting.status == "active"
    assert DeviceHold.objects.held().count() == 2
    with pytest.raises(Refused) as exc:
        actions.do_cancel(user, first.pk)
    assert exc.value.status == 409 and "already ended" in exc.value.message


@pytest.mark.django_db
@pytest.mark.parametrize(("req", "status", "words"), [
    (ReserveRequest("A100", 1, 60), 400, "Unknown GPU type 'A100'"),
    (ReserveRequest("H100", 9, 60), 400, "do not fit on one node"),
    (ReserveRequest("H100", 0, 60), 400, "at least 1"),
    (ReserveRequest("H100", 1, 0), 400, "at least 1 minute"),
    (ReserveRequest("H100", 1, -5), 400, "at least 1 minute"),
    (ReserveRequest("H100", 1, 25 * 60), 400, "longer than the longest"),
    (ReserveRequest("H100", 1, 60, pool="nope"), 400, "No reservable pool 'nope'"),
])
def test_bad_requests_change_nothing(user, req, status, words):
    gpu_pool()
    with pytest.raises(Refused) as exc:
        actions.do_reserve(user, req)
    assert exc.value.status == status and words in exc.value.message
    assert not Reservation.objects.exists()


@pytest.mark.django_db
def test_policy_limits_per_user(user):
    gpu_pool(max_gpus_per_user=4, max_gpu_hours_per_user=6)
    reserve(user, 3, 60)
    with pytest.raises(Refused, match="at most 4 GPUs per user"):
        reserve(user, 2, 60)
    with pytest.raises(Refused, match="at most 6 GPU-hours"):
        reserve(user, 1, 4 * 60)
    assert Reservation.objects.count() == 1


@pytest.mark.django_db
def test_competition_share_is_never_reserved(user, other):
    pool = gpu_pool(nodes=2, per_node=4, competition_share=0.5)
    reserve(user, 4, 60)
    with pytest.raises(Refused, match="lends at most 4"):
        reserve(other, 5, 60)
    queued = reserve(other, 1, 60)
    assert queued.status == "pending"
    kept = DeviceHold.objects.filter(pool=pool).values_list("node__hostname", flat=True).distinct()
    assert list(kept) == ["lab-node0"]  # node1 is the competitions' half


@pytest.mark.django_db
def test_extend_only_when_no_one_queued_is_delayed(user, other):
    gpu_pool(nodes=1, per_node=2)
    mine = reserve(user, 2, 60)
    extended = actions.do_extend(user, mine.pk, 30)
    assert extended.minutes == 90 and extended.ends_at - extended.started_at == timedelta(minutes=90)
    reserve(other, 1, 30)
    with pytest.raises(Refused) as exc:
        actions.do_extend(user, mine.pk, 30)
    assert exc.value.status == 409 and "delay 1 queued" in exc.value.message
    with pytest.raises(Refused) as exc:
        actions.do_extend(other, mine.pk, 30)
    assert exc.value.status == 404
    with pytest.raises(Refused, match="past pool lab's maximum"):
        actions.do_extend(user, mine.pk, 24 * 60)
    mine.refresh_from_db()
    assert mine.minutes == 90


@pytest.mark.django_db
def test_tick_warns_twice_then_expires_exactly_once(user, other, monkeypatch, sync_queue,
                                                    django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2)
    sent = []
    monkeypatch.setattr(actions, "NOTIFIERS", [lambda u, m: sent.append((u.username, m))])
    mine = reserve(user, 2, 40)
    waiting = reserve(other, 2, 30)
    later(monkeypatch, 12)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick()["warned"] == 1
        assert tasks.tick()["warned"] == 0
    later(monkeypatch, 36)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick()["warned"] == 1
    assert [m for _, m in sent if "ends in" in m] and len([m for _, m in sent if "ends in" in m]) == 2
    later(monkeypatch, 41)
    with django_capture_on_commit_callbacks(execute=True):
        first = tasks.tick()
        second = tasks.tick()
    assert first["expired"] == 1 and second["expired"] == 0
    mine.refresh_from_db()
    waiting.refresh_from_db()
    assert mine.status == "expired" and waiting.status == "active"
    ended = mine.holds.values_list("ended", flat=True)
    assert all(e == mine.ends_at for e in ended)
    assert DeviceHold.objects.held().filter(reservation=mine).count() == 0
    assert [e.kind for e in mine.events.all()][-1] == "expired"


@pytest.mark.django_db
def test_an_extension_re_arms_only_the_warnings_still_ahead(user, monkeypatch, sync_queue,
                                                           django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2)
    mine = reserve(user, 1, 20)
    later(monkeypatch, 1)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick()["warned"] == 1  # 19 minutes left: the 30-minute warning
        actions.do_extend(user, mine.pk, 5)  # 24 minutes left: still inside 30, nothing new to say
        assert tasks.tick()["warned"] == 0
        actions.do_extend(user, mine.pk, 30)  # 54 minutes left: the 30-minute warning will come again
        assert tasks.tick()["warned"] == 0
    later(monkeypatch, 26)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick()["warned"] == 1
    assert [e.message.split(" (")[0] for e in mine.events.filter(kind="warning")] == [
        f"Reservation {mine.pk} ends in 19 min", f"Reservation {mine.pk} ends in 29 min"]


@pytest.mark.django_db
def test_start_and_end_hooks_get_the_details(user, tmp_path, sync_queue, django_capture_on_commit_callbacks):
    script = tmp_path / "hook.sh"
    out = tmp_path / "calls"
    script.write_text(f"#!/bin/sh\n{{ cat; echo; echo \"$KB_RESERVATION_PHASE $KB_RESERVATION_HOSTNAME "
                      f"$KB_RESERVATION_GPUS\"; }} >> {out}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    gpu_pool(nodes=1, per_node=2, start_hook=str(script), end_hook=f"{script} end",
             access_note="ssh {user}@{hostname} (GPUs {gpus})")
    with django_capture_on_commit_callbacks(execute=True):
        mine = reserve(user, 2, 60)
    mine.refresh_from_db()
    assert mine.start_hook_done_at is not None
    assert mine.access["note"] == "ssh dev@lab-node0 (GPUs 0,1)"
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_cancel(user, mine.pk)
    lines = out.read_text().splitlines()
    assert json.loads(lines[0])["user"] == "dev" and json.loads(lines[0])["phase"] == "start"
    assert lines[1] == "start lab-node0 0,1" and lines[3] == "end lab-node0 0,1"


@pytest.mark.django_db
def test_failing_start_hook_fails_and_frees(user, sync_queue, django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2, start_hook="sh -c 'echo no keys >&2; exit 3'")
    with django_capture_on_commit_callbacks(execute=True):
        mine = reserve(user, 2, 60)
    mine.refresh_from_db()
    assert mine.status == "failed" and "exited 3: no keys" in mine.failure
    assert not DeviceHold.objects.held().exists()


@pytest.mark.django_db
def test_availability_eta_is_the_queue_start(user, other):
    gpu_pool(nodes=1, per_node=4)
    reserve(user, 3, 60)
    [row] = actions.availability(minutes=30)
    assert (row.free_now, row.queued) == (1, 0)
    assert row.eta[8] is None
    eta_two = row.eta[2]
    queued = reserve(other, 2, 30)
    assert queued.status == "pending" and abs((queued.planned_start - eta_two).total_seconds()) < 1


@pytest.mark.django_db
def test_extending_a_queued_request_moves_it_behind_the_promises_it_would_break(user, other):
    gpu_pool(nodes=1, per_node=2)
    reserve(factories.UserFactory(username="third"), 2, 60)
    first = reserve(user, 2, 60)
    second = reserve(other, 2, 60)
    slot = first.planned_start
    first = actions.do_extend(user, first.pk, 30)  # 90 minutes no longer fit before the second's promise
    second.refresh_from_db()
    assert second.planned_start == slot  # moved up into the room the first left: earlier, never later
    assert first.minutes == 90 and first.planned_start == slot + timedelta(minutes=60)
    second = actions.do_extend(other, second.pk, 30)  # the same for the second, and the first moves up in turn
    first.refresh_from_db()
    assert first.planned_start == slot and second.planned_start == slot + timedelta(minutes=90)


@pytest.mark.django_db
def test_a_dead_workers_run_hold_ends_at_its_lease(monkeypatch):
    pool = gpu_pool(nodes=1, per_node=1)
    hold = allocator.acquire_for_run(pool, pool.gpu_type, run_id=7, attempt=1, user_id=None, leaderboard="lb",
                                     seconds=600, lease_seconds=60)
    assert allocator.acquire_for_run(pool, pool.gpu_type, run_id=8, attempt=1, user_id=None, leaderboard="lb",
                                     seconds=600, lease_seconds=60) is None
    later(monkeypatch, 2)
    assert tasks.tick()["holds"] == 1 and tasks.tick()["holds"] == 0
    hold.refresh_from_db()
    assert hold.ended == hold.lease_until
    assert allocator.acquire_for_run(pool, pool.gpu_type, run_id=8, attempt=1, user_id=None, leaderboard="lb",
                                     seconds=600, lease_seconds=60) is not None


@pytest.mark.django_db
def test_requests_from_the_api_ask_for_few_passes_and_none_is_missed(user, other, monkeypatch):
    """`plan=False` (the API): the request is recorded and a pass is asked of the workers, once while one is asked and
    has not begun; a request recorded after a pass began asks for the next, which keeps its distance from the last."""
    gpu_pool(nodes=1, per_node=2)
    asked, slept = [], []
    monkeypatch.setattr(actions, "enqueue", lambda func, *args: asked.append(args))
    monkeypatch.setattr(actions.transaction, "on_commit", lambda f: f())  # the test's transaction never commits
    a = reserve(user, 1, 30, plan=False)
    b = reserve(other, 1, 30, plan=False)
    assert a.status == b.status == "pending" and a.planned_start is None and len(asked) == 1
    assert not DeviceHold.objects.exists()
    monkeypatch.setattr(actions.time, "sleep", slept.append)
    assert actions.do_asked_pass(*asked[0]) == 2 and not slept
    c = reserve(user, 1, 30, plan=False)
    assert len(asked) == 2
    assert actions.do_asked_pass(*asked[1]) == 0  # no device is free: c is promised the first end
    assert len(slept) == 1 and 0 < slept[0] <= actions.PASS_SPACING
    c.refresh_from_db()
    a.refresh_from_db()
    assert c.status == "pending" and c.planned_start == a.ends_at


@pytest.mark.django_db
def test_a_reserve_with_the_cache_away_is_recorded_and_still_asks_for_its_pass(user, settings, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on: every cache call fails to connect
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    settings.CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                                   "LOCATION": f"redis://127.0.0.1:{dead}/0"}}
    gpu_pool(nodes=1, per_node=2)
    asked = []
    monkeypatch.setattr(actions, "enqueue", lambda func, *args: asked.append(args))
    monkeypatch.setattr(actions.transaction, "on_commit", lambda f: f())
    a, b = reserve(user, 1, 30, plan=False), reserve(user, 1, 30, plan=False)
    assert len(asked) == 2  # no flag to share: each asks
    assert actions.do_asked_pass(*asked[0]) == 2 and actions.do_asked_pass(*asked[1]) == 0
    a.refresh_from_db()
    b.refresh_from_db()
    assert a.status == b.status == "active"
