"""Channel-layer events, sent only after the transaction that caused them commits.

Groups: `leaderboard.<id>` (ranking changes) and `submission.<id>` (run progress)."""

from __future__ import annotations

import logging
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

log = logging.getLogger(__name__)


def send(group: str, event_type: str, payload: dict[str, Any]) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, {"type": event_type, **payload})
    except Exception:  # a lost live update must never fail the work that caused it
        log.exception("could not send %s to %s", event_type, group)


def send_on_commit(group: str, event_type: str, payload: dict[str, Any]) -> None:
    transaction.on_commit(lambda: send(group, event_type, payload))


def run_changed(run) -> None:
    send(f"submission.{run.submission_id}", "submission.update", {
        "run": run.pk, "status": run.status, "attempt": run.attempt, "secret": run.secret,
        "gpu": run.gpu_type.name, "progress": run.progress, "passed": run.passed, "score": run.score,
    })


def board_changed(leaderboard_id: int, gpu_type_id: int, version: int, entries: list[dict]) -> None:
    send(f"leaderboard.{leaderboard_id}", "leaderboard.ranks", {
        "gpu_type": gpu_type_id, "version": version, "entries": entries,
    })
