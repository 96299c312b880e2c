"""django-q2 tasks for reservations. Each step of `tick` is its own short transaction that re-checks the row it
locked, so a repeated tick does nothing twice and a worker killed mid-way leaves every reservation in one state."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from . import actions, allocator
from .access import access_for
from .models import TERMINAL, PoolPolicy, Reservation, ReservationStatus

log = logging.getLogger(__name__)
WARNINGS = ((30, "warned_30_at"), (5, "warned_5_at"))
MAX_HOOK_ATTEMPTS = 3


def plan_pool(pool_id: int, gpu_type_id: int) -> int:
    return actions.do_plan(pool_id, gpu_type_id)


def plan_asked(pool_id: int, gpu_type_id: int) -> int:
    return actions.do_asked_pass(pool_id, gpu_type_id)


def finish(reservation_id: int, status: str, message: str, *, when=None) -> bool:
    """Move an open reservation to a terminal state and free its devices, once; False when it already moved."""
    with transaction.atomic():
        r = Reservation.objects.select_related("pool").filter(pk=reservation_id).first()
        if r is None or r.status in TERMINAL:
            return False
        PoolPolicy.objects.select_for_update().filter(pool_id=r.pool_id).first()
        r = Reservation.objects.select_for_update().get(pk=reservation_id)
        if r.status == ReservationStatus.ACTIVE:
            allocator.lock_gpus(r.planned_gpus)
        now = timezone.now()
        if r.status in TERMINAL or (status == ReservationStatus.EXPIRED and (
                r.status != ReservationStatus.ACTIVE or r.ends_at > now)):
            return False
        actions.close(r, status, message, now, at=when)
        actions.enqueue_on_commit("runners.reservations.tasks.plan_pool", r.pool_id, r.gpu_type_id)
    return True


def keep_time(now=None) -> int:
    """Ticked every few seconds by `manage.py workers` (settings.CLUSTER_TICKS): plan each pool × type where a
    reservation's time is up, a queued request's promised start has come or a request has no promise yet (recorded
    while another pass was planning), so devices are freed at the end time and handed on at the promised one, not at
    the next minute. Two indexed queries when nothing is due."""
    now = now or timezone.now()
    due = set(Reservation.objects.filter(status=ReservationStatus.ACTIVE, ends_at__lte=now)
              .values_list("pool_id", "gpu_type_id"))
    due |= set(Reservation.objects.filter(Q(planned_start__lte=now) | Q(planned_start=None),
                                          status=ReservationStatus.PENDING).values_list("pool_id", "gpu_type_id"))
    return sum(actions.do_plan(pool_id, type_id) + 1 for pool_id, type_id in due)


def warn(now) -> int:
    """One warning per threshold crossed: a reservation that crosses several at once (a short one, a late tick) gets
    one warning, which stamps them all."""
    sent = 0
    longest = max(minutes for minutes, _ in WARNINGS)
    for r in Reservation.objects.filter(status=ReservationStatus.ACTIVE, ends_at__gt=now,
                                        ends_at__lte=now + timedelta(minutes=longest)):
        left = r.ends_at - now
        crossed = [(m, f) for m, f in WARNINGS if left <= timedelta(minutes=m) and getattr(r, f) is None]
        if not crossed:
            continue
        with transaction.atomic():
            if not Reservation.objects.filter(pk=r.pk, status=ReservationStatus.ACTIVE,
                                              **{f: None for _, f in crossed}).update(**{f: now for _, f in crossed}):
                continue
            mins = max(1, round(left.total_seconds() / 60))
            actions.note(r, "warning", f"Reservation {r.pk} ends in {mins} min ({r.ends_at:%H:%M} UTC): "
                         "save your work or extend it.", notify=True)
            sent += 1
    return sent


def tick() -> dict[str, int]:
    """Scheduled every minute: expire, fail overdue queued requests, warn, end dead runs' holds, plan, retry hooks."""
    now = timezone.now()
    done = {"expired": 0, "failed": 0, "warned": 0, "holds": 0, "started": 0, "hooks": 0}
    for r in Reservation.objects.filter(status=ReservationStatus.ACTIVE, ends_at__lte=now):
        done["expired"] += finish(r.pk, ReservationStatus.EXPIRED, "Expired; devices freed.", when=r.ends_at)
    for r in Reservation.objects.filter(status=ReservationStatus.PENDING, status_deadline__lt=now):
        done["failed"] += finish(r.pk, ReservationStatus.FAILED, "Waited longer than the pool's queue limit.")
    done["warned"] = warn(now)
    done["holds"] = allocator.end_lapsed_run_holds(now)
    for pool_id, type_id in set(Reservation.objects.filter(status=ReservationStatus.PENDING)
                                .values_list("pool_id", "gpu_type_id")):
        done["started"] += actions.do_plan(pool_id, type_id)
    for r in Reservation.objects.filter(status=ReservationStatus.ACTIVE, start_hook_done_at=None,
                                        hook_attempts__lt=MAX_HOOK_ATTEMPTS, started_at__lt=now - timedelta(
                                            seconds=30)):
        done["hooks"] += run_hook(r.pk, "start")
    for r in Reservation.objects.filter(status__in=TERMINAL, started_at__isnull=False, end_hook_done_at=None,
                                        hook_attempts__lt=MAX_HOOK_ATTEMPTS, finished_at__lt=now - timedelta(
                                            seconds=30)):
        done["hooks"] += run_hook(r.pk, "end")
    return done


def run_hook(reservation_id: int, phase: str) -> bool:
    """Run the pool's start or end hook once it is due and not yet done; a failed start hook fails the reservation."""
    field = "start_hook_done_at" if phase == "start" else "end_hook_done_at"
    r = Reservation.objects.select_related("pool__reservation_policy", "user", "node", "gpu_type").get(
        pk=reservation_id)
    if getattr(r, field) is not None or (phase == "start" and r.status != ReservationStatus.ACTIVE):
        return False
    Reservation.objects.filter(pk=r.pk).update(hook_attempts=r.hook_attempts + 1)
    ok, output = access_for(r.pool.reservation_policy).run(r, phase)
    if ok:
        Reservation.objects.filter(pk=r.pk, **{field: None}).update(**{field: timezone.now()})
    elif phase == "start":
        finish(r.pk, ReservationStatus.FAILED, f"Access could not be set up: {output}")
    else:
        log.warning("reservation %s: %s", r.pk, output)
        with transaction.atomic():
            actions.note(r, "hook", output)
    return ok


def notify(reservation_id: int, message: str) -> None:
    r = Reservation.objects.select_related("user").get(pk=reservation_id)
    for send in actions.NOTIFIERS:
        try:
            send(r.user, message)
        except Exception:
            log.exception("notifier %r failed for reservation %s", send, reservation_id)
