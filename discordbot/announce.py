"""Announcements of a board's changes: a new first place, a personal best, a first successful submission; and, in
the report channel, a problem version whose own code failed (`claim_broken_problems`). Each is claimed as a unique
`Announcement` row before it is posted, so it is posted once however many bot processes hear the event, and a
restarted bot neither repeats nor (for recent changes) misses one. A claim whose post was never recorded is claimed
again later (`claim_stale`)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.utils import timezone

from leaderboards import finals
from leaderboards.models import BoardEntry, Final, FinalStatus, Problem, Run, RunStatus, SubmissionMode
from leaderboards.serializers import problem_error_of
from runners.harness.result import PROBLEM_BROKEN

from . import render
from .models import Announcement, Guild

log = logging.getLogger(__name__)
RECENT = timedelta(hours=1)  # older entries (a rescore, a bot started long after) are not news


@dataclass
class Claimed:
    announcement_id: int
    channel_id: int
    text: str


def _text(entry: BoardEntry) -> tuple[str, str]:
    profile = getattr(entry.user, "profile", None)
    name = (profile.display_name if profile else "") or entry.user.get_username()
    where = f"**{entry.leaderboard.name}** on **{entry.gpu_type.name}**"
    score = f"{render.seconds(entry.score)}{render.ratio(entry.ratio_low, entry.ratio, entry.ratio_high)}"
    if entry.rank == 1:
        return "top", f"🏆 First place on {where}: {name} with {score} (#{entry.submission_id})"
    earlier = Run.objects.filter(
        submission__user_id=entry.user_id, submission__leaderboard_id=entry.leaderboard_id,
        submission__mode=SubmissionMode.LEADERBOARD, gpu_type_id=entry.gpu_type_id, status=RunStatus.SUCCEEDED,
        passed=True, submission__created__lt=entry.submitted_at).exists()
    if earlier:
        return "best", f"📈 Personal best on {where}: {name} with {score}, rank {entry.rank} (#{entry.submission_id})"
    return "first", f"🎉 First successful submission on {where}: {name} with {score}, rank {entry.rank} " \
                    f"(#{entry.submission_id})"


def _claim_once(key: str, guild: Guild, text: str) -> list[Claimed]:
    """The announcement `key` in `guild`'s announcement channel, unless a process claimed it already."""
    try:
        with transaction.atomic():
            row = Announcement.objects.create(key=key, guild=guild, text=text)
    except IntegrityError:
        log.info("announcement %s was claimed already", key)  # by this process or another
        return []
    return [Claimed(row.pk, guild.announcement_channel_id, text)]


def claim(entries) -> list[Claimed]:
    """Claims the announcements these board entries call for, in every guild with an announcement channel."""
    guilds = list(Guild.objects.filter(enabled=True, announcement_channel_id__isnull=False))
    claimed = []
    for entry in entries:
        if entry.submitted_at < timezone.now() - RECENT:
            continue
        kind, text = _text(entry)
        for guild in guilds:
            key = f"{guild.guild_id}:{entry.leaderboard_id}:{entry.gpu_type_id}:{entry.submission_id}"
            claimed += _claim_once(key, guild, text)
    return claimed


def _entries():
    return BoardEntry.objects.with_rank().select_related("user__profile", "leaderboard", "gpu_type")


def claim_for_event(leaderboard_id: int, gpu_type_id: int, submission_ids: list[int]) -> list[Claimed]:
    return claim(_entries().filter(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id,
                                   submission_id__in=submission_ids))


def claim_recent() -> list[Claimed]:
    """What changed while no bot was listening (catch-up at start)."""
    return claim(_entries().filter(updated__gte=timezone.now() - RECENT))


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
        podium = [f"{e.rank}{' ≈' if e.tied else ''}. {e.user.get_username()} {render.seconds(e.score)}"
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
            claimed += _claim_once(f"{guild.guild_id}:final:{final.pk}", guild, text)
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
