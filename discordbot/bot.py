"""The Discord bot: application commands over `discordbot.service`, live status messages driven by the same
channel-layer events that update the site (`submission.<id>`, `leaderboard.<id>`), and announcements."""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import discord
import yarl
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from discord import app_commands
from django.conf import settings
from django.utils import timezone

from leaderboards import live
from leaderboards.models import TERMINAL_STATUSES

from . import announce, gpus, service
from .service import BotError, Member

log = logging.getLogger(__name__)
# Discord allows 5 edits of one message per 5 s; keep a margin for network delay between us and its clock
EDITS_PER_WINDOW, EDIT_WINDOW = 5, 5.5
RATE_LIMIT_BACKOFF = 2.0  # s, after a 429 that discord.py gave up on
SAFETY_REFRESH = 30.0  # a status re-read even without an event (channel layers deliver at most once)
MAX_FILE = 8 * 1024 * 1024


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


async def refuse(interaction: discord.Interaction, message: str) -> None:
    if interaction.response.is_done():
        await interaction.followup.send(message, ephemeral=True)
    else:
        await interaction.response.send_message(message, ephemeral=True)


async def answer(interaction: discord.Interaction, fn, *args, ephemeral: bool = True) -> None:
    """Run a service function and send its text (or its refusal, ephemeral)."""
    try:
        text = await in_thread(fn, member_of(interaction), *args)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(text, ephemeral=ephemeral)


def text_file(name: str, text: str) -> discord.File:
    return discord.File(io.BytesIO(text.encode()), filename=name)


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

    def next_edit_at(self, interval: float) -> float:
        """The coalescing interval, and never more edits per window than Discord allows on one message."""
        window_full = len(self.recent_edits) == EDITS_PER_WINDOW
        return max(0.0 if self.final else self.last_edit + interval,
                   self.recent_edits[0] + EDIT_WINDOW if window_full else 0.0)


class Live:
    """Follows submissions and boards on the channel layer. Each status message is re-rendered from the database
    when an event says its submission moved, at most once per DISCORD_EDIT_INTERVAL (edits coalesce)."""

    def __init__(self, client: KernelBot):
        self.client = client
        self.layer = get_channel_layer()
        self.watches: dict[int, Watch] = {}
        self.run_to_submission: dict[int, int] = {}
        self.boards: set[int] = set()
        self.tasks: set[asyncio.Task] = set()
        self.channel = ""

    def spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("live task failed", exc_info=task.exception())

    async def start(self) -> None:
        if self.layer is None:
            log.error("no channel layer: live status and announcements are off")
            return
        live.ensure_tailer()  # the outbox, when this process's layer cannot hear the workers by itself
        self.channel = await self.layer.new_channel("discordbot.")
        self.spawn(self._receive())
        self.spawn(self._follow_boards())
        for row in await in_live_thread(service.unfinished_status_messages):
            await self.watch(Watch(row.pk, row.submission_id, row.public, row.discord_user_id, row.channel_id,
                                   row.guild_id, row.application_id, row.interaction_token, row.token_expires,
                                   row.original_id, row.message_id))
        await self._announce(await in_live_thread(announce.claim_recent))

    async def watch(self, watch: Watch) -> None:
        leaderboard_id, run_ids = await in_live_thread(service.runs_of, watch.submission_id)
        for run_id in run_ids:
            self.run_to_submission[run_id] = watch.submission_id
        if leaderboard_id is not None:
            await self._follow_board(leaderboard_id)
        self.watches[watch.submission_id] = watch
        await self.layer.group_add(f"submission.{watch.submission_id}", self.channel)
        watch.dirty.set()  # events sent before group_add are covered by this first read
        self.spawn(self._follow(watch))

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
        """New open boards, broken problem versions to tell the report channel of, published final standings, and
        announcements that another (dead) process or a refused post left unposted."""
        while True:
            for board_id in await in_live_thread(announce.open_leaderboard_ids):
                await self._follow_board(board_id)
            await self._announce(await in_live_thread(announce.claim_broken_problems))
            await self._announce(await in_live_thread(announce.claim_final_standings))
            await self._announce(await in_live_thread(announce.claim_stale))
            await asyncio.sleep(settings.DISCORD_SWEEP_SECONDS)

    async def _follow_board(self, board_id: int) -> None:
        if board_id in self.boards:
            return
        self.boards.add(board_id)
        channel = await self.layer.new_channel("discordbot.")
        await self.layer.group_add(f"leaderboard.{board_id}", channel)
        self.spawn(self._receive_board(board_id, channel))

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
                sent = await self.client.get_partial_messageable(item.channel_id).send(item.text)
            except discord.HTTPException as exc:
                log.warning("could not post announcement %s (%s); retried after %s s", item.announcement_id, exc,
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
        return timezone.now() < watch.token_expires - timedelta(seconds=margin)

    async def _target(self, watch: Watch) -> discord.abc.Messageable:
        if watch.public:
            channel_id = watch.channel_id
            guild = await in_live_thread(service.guild_config, watch.guild_id)
            if guild and guild.report_channel_id:
                channel_id = guild.report_channel_id
            return self.client.get_partial_messageable(channel_id)
        user = await self.client.fetch_user(watch.discord_user_id)
        return await user.create_dm()

    async def _edit(self, watch: Watch, content: str) -> None:
        if watch.message_id is None and self._token_usable(watch):
            await self._webhook(watch).edit_message(watch.original_id, content=content)
            return
        target = await self._target(watch)
        if watch.message_id is None:
            sent = await target.send(content)
            watch.message_id = sent.id
            await in_live_thread(service.save_status_message, watch.row_id, message_id=sent.id, interaction_token="")
        else:
            await target.get_partial_message(watch.message_id).edit(content=content)

    async def _report(self, watch: Watch, report: str) -> None:
        file = text_file(f"submission-{watch.submission_id}.txt", report)
        if self._token_usable(watch):
            await self._webhook(watch).send("The full report (only you see it):", file=file, ephemeral=True)
        else:
            user = await self.client.fetch_user(watch.discord_user_id)
            await user.send(f"The full report of submission #{watch.submission_id}:", file=file)

    async def _follow(self, watch: Watch) -> None:
        interval = settings.DISCORD_EDIT_INTERVAL
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(watch.dirty.wait(), SAFETY_REFRESH)
            wait = watch.next_edit_at(interval) - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # everything that arrives meanwhile makes one edit
            watch.dirty.clear()
            watch.final = False
            shown = await in_live_thread(service.progress, watch.submission_id, watch.public)
            if shown is None:
                shown = service.Progress(f"Submission #{watch.submission_id} was deleted.", True, "")
            if shown.content != watch.last_content or (watch.message_id is None and not self._token_usable(watch)):
                try:
                    await self._edit(watch, shown.content)
                except discord.NotFound:
                    log.info("status message of submission %s is gone; no more edits", watch.submission_id)
                    shown.done, shown.report = True, ""
                except discord.HTTPException as exc:
                    if exc.status != 429:
                        raise
                    # rate limited past discord.py's own retries: show the latest state on a later round
                    log.info("edit of submission %s rate limited; retrying later", watch.submission_id)
                    watch.dirty.set()
                    watch.last_edit = time.monotonic() + RATE_LIMIT_BACKOFF
                    continue
                watch.last_content, watch.last_edit = shown.content, time.monotonic()
                watch.recent_edits.append(watch.last_edit)
            if shown.done:
                if shown.report:
                    await self._report(watch, shown.report)
                await in_live_thread(service.save_status_message, watch.row_id, finished=True, interaction_token="")
                self.watches.pop(watch.submission_id, None)
                await self.layer.group_discard(f"submission.{watch.submission_id}", self.channel)
                return


# --- commands ----------------------------------------------------------------------------------------------------

async def leaderboard_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    names = await in_thread(service.leaderboard_names, member_of(interaction), current)
    return [app_commands.Choice(name=n, value=n) for n in names]


async def gpu_autocomplete(interaction: discord.Interaction, current: str) -> list[app_commands.Choice]:
    board = getattr(interaction.namespace, "leaderboard", None)
    names = await in_thread(service.gpu_names, member_of(interaction), board, current)
    return [app_commands.Choice(name=n, value=n) for n in names]


def submit_command(mode: str, description: str) -> app_commands.Command:
    @app_commands.command(name=mode, description=description)
    @app_commands.describe(script="Your kernel (a .py or .cu file)",
                           leaderboard="Default: the file's #!POPCORN leaderboard line",
                           gpus="One or more GPU types, comma-separated (default: the file's #!POPCORN gpu line)")
    @app_commands.autocomplete(leaderboard=leaderboard_autocomplete, gpus=gpu_autocomplete)
    async def command(interaction: discord.Interaction, script: discord.Attachment | None = None,
                      leaderboard: str | None = None, gpus: str | None = None) -> None:
        await interaction.client.submit(interaction, mode, script, leaderboard, gpus)

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
@app_commands.autocomplete(leaderboard=leaderboard_autocomplete, gpu=gpu_autocomplete)
async def show_command(interaction: discord.Interaction, leaderboard: str, gpu: str | None = None,
                       page: app_commands.Range[int, 1, 10**6] = 1) -> None:
    await answer(interaction, service.show, leaderboard, gpu, page)


@leaderboard_group.command(name="show-personal", description="Your submissions on a leaderboard")
@app_commands.autocomplete(leaderboard=leaderboard_autocomplete)
async def show_personal_command(interaction: discord.Interaction, leaderboard: str) -> None:
    await answer(interaction, service.show_personal, leaderboard)


@leaderboard_group.command(name="task", description="A leaderboard's task and its public files")
@app_commands.autocomplete(leaderboard=leaderboard_autocomplete)
async def task_command(interaction: discord.Interaction, leaderboard: str) -> None:
    try:
        text, files = await in_thread(service.task, member_of(interaction), leaderboard)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(text, files=[text_file(n, t) for n, t in sorted(files.items())][:10],
                                            ephemeral=True)


@leaderboard_group.command(name="template", description="A starting point for a submission")
@app_commands.autocomplete(leaderboard=leaderboard_autocomplete)
async def template_command(interaction: discord.Interaction, leaderboard: str, lang: str | None = None) -> None:
    try:
        name, text = await in_thread(service.template, member_of(interaction), leaderboard, lang)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(f"Template for {leaderboard}:", file=text_file(name, text),
                                            ephemeral=True)


@leaderboard_group.command(name="get-submission", description="Download a submission's code (yours, or as organiser)")
async def get_submission_command(interaction: discord.Interaction, submission_id: int) -> None:
    try:
        name, text = await in_thread(service.get_submission, member_of(interaction), submission_id)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(f"Submission #{submission_id}:", file=text_file(name, text),
                                            ephemeral=True)


submission_group = app_commands.Group(name="submission", description="Submissions", guild_only=True)


@submission_group.command(name="status", description="A submission's status and results")
async def status_command(interaction: discord.Interaction, submission_id: int) -> None:
    await answer(interaction, service.submission_status, submission_id)


gpus_group = app_commands.Group(name="gpus", description="Reserve shared GPUs", guild_only=True)


@gpus_group.command(name="availability", description="Free GPUs, the queue and when a request would start")
async def gpus_availability_command(interaction: discord.Interaction) -> None:
    await answer(interaction, gpus.availability)


@gpus_group.command(name="reserve", description="Reserve GPUs of one node; waits in the queue when none are free")
@app_commands.describe(gpu_type="e.g. H100", count="GPUs on one node", minutes="How long", project="For reports")
async def gpus_reserve_command(interaction: discord.Interaction, gpu_type: str,
                               count: app_commands.Range[int, 1, 64], minutes: app_commands.Range[int, 1, 100_000],
                               project: str = "") -> None:
    await answer(interaction, gpus.reserve, gpu_type, count, minutes, project)


@gpus_group.command(name="list", description="Your open reservations")
async def gpus_list_command(interaction: discord.Interaction) -> None:
    await answer(interaction, gpus.mine)


@gpus_group.command(name="cancel", description="Cancel a queued reservation or end an active one")
async def gpus_cancel_command(interaction: discord.Interaction, reservation_id: int) -> None:
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
@app_commands.autocomplete(leaderboard=leaderboard_autocomplete)
async def rescore_command(interaction: discord.Interaction, leaderboard: str) -> None:
    await answer(interaction, service.rescore, leaderboard)


@admin_group.command(name="stats", description="Submissions, runs per runner, pass rate, queue delay, GPU time")
async def stats_command(interaction: discord.Interaction, days: app_commands.Range[int, 1, 3650] = 1) -> None:
    await answer(interaction, service.statistics, days)


@admin_group.command(name="import", description="Import a problem from a zip (task.yml and its files)")
async def import_command(interaction: discord.Interaction, archive: discord.Attachment,
                         leaderboard: str | None = None, deadline: str | None = None, gpus: str | None = None,
                         force: bool = False) -> None:
    member = member_of(interaction)
    try:
        await in_thread(service.require_organiser, member)
        if archive.size > MAX_FILE:
            raise BotError(f"'{archive.filename}' is {archive.size} bytes; the limit is {MAX_FILE} bytes.")
        await interaction.response.defer(ephemeral=True, thinking=True)  # an import can take longer than 3 s
        data = await archive.read()
        text = await in_thread(service.import_problem, member, data, leaderboard, deadline, gpus, force)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.followup.send(text, ephemeral=True)


class ConfirmDelete(discord.ui.View):
    def __init__(self, organiser_id: int, submission_id: int):
        super().__init__(timeout=300)
        self.organiser_id, self.submission_id = organiser_id, submission_id

    async def interaction_check(self, interaction: discord.Interaction) -> bool:
        if interaction.user.id != self.organiser_id:
            await interaction.response.send_message("Only the organiser who asked may confirm.", ephemeral=True)
            return False
        return True

    @discord.ui.button(label="Delete", style=discord.ButtonStyle.danger, custom_id="kb-delete-confirm")
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        try:
            text = await in_thread(service.delete_submission, member_of(interaction), self.submission_id)
        except BotError as exc:
            text = str(exc)
        await interaction.response.edit_message(content=text, view=None)

    @discord.ui.button(label="Keep", style=discord.ButtonStyle.secondary, custom_id="kb-delete-keep")
    async def keep(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        self.stop()
        await interaction.response.edit_message(content=f"Submission #{self.submission_id} is kept.", view=None)


@admin_group.command(name="delete-submission", description="Delete a submission (asks for confirmation)")
async def delete_command(interaction: discord.Interaction, submission_id: int) -> None:
    try:
        text = await in_thread(service.describe_for_delete, member_of(interaction), submission_id)
    except BotError as exc:
        return await refuse(interaction, str(exc))
    await interaction.response.send_message(text, view=ConfirmDelete(interaction.user.id, submission_id),
                                            ephemeral=True)


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
        for group in (leaderboard_group, submission_group, gpus_group, admin_group):
            self.tree.add_command(group)
        self.live = Live(self)

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
        await interaction.response.defer(ephemeral=not public, thinking=True)
        deferred_at = time.monotonic()
        try:
            content = await script.read()
            submitted = await in_thread(service.submit, member, mode, script.filename, content, leaderboard, gpus)
        except BotError as exc:
            if public:  # a refusal is for the submitter only: the public "thinking…" answer makes way for it
                await interaction.delete_original_response()
                await interaction.followup.send(str(exc), ephemeral=True)
            else:
                await interaction.edit_original_response(content=str(exc))
            return
        shown = await interaction.edit_original_response(content=submitted.content)
        row = await in_thread(service.track, submitted, member, interaction.application_id, interaction.token,
                              shown.id)
        edited_at = time.monotonic()
        await self.live.watch(Watch(row.pk, row.submission_id, row.public, row.discord_user_id, row.channel_id,
                                    row.guild_id, row.application_id, row.interaction_token, row.token_expires,
                                    shown.id, last_content=submitted.content, last_edit=edited_at,
                                    recent_edits=deque([deferred_at, edited_at], maxlen=EDITS_PER_WINDOW)))


def run(token: str) -> None:
    if settings.DISCORD_API_URL:
        point_at(settings.DISCORD_API_URL)
    KernelBot().run(token, log_handler=None)
