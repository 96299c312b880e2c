"""The Discord bot: application commands over `discordbot.service`, live status messages driven by the same
channel-layer events that update the site (`submission.<id>`, `leaderboard.<id>`), and announcements."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import socket
import time
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import aiohttp
import discord
import yarl
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from discord import app_commands
from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone
from django_redis.exceptions import ConnectionInterrupted
from redis.exceptions import RedisError

from leaderboards import live
from leaderboards.models import TERMINAL_STATUSES

from . import announce, gpus, render, service, verify
from .service import BotError, Member

log = logging.getLogger(__name__)
ANNOUNCE_MENTIONS = discord.AllowedMentions(everyone=False, users=False, roles=True)
# Discord allows 5 edits of one message per 5 s; keep a margin for network delay between us and its clock
EDITS_PER_WINDOW, EDIT_WINDOW = 5, 5.5
RATE_LIMIT_BACKOFF = 2.0  # s, after a 429 that discord.py gave up on
SAFETY_REFRESH = 30.0  # a status re-read even without an event (channel layers deliver at most once)
MAX_FILE = 8 * 1024 * 1024
GPU_CHOICE_SECONDS = 120.0  # how long a submission naming no GPU type waits for its author's choice
UPLOAD_LIMIT = 10 * 1024 * 1024 - 64 * 1024  # what any server accepts in one message (its boosts may allow more)
RETRY_AFTER = (1.0, 2.0, 5.0, 10.0, 15.0)  # s, after Discord, the network or a service failed past their own retries
VERIFY_POLL_SECONDS = 2.0  # how often /verify-task looks whether its runs have ended
VERIFY_WAIT_SECONDS = 13 * 60.0  # then it reports what has not ended (the interaction's token lives 15 minutes)
GIVE_UP_AFTER = 3600.0  # s of failing edits after which a status message is left as it is (the site has the result)
# Failures that pass: Discord answering 5xx (or 4xx we did not expect), the network, Redis (the channel layer, the
# cache), the database. What they interrupt is done again later; anything else is a bug and is logged as one.
TRANSIENT = (discord.HTTPException, aiohttp.ClientError, OSError, TimeoutError, DatabaseError, RedisError,
             ConnectionInterrupted)
# The process that holds a status message's lease edits it (several processes may run at once, e.g. in a restart)
PROCESS = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def point_at(api_url: str) -> None:
    """Send REST and gateway traffic to another endpoint (a proxy, the tests' fake)."""
    url = yarl.URL(api_url)
    discord.http.Route.BASE = str(url / "api" / "v10")
    scheme = "wss" if url.scheme == "https" else "ws"
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = url.with_scheme(scheme) / "gateway"


# Commands get threads of their own, so answers (due within Discord's 3 s) never queue behind status re-reads. Eight:
# more ORM threads starve the event loop of the GIL and delay the acknowledgements (bench/discord.py).
COMMAND_THREADS = ThreadPoolExecutor(8, thread_name_prefix="discordbot-command")
LIVE_THREADS = ThreadPoolExecutor(4, thread_name_prefix="discordbot-live")


def in_thread(fn, *args, **kwargs):
    """A blocking ORM call of a command off the event loop (connections closed when unusable)."""
    return database_sync_to_async(fn, thread_sensitive=False, executor=COMMAND_THREADS)(*args, **kwargs)


def in_live_thread(fn, *args, **kwargs):
    return database_sync_to_async(fn, thread_sensitive=False, executor=LIVE_THREADS)(*args, **kwargs)


def member_of(interaction: discord.Interaction) -> Member:
    user = interaction.user
    roles = [role.id for role in getattr(user, "roles", [])]
    return Member(user.id, user.name, getattr(user, "global_name", None) or user.display_name, roles,
                  interaction.guild_id, interaction.channel_id)


def already_acknowledged(exc: discord.HTTPException) -> bool:
    return exc.code == 40060


async def respond(interaction: discord.Interaction, content: str, ephemeral: bool = True, **kwargs) -> None:
    """The interaction's answer, or a follow-up when it has one already (Discord answers 40060 when another process
    of ours, or an earlier try, acknowledged it)."""
    content = render.contained(content)
    if not interaction.response.is_done():
        try:
            return await interaction.response.send_message(content, ephemeral=ephemeral, **kwargs)
        except discord.HTTPException as exc:
            if not already_acknowledged(exc):
                raise
            log.info("interaction %s was acknowledged already; following up instead", interaction.id)
    await interaction.followup.send(content, ephemeral=ephemeral, **kwargs)


async def send(interaction: discord.Interaction, text: str, ephemeral: bool = True, **kwargs) -> None:
    """Text of any length: the answer, then follow-ups, each within Discord's 2,000 characters."""
    first, *rest = render.split(text)
    await respond(interaction, first, ephemeral, **kwargs)
    for part in rest:
        await interaction.followup.send(part, ephemeral=ephemeral)


async def refuse(interaction: discord.Interaction, message: str) -> None:
    await respond(interaction, render.clip(message), True)


async def answer(interaction: discord.Interaction, fn, *args, ephemeral: bool = True) -> None:
    """Run a service function and send its text (or its refusal, ephemeral)."""
    try:
        text = await in_thread(fn, member_of(interaction), *args)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await send(interaction, text, ephemeral=ephemeral)


def text_file(name: str, text: str) -> discord.File:
    return discord.File(io.BytesIO(text.encode()), filename=name)


def upload_limit(interaction: discord.Interaction) -> int:
    return getattr(interaction, "filesize_limit", 0) or UPLOAD_LIMIT  # the guild's limit (its boosts), from Discord


# --- live status messages --------------------------------------------------------------------------------------

@dataclass
class Watch:
    row_id: int
    submission_id: int
    public: bool
    discord_user_id: int
    channel_id: int
    guild_id: int | None
    application_id: int
    token: str
    token_expires: datetime
    original_id: int
    message_id: int | None = None
    last_content: str = ""
    last_edit: float = 0.0
    recent_edits: deque[float] = field(  # the answer that created the message counts
        default_factory=lambda: deque([time.monotonic()], maxlen=EDITS_PER_WINDOW))
    dirty: asyncio.Event = field(default_factory=asyncio.Event)
    final: bool = False  # a run ended: shown without the coalescing interval (the rate-limit window still holds)
    reported: bool = False  # the owner has its report
    task: asyncio.Task | None = None

    def next_edit_at(self, interval: float) -> float:
        """The coalescing interval, and never more edits per window than Discord allows on one message."""
        window_full = len(self.recent_edits) == EDITS_PER_WINDOW
        return max(0.0 if self.final else self.last_edit + interval,
                   self.recent_edits[0] + EDIT_WINDOW if window_full else 0.0)


class Live:
    """Follows submissions and boards on the channel layer. Each status message is re-rendered from the database
    when an event says its submission moved, at most once per DISCORD_EDIT_INTERVAL (edits coalesce).

    A process edits only the status messages whose lease it holds (`service.claim_status_messages`), so bots running
    at once (a restart overlapping the old process) never edit one message twice or send its report twice; a dead
    process's messages are taken over when its lease lapses. Discord, Redis or the database failing for a while
    delays an edit, never loses it: the round is done again after RETRY_AFTER."""

    def __init__(self, client: KernelBot):
        self.client = client
        self.layer = get_channel_layer()
        self.watches: dict[int, Watch] = {}
        self.run_to_submission: dict[int, int] = {}
        self.boards: set[int] = set()
        self.tasks: set[asyncio.Task] = set()
        self.channel = ""
        self.layer_failed = False  # events may have been missed: re-read every watched submission soon

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("live task failed", exc_info=task.exception())

    async def _forever(self, what: str, step) -> None:
        """`step()` again and again; a transient failure is logged and the step retried after a pause."""
        failures = 0
        while True:
            try:
                await step()
                failures = 0
            except TRANSIENT as exc:
                log.warning("%s failed (%r); retrying", what, exc)
                await asyncio.sleep(RETRY_AFTER[min(failures, len(RETRY_AFTER) - 1)])
                failures += 1

    async def start(self) -> None:
        if self.layer is None:
            log.error("no channel layer: live status and announcements are off")
            return
        live.ensure_tailer()  # the outbox, when this process's layer cannot hear the workers by itself
        self.channel = await self.layer.new_channel("discordbot.")
        self.spawn(self._forever("receiving events", self._receive))
        self.spawn(self._forever("the board sweep", self._follow_boards))
        self.spawn(self._forever("keeping status messages", self._keep_leases))
        with contextlib.suppress(*TRANSIENT):  # the sweep posts them otherwise
            await self._announce(await in_live_thread(announce.claim_recent))

    async def _keep_leases(self) -> None:
        """Renew this process's leases, take over status messages no live process holds, drop those lost."""
        while True:
            held = await in_live_thread(service.renew_status_leases, PROCESS)
            for submission_id, watch in list(self.watches.items()):
                if watch.row_id not in held:
                    log.info("status message of submission %s is another process's now", submission_id)
                    self._drop(watch)
            for row in await in_live_thread(service.claim_status_messages, PROCESS):
                await self.watch(Watch(row.pk, row.submission_id, row.public, row.discord_user_id, row.channel_id,
                                       row.guild_id, row.application_id, row.interaction_token, row.token_expires,
                                       row.original_id, row.message_id, reported=row.reported))
            await asyncio.sleep(service.lease_seconds() / 3)

    async def _subscribe(self, group: str, channel: str) -> None:
        """Join a group; while Redis is away, the follow loops poll and the group is joined again later."""
        try:
            await self.layer.group_add(group, channel)
        except TRANSIENT as exc:
            log.warning("could not follow %s (%r); polling until the channel layer is back", group, exc)
            self.layer_failed = True
            self.spawn(self._subscribe_again(group, channel))

    async def _subscribe_again(self, group: str, channel: str) -> None:
        while True:
            await asyncio.sleep(RETRY_AFTER[1])
            try:
                await self.layer.group_add(group, channel)
            except TRANSIENT:
                continue
            self.layer_failed = False
            for watch in self.watches.values():
                watch.dirty.set()  # what happened while nobody listened
            return

    async def watch(self, watch: Watch) -> None:
        leaderboard_id, run_ids = await in_live_thread(service.runs_of, watch.submission_id)
        for run_id in run_ids:
            self.run_to_submission[run_id] = watch.submission_id
        if leaderboard_id is not None:
            await self._follow_board(leaderboard_id)
        self.watches[watch.submission_id] = watch
        await self._subscribe(f"submission.{watch.submission_id}", self.channel)
        watch.dirty.set()  # events sent before group_add are covered by this first read
        watch.task = self.spawn(self._follow(watch))

    def _drop(self, watch: Watch) -> None:
        self.watches.pop(watch.submission_id, None)
        if watch.task is not None and watch.task is not asyncio.current_task():
            watch.task.cancel()

    async def _receive(self) -> None:
        while True:
            message = await self.layer.receive(self.channel)
            kind = message.get("type")
            if kind == "submission.update":
                watch = self.watches.get(self.run_to_submission.get(message.get("run"), -1))
                if watch is not None:
                    watch.final = watch.final or message.get("status") in TERMINAL_STATUSES
                    watch.dirty.set()
            elif kind == "leaderboard.ranks":
                # the group name is not in the message: ranks events go to one channel per board (below)
                pass

    async def _follow_boards(self) -> None:
        """New open boards (followed and announced), podium changes no event brought, broken problem versions to tell
        the report channel of, published final standings, and announcements that another (dead) process or a refused
        post left unposted."""
        while True:
            for board_id in await in_live_thread(announce.open_leaderboard_ids):
                await self._follow_board(board_id)
            await self._announce(await in_live_thread(announce.claim_recent))
            await self._announce(await in_live_thread(announce.claim_broken_problems))
            await self._announce(await in_live_thread(announce.claim_final_standings))
            await self._announce(await in_live_thread(announce.claim_stale))
            await asyncio.sleep(settings.DISCORD_SWEEP_SECONDS)

    async def _follow_board(self, board_id: int) -> None:
        if board_id in self.boards:
            return
        try:
            channel = await self.layer.new_channel("discordbot.")
        except TRANSIENT as exc:  # the next sweep tries again
            log.warning("could not follow board %s (%r)", board_id, exc)
            self.layer_failed = True
            return
        self.boards.add(board_id)
        await self._subscribe(f"leaderboard.{board_id}", channel)
        self.spawn(self._forever(f"board {board_id}", lambda: self._receive_board(board_id, channel)))

    async def _receive_board(self, board_id: int, channel: str) -> None:
        while True:
            message = await self.layer.receive(channel)
            if message.get("type") == "leaderboard.ranks" and message.get("entries"):
                claimed = await in_live_thread(announce.claim_for_event, board_id, message["gpu_type"],
                                          [e["submission"] for e in message["entries"]])
                await self._announce(claimed)

    async def _announce(self, claimed: list[announce.Claimed]) -> None:
        for item in claimed:
            try:
                sent = await self.client.get_partial_messageable(item.channel_id).send(  # the participant role only:
                    render.contained(item.text), allowed_mentions=ANNOUNCE_MENTIONS)  # names never ping
            except TRANSIENT as exc:
                log.warning("could not post announcement %s (%r); retried after %s s", item.announcement_id, exc,
                            settings.DISCORD_ANNOUNCE_RETRY_SECONDS)
                continue
            await in_live_thread(announce.posted, item.announcement_id, sent.id)

    def _webhook(self, watch: Watch) -> discord.Webhook:
        """The interaction's webhook (what `interaction.followup` is), rebuilt from the stored token after a restart."""
        webhook = discord.Webhook.partial(watch.application_id, watch.token, client=self.client)
        webhook.type = discord.WebhookType.application
        return webhook

    def _token_usable(self, watch: Watch) -> bool:
        lifetime = settings.DISCORD_INTERACTION_TOKEN_SECONDS
        margin = min(60.0, lifetime / 4)
        return bool(watch.token) and timezone.now() < watch.token_expires - timedelta(seconds=margin)

    async def _target(self, watch: Watch) -> discord.abc.Messageable:
        if watch.public:
            channel_id = watch.channel_id
            guild = await in_live_thread(service.guild_config, watch.guild_id)
            if guild and guild.report_channel_id:
                channel_id = guild.report_channel_id
            return self.client.get_partial_messageable(channel_id)
        user = await self.client.fetch_user(watch.discord_user_id)
        return await user.create_dm()

    async def _through_token(self, watch: Watch, call):
        """A call through the interaction's token; when Discord says the token is spent (401, 50027) before we
        expected, the message moves on as if it had expired."""
        try:
            return await call()
        except discord.HTTPException as exc:
            if exc.status != 401 and exc.code != 50027:
                raise
            log.info("interaction token of submission %s expired early", watch.submission_id)
            watch.token = ""
            await in_live_thread(service.save_status_message, watch.row_id, interaction_token="")
            return None

    async def _edit(self, watch: Watch, content: str) -> bool:
        content = render.clip(content)
        if watch.message_id is None and self._token_usable(watch):
            edited = await self._through_token(
                watch, lambda: self._webhook(watch).edit_message(watch.original_id, content=content))
            if edited is not None:
                return True
        target = await self._target(watch)
        if watch.message_id is None:
            sent = await target.send(content)
            watch.message_id = sent.id
            await in_live_thread(service.save_status_message, watch.row_id, message_id=sent.id, interaction_token="")
        else:
            await target.get_partial_message(watch.message_id).edit(content=content)
        return True

    async def _report(self, watch: Watch, report: str) -> None:
        limit = UPLOAD_LIMIT
        while True:
            file = text_file(f"submission-{watch.submission_id}.txt", render.fit_file(report, limit))
            try:
                if self._token_usable(watch):
                    sent = await self._through_token(watch, lambda file=file: self._webhook(watch).send(
                        "The full report (only you see it):", file=file, ephemeral=True, wait=True))
                    if sent is not None:
                        return
                user = await self.client.fetch_user(watch.discord_user_id)
                await user.send(f"The full report of submission #{watch.submission_id}:", file=file)
                return
            except discord.HTTPException as exc:
                if exc.status == 413 or exc.code == 40005:  # this server's upload limit is lower: cut the report
                    limit = min(limit, len(render.fit_file(report, limit).encode())) // 2
                    if limit >= 64:
                        continue
                    log.info("submission %s's report fits no upload; it is on the site", watch.submission_id)
                    return
                if exc.code == 50007:  # the member accepts no DMs: there is nowhere private left to send it
                    log.info("submission %s's author takes no DMs; its report is on the site", watch.submission_id)
                    return
                raise

    async def _follow(self, watch: Watch) -> None:
        failures, failing_since = 0, 0.0
        while True:
            try:
                if await self._round(watch):
                    return
                failures = 0
            except TRANSIENT as exc:  # Discord, the network, Redis or the database failing: the round is done again
                failing_since = failing_since if failures else time.monotonic()
                if time.monotonic() - failing_since > GIVE_UP_AFTER:  # e.g. a channel the bot may not post in
                    log.warning("status of submission %s not updated for %s s (%r); giving up", watch.submission_id,
                                GIVE_UP_AFTER, exc)
                    with contextlib.suppress(*TRANSIENT):
                        await in_live_thread(service.save_status_message, watch.row_id, finished=True)
                    self.watches.pop(watch.submission_id, None)
                    return
                pause = RETRY_AFTER[min(failures, len(RETRY_AFTER) - 1)]
                log.warning("status of submission %s not updated (%r); trying again in %s s", watch.submission_id,
                            exc, pause)
                failures += 1
                watch.dirty.set()
                await asyncio.sleep(pause)

    async def _round(self, watch: Watch) -> bool:
        """One edit of the status message (when it changed), and at the end its report; True when it is done."""
        interval = settings.DISCORD_EDIT_INTERVAL
        refresh = RETRY_AFTER[2] if self.layer_failed else SAFETY_REFRESH
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(watch.dirty.wait(), refresh)
        wait = watch.next_edit_at(interval) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)  # everything that arrives meanwhile makes one edit
        watch.dirty.clear()
        if not await in_live_thread(service.hold_status_lease, watch.row_id, PROCESS):
            log.info("status message of submission %s is another process's now", watch.submission_id)
            self._drop(watch)
            return True
        shown = await in_live_thread(service.progress, watch.submission_id, watch.public)
        if shown is None:
            shown = service.Progress(f"Submission #{watch.submission_id} was deleted.", True, "")
        if shown.content != watch.last_content or (watch.message_id is None and not self._token_usable(watch)):
            try:
                await self._edit(watch, shown.content)
            except discord.NotFound:
                log.info("status message of submission %s is gone; no more edits", watch.submission_id)
                shown.done, shown.report = True, ""
            except discord.Forbidden as exc:
                if exc.code != 50007:
                    raise
                log.info("submission %s's author takes no DMs: its status is on the site", watch.submission_id)
                shown.done, shown.report = True, ""
            except discord.HTTPException as exc:
                if exc.status != 429:
                    raise
                # rate limited past discord.py's own retries: show the latest state on a later round
                log.info("edit of submission %s rate limited; retrying later", watch.submission_id)
                watch.dirty.set()
                watch.last_edit = time.monotonic() + RATE_LIMIT_BACKOFF
                return False
            watch.last_content, watch.last_edit = shown.content, time.monotonic()
            watch.recent_edits.append(watch.last_edit)
        watch.final = False
        if not shown.done:
            return False
        if shown.report and not watch.reported:
            await self._report(watch, shown.report)
            watch.reported = True
            await in_live_thread(service.save_status_message, watch.row_id, reported=True)
        await in_live_thread(service.save_status_message, watch.row_id, finished=True, interaction_token="")
        self.watches.pop(watch.submission_id, None)
        with contextlib.suppress(*TRANSIENT):
            await self.layer.group_discard(f"submission.{watch.submission_id}", self.channel)
        return True


# --- commands ----------------------------------------------------------------------------------------------------

async def leaderboard_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    names = await in_thread(service.leaderboard_names, member_of(interaction), current)
    return [app_commands.Choice(name=n, value=n) for n in names]


async def gpu_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    board = getattr(interaction.namespace, "leaderboard_name", None)
    names = await in_thread(service.gpu_names, member_of(interaction), board, current)
    return [app_commands.Choice(name=n, value=n) for n in names]


async def lang_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    """The chosen board's template languages (a fixed list of choices could not follow the board)."""
    board = getattr(interaction.namespace, "leaderboard_name", None)
    names = await in_thread(service.template_langs, member_of(interaction), board, current)
    return [app_commands.Choice(name=n, value=n) for n in names]


def submit_command(mode: str, description: str) -> app_commands.Command:
    @app_commands.command(name=mode, description=description)
    @app_commands.describe(script="Your kernel (a .py or .cu file)",
                           leaderboard_name="Default: the file's #!POPCORN leaderboard line",
                           gpu="One or more GPU types, comma-separated (default: the file's #!POPCORN gpu line)")
    @app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete, gpu=gpu_autocomplete)
    async def command(interaction: discord.Interaction, script: discord.Attachment | None = None,
                      leaderboard_name: str | None = None, gpu: str | None = None) -> None:
        await interaction.client.submit(interaction, mode, script, leaderboard_name, gpu)

    return command


leaderboard_group = app_commands.Group(name="leaderboard", description="Submit kernels and read the leaderboards",
                                       guild_only=True)
submit_group = app_commands.Group(name="submit", description="Submit a kernel", parent=leaderboard_group)
for _mode, _text in (("test", "Check correctness on the public tests"),
                     ("benchmark", "Time on the public benchmarks"),
                     ("ranked", "A ranked submission: tests, benchmarks and the secret run"),
                     ("profile", "Profile the kernel")):
    submit_group.add_command(submit_command(_mode, _text))


@leaderboard_group.command(name="list", description="Open leaderboards")
async def list_command(interaction: discord.Interaction) -> None:
    await answer(interaction, service.list_leaderboards)


@leaderboard_group.command(name="show", description="A leaderboard's ranking on one GPU type")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete, gpu=gpu_autocomplete)
async def show_command(interaction: discord.Interaction, leaderboard_name: str, gpu: str | None = None,
                       page: app_commands.Range[int, 1, 10**6] = 1) -> None:
    await answer(interaction, service.show, leaderboard_name, gpu, page)


@leaderboard_group.command(name="show-personal", description="Your submissions on a leaderboard")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def show_personal_command(interaction: discord.Interaction, leaderboard_name: str,
                                page: app_commands.Range[int, 1, 10**6] = 1) -> None:
    await answer(interaction, service.show_personal, leaderboard_name, page)


@leaderboard_group.command(name="task", description="A leaderboard's task and its public files")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def task_command(interaction: discord.Interaction, leaderboard_name: str) -> None:
    try:
        text, files = await in_thread(service.task, member_of(interaction), leaderboard_name)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(render.contained(text), ephemeral=True,
                                            files=[text_file(n, t) for n, t in sorted(files.items())][:10])


@leaderboard_group.command(name="template", description="A starting point for a submission")
@app_commands.describe(lang="The language of the template (the board's own list)")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete, lang=lang_autocomplete)
async def template_command(interaction: discord.Interaction, leaderboard_name: str, lang: str | None = None) -> None:
    try:
        name, text = await in_thread(service.template, member_of(interaction), leaderboard_name, lang)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(f"Template for {render.isolate(leaderboard_name)}:",
                                            file=text_file(name, text), ephemeral=True)


@leaderboard_group.command(name="get-submission",
                           description="Download a submission's code (yours; others' once its board's code is public)")
async def get_submission_command(interaction: discord.Interaction, submission_id: int) -> None:
    try:
        name, text = await in_thread(service.get_submission, member_of(interaction), submission_id)
        if len(text.encode()) > upload_limit(interaction):
            link = render.link("submission", submission_id)
            raise BotError(f"Submission #{submission_id} is {len(text.encode())} bytes, more than this server takes "
                           f"in an upload ({upload_limit(interaction)} bytes); download it on the site"
                           f"{': ' + link if link else ''}.")
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, f"Submission #{submission_id}:", file=text_file(name, text))


submission_group = app_commands.Group(name="submission", description="Submissions", guild_only=True)


@submission_group.command(name="status", description="A submission's status and results")
async def status_command(interaction: discord.Interaction, submission_id: int) -> None:
    await answer(interaction, service.submission_status, submission_id)


gpus_group = app_commands.Group(name="gpus", description="Reserve shared GPUs", guild_only=True)


@gpus_group.command(name="availability", description="Free GPUs, the queue and when a request would start")
async def gpus_availability_command(interaction: discord.Interaction) -> None:
    await answer(interaction, gpus.availability)


@gpus_group.command(name="reserve", description="Reserve GPUs on one node or more; waits in the queue when none are "
                    "free")
@app_commands.describe(gpu_type="e.g. H100", count="GPUs on each node", duration="How long: 90m, 2h, 0.25h, 1h30m",
                       project="For reports", nodes="Nodes, all or nothing (one pool)")
async def gpus_reserve_command(interaction: discord.Interaction, gpu_type: str,
                               count: app_commands.Range[int, 1, 64], duration: app_commands.Range[str, 1, 20],
                               project: str = "", nodes: app_commands.Range[int, 1, 64] = 1) -> None:
    await answer(interaction, gpus.reserve, gpu_type, count, duration, project, nodes)


@gpus_group.command(name="list", description="Your open reservations")
async def gpus_list_command(interaction: discord.Interaction) -> None:
    await answer(interaction, gpus.mine)


@gpus_group.command(name="cancel", description="Cancel a queued reservation or end an active one (yours, without "
                    "an id)")
async def gpus_cancel_command(interaction: discord.Interaction, reservation_id: int | None = None) -> None:
    await answer(interaction, gpus.cancel, reservation_id)


@gpus_group.command(name="extend", description="Extend a reservation (when no one queued would wait longer)")
async def gpus_extend_command(interaction: discord.Interaction, reservation_id: int,
                              minutes: app_commands.Range[int, 1, 100_000]) -> None:
    await answer(interaction, gpus.extend, reservation_id, minutes)


admin_group = app_commands.Group(name="admin", description="Organiser commands", guild_only=True)


@admin_group.command(name="stop", description="Pause new submissions on every front-end")
async def stop_command(interaction: discord.Interaction, reason: str = "") -> None:
    await answer(interaction, service.set_accepting, False, reason, ephemeral=False)


@admin_group.command(name="start", description="Accept submissions again")
async def start_command(interaction: discord.Interaction) -> None:
    await answer(interaction, service.set_accepting, True, "", ephemeral=False)


@admin_group.command(name="requeue", description="Run a run again")
async def requeue_command(interaction: discord.Interaction, run_id: int) -> None:
    await answer(interaction, service.requeue, run_id)


@admin_group.command(name="cancel", description="Cancel an unfinished run")
async def cancel_command(interaction: discord.Interaction, run_id: int) -> None:
    await answer(interaction, service.cancel, run_id)


@admin_group.command(name="rescore", description="Recompute a leaderboard's scores with its current rule")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def rescore_command(interaction: discord.Interaction, leaderboard_name: str) -> None:
    await answer(interaction, service.rescore, leaderboard_name)


@admin_group.command(name="stats", description="Submissions, runs per runner, pass rate, queue delay, GPU time")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def stats_command(interaction: discord.Interaction, days: app_commands.Range[int, 1, 3650] = 1,
                        leaderboard_name: str | None = None) -> None:
    await answer(interaction, service.statistics, days, leaderboard_name)


@admin_group.command(name="show-stats", description="KernelBot's statistics: all time, or the last day only")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def show_stats_command(interaction: discord.Interaction, last_day_only: bool = False,
                             leaderboard_name: str | None = None) -> None:
    await answer(interaction, service.statistics, 1 if last_day_only else 3650, leaderboard_name)


@admin_group.command(name="ban", description="Stop a Discord user from submitting (to one leaderboard or all)")
@app_commands.describe(user_id="Discord user id (Developer Mode → right-click → Copy User ID)")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def ban_command(interaction: discord.Interaction, user_id: str, leaderboard_name: str | None = None,
                      reason: str = "") -> None:
    await answer(interaction, service.ban, user_id, leaderboard_name, reason)


@admin_group.command(name="unban", description="Let a banned Discord user submit again")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def unban_command(interaction: discord.Interaction, user_id: str, leaderboard_name: str | None = None) -> None:
    await answer(interaction, service.unban, user_id, leaderboard_name)


@admin_group.command(name="get-user-names", description="Discord id → shown name of everyone who submitted (JSON)")
async def get_user_names_command(interaction: discord.Interaction) -> None:
    try:
        text = await in_thread(service.user_names, member_of(interaction))
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, "Discord id → name:", file=text_file("user_mapping.json", text))


@admin_group.command(name="update-user-names", description="Set shown names from a JSON file of Discord id → name")
async def update_user_names_command(interaction: discord.Interaction, attachment: discord.Attachment) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        if attachment.size > MAX_FILE:
            raise BotError(f"'{attachment.filename}' is {attachment.size} bytes; the limit is {MAX_FILE} bytes.")
        text = await in_thread(service.update_user_names, member, await attachment.read())
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, text)


@admin_group.command(name="update-problems", description="Import the problem sets of a repository's branch")
@app_commands.describe(repository_name="owner/name (default: the configured one)", problem_set="problems/<set>.yaml "
                       "(default: every set)", branch="The branch (no slashes)", force="Let leaderboards with "
                       "submissions change (with one problem set)", closed="New leaderboards are closed (invite "
                       "only)")
async def update_problems_command(interaction: discord.Interaction, repository_name: str | None = None,
                                  problem_set: str | None = None, branch: str = "main", force: bool = False,
                                  closed: bool = False) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        await interaction.response.defer(ephemeral=True, thinking=True)  # a download takes longer than 3 s
        text = await in_thread(service.update_problems, member, repository_name, problem_set, branch, force, closed)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await send(interaction, text)


@admin_group.command(name="export-hf", description="Push the submissions dataset to a Hugging Face dataset repository")
@app_commands.describe(leaderboard_name="One closed board (default: every closed board whose code is public)",
                       filename="Parquet file name in the repository (default: <leaderboard_name>.parquet)",
                       private="Keep a repository this creates private (default: true)",
                       repository="owner/name on the Hub (default: HF_PRIVATE_DATASET, or HF_PUBLIC_DATASET when "
                       "private is false)")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def export_hf_command(interaction: discord.Interaction, leaderboard_name: str | None = None,
                            filename: str | None = None, private: bool = True, repository: str | None = None) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        await interaction.response.defer(ephemeral=True, thinking=True)  # an export and an upload take a while
        text = await in_thread(service.export_hf, member, repository, leaderboard_name, filename, private)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await send(interaction, text)


@admin_group.command(name="verifyruns", description="Run the health checks (a known-good submission) on every pool")
async def verify_runs_command(interaction: discord.Interaction) -> None:
    await answer(interaction, service.verify_runs)


@admin_group.command(name="resync", description="Sync the slash commands to this server again")
async def resync_command(interaction: discord.Interaction) -> None:
    """KernelBot's resync: this guild's commands are replaced by the bot's current ones (after an upgrade, or when
    Discord shows stale options)."""
    try:
        await in_thread(service.require_organiser, member_of(interaction))
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.defer(ephemeral=True, thinking=True)
    tree, guild = interaction.client.tree, discord.Object(interaction.guild_id)
    tree.clear_commands(guild=guild)
    tree.copy_global_to(guild=guild)
    synced = await tree.sync(guild=guild)
    await send(interaction, "Resynced commands:\n" + "\n".join(f"- /{c.name}" for c in synced))


@admin_group.command(name="set-forum-ids", description="KernelBot's forum threads: nothing to set here")
async def set_forum_ids_command(interaction: discord.Interaction) -> None:
    await answer(interaction, service.set_forum_ids)


async def task_dir_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    names = await in_thread(verify.task_dirs, current)
    return [app_commands.Choice(name=n, value=n) for n in names]


@app_commands.command(name="verify-task", description="Check a task directory: it imports, and its solutions pass "
                      "(wrong… ones fail)")
@app_commands.guild_only()
@app_commands.describe(task="A task directory under the problems directory, e.g. demo/vectoradd_py",
                       mode="What to run each solution as (default: leaderboard)",
                       gpu="GPU type(s), comma-separated (default: the task's gpus)")
@app_commands.choices(mode=[app_commands.Choice(name=n, value=n) for n in verify.MODES])
@app_commands.autocomplete(task=task_dir_autocomplete)
async def verify_task_command(interaction: discord.Interaction, task: str,
                              mode: app_commands.Choice[str] | None = None, gpu: str | None = None) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        await interaction.response.defer(ephemeral=True, thinking=True)  # loading and previewing take a while
        started = await in_thread(verify.start, member, task, mode.value if mode else "leaderboard", gpu)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await send(interaction, started.text)
    if started.checks:
        interaction.client.keep(verify_report(interaction, started.checks))


async def verify_report(interaction: discord.Interaction, checks: list[verify.Check]) -> None:
    """Follows up with the report once every run has ended, or with what has not when the interaction's token is
    about to expire."""
    until = time.monotonic() + VERIFY_WAIT_SECONDS
    while (text := await in_thread(verify.report, checks, time.monotonic() >= until)) is None:
        await asyncio.sleep(VERIFY_POLL_SECONDS)
    await send(interaction, text)


@app_commands.command(name="ping", description="Is the bot alive?")
async def ping_command(interaction: discord.Interaction) -> None:
    await answer(interaction, service.ping)


@admin_group.command(name="import", description="Import a problem from a zip (task.yml and its files)")
async def import_command(interaction: discord.Interaction, archive: discord.Attachment,
                         leaderboard_name: str | None = None, deadline: str | None = None, gpus: str | None = None,
                         force: bool = False) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        if archive.size > MAX_FILE:
            raise BotError(f"'{archive.filename}' is {archive.size} bytes; the limit is {MAX_FILE} bytes.")
        await interaction.response.defer(ephemeral=True, thinking=True)  # an import can take longer than 3 s
        data = await archive.read()
        text = await in_thread(service.import_problem, member, data, leaderboard_name, deadline, gpus, force)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.followup.send(render.clip(text), ephemeral=True)


class ConfirmDelete(discord.ui.View):
    """Delete or keep, answered by the organiser who asked: `delete` is a service function of the member."""

    def __init__(self, organiser_id: int, what: str, delete, *args):
        super().__init__(timeout=300)
        self.organiser_id, self.what, self.delete, self.args = organiser_id, what, delete, args

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id != self.organiser_id:
            await interaction.response.send_message("Only the organiser who asked may confirm.", ephemeral=True)
            return False
        return True

    @discord.ui.button(label="Delete", style=discord.ButtonStyle.danger, custom_id="kb-delete-confirm")
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        try:
            text = await in_thread(self.delete, member_of(interaction), *self.args)
        except BotError as exc:
            text = str(exc)
        await interaction.response.edit_message(content=render.clip(text), view=None)

    @discord.ui.button(label="Keep", style=discord.ButtonStyle.secondary, custom_id="kb-delete-keep")
    async def keep(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        await interaction.response.edit_message(content=render.contained(f"{self.what} is kept."), view=None)


@admin_group.command(name="delete-leaderboard", description="Delete a leaderboard (asks for confirmation)")
@app_commands.autocomplete(leaderboard_name=leaderboard_autocomplete)
async def delete_leaderboard_command(interaction: discord.Interaction, leaderboard_name: str,
                                     force: bool = False) -> None:
    try:
        text = await in_thread(service.describe_leaderboard_delete, member_of(interaction), leaderboard_name, force)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, text, view=ConfirmDelete(interaction.user.id,
                                                        f"Leaderboard '{render.isolate(leaderboard_name)}'",
                                                        service.delete_leaderboard, leaderboard_name, force))


@admin_group.command(name="get-submission", description="A submission's code and runs.json (secret runs too)")
async def admin_get_submission_command(interaction: discord.Interaction, submission_id: int) -> None:
    try:
        text, (name, code), runs = await in_thread(service.admin_submission, member_of(interaction), submission_id)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, render.clip(text), files=[text_file(name, code), text_file("runs.json", runs)])


@admin_group.command(name="delete-submission", description="Delete a submission (asks for confirmation)")
async def delete_command(interaction: discord.Interaction, submission: int) -> None:
    try:
        text = await in_thread(service.describe_for_delete, member_of(interaction), submission)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await respond(interaction, text, view=ConfirmDelete(interaction.user.id, f"Submission #{submission}",
                                                        service.delete_submission, submission))


# --- the client ----------------------------------------------------------------------------------------------------

class CommandTree(app_commands.CommandTree):
    async def on_error(self, interaction: discord.Interaction, error: app_commands.AppCommandError) -> None:
        log.error("command %s failed", interaction.command and interaction.command.qualified_name,
                  exc_info=error)
        await refuse(interaction, "Something went wrong on our side; the organisers have the details.")


class KernelBot(discord.Client):
    def __init__(self, **options: Any):
        intents = discord.Intents.none()
        intents.guilds = True  # roles for the organiser check; slash commands need no privileged intent
        super().__init__(intents=intents, **options)
        self.tree = CommandTree(self)
        for command in (leaderboard_group, submission_group, gpus_group, admin_group, ping_command,
                        verify_task_command):
            self.tree.add_command(command)
        self.live = Live(self)
        self._kept: set[asyncio.Task] = set()

    def keep(self, coro) -> None:
        """Run `coro` in the background, holding a reference until it ends (asyncio keeps only a weak one)."""
        task = asyncio.create_task(coro)
        self._kept.add(task)
        task.add_done_callback(self._kept.discard)

    async def setup_hook(self) -> None:
        service.forget_guilds()
        await in_thread(service.ensure_bootstrap_guild)
        for guild_id in await in_thread(service.served_guild_ids):
            guild = discord.Object(guild_id)
            self.tree.copy_global_to(guild=guild)  # per-guild commands appear at once (global ones take up to 1 h)
            await self.tree.sync(guild=guild)
        await self.live.start()

    async def on_ready(self) -> None:
        log.info("discord bot ready as %s in %s guild(s)", self.user, len(self.guilds))

    async def submit(self, interaction: discord.Interaction, mode: str, script: discord.Attachment | None,
                     leaderboard: str | None, gpus: str | None) -> None:
        member = member_of(interaction)
        try:
            service.check_attachment(script and script.filename, script.size if script else 0)
        except BotError as exc:
            return await refuse(interaction, str(exc))
        # acknowledge at once ("thinking…"): under a burst of submissions the checks below queue for the database,
        # and Discord drops an interaction not answered within 3 s.
        public = service.is_public(mode)
        try:
            await interaction.response.defer(ephemeral=not public, thinking=True)
        except discord.HTTPException as exc:
            if not already_acknowledged(exc):
                raise
        deferred_at = time.monotonic()
        try:
            content = await script.read()
            if not gpus:
                gpus = await self.choose_gpus(interaction, member, leaderboard, content)
                if gpus is None:
                    raise BotError("No GPU type was chosen; nothing was submitted.")
            submitted = await in_thread(service.submit, member, mode, script.filename, content, leaderboard, gpus)
        except BotError as exc:
            if public:  # a refusal is for the submitter only: the public "thinking…" answer makes way for it
                await interaction.delete_original_response()
                await interaction.followup.send(render.clip(str(exc)), ephemeral=True)
            else:
                await interaction.edit_original_response(content=render.clip(str(exc)))
            return
        shown = await interaction.edit_original_response(content=submitted.content)
        row = await in_thread(service.track, submitted, member, interaction.application_id, interaction.token,
                              shown.id, PROCESS)
        edited_at = time.monotonic()
        await self.live.watch(Watch(row.pk, row.submission_id, row.public, row.discord_user_id, row.channel_id,
                                    row.guild_id, row.application_id, row.interaction_token, row.token_expires,
                                    shown.id, last_content=submitted.content, last_edit=edited_at,
                                    recent_edits=deque([deferred_at, edited_at], maxlen=EDITS_PER_WINDOW)))


    async def choose_gpus(self, interaction: discord.Interaction, member: Member, leaderboard: str | None,
                          content: bytes) -> str | None:
        """A submission that names no GPU type: its board's only one, or the author's choice from a menu (as
        KernelBot does); "" when there is nothing to choose from (`service.submit` says why), None when the author
        chose nothing in time."""
        options = await in_thread(service.gpu_options, member, leaderboard, content)
        if len(options) <= 1:
            return options[0] if options else ""
        view = GpuChoice(interaction.user.id, options)
        await interaction.followup.send("Choose the GPU type(s) to run on:", view=view, ephemeral=True)
        await view.wait()
        return ",".join(view.chosen) or None


class GpuChoice(discord.ui.View):
    def __init__(self, author_id: int, names: list[str]):
        super().__init__(timeout=GPU_CHOICE_SECONDS)
        self.author_id, self.chosen = author_id, []
        self.menu = discord.ui.Select(custom_id="kb-gpu-choice", placeholder="GPU types", min_values=1,
                                      max_values=min(len(names), 25),
                                      options=[discord.SelectOption(label=n) for n in names[:25]])
        self.menu.callback = self.picked
        self.add_item(self.menu)

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        return interaction.user.id == self.author_id

    async def picked(self, interaction: discord.Interaction) -> None:
        self.chosen = list(self.menu.values)
        self.stop()
        await interaction.response.edit_message(content=f"Submitting on {', '.join(self.chosen)}.", view=None)


def run(token: str) -> None:
    if settings.DISCORD_API_URL:
        point_at(settings.DISCORD_API_URL)
    KernelBot().run(token, log_handler=None)
