"""The record chart of a board: its record progression and the page's users' improving steps, read from the stored
`Record` rows (ranks.py keeps them as results arrive) in one indexed query."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth import get_user_model
from django.db.models import Q

from .models import Record


def board_history(leaderboard_id: int, gpu_type_id: int, user_ids: Iterable[int]) -> dict[str, Any]:
    """{"records": [[iso, seconds, user_id]], "users": {user_id: [[iso, seconds], ...] improving steps} for
    `user_ids`, "names": {user_id: name} of the record holders}."""
    user_ids = list(user_ids)
    rows = (Record.objects.filter(Q(board_best=True) | Q(user_id__in=user_ids), leaderboard_id=leaderboard_id,
                                  gpu_type_id=gpu_type_id)
            .order_by("submitted_at", "submission_id").values_list("user_id", "score", "submitted_at", "board_best"))
    records: list[list[Any]] = []
    users: dict[int, list[list[Any]]] = {}
    for user_id, score, submitted_at, board_best in rows:
        stamp = submitted_at.isoformat()
        users.setdefault(user_id, []).append([stamp, score])
        if board_best:
            records.append([stamp, score, user_id])
    return {"records": records, "users": {u: s for u, s in users.items() if u in user_ids},
            "names": user_names({user_id for _, _, user_id in records})}


def user_names(user_ids: Iterable[int]) -> dict[int, str]:
    """{user id: display name}; a query of its own, since joined to the records PostgreSQL hashed every user of the
    site to name a few dozen."""
    user_ids = list(user_ids)
    return {pk: display or username for pk, username, display in get_user_model().objects.filter(
        pk__in=user_ids).values_list("pk", "username", "profile__display_name")} if user_ids else {}
