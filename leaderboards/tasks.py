"""django-q2 entry points for runs, rankings and housekeeping. Each is idempotent: safe to run twice or late."""

from runners.models import GpuPool

from . import actions, finals, health, lifecycle


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
    return health.tick()


def check_pool(pool_id: int) -> int:
    pool = GpuPool.objects.filter(pk=pool_id).first()
    return len(health.do_start_pool_check(pool)) if pool else 0


def verify_finals() -> int:
    """Every minute: re-verify the final standings of boards whose deadline passed; move running ones on."""
    return finals.tick()
