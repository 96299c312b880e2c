"""The record chart of a board: its record progression and the page's users' improving steps, read from the stored
`Record` rows (ranks.py keeps them as results arrive) in one indexed query."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import CharField, F, Func, Q

from .models import Record


def stamp(moment: datetime) -> str:
    """A time as the chart's data carries it: ISO 8601, UTC, with microseconds (as `Stamp` formats it in SQL)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


class Stamp(Func):
    """PostgreSQL formats the time as `stamp` does: its text loads without Django's timestamp loader, written in
    Python and most of a page view's history read (a board's history is hundreds of rows)."""

    template = """to_char(%(expressions)s AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"+00:00"')"""
    output_field = CharField()


def board_history(leaderboard_id: int, gpu_type_id: int, user_ids: Iterable[int]) -> dict[str, Any]:
    """{"records": [[iso, seconds, user_id]], "users": {user_id: [[iso, seconds], ...] improving steps} for
    `user_ids`, "names": {user_id: name} of the record holders}."""
    user_ids = list(user_ids)
    at = Stamp(F("submitted_at")) if connection.vendor == "postgresql" else F("submitted_at")
    rows = (Record.objects.filter(Q(board_best=True) | Q(user_id__in=user_ids), leaderboard_id=leaderboard_id,
                                  gpu_type_id=gpu_type_id)
            .order_by("submitted_at", "submission_id").values_list("user_id", "score", at, "board_best"))
    records: list[list[Any]] = []
    users: dict[int, list[list[Any]]] = {}
    for user_id, score, when, board_best in rows:
        iso = when if isinstance(when, str) else stamp(when)
        users.setdefault(user_id, []).append([iso, score])
        if board_best:
            records.append([iso, score, user_id])
    return {"records": records, "users": {u: s for u, s in users.items() if u in user_ids},
            "names": user_names({user_id for _, _, user_id in records})}


def user_names(user_ids: Iterable[int]) -> dict[int, str]:
    """{user id: display name}; a query of its own, since joined to the records PostgreSQL hashed every user of the
    site to name a few dozen."""
    user_ids = list(user_ids)
    return {pk: display or username for pk, username, display in get_user_model().objects.filter(
        pk__in=user_ids).values_list("pk", "username", "profile__display_name")} if user_ids else {}
