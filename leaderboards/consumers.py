"""Websocket consumers: a full snapshot on connect, then small versioned deltas from the channel layer.

`LeaderboardConsumer` serves one board (leaderboard × GPU type) to anyone who may see the leaderboard;
`SubmissionConsumer` streams a submission's runs to its owner and staff only."""

from __future__ import annotations

from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import live
from .events import run_state
from .models import Board, BoardEntry, Leaderboard, Run, Submission, Visibility

SNAPSHOT_ROWS = 50


def entry_row(entry: BoardEntry) -> dict[str, Any]:
    return {"user": entry.user_id, "name": str(getattr(entry.user, "profile", None) or entry.user.username),
            "submission": entry.submission_id, "score": entry.score, "rank": entry.rank, "tied": entry.tied,
            "ratio": entry.ratio}


def board_snapshot(leaderboard_id: int, gpu_type_id: int) -> dict[str, Any]:
    version = Board.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).values_list(
        "version", flat=True).first() or 0
    entries = (BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
               .order_by("rank", "submitted_at").select_related("user__profile")[:SNAPSHOT_ROWS])
    return {"type": "snapshot", "version": version, "entries": [entry_row(e) for e in entries]}


def board_visible(user, leaderboard_id: int, gpu_type_id: int) -> bool:
    boards = Leaderboard.objects.filter(pk=leaderboard_id, gpu_types=gpu_type_id)
    if not user.is_staff:
        boards = boards.exclude(visibility=Visibility.CLOSED)
    return boards.exists()


def submission_snapshot(user, submission_id: int) -> dict[str, Any] | None:
    submission = Submission.objects.filter(pk=submission_id).first()
    if submission is None or not (user.is_staff or submission.user_id == user.pk):
        return None
    runs = Run.objects.filter(submission_id=submission_id).select_related("gpu_type")
    return {"type": "snapshot", "runs": [run_state(r) for r in runs]}


class LeaderboardConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        self.leaderboard_id, self.gpu_type_id = int(kwargs["leaderboard_id"]), int(kwargs["gpu_type_id"])
        if not await database_sync_to_async(board_visible)(self.scope["user"], self.leaderboard_id,
                                                           self.gpu_type_id):
            await self.close(code=4404)
            return
        live.ensure_tailer()
        self.group = f"leaderboard.{self.leaderboard_id}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def send_snapshot(self) -> None:
        await self.send_json(await database_sync_to_async(board_snapshot)(self.leaderboard_id, self.gpu_type_id))

    async def receive_json(self, content: Any, **kwargs) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            await self.send_snapshot()

    async def leaderboard_ranks(self, event: dict[str, Any]) -> None:
        if event["gpu_type"] != self.gpu_type_id:
            return
        names = event.get("names", {})
        entries = [{**e, "name": names.get(str(e["user"]), str(e["user"]))} for e in event["entries"]]
        await self.send_json({"type": "delta", "version": event["version"], "entries": entries,
                              "removed": event.get("removed", [])})


class SubmissionConsumer(AsyncJsonWebsocketConsumer):
    async def connect(self) -> None:
        self.submission_id = int(self.scope["url_route"]["kwargs"]["submission_id"])
        snapshot = await database_sync_to_async(submission_snapshot)(self.scope["user"], self.submission_id)
        if snapshot is None:
            await self.close(code=4403)
            return
        live.ensure_tailer()
        self.group = f"submission.{self.submission_id}"
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self.send_json(snapshot)

    async def disconnect(self, code: int) -> None:
        if hasattr(self, "group"):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive_json(self, content: Any, **kwargs) -> None:
        if isinstance(content, dict) and content.get("type") == "resync":
            snapshot = await database_sync_to_async(submission_snapshot)(self.scope["user"], self.submission_id)
            if snapshot:
                await self.send_json(snapshot)

    async def submission_update(self, event: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in event.items() if k != "type"} | {"type": "run"})
