"""django-q2 tasks for rankings and housekeeping. Each is idempotent: safe to run twice or late."""

from . import actions


def recompute_ranks(leaderboard_id: int, gpu_type_id: int) -> bool:
    return actions.do_recompute_ranks(leaderboard_id, gpu_type_id)


def reap_runs() -> int:
    return actions.do_reap_overdue_runs()
