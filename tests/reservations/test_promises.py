"""Exact expiry and promised starts (issue 25): a reservation ends at its end time, whatever plans first; a queued
request's start, once given, never moves later; early ends move starts earlier; one warning per threshold."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from django.utils import timezone

from kernelbot.errors import Refused
from runners.reservations import actions, allocator, planner, tasks
from runners.reservations.actions import ReserveRequest
from runners.reservations.models import DeviceHold, Reservation
from tests import factories

from .conftest import gpu_pool

REAL_NOW = timezone.now


def at(monkeypatch, moment) -> None:
    monkeypatch.setattr(timezone, "now", lambda: moment)


def reserve(user, count=2, minutes=60) -> Reservation:
    return actions.do_reserve(user, ReserveRequest("H100", count, minutes))


def test_planner_keeps_promises_and_compresses_after_an_early_end():
    devices = [planner.Device(i, 0, 100.0) for i in range(2)]
    first = planner.plan(0, devices, [planner.Request("a", 2, 50), planner.Request("b", 1, 30)])
    assert (first["a"].start, first["b"].start) == (100, 150)
    promised = [planner.Request(k, r.count, r.seconds, first[k].start, first[k].devices)
                for k, r in (("a", planner.Request("a", 2, 50)), ("b", planner.Request("b", 1, 30)))]
    # a newcomer fills what is left and moves no one
    again = planner.plan(0, devices, [*promised, planner.Request("c", 1, 200)])
    assert (again["a"].start, again["b"].start) == (100, 150) and again["c"].start == 150
    # the hold ends early: both move up, in promise order
    early = planner.plan(0, [planner.Device(i, 0, 20.0) for i in range(2)], promised)
    assert (early["a"].start, early["b"].start) == (20, 70)
    # a promise the world broke (a device gone) is planned again; the others keep theirs, or better
    kept = first["b"].devices[0]
    broken = planner.plan(0, [planner.Device(kept, 0, 100.0)], promised)
    assert broken["a"] is None and broken["b"] == planner.Placement(100, 0, (kept,))


@pytest.mark.django_db
def test_reserving_over_a_reservation_past_its_end_expires_it_first(user, other, monkeypatch, sync_queue):
    gpu_pool(nodes=1, per_node=2)
    mine = reserve(user, 2, 30)
    at(monkeypatch, mine.ends_at + timedelta(seconds=5))  # no tick has run since its end
    theirs = reserve(other, 2, 30)
    assert theirs.status == "active"
    mine.refresh_from_db()
    assert mine.status == "expired"
    assert set(mine.holds.values_list("ended", flat=True)) == {mine.ends_at}
    assert [e.kind for e in mine.events.all()][-1] == "expired"


@pytest.mark.django_db
def test_extending_while_another_is_past_its_end(user, other, monkeypatch, sync_queue):
    gpu_pool(nodes=1, per_node=4)
    theirs = reserve(other, 2, 30)
    mine = reserve(user, 2, 60)
    waiting = reserve(factories.UserFactory(username="w"), 2, 30)
    assert waiting.planned_start == theirs.ends_at
    at(monkeypatch, theirs.ends_at + timedelta(seconds=5))
    mine = actions.do_extend(user, mine.pk, 10)
    assert mine.minutes == 70
    waiting.refresh_from_db()
    theirs.refresh_from_db()
    assert theirs.status == "expired" and waiting.status == "active"
    with pytest.raises(Refused, match="only a pending or active one"):
        actions.do_extend(other, theirs.pk, 10)
    at(monkeypatch, mine.ends_at + timedelta(seconds=1))
    with pytest.raises(Refused, match="is expired"):  # its own end passed: expired, not extended
        actions.do_extend(user, mine.pk, 10)


@pytest.mark.django_db
def test_keep_time_frees_devices_at_the_end_and_starts_the_promised(user, other, monkeypatch, sync_queue,
                                                                     django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2)
    mine = reserve(user, 2, 30)
    waiting = reserve(other, 2, 30)
    assert waiting.planned_start == mine.ends_at
    at(monkeypatch, mine.ends_at - timedelta(seconds=1))
    assert tasks.keep_time() == 0
    at(monkeypatch, mine.ends_at + timedelta(seconds=1))
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.keep_time() == 2  # one pool planned, one request started
        assert tasks.keep_time() == 0
    mine.refresh_from_db()
    waiting.refresh_from_db()
    assert mine.status == "expired" and waiting.status == "active"
    assert waiting.started_at == mine.ends_at + timedelta(seconds=1)  # its promise, to the tick


@pytest.mark.django_db
def test_an_early_end_moves_every_start_earlier(user, other, sync_queue, django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2)
    first = reserve(user, 2, 60)
    second = reserve(other, 2, 60)
    third = reserve(factories.UserFactory(username="third"), 1, 30)
    assert third.planned_start == second.planned_start + timedelta(minutes=60)
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_cancel(user, first.pk)
    second.refresh_from_db()
    third.refresh_from_db()
    assert second.status == "active"
    assert third.planned_start == second.ends_at


@pytest.mark.django_db
def test_no_promise_ever_moves_later_through_the_service_layer(monkeypatch, sync_queue,
                                                             django_capture_on_commit_callbacks):
    gpu_pool(nodes=2, per_node=4, max_gpus_per_user=64, max_gpu_hours_per_user=10**4, max_duration_minutes=10**4)
    users = [factories.UserFactory(username=f"p{i}") for i in range(4)]
    rng = random.Random(25)
    now = REAL_NOW()
    promises: dict[int, object] = {}
    moved_earlier = refused = 0
    for _ in range(60):
        roll = rng.random()
        with django_capture_on_commit_callbacks(execute=True):
            if roll < 0.45:
                reserve(rng.choice(users), rng.choice((1, 2, 4)), rng.choice((15, 30, 60, 120)))
            elif roll < 0.65 and Reservation.objects.open().exists():
                r = rng.choice(list(Reservation.objects.open()))
                actions.do_cancel(r.user, r.pk)
            elif roll < 0.8 and Reservation.objects.filter(status="active").exists():
                r = rng.choice(list(Reservation.objects.filter(status="active")))
                try:
                    actions.do_extend(r.user, r.pk, rng.choice((10, 30)))
                except Refused as exc:
                    assert "would delay" in exc.message
                    refused += 1
            else:
                now += timedelta(minutes=rng.choice((5, 20, 45)))
                at(monkeypatch, now)
                tasks.keep_time()
        for r in Reservation.objects.filter(status="pending"):
            if r.pk in promises:
                assert r.planned_start <= promises[r.pk], r
                moved_earlier += r.planned_start < promises[r.pk]
            promises[r.pk] = r.planned_start
        held = list(DeviceHold.objects.held().values_list("gpu_id", flat=True))
        assert len(held) == len(set(held))
    print(f"promises moved earlier {moved_earlier} times; extensions refused {refused}")
    assert moved_earlier


@pytest.mark.django_db
def test_a_run_overrunning_its_limit_breaks_a_promise_without_a_500(user, monkeypatch, sync_queue):
    pool = gpu_pool(nodes=1, per_node=1)
    hold = allocator.acquire_for_run(pool, pool.gpu_type, run_id=7, attempt=1, user_id=None, leaderboard="lb",
                                     seconds=60, lease_seconds=600)
    queued = reserve(user, 1, 30)
    assert queued.planned_start == hold.ends
    at(monkeypatch, hold.ends + timedelta(seconds=30))  # the run is still going, its lease renewed
    assert actions.do_plan(pool.pk, pool.gpu_type.pk) == 0
    queued.refresh_from_db()
    assert queued.status == "pending" and queued.planned_start > hold.ends
    assert queued.events.filter(kind="replanned").exists()
    allocator.release_run_hold(hold.pk)
    assert actions.do_plan(pool.pk, pool.gpu_type.pk) == 1


@pytest.mark.django_db
def test_a_short_reservation_is_warned_once(user, monkeypatch, sync_queue, django_capture_on_commit_callbacks):
    gpu_pool(nodes=1, per_node=2)
    sent = []
    monkeypatch.setattr(actions, "NOTIFIERS", [lambda u, m: sent.append(m)])
    mine = reserve(user, 1, 5)
    at(monkeypatch, mine.started_at + timedelta(seconds=30))
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.tick()["warned"] == 1
        assert tasks.tick()["warned"] == 0
    assert len([m for m in sent if "ends in" in m]) == 1


def test_planner_places_a_multi_node_request_all_or_nothing():
    devices = [planner.Device(0, 0, 0.0), planner.Device(1, 0, 0.0), planner.Device(2, 1, 100.0),
               planner.Device(3, 1, 0.0)]
    placed = planner.plan(0, devices, [planner.Request("two", 2, 50, nodes=2), planner.Request("one", 1, 100)])
    assert placed["two"] == planner.Placement(100, 0, (0, 1, 2, 3))  # node 1 is whole only at 100
    assert placed["one"].start == 0 and placed["one"].node == 0  # the hole before it on node 0
    assert planner.plan(0, devices, [planner.Request("three", 1, 10, nodes=3)])["three"] is None


@pytest.mark.django_db
def test_a_two_node_reservation(user, other, sync_queue, django_capture_on_commit_callbacks):
    gpu_pool(nodes=3, per_node=4)
    both = actions.do_reserve(user, ReserveRequest("H100", 4, 60, nodes=2))
    assert both.status == "active" and both.total_gpus == 8
    assert len(both.hostnames()) == 2 and both.holds.held().count() == 8
    assert {h.node_id for h in both.holds.all()} == {g.node_id for g in both.gpus()}
    waiting = actions.do_reserve(other, ReserveRequest("H100", 4, 30, nodes=2))  # one node free: waits for two
    assert waiting.status == "pending" and waiting.planned_start == both.ends_at
    third = factories.UserFactory(username="third")
    assert actions.do_reserve(third, ReserveRequest("H100", 4, 30)).status == "active"  # the third node, now
    with pytest.raises(Refused, match="at most 3 nodes lend 4"):
        actions.do_reserve(third, ReserveRequest("H100", 4, 30, nodes=4))
    with pytest.raises(Refused, match="nodes must be at least 1"):
        actions.do_reserve(third, ReserveRequest("H100", 1, 30, nodes=0))
    with pytest.raises(Refused, match="at most 8 GPUs per user"):
        actions.do_reserve(user, ReserveRequest("H100", 1, 30, nodes=1))
    with django_capture_on_commit_callbacks(execute=True):
        actions.do_cancel(user, both.pk)
    waiting.refresh_from_db()
    assert waiting.status == "active" and len(waiting.hostnames()) == 2
    held = list(DeviceHold.objects.held().values_list("gpu_id", flat=True))
    assert len(held) == len(set(held)) == 12
