"""What the bot's commands do, as plain synchronous functions over `leaderboards.actions`, the access authority and
the serialisers (the bot calls them in a thread). They return text and data to send, and raise `BotError` with the
precise message a user gets (ephemeral) when a command is refused; nothing is written then."""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import PurePosixPath

from allauth.socialaccount.models import SocialAccount
from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Q, Sum
from django.utils import timezone

from kernelbot.cli.directives import parse_directives, with_header
from leaderboards import actions, dataset, finals, health
from leaderboards.access import actions as access
from leaderboards.access.authority import RunView, access_leaderboard, access_submission, run_view
from leaderboards.api import queue_out
from leaderboards.errors import AccessDenied, Refused, SubmissionRejected
from leaderboards.importing import ImportRejected, do_import_task
from leaderboards.models import BoardEntry, Leaderboard, Profile, Run, RunStatus, Submission, SubmissionMode, Visibility
from leaderboards.popcorn.wire import public_task
from leaderboards.repository import RepositoryError, do_import_repository
from leaderboards.serializers import job_state, run_out, submission_results, submission_scores
from runners.models import GpuPool
from taskspec.loader import TaskFileError, load_task_from_zip
from taskspec.model import parse_deadline

from . import render
from .identity import user_for_discord
from .models import Guild, StatusMessage

MODES = {"test": SubmissionMode.TEST, "benchmark": SubmissionMode.BENCHMARK, "ranked": SubmissionMode.LEADERBOARD,
         "profile": SubmissionMode.PROFILE}
EXTENSIONS = {"py": (".py",), "cu": (".cu", ".cuh", ".cpp")}
PAGE_SIZE = 20


class BotError(Exception):
    """A refused command: its message goes back to the user, ephemeral."""


@dataclass
class Member:
    """Who is asking, as Discord describes them."""

    id: int
    name: str
    display_name: str = ""
    role_ids: list[int] = field(default_factory=list)
    guild_id: int | None = None
    channel_id: int | None = None


@dataclass
class Actor:
    user: object
    organiser: bool

    @property
    def viewer(self):
        """The user as the access rules see them: an organiser sees what staff see (in memory only)."""
        if self.organiser and not self.user.is_staff:
            user = copy.copy(self.user)
            user.is_staff = True
            return user
        return self.user


GUILD_CONFIG_SECONDS = 5.0  # how soon an admin change reaches a running bot; every command reads it, often twice
_guilds: dict[int, tuple[float, Guild | None]] = {}


def forget_guilds() -> None:
    _guilds.clear()


def guild_config(guild_id: int | None) -> Guild | None:
    if guild_id is None:
        return None
    read_at, guild = _guilds.get(guild_id, (-GUILD_CONFIG_SECONDS, None))
    if time.monotonic() - read_at >= GUILD_CONFIG_SECONDS:
        guild = Guild.objects.filter(guild_id=guild_id, enabled=True).prefetch_related("organiser_roles").first()
        _guilds[guild_id] = (time.monotonic(), guild)
    return guild


def actor_for(member: Member) -> Actor:
    try:
        user = user_for_discord(member.id, member.name, member.display_name)
    except AccessDenied as exc:
        raise BotError(str(exc)) from exc
    guild = guild_config(member.guild_id)
    roles = {r.role_id for r in guild.organiser_roles.all()} if guild else set()
    return Actor(user, user.is_staff or bool(roles & set(member.role_ids)))


def require_organiser(member: Member) -> Actor:
    actor = actor_for(member)
    if not actor.organiser:
        raise BotError("This command is for organisers (a configured organiser role or a staff account).")
    return actor


def _leaderboard(actor: Actor, name: str) -> Leaderboard:
    try:
        return access_leaderboard(actor.viewer, name, queryset=Leaderboard.objects.select_related("problem")
                                  .prefetch_related("gpu_types"))
    except AccessDenied as exc:
        raise BotError(str(exc)) from exc


# --- submitting --------------------------------------------------------------------------------------------------

@dataclass
class Submitted:
    submission_id: int
    user_id: int
    public: bool  # a ranked submission is visible to everyone who sees the board: its status goes to the channel
    content: str
    run_ids: list[int]


def check_attachment(file_name: str | None, size: int) -> None:
    """What can be refused before downloading the attachment."""
    if not file_name:
        raise BotError("Attach your kernel as a file (the `script` option).")
    if size == 0:
        raise BotError(f"'{render.isolate(file_name)}' is empty.")
    if size > settings.MAX_SUBMISSION_BYTES:
        raise BotError(f"'{render.isolate(file_name)}' is {size} bytes; the limit is {settings.MAX_SUBMISSION_BYTES} "
                       "bytes.")


def is_public(command_mode: str) -> bool:
    """A ranked submission is visible to everyone who sees the board: its status goes to the channel."""
    return MODES[command_mode] == SubmissionMode.LEADERBOARD


def submit(member: Member, command_mode: str, file_name: str, content: bytes, leaderboard_name: str | None,
           gpus: str | None) -> Submitted:
    guild = guild_config(member.guild_id)
    if guild and guild.submission_channel_id and member.channel_id != guild.submission_channel_id:
        raise BotError(f"Submit in <#{guild.submission_channel_id}>.")
    actor = actor_for(member)
    text = content.decode("utf-8", errors="replace")
    found = parse_directives(text)
    name = (leaderboard_name or found.get("leaderboard") or "").strip()
    if not name:
        raise BotError("Name a leaderboard (the `leaderboard_name` option or a `#!POPCORN leaderboard <name>` line).")
    if leaderboard_name and found.get("leaderboard") and found["leaderboard"].lower() != leaderboard_name.lower():
        raise BotError(f"The file's #!POPCORN leaderboard is '{found['leaderboard']}' but you submitted to "
                       f"'{leaderboard_name}'; change one of them.")
    gpu_names = [g.strip() for g in (gpus or found.get("gpu", "")).replace(" ", ",").split(",") if g.strip()]
    try:
        board = access_leaderboard(actor.user, name, queryset=Leaderboard.objects.select_related("problem"))
        allowed = EXTENSIONS.get(board.problem.lang, ())
        if allowed and PurePosixPath(file_name).suffix.lower() not in allowed:
            raise BotError(f"'{render.isolate(file_name)}': leaderboard '{board.name}' takes {' or '.join(allowed)} "
                           "files.")
        request = actions.check_submission(actor.user, name, gpu_names, MODES[command_mode], file_name, content)
        submission = actions.do_submit(actor.user, request)
    except (SubmissionRejected, AccessDenied) as exc:
        raise BotError(str(exc)) from exc
    public = is_public(command_mode)
    return Submitted(submission.pk, actor.user.pk, public, progress(submission.pk, public).content,
                     [r.pk for r in submission.new_runs])


def track(submitted: Submitted, member: Member, application_id: int, token: str, original_id: int,
          process: str) -> StatusMessage:
    """The status message of a submission just made, leased to the process that answered it."""
    return StatusMessage.objects.create(
        submission_id=submitted.submission_id, user_id=submitted.user_id, discord_user_id=member.id,
        public=submitted.public, guild_id=member.guild_id, channel_id=member.channel_id, application_id=application_id,
        interaction_token=token, original_id=original_id,
        token_expires=timezone.now() + timedelta(seconds=settings.DISCORD_INTERACTION_TOKEN_SECONDS),
        owner=process, lease_until=timezone.now() + timedelta(seconds=lease_seconds()))


@dataclass
class Progress:
    content: str
    done: bool
    report: str  # the full report (logs, per-benchmark table, system info) for the owner, once done


def progress(submission_id: int, public: bool) -> Progress | None:
    """The status message as its audience may read it: the public message as anyone who sees the board, the
    owner's ephemeral one with the owner's view. None when the submission was deleted."""
    submission = Submission.objects.select_related("leaderboard", "user").filter(pk=submission_id).first()
    if submission is None:
        return None
    runs = list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))
    viewer = AnonymousUser() if public else submission.user
    view = run_view(viewer, submission)
    done, state, _ = job_state(runs, view)
    shown = [run_out(r, view) for r in runs]
    queue = None if done else queue_out(submission, runs)
    owner_view = [run_out(r, run_view(submission.user, submission)) for r in runs]
    return Progress(render.status(submission, shown, state, queue, submission_results(submission.mode, runs)), done,
                    render.report(submission, owner_view) if done else "")


def runs_of(submission_id: int) -> tuple[int | None, list[int]]:
    """The submission's leaderboard id and run ids."""
    leaderboard_id = Submission.objects.filter(pk=submission_id).values_list("leaderboard_id", flat=True).first()
    return leaderboard_id, list(Run.objects.filter(submission_id=submission_id).values_list("pk", flat=True))


def lease_seconds() -> float:
    return settings.DISCORD_LEASE_SECONDS


def claim_status_messages(process: str) -> list[StatusMessage]:
    """The unfinished status messages no process holds (their bot died or stopped), now leased to `process`: each
    taken with a compare-and-set, so two processes never both take one."""
    now = timezone.now()
    lapsed = StatusMessage.objects.filter(finished=False).filter(Q(lease_until__isnull=True) | Q(lease_until__lt=now))
    claimed = []
    for row in lapsed.order_by("pk")[:100]:
        if StatusMessage.objects.filter(pk=row.pk, finished=False, lease_until=row.lease_until).update(
                owner=process, lease_until=now + timedelta(seconds=lease_seconds())):
            row.owner = process
            claimed.append(row)
    return claimed


def renew_status_leases(process: str) -> set[int]:
    """Extend the leases `process` holds; the ids of its unfinished status messages."""
    mine = StatusMessage.objects.filter(owner=process, finished=False)
    mine.filter(lease_until__gte=timezone.now()).update(
        lease_until=timezone.now() + timedelta(seconds=lease_seconds()))
    return set(mine.filter(lease_until__gte=timezone.now()).values_list("pk", flat=True))


def hold_status_lease(row_id: int, process: str) -> bool:
    """True (and the lease extended) when `process` still holds the status message's lease: it may edit it."""
    now = timezone.now()
    return bool(StatusMessage.objects.filter(pk=row_id, owner=process, lease_until__gte=now).update(
        lease_until=now + timedelta(seconds=lease_seconds())))


def save_status_message(row_id: int, **fields) -> None:
    StatusMessage.objects.filter(pk=row_id).update(**fields)


# --- reading -----------------------------------------------------------------------------------------------------

def leaderboard_names(member: Member, current: str) -> list[str]:
    user = actor_for(member).viewer
    boards = Leaderboard.objects.visible_to(user).open().filter(name__icontains=current.strip())
    return list(boards.order_by("name").values_list("name", flat=True)[:25])


def _completing(member: Member, leaderboard_name: str | None) -> Leaderboard | None:
    """The board an autocomplete is about, or None (none named, or not one this member may see)."""
    if not leaderboard_name:
        return None
    try:
        return _leaderboard(actor_for(member), leaderboard_name)
    except BotError:
        return None


def gpu_names(member: Member, leaderboard_name: str | None, current: str) -> list[str]:
    if (board := _completing(member, leaderboard_name)) is None:
        return []
    typed = [g.strip() for g in current.split(",")]
    last = typed[-1].lower()
    prefix = ",".join(typed[:-1])
    names = [g.name for g in board.gpu_types.all() if last in g.name.lower() and g.name not in typed[:-1]]
    return [f"{prefix},{n}" if prefix else n for n in names][:25]


def list_leaderboards(member: Member) -> str:
    user = actor_for(member).viewer
    boards = Leaderboard.objects.listed_for(user).open().prefetch_related("gpu_types")
    lines = [f"**{b.name}** — GPUs: {', '.join(g.name for g in b.gpu_types.all()) or 'none'} — closes "
             f"{render.when(b.deadline)}" for b in boards]
    return "\n".join(lines) if lines else "No leaderboard is open."


def show(member: Member, leaderboard_name: str, gpu: str | None, page: int) -> str:
    board = _leaderboard(actor_for(member), leaderboard_name)
    gpu_types = list(board.gpu_types.all())
    gpu_type = next((g for g in gpu_types if g.name.lower() == (gpu or "").lower()), None) if gpu else \
        (gpu_types[0] if gpu_types else None)
    if gpu_type is None:
        raise BotError(f"Leaderboard '{board.name}' does not run on GPU '{gpu}'; available: "
                       f"{', '.join(g.name for g in gpu_types) or 'none'}.")
    entries = BoardEntry.objects.for_board(board, gpu_type).select_related("user__profile")
    count = entries.count()
    pages = max(1, -(-count // PAGE_SIZE))
    if not 1 <= page <= pages:
        raise BotError(f"Page {page} does not exist; '{board.name}' on {gpu_type.name} has {pages} page(s).")
    rows = entries.page((page - 1) * PAGE_SIZE, page * PAGE_SIZE)
    return render.ranking(board, gpu_type, rows, page, pages, [g.name for g in gpu_types])


def show_personal(member: Member, leaderboard_name: str, page: int = 1) -> str:
    actor = actor_for(member)
    board = _leaderboard(actor, leaderboard_name)
    mine = Submission.objects.made_by(actor.user).filter(leaderboard=board).order_by("-created", "-pk")
    count = mine.count()
    if not count:
        return f"You have no submissions on '{board.name}'."
    pages = -(-count // PAGE_SIZE)
    if not 1 <= page <= pages:
        raise BotError(f"Page {page} does not exist; your {count} submissions on '{board.name}' fill {pages} page(s).")
    subs = list(mine.prefetch_related("runs__gpu_type", "runs__submission")[(page - 1) * PAGE_SIZE:page * PAGE_SIZE])
    first = (page - 1) * PAGE_SIZE + 1
    lines = [f"Your submissions on **{board.name}**: {count} in all; {first}–{first + len(subs) - 1} (newest first)"
             + (f", page {page} of {pages}" if pages > 1 else "") + ":"]
    for s in subs:
        runs = list(s.runs.all())
        _, state, _ = job_state(runs, run_view(actor.user, s))
        scores = submission_scores(s.mode, runs)
        shown = ", ".join(f"{gpu} {render.seconds(v)}" for gpu, v in scores.items()) or "-"
        lines.append(f"#{s.pk} `{render.isolate(s.file_name)}` {s.mode} {state} {shown} ({render.when(s.created)})")
    if page < pages:
        lines.append(f"Older ones: `/leaderboard show-personal leaderboard_name:{board.name} page:{page + 1}`")
    return "\n".join(lines)


def task(member: Member, leaderboard_name: str) -> tuple[str, dict[str, str]]:
    board = _leaderboard(actor_for(member), leaderboard_name)
    definition = board.problem.definition
    files = {name: text for name, text in (definition.get("files") or {}).items()
             if name in public_task(board)["files"]}
    return render.task(board), files


def template_langs(member: Member, leaderboard_name: str | None, current: str) -> list[str]:
    if (board := _completing(member, leaderboard_name)) is None:
        return []
    langs = board.problem.definition.get("templates") or {}
    return [lang for lang in langs if current.strip().lower() in lang.lower()][:25]


def template(member: Member, leaderboard_name: str, lang: str | None) -> tuple[str, str]:
    board = _leaderboard(actor_for(member), leaderboard_name)
    templates = board.problem.definition.get("templates") or {}
    if not templates:
        raise BotError(f"Leaderboard '{board.name}' has no templates.")
    key = next((k for k in templates if k.lower() == (lang or "").lower()), None) if lang else next(iter(templates))
    if key is None:
        raise BotError(f"No '{lang}' template for '{board.name}'; available: {', '.join(templates)}.")
    name = board.problem.definition.get("submission_name") or "submission.py"
    if len(templates) > 1:
        name = f"{PurePosixPath(name).stem}_{key.lower()}{PurePosixPath(name).suffix}"
    return name, with_header(templates[key], name, board.name, [g.name for g in board.gpu_types.all()])


def get_submission(member: Member, submission_id: int) -> tuple[str, str]:
    actor = actor_for(member)
    try:
        submission = access_submission(actor.viewer, submission_id, for_code=True, queryset=Submission.objects
                                       .select_related("leaderboard", "code"))
    except AccessDenied as exc:
        raise BotError(str(exc)) from exc
    return submission.file_name, submission.code.text


def submission_status(member: Member, submission_id: int) -> str:
    actor = actor_for(member)
    try:
        submission = access_submission(actor.viewer, submission_id)
    except AccessDenied as exc:
        raise BotError(str(exc)) from exc
    view = run_view(actor.viewer, submission)
    runs = list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))
    done, state, _ = job_state(runs, view)
    return render.status(submission, [run_out(r, view) for r in runs], state,
                         None if done else queue_out(submission, runs), submission_results(submission.mode, runs))


# --- organisers --------------------------------------------------------------------------------------------------

def set_accepting(member: Member, accepting: bool, reason: str) -> str:
    require_organiser(member)
    access.do_set_accepting_jobs(accepting, reason)
    return "Submissions are accepted again." if accepting else \
        "Submissions are paused on every front-end" + (f": {reason}" if reason else "") + "."


def _run(run_id: int) -> Run:
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise BotError(f"Run {run_id} not found.")
    return run


def requeue(member: Member, run_id: int) -> str:
    require_organiser(member)
    actions.do_requeue_run(_run(run_id), f"requeued by {member.name} on Discord")
    return f"Run {run_id} is queued again."


def cancel(member: Member, run_id: int) -> str:
    require_organiser(member)
    if not actions.do_cancel_run(_run(run_id), f"cancelled by {member.name} on Discord"):
        raise BotError(f"Run {run_id} has already finished.")
    return f"Run {run_id} is cancelled."


def rescore(member: Member, leaderboard_name: str) -> str:
    actor = require_organiser(member)
    board = _leaderboard(actor, leaderboard_name)
    changed = actions.do_rescore_leaderboard(board)
    return f"Rescored '{board.name}': {changed} run score(s) changed; its rankings are being recomputed."


def describe_for_delete(member: Member, submission_id: int) -> str:
    actor = require_organiser(member)
    try:
        submission = access_submission(actor.viewer, submission_id)
        finals.check_may_delete(submission)
    except Refused as exc:
        raise BotError(exc.message) from exc
    return f"Delete submission #{submission.pk} (`{render.isolate(submission.file_name)}` by " \
           f"{render.isolate(submission.user.get_username())} on " \
           f"'{submission.leaderboard.name}')? Its runs and board entries go with it."


def delete_submission(member: Member, submission_id: int) -> str:
    require_organiser(member)
    submission = Submission.objects.filter(pk=submission_id).first()
    if submission is None:
        raise BotError(f"Submission {submission_id} not found (already deleted?).")
    try:
        actions.do_delete_submission(submission)
    except Refused as exc:
        raise BotError(exc.message) from exc
    return f"Submission #{submission_id} is deleted; its boards are being re-ranked."


def admin_submission(member: Member, submission_id: int) -> tuple[str, tuple[str, str], str]:
    """KernelBot's `/admin get-submission`: a summary, the code, and runs.json with every run (secret ones too), as
    staff see them: organisers only."""
    require_organiser(member)
    submission = Submission.objects.select_related("leaderboard", "code", "user").filter(pk=submission_id).first()
    if submission is None:
        raise BotError(f"Submission {submission_id} does not exist.")
    runs = [run_out(r, RunView.ALL)
            for r in submission.runs.select_related("gpu_type").order_by("gpu_type", "secret")]
    lines = [f"# Submission {submission.pk}", f"submitted by {render.isolate(submission.user.get_username())} on "
             f"{submission.created:%Y-%m-%d %H:%M} UTC to leaderboard `{submission.leaderboard.name}` "
             f"({submission.mode})."]
    if not job_state(list(submission.runs.all()), RunView.ALL)[0]:
        lines.append("*Submission is still running!*")
    lines += [f" * {'secret' if r['secret'] else 'public'} on {r['gpu']}: "
              + (f"{r['score']}" if r["passed"] and r["score"] is not None else "pass" if r["passed"] else r["status"])
              for r in runs]
    return "\n".join(lines), (submission.file_name, submission.code.text), json.dumps(runs, default=str, indent=2)


def import_problem(member: Member, data: bytes, leaderboard: str | None, deadline: str | None, gpus: str | None,
                   force: bool) -> str:
    require_organiser(member)
    try:
        when = parse_deadline(deadline) if deadline else None
        task_def = load_task_from_zip(data)
        report = do_import_task(task_def, leaderboard=leaderboard or None, deadline=when,
                                gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None,
                                force=force)
    except (TaskFileError, ValueError) as exc:
        raise BotError(f"Import refused: {exc}") from exc
    except ImportRejected as exc:
        raise BotError("Import refused: " + "; ".join(exc.errors)) from exc
    return f"Imported {task_def.name}: " + "; ".join(report.lines)


def statistics(member: Member, days: int, leaderboard_name: str | None = None) -> str:
    actor = require_organiser(member)
    since = timezone.now() - timedelta(days=days)
    subs = Submission.objects.filter(created__gte=since, leaderboard__internal=False)  # not the pool health checks
    if leaderboard_name:
        subs = subs.filter(leaderboard=_leaderboard(actor, leaderboard_name))
    runs = Run.objects.filter(submission__in=subs)
    finished = runs.filter(status__in=[RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT,
                                       RunStatus.HACKED])
    per_runner = list(runs.exclude(runner="").values("runner").annotate(n=Count("pk")).order_by("-n")[:10])
    passed = finished.filter(passed=True).count()
    delay = runs.filter(dispatched_at__isnull=False).aggregate(d=Avg(ExpressionWrapper(
        F("dispatched_at") - F("queued_at"), output_field=DurationField())))["d"]
    gpu_time = runs.filter(started_at__isnull=False, finished_at__isnull=False).aggregate(t=Sum(ExpressionWrapper(
        F("finished_at") - F("started_at"), output_field=DurationField())))["t"]
    top = list(subs.values("user__username").annotate(n=Count("pk")).order_by("-n", "user__username")[:5])
    by_mode = dict(subs.values_list("mode").annotate(n=Count("pk")).values_list("mode", "n"))
    text = render.statistics(days, subs.count(), by_mode, per_runner, passed, finished.count(), delay, gpu_time,
                             top, runs.filter(Q(status=RunStatus.QUEUED)).count())
    return f"'{leaderboard_name}': {text}" if leaderboard_name else text


@transaction.atomic
def ensure_bootstrap_guild() -> None:
    if settings.DISCORD_GUILD_ID:
        Guild.objects.get_or_create(guild_id=settings.DISCORD_GUILD_ID)


def served_guild_ids() -> list[int]:
    return list(Guild.objects.filter(enabled=True).values_list("guild_id", flat=True))


def gpu_options(member: Member, leaderboard_name: str | None, content: bytes) -> list[str]:
    """The GPU types a submission naming none may choose from (KernelBot offers them): [] when it names some (the
    option or a #!POPCORN gpu line) or its leaderboard cannot be found (`submit` then says why)."""
    found = parse_directives(content.decode("utf-8", errors="replace"))
    name = (leaderboard_name or found.get("leaderboard") or "").strip()
    if found.get("gpu") or not name:
        return []
    try:
        board = access_leaderboard(actor_for(member).user, name, queryset=Leaderboard.objects.prefetch_related(
            "gpu_types"))
    except AccessDenied:
        return []
    return sorted(g.name for g in board.gpu_types.all())


# --- KernelBot's other organiser commands --------------------------------------------------------------------------

def ping(member: Member) -> str:
    started = time.monotonic()
    Guild.objects.exists()
    return f"pong (the database answered in {(time.monotonic() - started) * 1000:.0f} ms)"


def _discord_user(discord_id: str):
    """The platform user of a Discord id (created when they have never used the bot, so they can be banned first)."""
    if not discord_id.strip().isdigit() or len(discord_id.strip()) > 20:
        raise BotError(f"'{discord_id[:40]}' is not a Discord user id (Developer Mode → right-click → Copy User ID).")
    try:
        return user_for_discord(int(discord_id), f"discord-{discord_id.strip()}")
    except AccessDenied as exc:
        raise BotError(str(exc)) from exc


def ban(member: Member, discord_id: str, leaderboard_name: str | None, reason: str) -> str:
    actor = require_organiser(member)
    board = _leaderboard(actor, leaderboard_name) if leaderboard_name else None
    user = _discord_user(discord_id)
    access.do_ban(user, board, reason[:200])
    return f"<@{discord_id.strip()}> may no longer submit to " + (f"'{board.name}'" if board else "any leaderboard") \
        + (f": {reason[:200]}" if reason else "") + "."


def unban(member: Member, discord_id: str, leaderboard_name: str | None) -> str:
    actor = require_organiser(member)
    board = _leaderboard(actor, leaderboard_name) if leaderboard_name else None
    if not access.do_unban(_discord_user(discord_id), board):
        raise BotError(f"<@{discord_id.strip()}> is not banned from "
                       + (f"'{board.name}'" if board else "all leaderboards") + ".")
    return f"<@{discord_id.strip()}> may submit to " + (f"'{board.name}'" if board else "every leaderboard") + \
        " again."


def describe_leaderboard_delete(member: Member, leaderboard_name: str, force: bool) -> str:
    actor = require_organiser(member)
    board = _leaderboard(actor, leaderboard_name)
    count = board.submissions.count()
    if count and not force:
        raise BotError(f"Leaderboard '{board.name}' has {count} submission(s); pass force:True to delete them too.")
    return f"Delete leaderboard '{board.name}'" + (f" and its {count} submission(s)" if count else "") + \
        "? Its board and announcements go with it."


def delete_leaderboard(member: Member, leaderboard_name: str, force: bool) -> str:
    actor = require_organiser(member)
    board = _leaderboard(actor, leaderboard_name)
    try:
        count = actions.do_delete_leaderboard(board, force=force)
    except SubmissionRejected as exc:
        raise BotError(str(exc)) from exc
    return f"Leaderboard '{leaderboard_name}' is deleted" + (f" with {count} submission(s)." if count else ".")


def user_names(member: Member) -> str:
    """KernelBot's get-user-names: Discord id → the name shown on the boards, for everyone who submitted."""
    require_organiser(member)
    accounts = SocialAccount.objects.filter(provider="discord", user__submissions__isnull=False).distinct() \
        .select_related("user__profile")
    return json.dumps({a.uid: (getattr(a.user, "profile", None) and a.user.profile.display_name)
                       or a.user.get_username() for a in accounts.order_by("uid")}, indent=2, ensure_ascii=False)


def update_user_names(member: Member, data: bytes) -> str:
    """KernelBot's update-user-names: a JSON object of Discord id → display name; unknown ids are created."""
    require_organiser(member)
    try:
        mapping = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BotError(f"The file is not JSON: {exc}.") from exc
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise BotError('Expected a JSON object of Discord user id → name, e.g. {"123456789": "Ada"}.')
    bad = [k for k, v in mapping.items() if not k.isdigit() or len(k) > 20 or "\x00" in v or not v.strip()]
    if bad:
        raise BotError(f"Not a Discord id with a name: {', '.join(bad[:5])}.")
    with transaction.atomic():
        for discord_id, name in mapping.items():
            user = _discord_user(discord_id)
            Profile.objects.update_or_create(user=user, defaults={"display_name": name.strip()[:80]})
    return f"Updated {len(mapping)} name(s)."


def update_problems(member: Member, repository: str | None, problem_set: str | None, branch: str,
                    force: bool, closed: bool = False) -> str:
    """KernelBot's update-problems: the competition files of a repository's branch (`leaderboards.repository`)."""
    require_organiser(member)
    repository = (repository or settings.PROBLEMS_REPOSITORY).strip()
    try:
        done = do_import_repository(repository, branch.strip() or "main", (problem_set or "").strip() or None,
                                    force=force, visibility=Visibility.CLOSED if closed else None)
    except RepositoryError as exc:
        raise BotError(f"Update refused: {exc}") from exc
    lines = [f"From {repository}@{branch}:"] + done.imported + [f"refused (nothing of it imported): {e}"
                                                               for e in done.errors]
    return "\n".join(lines)


def export_hf(member: Member, repository: str | None, leaderboard: str | None = None, filename: str | None = None,
              private: bool = True) -> str:
    """KernelBot's export-hf: the submissions dataset (leaderboards.dataset) of one closed board, or of every closed
    board whose code is public, pushed to a Hugging Face dataset repository (HF_TOKEN): `repository`, else
    HF_PRIVATE_DATASET (HF_PUBLIC_DATASET when not `private`), as `filename` (.parquet added). A board named with
    `private`: a private snapshot of it, live too, to a private repository only."""
    actor = require_organiser(member)
    repository = (repository or (settings.HF_PRIVATE_DATASET if private else settings.HF_PUBLIC_DATASET)).strip()
    if not repository:
        raise BotError(f"Name the repository (repository:owner/name), or set "
                       f"{'HF_PRIVATE_DATASET' if private else 'HF_PUBLIC_DATASET'}.")
    filename = (filename or "").strip()
    if filename and not filename.endswith(".parquet"):
        filename += ".parquet"
    if filename and (filename.startswith("/") or ".." in PurePosixPath(filename).parts):
        raise BotError(f"'{filename}' is not a file name inside the repository.")
    try:
        if leaderboard and private:  # a private snapshot: the board's ranked submissions, live or not
            boards = [_leaderboard(actor, leaderboard)]
            filename = filename or dataset.file_name(boards)
            url = dataset.do_push_snapshot(boards, repository, filename).url
            return f"Pushed a private snapshot {filename} ({boards[0].name}) to {url}"
        if leaderboard:
            boards = [_leaderboard(actor, leaderboard)]
            dataset.check_exportable(boards[0])
        else:
            boards = dataset.published_leaderboards()
            if not boards:
                raise BotError("No closed leaderboard has public code; name the leaderboard to export.")
        filename = filename or dataset.file_name(boards)
        url = dataset.do_push_dataset(boards, repository, filename, private).url
    except Refused as exc:
        raise BotError(exc.message) from exc
    return f"Pushed {filename} ({', '.join(b.name for b in boards)}) to {url}"


def set_forum_ids(member: Member) -> str:
    """KernelBot matched each leaderboard to a thread of its forum channel; this bot keeps no forum threads."""
    require_organiser(member)
    return ("Nothing to set: KernelBot kept a forum thread per leaderboard, this bot keeps none. It posts a guild's "
            "announcements and reports to the channels an organiser sets in the site's admin (Discord → Guilds: "
            "announcement channel, report channel), and each leaderboard's page is its place on the site.")


def verify_runs(member: Member) -> str:
    """KernelBot's verifyruns: a round of the health checks (a known-good submission of the check problem) on every
    pool; their results show on the pool's admin page and in its health."""
    require_organiser(member)
    lines = []
    for pool in GpuPool.objects.filter(enabled=True).order_by("name"):
        started = health.do_start_pool_check(pool)
        lines.append(f"**{pool.name}**: " + (f"{len(started)} check run(s) started" if started
                                              else "a round of checks is already running"))
    return "\n".join(lines) or "No pool is enabled."
