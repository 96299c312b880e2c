"""The one allocator: which `Gpu` rows a run attempt or a reservation gets. Every decision is taken with the pool ×
GPU type's device rows locked (`SELECT … FOR UPDATE`, in primary-key order, so runs and planning passes queue behind
each other and never deadlock), and every grant is a `DeviceHold` row; the partial unique index on open holds is the
last word on double booking."""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from runners import wakeups
from runners.models import Gpu, GpuPool, GpuType
from runners.queue import enqueue_on_commit

from . import planner, usage
from .models import DeviceHold, HoldKind, PoolPolicy, Reservation, ReservationStatus


def current_holds(node_id: int, now: datetime):
    """The node's open reservation holds whose reservation's time is not up: one past `ends_at` is over for its node
    agent at once, though the reaper (`tasks.keep_time`, every few seconds) has yet to mark it expired."""
    return DeviceHold.objects.held().filter(Q(reservation=None) | Q(reservation__ends_at__gt=now),
                                            kind=HoldKind.RESERVATION, gpu__node_id=node_id)


def reserved_indices(node_id: int) -> list[int]:
    """The node's devices a reservation holds now (its agent leaves their processes alone; any other device that no
    run of its own holds is swept clean)."""
    return sorted(current_holds(node_id, timezone.now()).values_list("gpu__index", flat=True).distinct())


def reservations_on(node_id: int) -> list[dict]:
    """The reservations holding devices of the node now, `{"id", "gpus", "ends_in"}` each: its agent kills the
    processes of a reservation once it is no longer here, also when the next one holds the same devices, and asks
    again `ends_in` seconds from now (when it ends, if not extended), so an expiry is acted on as soon as a cancel."""
    now = timezone.now()
    held: dict[int, list[int]] = {}
    ends: dict[int, datetime] = {}
    for rid, index, ends_at in current_holds(node_id, now).exclude(reservation=None).values_list(
            "reservation_id", "gpu__index", "reservation__ends_at"):
        held.setdefault(rid, []).append(index)
        ends[rid] = ends_at
    return [{"id": rid, "gpus": sorted(gpus), "ends_in": round((ends[rid] - now).total_seconds(), 3)}
            for rid, gpus in sorted(held.items())]


def run_lease_seconds() -> float:
    """A run's hold lapses as fast as its heartbeat deadline, so a dead worker's device is back when its run is."""
    return float(settings.RUN_HEARTBEAT_DEADLINE)


def devices(pool: GpuPool, gpu_type: GpuType, *, lock: bool = False) -> list[Gpu]:
    qs = Gpu.objects.filter(node__pool=pool, node__enabled=True, enabled=True, gpu_type=gpu_type)
    if lock:
        qs = qs.select_for_update(of=("self",))
    return list(qs.select_related("node").order_by("pk"))


def lock_devices(pool: GpuPool, gpu_type: GpuType) -> None:
    """Lock the pool × type's device rows (primary-key order) without loading them."""
    list(Gpu.objects.select_for_update(of=("self",)).filter(node__pool=pool, gpu_type=gpu_type).order_by("pk")
         .values_list("pk", flat=True))


def kept_for_competitions(policy: PoolPolicy | None, gpus: list[Gpu]) -> set[int]:
    """The devices reservations never take: the pool's share, from the end of the node order (whole nodes first)."""
    share = policy.competition_share if policy else 1.0
    keep = math.ceil(round(share * len(gpus), 9))
    ordered = sorted(gpus, key=lambda g: (g.node.hostname, g.node_id, g.index), reverse=True)
    return {g.pk for g in ordered[:keep]}


def kept_among(pool: GpuPool, gpu_type: GpuType, gpus: list[Gpu]) -> set[int]:
    """`kept_for_competitions` of the pool's devices of the type, among `gpus`; the pool's devices are read (as
    bare tuples) only when its share keeps some but not all: a node's claim in a pool of thousands of devices."""
    policy = PoolPolicy.objects.filter(pool=pool).first()
    share = policy.competition_share if policy else 1.0
    if share >= 1 or share <= 0:
        return {g.pk for g in gpus} if share >= 1 else set()
    rows = list(Gpu.objects.filter(node__pool=pool, node__enabled=True, enabled=True, gpu_type=gpu_type)
                .values_list("pk", "node__hostname", "node_id", "index"))
    keep = math.ceil(round(share * len(rows), 9))
    return {row[0] for row in sorted(rows, key=lambda r: r[1:], reverse=True)[:keep]} & {g.pk for g in gpus}


def open_holds(gpu_ids: Iterable[int]) -> dict[int, DeviceHold]:
    return {h.gpu_id: h for h in DeviceHold.objects.held().filter(gpu_id__in=list(gpu_ids))
            .only("gpu_id", "ends", "reservation_id", "kind")}


def to_seconds(moment: datetime) -> float:
    return moment.timestamp()


def planner_devices(gpus: list[Gpu], kept: set[int], holds: dict[int, DeviceHold], now: datetime
                    ) -> list[planner.Device]:
    """What the planner may place reservations on, each busy until its open hold's planned end. A hold past its end
    is not free yet: a run overrunning its time limit keeps its device until its lease lapses; a reservation's is
    ended by the next planning pass, which expires it first."""
    def busy(hold: DeviceHold) -> float:
        if hold.ends > now:
            return to_seconds(hold.ends)
        return to_seconds(now) + (run_lease_seconds() if hold.kind == HoldKind.RUN else 1.0)
    return [planner.Device(g.pk, g.node_id, busy(holds[g.pk]) if g.pk in holds else 0.0)
            for g in gpus if g.pk not in kept]


def requests(queue: Iterable[Reservation]) -> list[planner.Request]:
    """The queue as the planner reads it: each request with the start and devices it was promised."""
    return [planner.Request(r.pk, r.gpu_count, r.minutes * 60,
                            to_seconds(r.planned_start) if r.planned_start and r.planned_gpus else None,
                            tuple(r.planned_gpus) if r.planned_start else (), r.node_count) for r in queue]


def plan_queue(pool: GpuPool, gpu_type: GpuType, now: datetime, extra: Iterable[planner.Request] = (),
               *, lock: bool = False, policy: PoolPolicy | None = None, queue: list[Reservation] | None = None,
               compress: bool = True) -> tuple[dict, list[Reservation], list[Gpu], set[int]]:
    """Plan the pool × type's queue (plus hypothetical `extra` requests at its end) from the devices' current holds
    and the queue's promises."""
    gpus = devices(pool, gpu_type, lock=lock)
    if policy is None:
        policy = PoolPolicy.objects.filter(pool=pool).first()
    kept = kept_for_competitions(policy, gpus)
    holds = open_holds(g.pk for g in gpus)
    if queue is None:
        queue = list(Reservation.objects.queue(pool, gpu_type))
    placements = planner.plan(to_seconds(now), planner_devices(gpus, kept, holds, now),
                              [*requests(queue), *extra], compress=compress)
    return placements, queue, gpus, kept


def activate(reservation: Reservation, gpus: list[Gpu], now: datetime) -> list[DeviceHold]:
    """PENDING → ACTIVE with holds on `gpus` (the caller holds their row locks and the reservation's); `node` is the
    first of its nodes."""
    gpus = sorted(gpus, key=lambda g: g.pk)
    reservation.update_status(ReservationStatus.ACTIVE, now=now, node_id=gpus[0].node_id, planned_start=None,
                              planned_gpus=[g.pk for g in gpus])
    wakeups.node_changed(gpus[0].node_id)  # on commit: its agent learns of the reservation and its keys
    return DeviceHold.objects.bulk_create(
        DeviceHold(gpu=g, node_id=g.node_id, pool_id=reservation.pool_id, gpu_type_id=g.gpu_type_id,
                   kind=HoldKind.RESERVATION, reservation=reservation, user_id=reservation.user_id,
                   project=reservation.project, started=now, ends=reservation.ends_at) for g in gpus)


def lock_gpus(ids: Iterable[int]) -> None:
    list(Gpu.objects.select_for_update().filter(pk__in=list(ids)).order_by("pk").values_list("pk", flat=True))


def end_hold(hold: DeviceHold, at: datetime) -> bool:
    """End an open hold at `at` and count it into the usage roll-up, in one transaction; False when it had already
    ended (so each hold is counted exactly once)."""
    with transaction.atomic():
        if not DeviceHold.objects.held().filter(pk=hold.pk).update(ended=at):
            return False
        hold.ended = at
        usage.add_hold(hold, at)
        if hold.node_id:
            wakeups.node_changed(hold.node_id)  # on commit: its agent asks again with the device free
    return True


def release_reservation(reservation: Reservation, at: datetime | None = None) -> int:
    """End the reservation's open holds at `at` (default: now, stamped under the devices' locks, so no later hold on
    them starts before it); the count of holds ended (0 the second time: exactly once)."""
    held = DeviceHold.objects.held().filter(reservation=reservation)
    lock_gpus(held.values_list("gpu_id", flat=True))
    at = at or timezone.now()
    return sum(end_hold(hold, at) for hold in held)


# ---- runs --------------------------------------------------------------------------------------------------------

def acquire_for_run(pool: GpuPool, gpu_type: GpuType, *, run_id: int, attempt: int, user_id: int | None,
                    leaderboard: str, seconds: float, lease_seconds: float) -> DeviceHold | None:
    """A device for one run attempt, or None when every one is held or promised to a reservation about to start.
    Devices kept for competitions come first, then those no queued reservation is planned on."""
    with transaction.atomic():
        gpus = devices(pool, gpu_type, lock=True)
        now = timezone.now()
        holds = open_holds(g.pk for g in gpus)
        lapsed = DeviceHold.objects.held().filter(gpu__in=gpus, kind=HoldKind.RUN, lease_until__lt=now)
        for hold in lapsed:  # a dead worker's: ended at its last renewal, not used after
            end_hold(hold, hold.lease_until)
            holds.pop(hold.gpu_id, None)
        existing = DeviceHold.objects.held().filter(kind=HoldKind.RUN, run_id=run_id, run_attempt=attempt).first()
        if existing:
            return existing
        soon = now + timedelta(seconds=seconds)
        promised = {pk for r in Reservation.objects.filter(
                        pool=pool, gpu_type=gpu_type, status=ReservationStatus.PENDING, planned_start__lte=soon)
                    for pk in r.planned_gpus}
        kept = kept_for_competitions(PoolPolicy.objects.filter(pool=pool).first(), gpus)
        free = [g for g in gpus if g.pk not in holds and g.pk not in promised]
        if not free:
            return None
        gpu = min(free, key=lambda g: (g.pk not in kept, g.pk))
        return DeviceHold.objects.create(
            gpu=gpu, node_id=gpu.node_id, pool=pool, gpu_type=gpu_type, kind=HoldKind.RUN, run_id=run_id,
            run_attempt=attempt, user_id=user_id, project=leaderboard, leaderboard=leaderboard, started=now,
            ends=soon, lease_until=now + timedelta(seconds=lease_seconds))


def acquire_on_node(gpus: list[Gpu], count: int, *, run_id: int, attempt: int, user_id: int | None,
                    leaderboard: str, seconds: float, lease_seconds: float) -> list[DeviceHold]:
    """`count` (at least one) of `gpus` — one node's devices of one type that its agent says are free — for a run
    attempt, or [] when fewer are free of holds and of reservations about to start. Devices kept for competitions
    come first, as in `acquire_for_run`."""
    if not gpus:
        return []
    count = max(1, count)
    pool, gpu_type = gpus[0].node.pool, gpus[0].gpu_type
    with transaction.atomic():
        ids = {g.pk for g in gpus}
        lock_gpus(ids)
        now = timezone.now()
        this_run = Q(kind=HoldKind.RUN, run_id=run_id, run_attempt=attempt)
        rows = list(DeviceHold.objects.held().filter(Q(gpu_id__in=ids) | this_run))  # one read for all three uses
        if existing := [h for h in rows if h.kind == HoldKind.RUN and (h.run_id, h.run_attempt) == (run_id, attempt)]:
            return existing
        holds: dict[int, DeviceHold] = {}
        for hold in rows:
            if hold.kind == HoldKind.RUN and hold.lease_until is not None and hold.lease_until < now:
                end_hold(hold, hold.lease_until)  # a dead agent's: ended at its last renewal
            else:
                holds[hold.gpu_id] = hold
        soon = now + timedelta(seconds=seconds)
        promised = {pk for r in Reservation.objects.filter(
                        pool=pool, gpu_type=gpu_type, status=ReservationStatus.PENDING, planned_start__lte=soon)
                    for pk in r.planned_gpus}
        kept = kept_among(pool, gpu_type, gpus)
        free = sorted((g for g in gpus if g.pk not in holds and g.pk not in promised),
                      key=lambda g: (g.pk not in kept, g.pk))
        if len(free) < count:
            return []
        return [DeviceHold.objects.create(
            gpu=gpu, node_id=gpu.node_id, pool=pool, gpu_type=gpu_type, kind=HoldKind.RUN, run_id=run_id,
            run_attempt=attempt, user_id=user_id, project=leaderboard, leaderboard=leaderboard, started=now,
            ends=soon, lease_until=now + timedelta(seconds=lease_seconds)) for gpu in free[:count]]


def hold_placement(pool: GpuPool, hostname: str, indices: list[int], *, run_id: int, attempt: int,
                   user_id: int | None, leaderboard: str, seconds: float) -> list[DeviceHold]:
    """A remote run's job started on `hostname`'s devices `indices` (its scheduler chose them): where the pool's
    inventory has them, they are held for the run until it ends (Run.update_status) or its budget lapses, so the
    planner gives no reservation a device a run is using. Devices held already (inventory out of date) are left be."""
    with transaction.atomic():
        gpus = list(Gpu.objects.select_for_update().filter(node__pool=pool, node__hostname=hostname, enabled=True,
                                                           index__in=indices))
        if not gpus or DeviceHold.objects.held().filter(kind=HoldKind.RUN, run_id=run_id, run_attempt=attempt).exists():
            return []
        now = timezone.now()
        holds = open_holds(g.pk for g in gpus)
        until = now + timedelta(seconds=seconds)
        return [DeviceHold.objects.create(
            gpu=gpu, node_id=gpu.node_id, pool=pool, gpu_type_id=gpu.gpu_type_id, kind=HoldKind.RUN, run_id=run_id,
            run_attempt=attempt, user_id=user_id, project=leaderboard, leaderboard=leaderboard, started=now,
            ends=until, lease_until=until) for gpu in gpus if gpu.pk not in holds]


def renew_attempt_holds(run_id: int, attempt: int, lease_seconds: float) -> int:
    return DeviceHold.objects.held().filter(kind=HoldKind.RUN, run_id=run_id, run_attempt=attempt).update(
        lease_until=timezone.now() + timedelta(seconds=lease_seconds))


def end_attempt_holds(run_id: int, attempt: int) -> int:
    """End a run attempt's holds now (its run left the device: result, failure, retry, cancel); once each."""
    now = timezone.now()
    ended = sum(end_hold(hold, now) for hold in
                DeviceHold.objects.held().filter(kind=HoldKind.RUN, run_id=run_id, run_attempt=attempt))
    if ended:
        for pool_id, gpu_type_id in DeviceHold.objects.filter(run_id=run_id, run_attempt=attempt).values_list(
                "pool_id", "gpu_type_id").distinct():
            if Reservation.objects.filter(pool_id=pool_id, gpu_type_id=gpu_type_id,
                                          status=ReservationStatus.PENDING).exists():
                enqueue_on_commit("runners.reservations.tasks.plan_pool", pool_id, gpu_type_id)
    return ended


def renew_run_hold(hold_id: int, lease_seconds: float) -> bool:
    return bool(DeviceHold.objects.held().filter(pk=hold_id).update(
        lease_until=timezone.now() + timedelta(seconds=lease_seconds)))


def release_run_hold(hold_id: int) -> bool:
    """End a run's hold (once); tell the pool's queue when a reservation is waiting for its devices."""
    with transaction.atomic():
        lock_gpus(DeviceHold.objects.filter(pk=hold_id).values_list("gpu_id", flat=True))
        hold = DeviceHold.objects.held().select_for_update().filter(pk=hold_id).first()
        if hold is None or not end_hold(hold, timezone.now()):
            return False
        if Reservation.objects.queue(hold.pool, hold.gpu_type).exists():
            enqueue_on_commit("runners.reservations.tasks.plan_pool", hold.pool_id, hold.gpu_type_id)
    return True


def end_lapsed_run_holds(now: datetime | None = None) -> int:
    """Holds of runs whose worker died: ended at their last renewed lease (their devices were not used after)."""
    now = now or timezone.now()
    ended = 0
    for hold in DeviceHold.objects.held().filter(kind=HoldKind.RUN).filter(
            Q(lease_until__lt=now) | Q(lease_until__isnull=True, ends__lt=now)):
        ended += end_hold(hold, hold.lease_until or hold.ends)
    return ended


@contextlib.contextmanager
def leased(hold: DeviceHold, lease_seconds: float) -> Iterator[DeviceHold]:
    """Keep a run's hold leased while the block runs (a thread renews it every lease/4), then release it."""
    stop = threading.Event()

    def renew() -> None:
        try:
            while not stop.wait(lease_seconds / 4):
                renew_run_hold(hold.pk, lease_seconds)
        finally:
            connection.close()

    thread = threading.Thread(target=renew, name=f"lease-{hold.pk}", daemon=True)
    thread.start()
    try:
        yield hold
    finally:
        stop.set()
        thread.join()
        release_run_hold(hold.pk)
