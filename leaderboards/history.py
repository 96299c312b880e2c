"""Record progression (best score over time) and per-user score history, memoised per board version."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model

from .actions import ranked_candidates

_memo: dict[tuple[int, int], tuple[int, dict[str, Any]]] = {}


def board_history(leaderboard_id: int, gpu_type_id: int, version: int) -> dict[str, Any]:
    """{"records": [[iso, seconds, user_id]], "users": {user_id: [[iso, seconds], ...] improving steps},
    "names": {user_id: name}}. Recomputed only when the board's version moves (every rank change does)."""
    held = _memo.get((leaderboard_id, gpu_type_id))
    if held and held[0] == version:
        return held[1]
    records: list[list[Any]] = []
    users: dict[int, list[list[Any]]] = {}
    best = float("inf")
    for c in sorted(ranked_candidates(leaderboard_id, gpu_type_id), key=lambda c: (c.submitted_at, c.submission_id)):
        stamp = c.submitted_at.isoformat()
        steps = users.setdefault(c.user_id, [])
        if not steps or c.score < steps[-1][1]:
            steps.append([stamp, c.score])
        if c.score < best:
            best = c.score
            records.append([stamp, c.score, c.user_id])
    holders = {r[2] for r in records}
    names = {pk: display or username for pk, username, display in get_user_model().objects.filter(
        pk__in=holders).values_list("pk", "username", "profile__display_name")} if holders else {}
    data = {"records": records, "users": users, "names": names}
    _memo[(leaderboard_id, gpu_type_id)] = (version, data)
    return data
