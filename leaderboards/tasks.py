"""django-q2 entry points for runs, rankings and housekeeping. Each is idempotent: safe to run twice or late."""

import logging
import os

from django.conf import settings

from runners.models import GpuPool

from . import actions, dataset, finals, health, lifecycle, spread
from .errors import Refused

log = logging.getLogger(__name__)


def dispatch_run(run_id: int) -> None:
    lifecycle.dispatch_run(run_id)


def cancel_remote_job(pool_id: int, external_id: str) -> None:
    lifecycle.cancel_remote_job(pool_id, external_id)


def poll_remote_runs() -> int:
    return lifecycle.poll_remote_runs()


def poll_attempt(attempt_id: int) -> bool:
    return lifecycle.poll_attempt(attempt_id)


def reap_runs() -> int:
    return lifecycle.do_reap_overdue_runs()


def rank_run(run_id: int) -> bool:
    """A ranked run ended or was requeued (its `on_finish` hook): change its board by what the result changes
    (`ranks.do_rank_result`, which falls back to a full rebuild where it must)."""
    return actions.do_rank_result(run_id)


def recompute_ranks(leaderboard_id: int, gpu_type_id: int) -> bool:
    """The full rebuild of a board from all its runs (deletions, requeues, rescoring)."""
    return actions.do_recompute_ranks(leaderboard_id, gpu_type_id)


def check_pools() -> int:
    """Every minute: the pools' health rounds (`health.tick`), then a between-run spread measurement that is due
    (`spread.do_measure_due_spreads`); the rounds started."""
    started = health.tick()
    spread.do_measure_due_spreads()
    return started


def check_pool(pool_id: int) -> int:
    pool = GpuPool.objects.filter(pk=pool_id).first()
    return len(health.do_start_pool_check(pool)) if pool else 0


def verify_finals() -> int:
    """Every minute: re-verify the final standings of boards whose deadline passed; move running ones on."""
    return finals.tick()


def export_snapshot() -> str:
    """Every 6 hours: the private snapshot of live boards to HF_PRIVATE_DATASET (KernelBot's scheduled export); off
    while HF_PRIVATE_DATASET or HF_TOKEN is unset. Idempotent: a push replaces the one file."""
    if not settings.HF_PRIVATE_DATASET or not os.environ.get("HF_TOKEN"):
        return "off: set HF_PRIVATE_DATASET and HF_TOKEN"
    if not dataset.snapshot_leaderboards():
        return "no live leaderboard"
    try:
        return dataset.do_push_snapshot().url
    except Refused as exc:
        log.warning("private snapshot not pushed: %s", exc.message)
        return exc.message
