"""Announcements. Podium changes of open public boards as KernelBot words them ("took #1", "entered the top 3",
"fell out of the top 3", "lost #1"), in each guild's submission channel: the top three last announced is kept per
board (`Podium`) and moved on by compare-and-set, so each change is posted once however many bot processes hear it
and across restarts. A new leaderboard (its deadline, the participant role pinged); personal bests and first
successful submissions only where a guild keeps them (`Guild.personal_bests`); published final standings; and, in
the report channel, a problem version whose own code failed (`claim_broken_problems`). Each message is claimed as a
unique `Announcement` row before it is posted; a claim whose post was never recorded is claimed again later
(`claim_stale`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from discord.utils import escape_markdown, escape_mentions
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from leaderboards import finals
from leaderboards.models import (
    BOARD_ORDER,
    Board,
    BoardEntry,
    Final,
    FinalStatus,
    GpuType,
    Leaderboard,
    Problem,
    Record,
    Visibility,
)
from leaderboards.serializers import problem_error_of
from runners.harness.result import PROBLEM_BROKEN

from . import render
from .models import Announcement, Guild, Podium

log = logging.getLogger(__name__)
RECENT = timedelta(hours=1)  # older entries (a rescore, a bot started long after) are not news
PODIUM = 3


@dataclass
class Claimed:
    announcement_id: int
    channel_id: int
    text: str


def shown_name(user) -> str:
    """The display name (else the user name), its markdown and mentions escaped, isolated (FSI … PDI): a name
    starting with U+202E turns nothing after it."""
    profile = getattr(user, "profile", None)
    name = (profile.display_name if profile else "") or user.get_username()
    return render.isolate(escape_mentions(escape_markdown(name)))


def _name(user) -> str:
    return f"**{shown_name(user)}**"


def measure(entry: BoardEntry, on_ratio: bool) -> str:
    """What the board ranks the entry by, said as such: a ratio to the reference's time, or a time."""
    if on_ratio and entry.ratio is not None:
        return f"{entry.rank_key:.3g}× the reference's time (ranked by ratio)"
    return f"{render.seconds(entry.score)} (ranked by time)"


def _claim(key: str, guild: Guild, channel_id: int, text: str) -> list[Claimed]:
    """The announcement `key` in `channel_id`, unless a process claimed it already."""
    try:
        with transaction.atomic():
            row = Announcement.objects.create(key=key, guild=guild, text=text, channel_id=channel_id)
    except IntegrityError:
        log.info("announcement %s was claimed already", key)  # by this process or another
        return []
    return [Claimed(row.pk, channel_id, text)]


def announced_boards():
    """Open public boards, less the beginner ones (settings.DISCORD_BEGINNER_BOARDS): closed, unlisted, expired and
    internal boards are not announced."""
    return (Leaderboard.objects.open().filter(visibility=Visibility.PUBLIC, internal=False)
            .exclude(name__in=settings.DISCORD_BEGINNER_BOARDS))


def _top(leaderboard_id: int, gpu_type_id: int, before=None) -> list[BoardEntry]:
    entries = BoardEntry.objects.filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
    if before is not None:
        entries = entries.filter(updated__lt=before)
    return list(entries.order_by(*BOARD_ORDER).select_related("user__profile")[:PODIUM])


def podium_lines(where: str, before: list, after: list[BoardEntry], on_ratio: bool, users: dict) -> list[str]:
    """KernelBot's lines for a change of the top three (user ids `before`, entries `after`), each improvement with
    its measure."""
    after_ids = [e.user_id for e in after]
    winner = bool(after_ids) and (not before or before[0] != after_ids[0])
    lines = []
    if winner:
        lines.append(f"{_name(after[0].user)} took **#1** on {where} with {measure(after[0], on_ratio)}.")
    else:
        lines += [f"{_name(e.user)} entered the **top 3** on {where} with {measure(e, on_ratio)}."
                  for e in after if e.user_id not in before]
    departed = [uid for uid in before if uid not in after_ids]
    lines += [f"{_name(users[uid])} fell out of the **top 3**." for uid in departed if uid in users]
    if winner and before and before[0] not in departed and before[0] in users:
        lines.append(f"{_name(users[before[0]])} lost **#1**.")
    return lines


def claim_podium(leaderboard: Leaderboard, gpu_type: GpuType, guilds: list[Guild]) -> list[Claimed]:
    """The change of this board's top three since it was last announced, claimed once in every guild."""
    after = _top(leaderboard.pk, gpu_type.pk)
    podium = Podium.objects.filter(leaderboard=leaderboard, gpu_type=gpu_type).first()
    if podium is None:  # a board first seen: what it was before the recent changes (a new board: nobody), so the
        # first sweep after an upgrade does not announce every standing podium
        seed = [e.user_id for e in _top(leaderboard.pk, gpu_type.pk, timezone.now() - RECENT)]
        podium, _ = Podium.objects.get_or_create(leaderboard=leaderboard, gpu_type=gpu_type,
                                                 defaults={"user_ids": seed})
    before = list(podium.user_ids)
    if before == [e.user_id for e in after]:
        return []
    on_ratio = bool(Board.objects.filter(leaderboard=leaderboard, gpu_type=gpu_type, ranks_on_ratio=True).exists())
    users = get_user_model().objects.select_related("profile").in_bulk(before)
    lines = podium_lines(f"`{leaderboard.name}` (`{gpu_type.name}`)", before, after, on_ratio, users)
    claimed = []
    with transaction.atomic():
        if not Podium.objects.filter(pk=podium.pk, version=podium.version).update(
                user_ids=[e.user_id for e in after], version=podium.version + 1, updated=timezone.now()):
            log.info("podium change %s of %s was claimed already", podium.version + 1, podium)  # by another
            return []
        if lines:  # a reorder within the top three says nothing
            text = render.clip("\n".join(lines))
            for guild in guilds:
                claimed += _claim(f"{guild.guild_id}:podium:{podium.pk}:{podium.version + 1}", guild,
                                  guild.submission_channel_id or guild.announcement_channel_id, text)
    return claimed


def _podium_guilds() -> list[Guild]:
    return list(Guild.objects.filter(enabled=True).filter(
        Q(submission_channel_id__isnull=False) | Q(announcement_channel_id__isnull=False)))


def claim_podiums(leaderboard_id: int | None = None, gpu_type_id: int | None = None) -> list[Claimed]:
    """Podium changes of the announced boards (one board, or all)."""
    guilds = _podium_guilds()
    if not guilds:
        return []
    claimed = []
    boards = announced_boards().prefetch_related("gpu_types")
    if leaderboard_id is not None:
        boards = boards.filter(pk=leaderboard_id)
    for leaderboard in boards:
        for gpu_type in leaderboard.gpu_types.all():
            if gpu_type_id is None or gpu_type.pk == gpu_type_id:
                claimed += claim_podium(leaderboard, gpu_type, guilds)
    return claimed


def _personal_text(entry: BoardEntry, on_ratio: bool) -> str:
    where = f"`{entry.leaderboard.name}` (`{entry.gpu_type.name}`)"
    earlier = (Record.objects.filter(leaderboard_id=entry.leaderboard_id, gpu_type_id=entry.gpu_type_id,
                                     user_id=entry.user_id, submitted_at__lt=entry.submitted_at)
               .order_by("-submitted_at").first())
    if earlier is None:
        return (f"🎉 {_name(entry.user)}'s first successful submission on {where}: {measure(entry, on_ratio)}, "
                f"rank {entry.rank} (#{entry.submission_id})")
    was = f"{earlier.score:.3g}×" if on_ratio else render.seconds(earlier.score)
    return (f"📈 Personal best of {_name(entry.user)} on {where}: {measure(entry, on_ratio)}, was {was}; "
            f"rank {entry.rank} (#{entry.submission_id})")


def claim_personal(entries) -> list[Claimed]:
    """Personal bests and first successful submissions, in the guilds that keep them (off by default)."""
    guilds = list(Guild.objects.filter(enabled=True, personal_bests=True, announcement_channel_id__isnull=False))
    claimed = []
    for entry in entries if guilds else []:
        if entry.submitted_at < timezone.now() - RECENT:
            continue
        on_ratio = Board.objects.filter(leaderboard_id=entry.leaderboard_id, gpu_type_id=entry.gpu_type_id,
                                        ranks_on_ratio=True).exists()
        text = _personal_text(entry, on_ratio)
        for guild in guilds:
            key = f"{guild.guild_id}:{entry.leaderboard_id}:{entry.gpu_type_id}:{entry.submission_id}"
            claimed += _claim(key, guild, guild.announcement_channel_id, text)
    return claimed


def _entries():
    return (BoardEntry.objects.with_rank().select_related("user__profile", "leaderboard", "gpu_type")
            .filter(leaderboard__in=announced_boards()))


def claim_for_event(leaderboard_id: int, gpu_type_id: int, submission_ids: list[int]) -> list[Claimed]:
    return claim_podiums(leaderboard_id, gpu_type_id) + claim_personal(
        _entries().filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id, submission_id__in=submission_ids))


def _new_board_text(leaderboard: Leaderboard, role_id: int | None) -> str:
    gpus = ", ".join(f"`{g.name}`" for g in leaderboard.gpu_types.all())
    lines = [f"# New leaderboard: {leaderboard.name}",
             f"**Deadline**: {leaderboard.deadline:%Y-%m-%d %H:%M} UTC (<t:{int(leaderboard.deadline.timestamp())}:R>)"]
    if gpus:
        lines.append(f"**GPUs**: {gpus}")
    if leaderboard.description:
        lines.append(escape_mentions(leaderboard.description))
    lines.append("Submit your entries with `/leaderboard submit ranked` in the submissions channel.")
    if url := render.link("leaderboard", leaderboard.name):
        lines.append(url)
    lines.append("Good luck to all participants! 🚀" + (f" <@&{role_id}>" if role_id else ""))
    return render.clip("\n".join(lines))


def claim_new_boards() -> list[Claimed]:
    """A board that opened within RECENT (created, or its start reached), once per guild."""
    guilds = list(Guild.objects.filter(enabled=True).filter(
        Q(announcement_channel_id__isnull=False) | Q(submission_channel_id__isnull=False)))
    since = timezone.now() - RECENT
    boards = announced_boards().filter(Q(starts_at__gte=since) | Q(starts_at__isnull=True, created__gte=since)) \
        .prefetch_related("gpu_types") if guilds else []
    claimed = []
    for leaderboard in boards:
        for guild in guilds:
            claimed += _claim(f"{guild.guild_id}:new-board:{leaderboard.pk}", guild,
                              guild.announcement_channel_id or guild.submission_channel_id,
                              _new_board_text(leaderboard, guild.participant_role_id))
    return claimed


def claim_recent() -> list[Claimed]:
    """What changed while no bot was listening (catch-up at start, and every sweep)."""
    return (claim_new_boards() + claim_podiums()
            + claim_personal(_entries().filter(updated__gte=timezone.now() - RECENT)))


def _broken_text(problem: Problem) -> str:
    """Says which version broke and where, not how: the report channel may be read by competitors, and the error's
    message and traceback (which may show the problem's inputs) are for the admin."""
    run = problem.broken_run
    where = problem_error_of(run.result).get("where") if run else None
    boards = ", ".join(sorted(b.name for b in problem.leaderboards.all() if not b.internal)) or "no leaderboard"
    text = (f"⚠️ Problem **{problem}** ({boards}) is broken: its own code failed"
            + (f" in `{where}`" if where else "") + (f" (run {run.pk})" if run else "")
            + f". Competitors' runs of it end with “{PROBLEM_BROKEN}” and are not charged to their quotas; the "
            "error and traceback are in the admin, where the version is marked fixed.")
    if url := render.link("admin:leaderboards_problem_change", problem.pk):
        text += f"\n{url}"
    return render.clip(text)


def claim_broken_problems() -> list[Claimed]:
    """Claims, in every guild with a report channel, one message per broken problem version and per time it broke
    (`Problem.broken_since`, set when a run's harness reports that the problem's own code failed, cleared when an
    organiser marks it fixed). Every bot sweeps this; the unique key makes one of them post it."""
    guilds = list(Guild.objects.filter(enabled=True, report_channel_id__isnull=False))
    problems = list(Problem.objects.filter(broken_since__isnull=False).select_related("broken_run")
                    .prefetch_related("leaderboards")) if guilds else []
    wanted = {f"{guild.guild_id}:problem-broken:{problem.pk}:{problem.broken_since:%Y%m%dT%H%M%S.%f}":
              (guild, problem) for guild in guilds for problem in problems}
    taken = set(Announcement.objects.filter(key__in=list(wanted)).values_list("key", flat=True))
    claimed = []
    for key, (guild, problem) in wanted.items():
        if key in taken:
            continue
        text = _broken_text(problem)
        try:
            with transaction.atomic():
                row = Announcement.objects.create(key=key, guild=guild, text=text, channel_id=guild.report_channel_id)
        except IntegrityError:
            log.info("announcement %s was claimed already", key)  # by another process since we looked
            continue
        claimed.append(Claimed(row.pk, guild.report_channel_id, text))
    return claimed


def _final_text(final: Final) -> str:
    lines = [f"🏁 Final standings of **{final.leaderboard.name}**: the top {final.top_n} re-run {final.rounds}× on "
             "fresh inputs after the deadline"]
    entries = finals.final_entries(final)
    for gpu in dict.fromkeys(e.gpu_type.name for e in entries):
        mine = [e for e in entries if e.gpu_type.name == gpu]
        podium = [f"{e.rank}{' ≈' if e.tied else ''}. {shown_name(e.user)} {render.seconds(e.score)}"
                  f"{render.ratio(e.ratio_low, e.ratio, e.ratio_high)}"
                  for e in mine if e.rank is not None][:3]
        dropped = sum(1 for e in mine if e.dropped)
        lines.append(f"**{gpu}**: " + "; ".join(podium) + (f" ({dropped} dropped out)" if dropped else ""))
    if url := render.link("leaderboard", final.leaderboard.name):
        lines.append(url)
    return render.clip("\n".join(lines))


def claim_final_standings() -> list[Claimed]:
    """Claims, in every guild with an announcement channel, one message per published final standings
    (`leaderboards.finals`), published within the last RECENT. Every bot sweeps this; the unique key makes one post."""
    guilds = list(Guild.objects.filter(enabled=True, announcement_channel_id__isnull=False))
    published = list(Final.objects.filter(status=FinalStatus.PUBLISHED, published_at__gte=timezone.now() - RECENT)
                     .select_related("leaderboard")) if guilds else []
    claimed = []
    for final in published:
        text = _final_text(final)
        for guild in guilds:
            claimed += _claim(f"{guild.guild_id}:final:{final.pk}", guild, guild.announcement_channel_id, text)
    return claimed


def claim_stale() -> list[Claimed]:
    """Claims whose post was never recorded (the bot that claimed it died, or Discord refused the post), claimed
    again by exactly one process once they are older than DISCORD_ANNOUNCE_RETRY_SECONDS."""
    now = timezone.now()
    claimed = []
    stale = Announcement.objects.filter(
        Q(channel_id__isnull=False) | Q(guild__announcement_channel_id__isnull=False),
        message_id__isnull=True, created__gte=now - RECENT, guild__enabled=True,
        claimed_at__lt=now - timedelta(seconds=settings.DISCORD_ANNOUNCE_RETRY_SECONDS)).select_related("guild")
    for row in stale:
        if Announcement.objects.filter(pk=row.pk, message_id__isnull=True, claimed_at=row.claimed_at).update(
                claimed_at=now, attempts=F("attempts") + 1):
            claimed.append(Claimed(row.pk, row.channel_id or row.guild.announcement_channel_id, row.text))
    return claimed


def posted(announcement_id: int, message_id: int) -> None:
    Announcement.objects.filter(pk=announcement_id).update(message_id=message_id)


def open_leaderboard_ids() -> list[int]:
    from leaderboards.models import Leaderboard

    return list(Leaderboard.objects.open().values_list("pk", flat=True))
