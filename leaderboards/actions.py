"""Service layer: `check_*` validates and authorises, `do_*` writes and emits. Every front-end (admin,
management commands, web, API, Discord) calls these, so they never disagree."""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runners.harness.result import NEEDS_CUDA, NEEDS_CUDA_FLAG
from runners.models import GpuPool, GpuType
from runners.queue import enqueue_on_commit

from . import events
from .access.actions import check_may_submit
from .access.authority import access_leaderboard
from .access.cache import cached, key
from .errors import SubmissionRejected
from .models import (
    ACTIVE_STATUSES,
    Board,
    BoardEntry,
    Code,
    Leaderboard,
    Problem,
    Profile,
    Run,
    RunStatus,
    Submission,
    SubmissionMode,
)
from .ranking import Candidate, Interval, rank, ratio_from_timings, score_seconds, slower_run

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmissionRequest:
    leaderboard: Leaderboard
    gpu_types: list[GpuType]
    mode: str
    file_name: str
    code: str


def check_submission(user, leaderboard_name: str, gpu_names: list[str], mode: str, file_name: str,
                     content: bytes) -> SubmissionRequest:
    leaderboard = access_leaderboard(user, leaderboard_name, for_submit=True)
    if mode not in SubmissionMode.values:
        raise SubmissionRejected(f"Unknown mode '{mode}'; use one of: {', '.join(SubmissionMode.values)}.")
    accepted = serving_gpu_types(leaderboard)
    if not gpu_names:
        raise SubmissionRejected(f"Choose a GPU type for '{leaderboard.name}': {', '.join(sorted(accepted))}.")
    gpu_types = []
    for name in gpu_names:
        gpu = accepted.get(name.strip().lower())
        if gpu is None:
            raise SubmissionRejected(f"Leaderboard '{leaderboard.name}' does not run on GPU '{name}'; "
                                     f"available: {', '.join(g.name for g in accepted.values()) or 'none'}.")
        if not gpu.served:
            raise SubmissionRejected(f"No runner currently serves GPU '{gpu.name}'; try again later.", 503)
        gpu_types.append(gpu)
    if not content.strip():
        raise SubmissionRejected(f"'{file_name}' is empty.")
    if len(content) > settings.MAX_SUBMISSION_BYTES:
        raise SubmissionRejected(f"'{file_name}' is {len(content)} bytes; the limit is "
                                 f"{settings.MAX_SUBMISSION_BYTES} bytes.", 413)
    try:
        code = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionRejected(f"'{file_name}' is not UTF-8 text (invalid byte at offset {exc.start}).") from exc
    if "\x00" in code:
        raise SubmissionRejected(f"'{file_name}' contains NUL bytes; submit source text.")
    check_may_submit(user, leaderboard, mode)
    return SubmissionRequest(leaderboard, list(dict.fromkeys(gpu_types)), mode, file_name[:255], code)


def serving_gpu_types(leaderboard: Leaderboard) -> dict[str, GpuType]:
    """The leaderboard's GPU types by lower-cased name, each marked `served` when an enabled pool has one;
    kept ≤ 2 s per process like the other settings read on every submission."""
    def compute() -> dict[str, GpuType]:
        gpu_types = {g.name.lower(): g for g in leaderboard.gpu_types.all()}
        for gpu in gpu_types.values():
            gpu.served = GpuPool.objects.serving(gpu).exists()
        return gpu_types
    return cached(key("serving", leaderboard.pk), compute)


def do_submit(user, request: SubmissionRequest) -> Submission:
    """Writes the code, the submission and its queued runs atomically and enqueues the runs after commit.
    The new runs (with their GPU types) are on `submission.new_runs`, to report without another query."""
    if not hasattr(user, "profile"):
        Profile.objects.get_or_create(user=user, defaults={"display_name": user.get_username()})
    insert = _insert_in_one_statement if connection.vendor == "postgresql" else _insert_with_orm
    try:
        submission = insert(user, request, Code.digest(request.code), timezone.now())
    except IntegrityError as exc:  # the leaderboard, problem or GPU type was deleted after check_submission
        raise SubmissionRejected(f"Leaderboard '{request.leaderboard.name}' changed while your submission was "
                                 "being saved; submit again.", 409) from exc
    for run in submission.new_runs:
        enqueue_on_commit("runners.tasks.dispatch_run", run.pk)
    return submission


def _run_keys(request: SubmissionRequest) -> list[tuple[GpuType, bool]]:
    secrets = [False, True] if request.mode == SubmissionMode.LEADERBOARD else [False]
    return [(gpu_type, secret) for gpu_type in request.gpu_types for secret in secrets]


def _insert_with_orm(user, request: SubmissionRequest, sha256: str, now) -> Submission:
    with transaction.atomic():
        # DO NOTHING takes no row lock on an existing file (an upsert's would serialise every concurrent
        # submission of the same file until commit); code rows are content-addressed and never change
        Code.objects.bulk_create([Code(sha256=sha256, text=request.code)], ignore_conflicts=True)
        code_id = Code.objects.filter(sha256=sha256).values_list("pk", flat=True).get()
        (submission,) = Submission.objects.bulk_create([Submission(
            user=user, leaderboard=request.leaderboard, problem_id=request.leaderboard.problem_id,
            file_name=request.file_name, code_id=code_id, mode=request.mode)])
        deadline = Run.deadline_for(RunStatus.QUEUED)
        submission.new_runs = Run.objects.bulk_create([
            Run(submission=submission, gpu_type=gpu_type, secret=secret, status_deadline=deadline, queued_at=now)
            for gpu_type, secret in _run_keys(request)])
    return submission


# The same rows as `_insert_with_orm` in one statement: one round trip, atomic without a transaction block,
# and no ORM compiling: with the cached lookups, a submission's CPU fell 2.3x (bench/RESULTS.md). It names every
# Run column with the model's default; tests/leaderboards/test_submit_paths.py compares both paths column by column.
SUBMIT_SQL = f"""
WITH new_code AS (
  INSERT INTO {Code._meta.db_table} (sha256, text) VALUES (%(sha256)s, %(text)s)
  ON CONFLICT (sha256) DO NOTHING RETURNING id
), code AS (
  SELECT id FROM new_code UNION ALL SELECT id FROM {Code._meta.db_table} WHERE sha256 = %(sha256)s LIMIT 1
), submission AS (
  INSERT INTO {Submission._meta.db_table} (user_id, leaderboard_id, problem_id, file_name, code_id, mode, created)
  SELECT %(user_id)s, %(leaderboard_id)s, %(problem_id)s, %(file_name)s, code.id, %(mode)s, %(now)s FROM code
  RETURNING id, code_id
), runs AS (
  INSERT INTO {Run._meta.db_table} (submission_id, gpu_type_id, secret, status, attempt, status_deadline, queued_at,
    runner, verdict, error, result, system_info, stdout, stderr, progress, infra_failures)
  SELECT submission.id, new.gpu_type_id, new.secret, %(status)s, 0, %(deadline)s, %(now)s,
    '', '', '', '{{}}', '{{}}', '', '', '{{}}', 0
  FROM submission, unnest(%(gpu_type_ids)s::bigint[], %(secrets)s::boolean[]) AS new(gpu_type_id, secret)
  RETURNING id, gpu_type_id, secret
)
SELECT submission.id, submission.code_id, runs.id, runs.gpu_type_id, runs.secret,
  (SELECT count(*) FROM {Run._meta.db_table} ahead WHERE ahead.gpu_type_id = runs.gpu_type_id
     AND ahead.status = ANY(%(active)s) AND ahead.id < runs.id)
FROM submission, runs ORDER BY runs.id
"""


def _insert_in_one_statement(user, request: SubmissionRequest, sha256: str, now) -> Submission:
    keys = _run_keys(request)
    params = {"sha256": sha256, "text": request.code, "user_id": user.pk, "leaderboard_id": request.leaderboard.pk,
              "problem_id": request.leaderboard.problem_id, "file_name": request.file_name, "mode": request.mode,
              "now": now, "status": RunStatus.QUEUED.value, "deadline": Run.deadline_for(RunStatus.QUEUED),
              "gpu_type_ids": [gpu_type.pk for gpu_type, _ in keys], "secrets": [secret for _, secret in keys],
              "active": sorted(ACTIVE_STATUSES)}
    for _ in range(3):
        # an error inside the caller's transaction must only undo this statement
        with transaction.atomic() if connection.in_atomic_block else nullcontext(), connection.cursor() as cursor:
            cursor.execute(SUBMIT_SQL, params)
            rows = cursor.fetchall()
        if rows:
            break
        # empty: another transaction inserted the same code after this statement's snapshot was taken, so
        # neither half of `code` saw it; the next statement's snapshot does
    else:
        raise SubmissionRejected("The same file was being saved by another submission; submit again.", 409)
    submission_id, code_id = rows[0][:2]
    submission = Submission(pk=submission_id, user=user, leaderboard=request.leaderboard,
                            problem_id=request.leaderboard.problem_id, file_name=request.file_name, code_id=code_id,
                            mode=request.mode, created=now)
    gpu_types = {gpu_type.pk: gpu_type for gpu_type in request.gpu_types}
    submission.new_runs = []
    for _, _, run_id, gpu_type_id, secret, ahead in rows:
        run = Run(pk=run_id, submission=submission, gpu_type=gpu_types[gpu_type_id], secret=secret,
                  status_deadline=params["deadline"], queued_at=now)
        run.queued_ahead = ahead
        submission.new_runs.append(run)
    return submission


def _locked_run(run_id: int) -> Run:
    return Run.objects.select_for_update().select_related("submission__leaderboard", "gpu_type").get(pk=run_id)


def do_mark_running(run_id: int, attempt: int, *, deadline_seconds: int | None = None) -> bool:
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status != RunStatus.DISPATCHED:
            return False
        run.update_status(RunStatus.RUNNING, deadline_seconds=deadline_seconds)
        return True


def do_record_progress(run_id: int, attempt: int, progress: dict) -> None:
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status != RunStatus.RUNNING:
            return
        run.progress = progress
        run.save(update_fields=["progress"])
        transaction.on_commit(lambda: events.run_changed(run))


FAILING_VERDICT_STATUS = {"timeout": RunStatus.TIMED_OUT, "hacked": RunStatus.HACKED}


def do_ingest_result(run_id: int, attempt: int, result: dict) -> bool:
    """The only way a runner's result enters the database. Stale or repeated reports are ignored."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status not in (RunStatus.DISPATCHED, RunStatus.RUNNING):
            log.info("ignoring result for run %s attempt %s (now %s, attempt %s)",
                     run_id, attempt, run.status, run.attempt)
            return False
        if result.get("status") != "ok" and NEEDS_CUDA_FLAG in (result.get("flags") or []):
            # the problem cannot run on this runner at all: retrying here only repeats it (not the user's fault)
            run.update_status(RunStatus.ERROR, infra_failures=run.infra_failures + 1, reason=result["error"],
                              error=str(result.get("error") or NEEDS_CUDA), result=result,
                              system_info=result.get("system", {}))
            return True
        if result.get("status") != "ok":
            _infrastructure_failure(run, result.get("error") or "the runner reported an error")
            return True
        leaderboard = run.submission.leaderboard
        verdict = str(result.get("verdict", "fail"))
        passed = bool(result.get("passed")) and verdict == "pass"
        score, ratio, error = None, None, "" if passed else str(result.get("error") or f"verdict: {verdict}")
        if passed and run.mode in (SubmissionMode.LEADERBOARD, SubmissionMode.BENCHMARK):
            try:
                score = score_from_result(result, run.mode, leaderboard.ranking_by)
                ratio = ratio_from_result(result, run.mode, leaderboard.ranking_by)
            except ValueError as exc:
                passed, verdict, error = False, "fail", f"unusable timings: {exc}"
        run.update_status(
            RunStatus.SUCCEEDED if passed else FAILING_VERDICT_STATUS.get(verdict, RunStatus.FAILED),
            verdict=verdict, passed=passed, score=score, **ratio_fields(ratio), error=error, result=result,
            progress=final_progress(result, run.mode, _phase_totals(run)),
            system_info=result.get("system", {}), stdout=str(result.get("stdout", "")),
            stderr=str(result.get("stderr", "")))
        if run.mode == SubmissionMode.LEADERBOARD:
            enqueue_on_commit("leaderboards.tasks.recompute_ranks", leaderboard.pk, run.gpu_type_id)
        return True


MODE_PHASES = {SubmissionMode.TEST: ("test",), SubmissionMode.BENCHMARK: ("benchmark",),
               SubmissionMode.LEADERBOARD: ("test", "benchmark", "ranked"), SubmissionMode.PROFILE: ()}
PHASE_RESULTS = {"test": "tests", "benchmark": "benchmarks", "ranked": "ranked"}


def _phase_totals(run: Run) -> dict[str, int]:
    tests, benchmarks = (Problem.objects.filter(pk=run.submission.problem_id)
                         .values_list("definition__tests", "definition__benchmarks").get())
    tests, benchmarks = len(tests or []), len(benchmarks or [])
    last_only = run.submission.leaderboard.ranking_by == "last"
    return {"test": tests, "benchmark": benchmarks, "ranked": min(1, benchmarks) if last_only else benchmarks}


def final_progress(result: dict, mode: str, totals: dict[str, int]) -> dict:
    """Where the finished run got to: the first phase of its mode whose cases did not all pass (or the last
    phase), with the cases that passed. Replaces the last live progress, which can be ahead of a crash. Both
    protocols run a leaderboard submission as tests, benchmarks, then the ranked cases."""
    progress: dict = {}
    for phase in MODE_PHASES.get(mode, ()):
        cases = result.get(PHASE_RESULTS[phase]) or []
        passed = sum(1 for case in cases if isinstance(case, dict) and case.get("status") == "pass")
        progress = {"phase": phase, "done": passed, "total": totals[phase], "final": True}
        if passed < totals[phase]:
            break
    return progress


def _timings(result: dict, mode: str) -> list[dict]:
    return (result.get("ranked") if mode == SubmissionMode.LEADERBOARD else result.get("benchmarks")) or []


def score_from_result(result: dict, mode: str, ranking_by: str) -> float:
    """Seconds: the harness's robust per-case `time` (median over interleaved batches), else the mean."""
    means = [float(t["time"] if t.get("time") is not None else t["mean"]) for t in _timings(result, mode)]
    return score_seconds(means, ranking_by)


def ratio_from_result(result: dict, mode: str, ranking_by: str) -> Interval | None:
    return ratio_from_timings(_timings(result, mode), ranking_by)


def ratio_fields(ratio: Interval | None) -> dict[str, float | None]:
    """Model fields; an unbounded interval side is stored as null."""
    if ratio is None:
        return {"ratio": None, "ratio_low": None, "ratio_high": None}
    return {"ratio": ratio.value, "ratio_low": ratio.low or None,
            "ratio_high": ratio.high if math.isfinite(ratio.high) else None}


def do_report_failure(run_id: int, attempt: int, reason: str) -> bool:
    """A runner could not run the job at all (not the submission's fault)."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.is_terminal:
            return False
        _infrastructure_failure(run, reason)
        return True


def _infrastructure_failure(run: Run, reason: str) -> None:
    failures = run.infra_failures + 1
    if failures < settings.RUN_MAX_ATTEMPTS:
        log.warning("run %s attempt %s failed on infrastructure (%s); retrying", run.pk, run.attempt, reason)
        run.update_status(RunStatus.QUEUED, infra_failures=failures, error=f"retrying after: {reason}",
                          reason=reason)
        enqueue_on_commit("runners.tasks.dispatch_run", run.pk)
    else:
        run.update_status(RunStatus.ERROR, infra_failures=failures, reason=reason,
                          error=f"gave up after {failures} infrastructure failures; last: {reason}")


def do_heartbeat(run_id: int, attempt: int, status: str) -> bool:
    """The runner still holds this attempt: move its deadline a heartbeat ahead, so a runner that dies is known
    within seconds. False when the run moved on (cancelled, reaped, requeued) and the runner should stop."""
    return Run.objects.filter(pk=run_id, attempt=attempt, status=status).update(
        status_deadline=Run.deadline_for(status, settings.RUN_HEARTBEAT_DEADLINE)) == 1


def do_reap_overdue_runs(now=None) -> int:
    """Retry or fail every run that sat in a non-terminal state past its deadline."""
    reaped = 0
    for run_id in Run.objects.overdue(now).values_list("pk", flat=True):
        with transaction.atomic():
            run = _locked_run(run_id)
            if run.is_terminal or run.status_deadline is None or run.status_deadline >= (now or timezone.now()):
                continue
            if run.status == RunStatus.QUEUED:
                _requeue_lost(run, now or timezone.now())
            else:
                _infrastructure_failure(run, f"the runner did not report back while {run.status}")
            reaped += 1
    return reaped


def do_resend_queued_runs(queued_before=None) -> int:
    """Send every queued run's dispatch message again (those queued before `queued_before`): a killed or wedged
    worker cluster takes the messages it had already pulled from the broker with it. Dispatch is idempotent, so a
    duplicate costs one query."""
    runs = Run.objects.filter(status=RunStatus.QUEUED)
    if queued_before is not None:
        runs = runs.filter(queued_at__lt=queued_before)
    run_ids = list(runs.values_list("pk", flat=True))
    for run_id in run_ids:
        enqueue_on_commit("runners.tasks.dispatch_run", run_id)
    return len(run_ids)


def _requeue_lost(run: Run, now) -> None:
    """A queued run past its deadline may have lost its broker message: send another (dispatch is
    idempotent, so a duplicate is harmless). Waiting is not the user's fault, so it is not charged."""
    if now - run.queued_at > timedelta(seconds=settings.RUN_MAX_QUEUED_SECONDS):
        run.update_status(RunStatus.ERROR, error=f"no runner picked the run up within "
                          f"{settings.RUN_MAX_QUEUED_SECONDS // 3600} h")
        return
    run.update_status(RunStatus.QUEUED)
    enqueue_on_commit("runners.tasks.dispatch_run", run.pk)


def do_requeue_run(run: Run, reason: str = "requeued by an organiser") -> None:
    with transaction.atomic():
        run = _locked_run(run.pk)
        run.update_status(RunStatus.QUEUED, infra_failures=0, error=reason, verdict="", passed=None, score=None,
                          **ratio_fields(None), progress={})
        enqueue_on_commit("runners.tasks.dispatch_run", run.pk)
        if run.mode == SubmissionMode.LEADERBOARD:
            enqueue_on_commit("leaderboards.tasks.recompute_ranks", run.submission.leaderboard_id, run.gpu_type_id)


def do_cancel_run(run: Run, reason: str = "cancelled by an organiser") -> bool:
    with transaction.atomic():
        run = _locked_run(run.pk)
        if run.is_terminal:
            return False
        run.update_status(RunStatus.CANCELLED, error=reason)
        return True


def do_rescore_leaderboard(leaderboard: Leaderboard) -> int:
    """Recompute scores from stored results with the current ranking rule, then every board's ranks."""
    changed = 0
    with transaction.atomic():
        runs = Run.objects.select_for_update().filter(
            submission__leaderboard=leaderboard, status=RunStatus.SUCCEEDED, passed=True,
            submission__mode=SubmissionMode.LEADERBOARD)
        for run in runs:
            score = score_from_result(run.result, SubmissionMode.LEADERBOARD, leaderboard.ranking_by)
            ratio = ratio_fields(ratio_from_result(run.result, SubmissionMode.LEADERBOARD, leaderboard.ranking_by))
            if score != run.score or any(getattr(run, k) != v for k, v in ratio.items()):
                run.score = score
                for k, v in ratio.items():
                    setattr(run, k, v)
                run.save(update_fields=["score", *ratio])
                changed += 1
        for gpu_type in leaderboard.gpu_types.all():
            enqueue_on_commit("leaderboards.tasks.recompute_ranks", leaderboard.pk, gpu_type.pk)
    return changed


def ranked_candidates(leaderboard_id: int, gpu_type_id: int) -> list[Candidate]:
    """Submissions whose public AND secret ranked runs both passed; scored on the slower of the two (by the
    ratio when both runs have one, else by time), time and ratio taken from that run."""
    rows = Run.objects.ranked().filter(
        submission__leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id,
    ).values_list("submission_id", "submission__user_id", "submission__created", "secret", "status", "passed",
                  "score", "ratio", "ratio_low", "ratio_high")
    by_submission: dict[int, dict] = {}
    for submission_id, user_id, created, secret, status, passed, score, ratio, low, high in rows:
        entry = by_submission.setdefault(submission_id, {"user": user_id, "created": created, "runs": {}})
        if status == RunStatus.SUCCEEDED and passed and score is not None:
            interval = None if ratio is None else Interval(ratio, low or 0.0, math.inf if high is None else high)
            entry["runs"][secret] = (score, interval)
    candidates = []
    for sid, e in by_submission.items():
        if len(e["runs"]) == 2:
            runs = list(e["runs"].values())
            score, ratio = slower_run(runs)
            by_ratio = all(r is not None for _, r in runs)
            candidates.append(Candidate(e["user"], sid, score, e["created"], ratio if by_ratio else None))
    return candidates


def do_recompute_ranks(leaderboard_id: int, gpu_type_id: int) -> bool:
    """Rewrite one board's materialised ranks; emits one event when anything changed."""
    with transaction.atomic():
        Board.objects.get_or_create(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
        board = Board.objects.select_for_update().get(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id)
        ranked = rank(ranked_candidates(leaderboard_id, gpu_type_id))
        existing = {e.user_id: e for e in BoardEntry.objects.filter(leaderboard_id=leaderboard_id,
                                                                     gpu_type_id=gpu_type_id)}
        to_create, to_update = [], []
        for r in ranked:
            entry = existing.pop(r.user_id, None)
            values = {"submission_id": r.submission_id, "score": r.score, "rank": r.rank,
                      "submitted_at": r.submitted_at, "tied": r.tied, **ratio_fields(r.ratio)}
            if entry is None:
                to_create.append(BoardEntry(leaderboard_id=leaderboard_id, gpu_type_id=gpu_type_id,
                                            user_id=r.user_id, **values))
            elif any(getattr(entry, k) != v for k, v in values.items()):
                for k, v in values.items():
                    setattr(entry, k, v)
                to_update.append(entry)
        if existing:
            BoardEntry.objects.filter(pk__in=[e.pk for e in existing.values()]).delete()
        BoardEntry.objects.bulk_create(to_create)
        BoardEntry.objects.bulk_update(to_update, ["submission_id", "score", "rank", "submitted_at", "tied", "ratio",
                                                   "ratio_low", "ratio_high"])
        if not (to_create or to_update or existing):
            return False
        board.version += 1
        board.save(update_fields=["version", "updated"])
        changed = {e.user_id for e in to_create + to_update}
        delta = [{"user": r.user_id, "submission": r.submission_id, "score": r.score, "rank": r.rank, "tied": r.tied,
                  "ratio": r.ratio and r.ratio.value} for r in ranked if r.user_id in changed]
        removed, version = list(existing), board.version
        transaction.on_commit(lambda: events.board_changed(leaderboard_id, gpu_type_id, version, delta, removed))
        return True


def do_delete_submission(submission: Submission) -> None:
    """Cancel what is still running, delete the submission and re-rank the boards it was on."""
    with transaction.atomic():
        boards = set(BoardEntry.objects.filter(submission=submission).values_list("leaderboard_id", "gpu_type_id"))
        for run in submission.runs.filter(status__in=[RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.RUNNING]):
            do_cancel_run(run, "submission deleted")
        submission.delete()
        for leaderboard_id, gpu_type_id in boards:
            enqueue_on_commit("leaderboards.tasks.recompute_ranks", leaderboard_id, gpu_type_id)
