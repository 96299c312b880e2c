"""The record chart of a board: its record progression and the page's users' improving steps, read from the stored
`Record` rows (ranks.py keeps them as results arrive) in one indexed query."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Q

from .models import Record


def board_history(leaderboard_id: int, gpu_type_id: int, user_ids: Iterable[int]) -> dict[str, Any]:
    """{"records": [[iso, seconds, user_id]], "users": {user_id: [[iso, seconds], ...] improving steps} for
    `user_ids`, "names": {user_id: name} of the record holders}."""
    rows = (Record.objects.filter(Q(board_best=True) | Q(user_id__in=list(user_ids)), leaderboard_id=leaderboard_id,
                                  gpu_type_id=gpu_type_id)
            .order_by("submitted_at", "submission_id")
            .values_list("user_id", "score", "submitted_at", "board_best", "user__username",
                         "user__profile__display_name"))
    records: list[list[Any]] = []
    users: dict[int, list[list[Any]]] = {}
    names: dict[int, str] = {}
    for user_id, score, submitted_at, board_best, username, display in rows:
        stamp = submitted_at.isoformat()
        users.setdefault(user_id, []).append([stamp, score])
        if board_best:
            records.append([stamp, score, user_id])
            names[user_id] = display or username
    return {"records": records, "users": users, "names": names}
