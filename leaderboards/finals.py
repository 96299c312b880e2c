"""Final standings re-verified at the deadline (issue 28, part 2).

A board's ranks come from runs made days apart on whatever device was free. At the deadline (`tick`, scheduled every
minute) or when an organiser asks (`do_start_final`: admin), the top `Leaderboard.final_top_n` entries of each GPU type
are re-run `final_rounds` times on inputs from a fresh secret seed (`Final.seed`; every entry of a round gets the same
inputs: `runners.jobs.run_seed`), as ordinary secret runs of copies of their submissions (`Submission.final_entry`:
ranked on no board, counted in no quota) through the normal lifecycle, the same harness and timing. Per GPU type the
re-runs go one at a time, interleaved A B C … A B C …, each started when the one before it ends (`run_finished`, the
re-runs' `on_finish`), all on the pool that took the first one. An entry whose re-run does not pass drops out with
the reason (its author and organisers see it). When every re-run has ended, each entry is scored on the geometric
mean of its re-runs (ratio and interval, time) and ranked with `ranking.rank` (shared ranks, statistical ties). The
deadline's verification publishes at once; an organiser's re-run waits as DONE, compared with the board and the
published standings in the admin, until they publish it (`do_publish_final`). The Discord bot announces a publication
(`discordbot.announce.claim_final_standings`); open board pages hear of every change (`_announce`). Every step locks
the `Final` row and re-checks its state, so a repeated or late hook, or the tick, changes nothing twice."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from runners.queue import enqueue_on_commit

from . import events, lifecycle
from .errors import Refused
from .models import (
    ACTIVE_STATUSES,
    BoardEntry,
    Final,
    FinalEntry,
    FinalStatus,
    Leaderboard,
    Run,
    RunAttempt,
    RunStatus,
    Submission,
    SubmissionMode,
)
from .ranking import Candidate, rank, ratio_fields, ratio_from_timings

FINAL_HOOK = "leaderboards.finals.run_finished"  # a re-run's on_finish, called with its id
ADVANCE_TASK = "leaderboards.finals.advance"
REASON_CHARS = 500


# --- starting -----------------------------------------------------------------------------------------------------

def check_may_verify(leaderboard: Leaderboard) -> None:
    if leaderboard.internal:
        raise Refused("Internal leaderboards have no final standings.", 404)
    if not leaderboard.is_finished:
        raise Refused(f"'{leaderboard.name}' is still open: its final standings are re-verified after its deadline.",
                      409)
    if not leaderboard.final_top_n or not leaderboard.final_rounds:
        raise Refused(f"'{leaderboard.name}' re-verifies no entry (its final top N or rounds is 0).")
    if leaderboard.finals.filter(status=FinalStatus.RUNNING).exists():
        raise Refused(f"The final standings of '{leaderboard.name}' are being re-verified already.", 409)


def do_start_final(leaderboard: Leaderboard, *, requested_by=None, publish_when_done: bool | None = None) -> Final:
    """Takes the top N entries of each GPU type (the board's order now) and starts their first re-runs. Started at
    the deadline (`requested_by` None), the standings are published when the re-runs end; an organiser's re-run
    waits to be published unless `publish_when_done`."""
    check_may_verify(leaderboard)
    try:
        with transaction.atomic():
            leaderboard = Leaderboard.objects.select_for_update().get(pk=leaderboard.pk)
            final = Final.objects.create(
                leaderboard=leaderboard, top_n=leaderboard.final_top_n, rounds=leaderboard.final_rounds,
                requested_by=requested_by,
                publish_when_done=requested_by is None if publish_when_done is None else publish_when_done)
            rows = []
            for gpu_type in leaderboard.gpu_types.order_by("name"):
                entries = BoardEntry.objects.for_board(leaderboard, gpu_type).page(0, final.top_n)
                rows += [FinalEntry(final=final, gpu_type=gpu_type, submission_id=e.submission_id, user_id=e.user_id,
                                    board_rank=e.rank, position=position) for position, e in enumerate(entries)]
            FinalEntry.objects.bulk_create(rows)
            for gpu_type_id in sorted({row.gpu_type_id for row in rows}):
                enqueue_on_commit(ADVANCE_TASK, final.pk, gpu_type_id)
            _announce(final)
            if not rows:
                _settle(final)
    except IntegrityError as exc:  # another process started one at the same moment (final_one_running)
        raise Refused(f"The final standings of '{leaderboard.name}' are being re-verified already.", 409) from exc
    return final


def due_leaderboards():
    """Boards past their deadline (within FINAL_VERIFY_WITHIN, so an installation's old boards are left alone) that
    re-verify their top entries and have never been re-verified."""
    now = timezone.now()
    return (Leaderboard.objects.filter(internal=False, final_top_n__gt=0, final_rounds__gt=0, deadline__lte=now,
                                       deadline__gte=now - timedelta(seconds=settings.FINAL_VERIFY_WITHIN))
            .annotate(n=Count("finals")).filter(n=0))


def tick() -> int:
    """Scheduled every minute: starts the re-verification of boards whose deadline passed, and moves every running
    one on (a lost hook or broker message costs a minute, not the standings). Idempotent."""
    started = 0
    for leaderboard in due_leaderboards():
        try:
            do_start_final(leaderboard)
            started += 1
        except Refused:
            continue
    for final_id, gpu_type_id in (FinalEntry.objects.filter(final__status=FinalStatus.RUNNING)
                                  .values_list("final_id", "gpu_type_id").distinct()):
        advance(final_id, gpu_type_id)
    for final in Final.objects.filter(status=FinalStatus.RUNNING, entries__isnull=True):
        with transaction.atomic():
            _settle(Final.objects.select_for_update().get(pk=final.pk))
    return started


# --- the re-runs --------------------------------------------------------------------------------------------------

def run_finished(run_id: int) -> None:
    """A re-run ended (or an ended one was requeued): the next one of its GPU type starts."""
    row = (Run.objects.filter(pk=run_id, submission__final_entry__isnull=False)
           .values_list("submission__final_entry__final_id", "gpu_type_id").first())
    if row:
        advance(*row)
        final = Final.objects.filter(pk=row[0], status=FinalStatus.RUNNING).first()
        if final is not None:  # one more re-run done (a settled final has told its outcome)
            _announce(final)


def _reruns(final: Final, gpu_type_id: int):
    return Submission.objects.filter(final_entry__final=final, final_entry__gpu_type_id=gpu_type_id)


def advance(final_id: int, gpu_type_id: int) -> int | None:
    """Drops the entries whose re-run failed and starts the next re-run of this GPU type unless one is under way;
    settles the standings when none is left. Returns the new run's id."""
    with transaction.atomic():
        final = Final.objects.select_for_update().filter(pk=final_id).first()
        if final is None or final.status != FinalStatus.RUNNING:
            return None
        reruns = _reruns(final, gpu_type_id)
        if Run.objects.filter(submission__in=reruns, status__in=ACTIVE_STATUSES).exists():
            return None  # one at a time: the run under way calls again when it ends
        _drop_failed(final, gpu_type_id)
        entries = list(final.entries.filter(gpu_type_id=gpu_type_id, dropped="").order_by("position"))
        started = set(reruns.values_list("final_entry_id", "final_round"))
        for round_ in range(final.rounds):
            for entry in entries:
                if (entry.pk, round_) not in started:
                    return _start_rerun(final, entry, round_, reruns)
        if not Run.objects.filter(submission__final_entry__final=final, status__in=ACTIVE_STATUSES).exists() \
                and not _work_left(final):
            _settle(final)
    return None


def _work_left(final: Final) -> bool:
    started = set(Submission.objects.filter(final_entry__final=final).values_list("final_entry_id", "final_round"))
    return any((entry_id, r) not in started for entry_id in
               final.entries.filter(dropped="").values_list("pk", flat=True) for r in range(final.rounds))


def _start_rerun(final: Final, entry: FinalEntry, round_: int, reruns) -> int:
    original = entry.submission
    copy = Submission.objects.create(user_id=entry.user_id, leaderboard_id=final.leaderboard_id,
                                     problem_id=original.problem_id, file_name=original.file_name,
                                     code_id=original.code_id, mode=SubmissionMode.LEADERBOARD, final_entry=entry,
                                     final_round=round_)
    # the pool that took this GPU type's first re-run takes them all (one device type, one place, one at a time)
    pool_id = (RunAttempt.objects.filter(run__submission__in=reruns, pool__isnull=False).order_by("pk")
               .values_list("pool_id", flat=True).first())
    run = Run.objects.create(submission=copy, gpu_type_id=entry.gpu_type_id, secret=True, on_finish=FINAL_HOOK,
                             pool_id=pool_id, status_deadline=Run.deadline_for(RunStatus.QUEUED))
    enqueue_on_commit(lifecycle.DISPATCH_TASK, run.pk)
    return run.pk


def _drop_failed(final: Final, gpu_type_id: int | None = None) -> None:
    failed = Run.objects.filter(submission__final_entry__final=final, submission__final_entry__dropped="",
                                status__in=_ENDED)
    if gpu_type_id is not None:
        failed = failed.filter(gpu_type_id=gpu_type_id)
    failed = failed.exclude(status=RunStatus.SUCCEEDED, passed=True).select_related("submission") \
        .order_by("submission__final_round")
    for run in failed:
        FinalEntry.objects.filter(pk=run.submission.final_entry_id, dropped="").update(dropped=drop_reason(run))


_ENDED = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.HACKED, RunStatus.ERROR,
          RunStatus.CANCELLED]


def drop_reason(run: Run) -> str:
    what = run.error.strip() or run.verdict or run.status
    return f"re-run {run.submission.final_round + 1} on fresh inputs: {run.get_status_display().lower()}: " \
           f"{what}"[:REASON_CHARS]


# --- the standings ------------------------------------------------------------------------------------------------

def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _settle(final: Final) -> None:
    """Scores and ranks every entry that passed all its re-runs; DONE (and published if it publishes when done)."""
    _drop_failed(final)
    entries = list(final.entries.select_related("submission"))
    by_entry: dict[int, list[Run]] = {}
    for run in Run.objects.filter(submission__final_entry__final=final, status=RunStatus.SUCCEEDED, passed=True,
                                  score__isnull=False).select_related("submission"):
        by_entry.setdefault(run.submission.final_entry_id, []).append(run)
    for gpu_type_id in {e.gpu_type_id for e in entries}:
        mine = [e for e in entries if e.gpu_type_id == gpu_type_id]
        candidates = {}
        for entry in mine:
            runs = by_entry.get(entry.pk, [])
            if entry.dropped or len(runs) < final.rounds:
                if not entry.dropped:
                    entry.dropped = "its re-runs did not all end"
                continue
            ratios = [{"ratio": r.ratio, "ratio_low": r.ratio_low, "ratio_high": r.ratio_high} for r in runs]
            ratio = ratio_from_timings(ratios, "geom") if all(r.ratio for r in runs) else None
            candidates[entry.submission_id] = entry
            entry.candidate = Candidate(entry.user_id, entry.submission_id, _geomean([r.score for r in runs]),
                                        entry.submission.created, ratio)
        for ranked in rank([e.candidate for e in candidates.values()]):
            entry = candidates[ranked.submission_id]
            entry.rank, entry.tied, entry.score = ranked.rank, ranked.tied, ranked.score
            for name, value in ratio_fields(ranked.ratio).items():
                setattr(entry, name, value)
    FinalEntry.objects.bulk_update(entries, ["rank", "tied", "score", "ratio", "ratio_low", "ratio_high", "dropped"])
    final.status, final.finished_at = FinalStatus.DONE, timezone.now()
    final.save(update_fields=["status", "finished_at"])
    if final.publish_when_done:
        _publish(final)
    _announce(final)


def do_publish_final(final: Final) -> Final:
    with transaction.atomic():
        final = Final.objects.select_for_update().get(pk=final.pk)
        if final.status == FinalStatus.PUBLISHED:
            return final
        if final.status != FinalStatus.DONE:
            raise Refused(f"Only finished re-verifications can be published; this one is {final.status}.", 409)
        _publish(final)
        _announce(final)
    return final


def _publish(final: Final) -> None:
    Final.objects.filter(leaderboard_id=final.leaderboard_id, status=FinalStatus.PUBLISHED).exclude(pk=final.pk) \
        .update(status=FinalStatus.SUPERSEDED)
    final.status, final.published_at = FinalStatus.PUBLISHED, timezone.now()
    final.save(update_fields=["status", "published_at"])


def do_cancel_final(final: Final) -> Final:
    """Stops a running re-verification: its runs under way are cancelled, nothing is published."""
    with transaction.atomic():
        final = Final.objects.select_for_update().get(pk=final.pk)
        if final.status != FinalStatus.RUNNING:
            raise Refused(f"Only a running re-verification can be cancelled; this one is {final.status}.", 409)
        final.status, final.finished_at = FinalStatus.CANCELLED, timezone.now()
        final.save(update_fields=["status", "finished_at"])
        for run in Run.objects.filter(submission__final_entry__final=final, status__in=ACTIVE_STATUSES):
            lifecycle.do_cancel_run(run, "final re-verification cancelled by an organiser")
        _announce(final)
    return final


FINAL_EVENT = "leaderboard.final"  # LeaderboardConsumer.leaderboard_final


def _announce(final: Final) -> None:
    """Tells the board's open pages, after commit, that its final standings started, moved on, ended, were published
    or cancelled: they fetch the standings as a reload would show them (every viewer may see those of a board they
    see, so the event names no entry)."""
    events.send_on_commit(f"leaderboard.{final.leaderboard_id}", FINAL_EVENT, {"final": final.pk,
                                                                             "status": final.status})


# --- the re-runs belong to the finals ------------------------------------------------------------------------------

UNSETTLED = [FinalStatus.RUNNING, FinalStatus.DONE]  # re-runs under way, or ended and not yet published


def check_may_delete(submission: Submission) -> None:
    """Nobody deletes a re-run (staff included) while its final standings are under way or wait to be published: it
    would be run again, or its standings change under the organiser comparing them; nor a submission being
    re-verified, whose re-runs would go with it. A re-run may go once its standings are published (or cancelled); the
    submission an entry of published standings names never goes: its entry (and with it the row of the final table
    everyone has seen) would go with it, and published standings stay as they were published."""
    if submission.is_rerun:
        final = Final.objects.filter(entries__pk=submission.final_entry_id).values_list("status", "leaderboard__name") \
            .first()
        if final and final[0] in UNSETTLED:
            original = FinalEntry.objects.filter(pk=submission.final_entry_id).values_list("submission_id", flat=True)
            raise Refused(f"Submission {submission.pk} is re-run {submission.final_round + 1} of submission "
                          f"{original.first()} for the final standings of '{final[1]}': it belongs to them and cannot "
                          "be deleted until they are published.", 409)
    elif (final := Final.objects.filter(entries__submission=submission, status__in=UNSETTLED).select_related(
            "leaderboard").first()) is not None:
        raise Refused(f"Submission {submission.pk} is being re-verified for the final standings of "
                      f"'{final.leaderboard.name}': it cannot be deleted while they are "
                      "under way or wait to be published.", 409)
    elif (final := Final.objects.filter(entries__submission=submission, published_at__isnull=False).select_related(
            "leaderboard").order_by("-published_at").first()) is not None:
        raise Refused(f"Submission {submission.pk} is an entry of the published final standings of "
                      f"'{final.leaderboard.name}': published standings stay as they were published, so it cannot "
                      "be deleted.", 409)


def rerun_of(submission: Submission) -> dict[str, int] | None:
    """What the APIs say a re-run is (`rerun_of`): the submission it re-runs, which re-run it is (from 1) and of
    which final standings; None for a submission its user made. Load `final_entry` with the submission."""
    if not submission.is_rerun:
        return None
    entry = submission.final_entry
    return {"submission_id": entry.submission_id, "round": submission.final_round + 1, "final_id": entry.final_id}


def rerun_label(submission: Submission) -> str:
    """What a re-run is, naming the submission it re-runs; "" for any other."""
    if not submission.is_rerun:
        return ""
    entry = submission.final_entry
    return f"re-run {submission.final_round + 1} of #{entry.submission_id} (final standings #{entry.final_id})"


# --- what the pages, the API and Discord show ---------------------------------------------------------------------

@dataclass
class Standings:
    """A board's final standings as a viewer sees them: the published ones (if any), whether the board's ranks are
    still provisional (past the deadline, not yet re-verified), and the running re-verification's progress."""

    leaderboard: Leaderboard
    published: Final | None
    running: Final | None
    provisional: bool
    done: int = 0
    total: int = 0

    @property
    def state(self) -> str:
        """Which standings a page shows, "<published id>/<running id>": the board's websocket snapshot carries it, so a
        page that missed an event (a reconnect) sees that it did."""
        return f"{self.published.pk if self.published else ''}/{self.running.pk if self.running else ''}"


def standings(leaderboard: Leaderboard, *, progress: bool = True) -> Standings:
    if not leaderboard.is_finished or leaderboard.internal:  # an open board's page costs no query here
        return Standings(leaderboard, None, None, False)
    finals = {f.status: f for f in leaderboard.finals.filter(
        status__in=[FinalStatus.PUBLISHED, FinalStatus.RUNNING]).order_by("created")}
    published, running = finals.get(FinalStatus.PUBLISHED), finals.get(FinalStatus.RUNNING)
    provisional = (leaderboard.is_finished and published is None and bool(leaderboard.final_top_n)
                   and bool(leaderboard.final_rounds) and not leaderboard.internal)
    result = Standings(leaderboard, published, running, provisional)
    if running is not None and progress:  # an entry that dropped out runs no more: its rounds leave the total
        kept = running.entries.filter(dropped="").count()
        started_dropped = Submission.objects.filter(final_entry__final=running).exclude(final_entry__dropped="")
        result.total = kept * running.rounds + started_dropped.count()
        result.done = Run.objects.filter(submission__final_entry__final=running, status__in=_ENDED).count()
    return result


def entry_out(entry: FinalEntry, viewer) -> dict:
    """One final entry for the page, /api/v1 and Discord; why it dropped out only for its author and staff."""
    own = viewer is not None and viewer.is_authenticated and (viewer.is_staff or viewer.pk == entry.user_id)
    return {"gpu": entry.gpu_type.name, "rank": entry.rank, "board_rank": entry.board_rank,
            "user": entry.user.get_username(),
            "submission_id": entry.submission_id, "score": entry.score, "ratio": entry.ratio,
            "ratio_low": entry.ratio_low, "ratio_high": entry.ratio_high, "tied": entry.tied,
            "dropped": bool(entry.dropped), "reason": entry.dropped if own and entry.dropped else None}


def final_entries(final: Final) -> list[FinalEntry]:
    """Ranked entries first (by GPU type, rank), then those that dropped out in the board's order."""
    entries = list(final.entries.select_related("gpu_type", "user__profile"))
    return sorted(entries, key=lambda e: (e.gpu_type.name, e.rank is None, e.rank or 0, e.position))


def final_out(final: Final, viewer) -> dict:
    return {"id": final.pk, "status": final.status, "top_n": final.top_n, "rounds": final.rounds,
            "started": final.created, "finished": final.finished_at, "published": final.published_at,
            "entries": [entry_out(e, viewer) for e in final_entries(final)]}


def compare(final: Final) -> list[dict]:
    """Organisers' view: each entry's board rank, its rank in this re-verification and in the published standings
    (this one's own once it is the published one), side by side."""
    published = {(e.gpu_type_id, e.user_id): e.rank for e in FinalEntry.objects.filter(
        final__leaderboard_id=final.leaderboard_id, final__status=FinalStatus.PUBLISHED)}
    return [{**entry_out(e, None), "reason": e.dropped or None,
             "published_rank": published.get((e.gpu_type_id, e.user_id))} for e in final_entries(final)]

