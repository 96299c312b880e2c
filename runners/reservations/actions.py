"""The service layer for reservations: every front-end (web, /api/v1, CLI through the API, Discord) calls these.
`check_*` validates and refuses with a precise `Refused`; `do_*` writes. A pool's reservation changes are serialised
on its policy row (`SELECT … FOR UPDATE`), so its limits hold under concurrency; devices are granted by the
allocator alone."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import SimpleNamespace

from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.db import IntegrityError, OperationalError, connection, transaction
from django.utils import timezone
from django_redis.exceptions import ConnectionInterrupted
from redis.exceptions import RedisError

from kernelbot.errors import AccessDenied, Refused
from runners.models import Gpu, GpuPool, GpuType, Node
from runners.queue import enqueue, enqueue_on_commit

from . import allocator, planner
from .access import access_for
from .models import OPEN, DeviceHold, HoldKind, PoolPolicy, Reservation, ReservationEvent, ReservationStatus

log = logging.getLogger(__name__)

ETA_COUNTS = (1, 2, 4, 8)
DEFAULT_ETA_MINUTES = 60
PASS_ASKED_TTL = 10  # seconds a pass asked for stays asked (a lost message is made up for by keep_time)
CACHE_AWAY = (ConnectionInterrupted, RedisError, OSError)
PASS_SPACING = 0.2  # seconds between the starts of asked passes of one pool × type
# Callables (user, message) that deliver a notice elsewhere (the Discord bot registers its DM sender here).
NOTIFIERS: list[Callable[[object, str], None]] = []


@dataclass
class ReserveRequest:
    gpu_type: str
    gpu_count: int  # on each node
    minutes: int
    project: str = ""
    pool: str = ""
    nodes: int = 1  # all or nothing, on nodes of one pool


def find_gpu_type(name: str) -> GpuType:
    found = GpuType.objects.filter(name__iexact=name.strip()).first()
    if found is None:
        known = ", ".join(GpuType.objects.values_list("name", flat=True)) or "none"
        raise Refused(f"Unknown GPU type '{name}'. Known types: {known}.", 400)
    return found


# The request path's reads are plain SQL: on a small shared host the ORM's building of these joins cost ten times
# their execution (bench/reserve.py). Same rules as `GpuPool.objects.serving` and `allocator.devices`.
TYPE_SQL = f"SELECT id, name FROM {GpuType._meta.db_table} WHERE upper(name) = upper(%s) ORDER BY id LIMIT 1"
POLICY_FIELDS = ("max_gpus_per_user", "max_gpu_hours_per_user", "competition_share", "max_duration_minutes",
                 "max_queue_minutes")
LENDING_SQL = f"""SELECT p.id, p.name, {", ".join(f"pol.{f}" for f in POLICY_FIELDS)}, n.id, n.hostname, g.id, g."index"
FROM {Gpu._meta.db_table} g JOIN {Node._meta.db_table} n ON n.id = g.node_id
JOIN {GpuPool._meta.db_table} p ON p.id = n.pool_id JOIN {PoolPolicy._meta.db_table} pol ON pol.pool_id = p.id
WHERE g.gpu_type_id = %s AND g.enabled AND n.enabled AND p.enabled AND pol.reservable ORDER BY p.id, g.id"""
BOOKED_SQL = f"""SELECT coalesce(sum(gpu_count * node_count), 0), coalesce(sum(gpu_count * node_count * minutes), 0)
FROM {Reservation._meta.db_table} WHERE user_id = %s AND pool_id = %s AND status IN ('pending', 'active')
AND id <> %s"""
LOCK_USER_SQL = f"SELECT id FROM {get_user_model()._meta.db_table} WHERE id = %s FOR NO KEY UPDATE"


def lending(gpu_type: GpuType) -> tuple[list[GpuPool], dict[int, list[int]]]:
    """The enabled pools that lend the type for reservations (each with its `reservation_policy`), and per pool the
    devices reservations may take on each of its nodes (largest first), in one query."""
    with connection.cursor() as cursor:
        cursor.execute(LENDING_SQL, [gpu_type.pk])
        rows = cursor.fetchall()
    pools: dict[int, GpuPool] = {}
    devices: dict[int, list[SimpleNamespace]] = {}
    for pool_id, name, *limits, node_id, hostname, gpu_id, index in rows:
        if pool_id not in pools:
            # rows as the ORM loads them with only(): any other field is read when first used
            pool = pools[pool_id] = GpuPool.from_db("default", ["id", "name"], [pool_id, name])
            pool.reservation_policy = PoolPolicy.from_db("default", ["pool_id", *POLICY_FIELDS], [pool_id, *limits])
            pool.reservation_policy.pool = pool
        devices.setdefault(pool_id, []).append(SimpleNamespace(pk=gpu_id, index=index, node_id=node_id,
                                                               node=SimpleNamespace(hostname=hostname)))
    sizes = {}
    for pool_id, mine in devices.items():
        kept = allocator.kept_for_competitions(pools[pool_id].reservation_policy, mine)
        per_node: dict[int, int] = {}
        for g in mine:
            if g.pk not in kept:
                per_node[g.node_id] = per_node.get(g.node_id, 0) + 1
        sizes[pool_id] = sorted(per_node.values(), reverse=True)
    return list(pools.values()), sizes


def check_reserve(user, req: ReserveRequest) -> tuple[GpuPool, GpuType]:
    """The request's pool (the one that starts it first when several fit) and type, or a precise `Refused`. The pool
    carries the policy it is lent under (`pool.reservation_policy`); both are read in two plain queries."""
    with connection.cursor() as cursor:
        cursor.execute(TYPE_SQL, [req.gpu_type.strip()])
        row = cursor.fetchone()
    gpu_type = GpuType.from_db("default", ["id", "name"], row) if row else find_gpu_type(req.gpu_type)
    if req.gpu_count < 1:
        raise Refused(f"gpu_count must be at least 1; got {req.gpu_count}.", 400)
    if req.nodes < 1:
        raise Refused(f"nodes must be at least 1; got {req.nodes}.", 400)
    if req.minutes < 1:
        raise Refused(f"The duration must be at least 1 minute; got {req.minutes}.", 400)
    if len(req.project) > 60:
        raise Refused("project is at most 60 characters.", 400)
    pools, sizes = lending(gpu_type)
    if req.pool:
        pools = [p for p in pools if p.name.lower() == req.pool.strip().lower()]
        if not pools:
            raise Refused(f"No reservable pool '{req.pool}' serves {gpu_type}.", 400)
    if not pools:
        raise Refused(f"No pool lends {gpu_type} GPUs for reservations.", 400)
    fitting = [p for p in pools if len([n for n in sizes[p.pk] if n >= req.gpu_count]) >= req.nodes]
    if not fitting and req.nodes == 1:
        raise Refused(f"{req.gpu_count} {gpu_type} GPUs do not fit on one node: a node lends at most "
                      f"{max((sizes[p.pk][0] for p in pools if sizes[p.pk]), default=0)}.", 400)
    if not fitting:
        most = max(len([n for n in sizes[p.pk] if n >= req.gpu_count]) for p in pools)
        raise Refused(f"{req.nodes} nodes with {req.gpu_count} {gpu_type} GPUs each do not fit in one pool: at most "
                      f"{most} nodes lend {req.gpu_count}.", 400)
    fitting = [p for p in fitting if req.minutes <= p.reservation_policy.max_duration_minutes]
    if not fitting:
        longest = max(p.reservation_policy.max_duration_minutes for p in pools)
        raise Refused(f"{req.minutes} minutes is longer than the longest allowed reservation ({longest} minutes).",
                      400)
    if len(fitting) == 1:
        return fitting[0], gpu_type
    now = timezone.now()  # several pools: the one whose queue starts it first
    probe = planner.Request("probe", req.gpu_count, req.minutes * 60, nodes=req.nodes)
    starts = {p.pk: allocator.plan_queue(p, gpu_type, now, [probe], policy=p.reservation_policy)[0]["probe"]
              for p in fitting}
    return min(fitting, key=lambda p: (starts[p.pk].start if starts[p.pk] else float("inf"), p.pk)), gpu_type


def check_policy(user, policy: PoolPolicy, gpu_count: int, minutes: int, exclude: int | None = None) -> None:
    with connection.cursor() as cursor:
        cursor.execute(BOOKED_SQL, [user.pk, policy.pool_id, exclude or 0])
        booked_gpus, booked_minutes = cursor.fetchone()
    gpus = booked_gpus + gpu_count
    if gpus > policy.max_gpus_per_user:
        raise Refused(f"Pool {policy.pool.name} lends at most {policy.max_gpus_per_user} GPUs per user at once; "
                      f"this would make {gpus}.", 409)
    hours = booked_minutes / 60 + gpu_count * minutes / 60
    if hours > policy.max_gpu_hours_per_user + 1e-9:
        raise Refused(f"Pool {policy.pool.name} lends at most {policy.max_gpu_hours_per_user:g} GPU-hours per user "
                      f"at once; this would make {hours:g}.", 409)


def note(reservation: Reservation, kind: str, message: str, *, notify: bool = False) -> ReservationEvent:
    event = ReservationEvent.objects.create(reservation=reservation, kind=kind, message=message)
    if notify and NOTIFIERS:
        enqueue_on_commit("runners.reservations.tasks.notify", reservation.pk, message)
    return event


def lock_user(user) -> None:
    """One user's reservations change one at a time, so their limits hold under concurrency, while other users'
    requests go on (the user's row, `SELECT … FOR NO KEY UPDATE`: rows that refer to the user are still written)."""
    if connection.features.has_select_for_update:  # SQLite has no row locks (and one writer at a time)
        with connection.cursor() as cursor:
            cursor.execute(LOCK_USER_SQL, [user.pk])


def do_reserve(user, req: ReserveRequest, *, plan: bool = True) -> Reservation:
    """Record the request (a short transaction serialised per user), then plan its pool. `plan`: here and now unless
    another request is planning it this instant (active on return when devices were free, else pending with its
    promised start, or in a burst pending for the few milliseconds until the pass under way plans it). Not `plan`
    (the API's request path): a pass is asked of the workers, so the answer never waits on planning; the request is
    pending until that pass (or `tasks.keep_time` within seconds) gives it its promise or starts it."""
    pool, gpu_type = check_reserve(user, req)
    policy = pool.reservation_policy
    with transaction.atomic():
        lock_user(user)
        check_policy(user, policy, req.gpu_count * req.nodes, req.minutes)
        now = timezone.now()
        reservation = Reservation.objects.create(
            user=user, project=req.project or user.get_username(), pool=pool, gpu_type=gpu_type,
            gpu_count=req.gpu_count, node_count=req.nodes, minutes=req.minutes, created=now,
            status_deadline=now + timedelta(minutes=policy.max_queue_minutes))
        nodes = f" on each of {req.nodes} nodes" if req.nodes > 1 else ""
        queued = note(reservation, "queued", f"Requested {req.gpu_count}× {gpu_type}{nodes} for {req.minutes} min on "
                      f"{pool.name}.")
        if not plan:
            transaction.on_commit(lambda: ask_for_pass(pool.pk, gpu_type.pk))
    if plan:
        plan_unless_busy(pool, gpu_type)
        reservation.refresh_from_db()
    else:
        reservation.recorded_events = [queued]  # all it has yet: its answer needs no query for them
    return reservation


def pass_key(pool_id: int, gpu_type_id: int, what: str = "asked") -> str:
    return f"reservations:pass-{what}:{pool_id}:{gpu_type_id}"


def ask_for_pass(pool_id: int, gpu_type_id: int) -> None:
    """Enqueue a planning pass of the pool × type unless one is asked for and has not begun: a burst of requests is
    planned by a few passes, not one each. The flag is cleared by the pass before it reads the queue
    (`do_asked_pass`), so a request recorded after that read asks for the next pass; it lapses by itself if a message
    is lost, and `tasks.keep_time` plans any request still without a promise within seconds anyway. With the cache
    away every request asks (the request is recorded already: it never fails for that)."""
    if quietly(cache.add, pass_key(pool_id, gpu_type_id), 1, PASS_ASKED_TTL, away=True):
        enqueue("runners.reservations.tasks.plan_asked", pool_id, gpu_type_id)


def do_asked_pass(pool_id: int, gpu_type_id: int) -> int:
    """The pass `ask_for_pass` enqueued: at once, unless the last asked pass of the pool × type began less than
    `PASS_SPACING` ago, then that much later (a wait, not work: a burst's requests are answered while it waits, and
    one pass plans them all)."""
    last = quietly(cache.get, pass_key(pool_id, gpu_type_id, "began"), away=None)
    if last is not None and (wait := last + PASS_SPACING - time.time()) > 0:
        time.sleep(min(wait, PASS_SPACING))
    quietly(cache.set, pass_key(pool_id, gpu_type_id, "began"), time.time(), PASS_ASKED_TTL, away=None)
    quietly(cache.delete, pass_key(pool_id, gpu_type_id), away=None)
    return do_plan(pool_id, gpu_type_id)


def quietly(call: Callable, *args, away: object) -> object:
    """A cache call, or `away` when the cache (Redis) cannot be reached."""
    try:
        return call(*args)
    except CACHE_AWAY as exc:
        log.warning("cache away (%r): planning goes on without its flags", exc)
        return away


def plan_unless_busy(pool: GpuPool, gpu_type: GpuType, passes: int = 3) -> bool:
    """Plan the pool × type now if no one else is (its policy row taken with NOWAIT); again while requests that came
    in meanwhile are still without a promise. Busy: leave it to a queued pass, so a burst of requests is not answered
    one planning pass after another. False when it left it."""
    for _ in range(passes):
        try:
            with transaction.atomic():
                policy = PoolPolicy.objects.select_for_update(nowait=True, of=("self",)).select_related("pool").get(
                    pool=pool)
                allocator.lock_devices(pool, gpu_type)
                plan_locked(policy, gpu_type, timezone.now())
        except OperationalError:  # locked by a pass under way (PostgreSQL's lock_not_available)
            enqueue_on_commit("runners.reservations.tasks.plan_pool", pool.pk, gpu_type.pk)
            return False
        if not Reservation.objects.queue(pool, gpu_type).filter(planned_start=None).exists():
            break
    return True


def close(r: Reservation, status: str, message: str, now: datetime, at: datetime | None = None) -> None:
    """Move an open reservation to a terminal state and free its devices at `at` (default now), once; the caller
    holds its pool's policy row and its own row."""
    was_active = r.status == ReservationStatus.ACTIVE
    r.update_status(status, now=now, failure=message if status == ReservationStatus.FAILED else r.failure)
    if was_active:
        allocator.release_reservation(r, at or now)
        enqueue_on_commit("runners.reservations.tasks.run_hook", r.pk, "end")
    note(r, status, message, notify=True)


def expire_due_locked(policy: PoolPolicy, gpu_type: GpuType, now: datetime) -> int:
    """End the pool × type's reservations whose time is up, and the holds of runs whose agent went silent, so no
    plan counts a device as busy or free when it is not (the caller holds the policy row and the device rows)."""
    expired = 0
    for r in Reservation.objects.select_for_update().filter(pool=policy.pool, gpu_type=gpu_type,
                                                            status=ReservationStatus.ACTIVE, ends_at__lte=now):
        close(r, ReservationStatus.EXPIRED, "Expired; devices freed.", now, at=r.ends_at)
        expired += 1
    for hold in DeviceHold.objects.held().filter(pool=policy.pool, gpu_type=gpu_type, kind=HoldKind.RUN,
                                                 lease_until__lt=now):
        allocator.end_hold(hold, hold.lease_until)
    return expired


def plan_locked(policy: PoolPolicy, gpu_type: GpuType, now: datetime) -> list[Reservation]:
    """One planning pass (the caller holds the policy row and the device rows): expire what is due, start every
    queued request whose promised start has come, store the others' promises (kept, or earlier after a compression;
    a new request's is given here). Returns those it activated."""
    pool = policy.pool
    expire_due_locked(policy, gpu_type, now)
    queue = list(Reservation.objects.queue(pool, gpu_type).select_for_update())
    placements, queue, gpus, _ = allocator.plan_queue(pool, gpu_type, now, policy=policy, queue=queue)
    by_pk = {g.pk: g for g in gpus}
    started, waiting = [], []
    for r in queue:
        placed = placements[r.pk]
        if placed is not None and placed.start <= now.timestamp():
            try:
                with transaction.atomic():  # the one-open-hold index is the last word: never a 500 here
                    allocator.activate(r, [by_pk[i] for i in placed.devices], now)
            except IntegrityError:
                log.warning("reservation %s: a device was held after all; it stays queued", r.pk)
                r.refresh_from_db()
                continue
            started.append(r)
            continue
        start = datetime.fromtimestamp(placed.start, tz=now.tzinfo) if placed else None
        gpus = list(placed.devices) if placed else []
        if (start, gpus) != (r.planned_start, r.planned_gpus):
            if r.planned_start and start and start > r.planned_start + timedelta(seconds=1):
                note(r, "replanned", f"Its promised start could not be kept (a device it was given was disabled "
                     f"or is still held past its end); it now starts {start:%Y-%m-%d %H:%M} UTC.", notify=True)
            r.planned_start, r.planned_gpus = start, gpus
            waiting.append(r)
    write_plans(waiting)
    for r in started:
        r.access = access_info(r, policy)
        r.save(update_fields=["access"])
        note(r, "active", f"Active on {', '.join(r.hostnames())} until {r.ends_at:%Y-%m-%d %H:%M} UTC.",
             notify=True)
        enqueue_on_commit("runners.reservations.tasks.run_hook", r.pk, "start")
    return started


# One statement for a whole queue's planned starts on PostgreSQL (bulk_update's CASE per row is quadratic).
PLANS_SQL = f"""UPDATE {Reservation._meta.db_table} r SET planned_start = v.start, planned_gpus = v.gpus
FROM unnest(%s::bigint[], %s::timestamptz[], %s::text[]::jsonb[]) AS v(id, start, gpus) WHERE r.id = v.id"""


def write_plans(waiting: list[Reservation]) -> None:
    if not waiting:
        return
    if connection.vendor != "postgresql":
        Reservation.objects.bulk_update(waiting, ["planned_start", "planned_gpus"], batch_size=200)
        return
    with connection.cursor() as cursor:
        cursor.execute(PLANS_SQL, [[r.pk for r in waiting], [r.planned_start for r in waiting],
                                   [json.dumps(r.planned_gpus) for r in waiting]])


def access_info(r: Reservation, policy: PoolPolicy) -> dict:
    return access_for(policy).describe(r)


def do_plan(pool_id: int, gpu_type_id: int) -> int:
    with transaction.atomic():
        policy = PoolPolicy.objects.select_for_update(of=("self",)).select_related("pool").filter(
            pool_id=pool_id).first()
        if policy is None:
            return 0
        gpu_type = GpuType.objects.get(pk=gpu_type_id)
        allocator.lock_devices(policy.pool, gpu_type)
        return len(plan_locked(policy, gpu_type, timezone.now()))


def access_reservation(user, reservation_id: int, *, lock: bool = False) -> Reservation:
    """The one rule: a reservation is its holder's (and staff's) to see and change; others get a 404."""
    qs = Reservation.objects.select_related("pool", "gpu_type", "node", "user")
    if lock:
        qs = qs.select_for_update(of=("self",))
    found = qs.filter(pk=reservation_id).first()
    if found is None or not (found.user_id == user.pk or user.is_staff):
        raise AccessDenied(f"Reservation {reservation_id} not found.", 404)
    return found


def visible_to(user):
    qs = Reservation.objects.select_related("pool", "gpu_type", "node", "user")
    return qs if user.is_staff else qs.filter(user=user)


def do_cancel(user, reservation_id: int) -> Reservation:
    """Pending → cancelled, active → ended (devices freed now, once). A finished one is a 409."""
    access_reservation(user, reservation_id)
    with transaction.atomic():
        r = access_reservation(user, reservation_id)
        PoolPolicy.objects.select_for_update().get(pool_id=r.pool_id)
        r = access_reservation(user, reservation_id, lock=True)
        if r.status not in OPEN:
            raise Refused(f"Reservation {r.pk} is already {r.status}.", 409)
        was_active = r.status == ReservationStatus.ACTIVE
        if was_active:
            allocator.release_reservation(r)
        r.update_status(ReservationStatus.ENDED if was_active else ReservationStatus.CANCELLED)
        if was_active:
            enqueue_on_commit("runners.reservations.tasks.run_hook", r.pk, "end")
        note(r, r.status, "Ended by its holder; devices freed." if was_active else "Cancelled while queued.")
        enqueue_on_commit("runners.reservations.tasks.plan_pool", r.pool_id, r.gpu_type_id)
    return r


def do_extend(user, reservation_id: int, minutes: int) -> Reservation:
    """More time for an open reservation, within policy and only when no queued request's promised start moves later
    by more than the pool allows. A queued one is planned again with its new length, behind every promise."""
    if minutes < 1:
        raise Refused(f"An extension must be at least 1 minute; got {minutes}.", 400)
    access_reservation(user, reservation_id)
    with transaction.atomic():
        r = access_reservation(user, reservation_id)
        policy = PoolPolicy.objects.select_for_update(of=("self",)).select_related("pool").get(pool_id=r.pool_id)
        allocator.lock_devices(policy.pool, r.gpu_type)
        now = timezone.now()
        expire_due_locked(policy, r.gpu_type, now)  # a reservation past its end is expired, not extended
        r = access_reservation(user, reservation_id, lock=True)
        if r.user_id != user.pk:
            raise AccessDenied(f"Reservation {r.pk} is {r.user.get_username()}'s; only its holder extends it.", 403)
        if r.status not in OPEN:
            raise Refused(f"Reservation {r.pk} is {r.status}; only a pending or active one can be extended.", 409)
        total = r.minutes + minutes
        if total > policy.max_duration_minutes:
            raise Refused(f"{total} minutes in all is past pool {policy.pool.name}'s maximum of "
                          f"{policy.max_duration_minutes} minutes.", 409)
        lock_user(user)  # policy row, device rows, reservation rows, user row: the one lock order
        check_policy(user, policy, r.total_gpus, total, exclude=r.pk)
        delayed = delays_if_extended(r, minutes, now)
        if delayed and max(delayed.values()) > policy.extend_max_delay_minutes * 60:
            worst = max(delayed.values())
            raise Refused(f"Extending by {minutes} minutes would delay {len(delayed)} queued request(s), one by "
                          f"{math.ceil(worst / 60)} minutes (the pool allows {policy.extend_max_delay_minutes}).",
                          409)
        if r.status == ReservationStatus.ACTIVE:
            r.ends_at += timedelta(minutes=minutes)
            r.status_deadline = r.ends_at
            left = r.ends_at - now
            if left > timedelta(minutes=30):  # re-arm only the warnings that lie ahead again
                r.warned_30_at = None
            if left > timedelta(minutes=5):
                r.warned_5_at = None
            r.holds.filter(ended__isnull=True).update(ends=r.ends_at)
            ok, why = access_for(policy).extend(r)  # a Slurm pool's job must last as long
            if not ok:
                raise Refused(f"{why}; reservation {r.pk} was not extended.", 409)
        else:  # its promise was for the shorter request: it is planned again, behind every other promise
            r.planned_start, r.planned_gpus = None, []
        r.minutes = total
        r.save()
        note(r, "extended", f"Extended by {minutes} min" + (f"; now ends {r.ends_at:%Y-%m-%d %H:%M} UTC."
                                                            if r.ends_at else "."))
        plan_locked(policy, r.gpu_type, now)
    r.refresh_from_db()
    return r


def delays_if_extended(r: Reservation, minutes: int, now: datetime) -> dict[int, float]:
    """Seconds each other queued request would start after its promise if `r` ran `minutes` longer: the same planner,
    with the holds and the queue as they would be."""
    gpus = allocator.devices(r.pool, r.gpu_type)
    kept = allocator.kept_for_competitions(PoolPolicy.objects.filter(pool=r.pool).first(), gpus)
    holds = allocator.open_holds(g.pk for g in gpus)
    for hold in holds.values():
        if hold.reservation_id == r.pk:
            hold.ends = hold.ends + timedelta(minutes=minutes)
    queue = allocator.requests(Reservation.objects.queue(r.pool, r.gpu_type))
    longer = [planner.Request(q.key, q.count, q.seconds + minutes * 60, nodes=q.nodes) if q.key == r.pk else q
              for q in queue]
    after = planner.plan(now.timestamp(), allocator.planner_devices(gpus, kept, holds, now), longer)
    return {q.key: after[q.key].start - max(q.promise, now.timestamp()) for q in queue
            if q.key != r.pk and q.promise is not None and after[q.key]
            and after[q.key].start > max(q.promise, now.timestamp()) + 1e-6}


@dataclass
class Availability:
    gpu_type: str
    pool: str
    devices: int
    reservable: int
    free_now: int
    queued: int
    eta: dict[int, datetime | None]  # GPUs → planned start of such a request at the end of the queue
    largest: int = 0  # the most GPUs one request can get (reservable devices on one node)
    never: str = ""  # why some ETA is never, in words


def why_never(policy: PoolPolicy, devices: int, reservable: int, largest: int) -> str:
    kept = devices - reservable
    share = f"{policy.competition_share:.0%} of {devices} kept for competitions"
    if not reservable:
        return f"none of its devices can be reserved ({share}; an organiser may lower the share)."
    return f"a request gets devices of one node, and at most {largest} can be reserved on one node" + (
        f" ({share}: {kept})." if kept else ".")


def availability(minutes: int = DEFAULT_ETA_MINUTES) -> list[Availability]:
    """Per pool × GPU type: devices, free now, queued requests, and the planner's start for 1/2/4/8 GPUs (with why
    a start is never)."""
    now = timezone.now()
    out = []
    for policy in PoolPolicy.objects.filter(reservable=True, pool__enabled=True).select_related("pool"):
        for gpu_type in GpuType.objects.filter(gpus__node__pool=policy.pool).distinct():
            gpus = allocator.devices(policy.pool, gpu_type)
            kept = allocator.kept_for_competitions(policy, gpus)
            holds = allocator.open_holds(g.pk for g in gpus)
            devices = allocator.planner_devices(gpus, kept, holds, now)
            queue = allocator.requests(Reservation.objects.queue(policy.pool, gpu_type))
            etas = {}
            for n in ETA_COUNTS:  # each probe planned alone behind the queue: what reserve would get now
                found = planner.plan(now.timestamp(), devices, [*queue, planner.Request("probe", n, minutes * 60)])
                etas[n] = datetime.fromtimestamp(found["probe"].start, tz=now.tzinfo) if found["probe"] else None
            reservable = [g for g in gpus if g.pk not in kept]
            per_node: dict[int, int] = {}
            for g in reservable:
                per_node[g.node_id] = per_node.get(g.node_id, 0) + 1
            largest = max(per_node.values(), default=0)
            never = why_never(policy, len(gpus), len(reservable), largest) if None in etas.values() else ""
            out.append(Availability(gpu_type.name, policy.pool.name, len(gpus), len(reservable),
                                    sum(g.pk not in holds for g in reservable), len(queue), etas, largest, never))
    return out
