"""Websocket consumers: a full snapshot on connect, then small versioned deltas from the channel layer.

`LeaderboardConsumer` serves one board (leaderboard × GPU type), `SubmissionConsumer` a submission's runs (outcome
level: `serializers.live_run`), each to whoever may see it (`access.authority`); others are closed with 4404."""

from __future__ import annotations

import json
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from . import finals, live
from .access.authority import access_submission
from .errors import AccessDenied
from .models import BOARD_ORDER, Board, BoardEntry, Leaderboard, Run
from .serializers import live_run

SNAPSHOT_ROWS = 50
MAX_ID = 2**63 - 1  # larger ids name nothing (and the database would refuse to compare them)


def entry_row(entry: BoardEntry) -> dict[str, Any]:
    return {"user": entry.user_id, "name": str(getattr(entry.user, "profile", None) or entry.user.username),
            "submission": entry.submission_id, "score": entry.score, "rank": entry.rank, "tied": entry.tied,
            "ratio": entry.ratio}


def board_snapshot(leaderboard_id: int, gpu_type_id: int) -> dict[str, Any]:
    version = Board.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id).values_list(
        "version", flat=True).first() or 0
    entries = (BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
               .order_by(*BOARD_ORDER).select_related("user__profile").page(0, SNAPSHOT_ROWS))
    board = Leaderboard.objects.filter(pk=leaderboard_id).first()
    final = finals.standings(board, progress=False).state if board else "/"
    return {"type": "snapshot", "version": version, "entries": [entry_row(e) for e in entries], "final": final}


def board_visible(user, leaderboard_id: int, gpu_type_id: int) -> bool:
    return Leaderboard.objects.visible_to(user).filter(pk=leaderboard_id, gpu_types=gpu_type_id).exists()


def submission_snapshot(user, submission_id: int) -> dict[str, Any]:
    access_submission(user, submission_id)
    runs = Run.objects.filter(submission_id=submission_id).select_related("gpu_type")
    return {"type": "snapshot", "runs": [live_run(r) for r in runs]}


class LiveConsumer(AsyncJsonWebsocketConsumer):
    """Client frames that are not JSON get an error frame, not a server traceback."""

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs) -> None:
        try:
            content = json.loads(text_data if text_data is not None else bytes_data or b"")
        except (ValueError, UnicodeDecodeError):
            await self.send_json({"type": "error", "detail": "Frames must be JSON, e.g. {\"type\": \"resync\"}."})
            return
        await self.receive_json(content, **kwargs)


class NoSuchStream(AsyncJsonWebsocketConsumer):
    """Any other websocket path: refused with 4404 (URLRouter would log an error with a traceback for each)."""

    async def connect(self) -> None:
        await self.close(code=4404)


class LeaderboardConsumer(LiveConsumer):
    async def connect(self) -> None:
        kwargs = self.scope["url_route"]["kwargs"]
        self.leaderboard_id, self.gpu_type_id = int(kwargs["leaderboard_id"]), int(kwargs["gpu_type_id"])
        if max(self.leaderboard_id, self.gpu_type_id) > MAX_ID or not await database_sync_to_async(board_visible)(
                self.scope["user"], self.leaderboard_id, self.gpu_type_id):
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
                              "removed": event.get("removed", []), "shift": event.get("shift"),
                              **{k: event[k] for k in ("rows", "entrants", "pager", "records", "record_names",
                                                       "records_html", "record_added", "record_html",
                                                       "records_on_ratio") if k in event}})


    async def leaderboard_final(self, event: dict[str, Any]) -> None:
        """The board's final standings changed (leaderboards/finals.py): the page fetches them as a reload shows."""
        await self.send_json({"type": "final", "final": event["final"], "status": event["status"]})


class SubmissionConsumer(LiveConsumer):
    async def connect(self) -> None:
        self.submission_id = int(self.scope["url_route"]["kwargs"]["submission_id"])
        if self.submission_id > MAX_ID:
            await self.close(code=4404)
            return
        try:
            snapshot = await database_sync_to_async(submission_snapshot)(self.scope["user"], self.submission_id)
        except AccessDenied as exc:
            await self.close(code=4000 + exc.status)  # the HTTP status as a websocket close code: 4404
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
            try:
                await self.send_json(await database_sync_to_async(submission_snapshot)(self.scope["user"],
                                                                                       self.submission_id))
            except AccessDenied:  # deleted meanwhile
                await self.close(code=4404)

    async def submission_update(self, event: dict[str, Any]) -> None:
        await self.send_json({k: v for k, v in event.items() if k != "type"} | {"type": "run"})
