"""Service layer: `check_*` validates and authorises, `do_*` writes and emits. Every front-end (admin,
management commands, web, API, Discord) calls these, so they never disagree."""

from __future__ import annotations

import functools
import json
import logging
from contextlib import nullcontext
from dataclasses import dataclass, field

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from runners.actions import gpu_availability
from runners.models import GpuType
from runners.queue import enqueue_on_commit

from . import finals, lifecycle, precheck
from .access.actions import check_may_submit, lock_quota
from .access.authority import access_leaderboard
from .access.cache import cached, key
from .errors import Refused, SubmissionRejected

# Run transitions live in lifecycle; these names stay importable from here for code written before the move.
from .lifecycle import (  # noqa: E402, F401
    do_cancel_run,
    do_heartbeat,
    do_ingest_result,
    do_mark_running,
    do_reap_overdue_runs,
    do_record_progress,
    do_report_failure,
    do_requeue_run,
    do_resend_queued_runs,
)
from .models import (
    ACTIVE_STATUSES,
    REFUSED_TALLY,
    Code,
    Leaderboard,
    Profile,
    Run,
    RunStatus,
    Submission,
    SubmissionMode,
    Tally,
)
from .ranks import (  # noqa: F401 - the service layer's verbs
    RECOMPUTE_TASK,
    do_rank_result,
    do_recompute_ranks,
    do_take_off_boards,
    ranked_candidates,
)
from .scoring import ratio_fields, ratio_from_result, score_from_result

# What a finished ranked run does next (its `on_finish` task, called with the run's id).
RANK_HOOK = "leaderboards.tasks.rank_run"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmissionRequest:
    leaderboard: Leaderboard
    gpu_types: list[GpuType]
    mode: str
    file_name: str
    code: str
    precheck: dict = field(default_factory=dict)  # kernelguard's findings (`precheck.check_precheck`)


def counts_refusals(check):
    """Every refused submission is counted in the database (Tally `submissions_refused:<status>`, read by
    /metrics), whichever front end it came through."""
    @functools.wraps(check)
    def counted(*args, **kwargs):
        try:
            return check(*args, **kwargs)
        except Refused as exc:
            Tally.add(f"{REFUSED_TALLY}{exc.status}")
            raise
    return counted


@counts_refusals
def check_submission(user, leaderboard_name: str, gpu_names: list[str], mode: str, file_name: str,
                     content: bytes, size: int | None = None, *, after_deadline: bool = False) -> SubmissionRequest:
    """`size`: the upload's whole size where `content` holds only its first MAX_SUBMISSION_BYTES + 1 bytes."""
    leaderboard = access_leaderboard(user, leaderboard_name, for_submit=True, after_deadline=after_deadline)
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
        if gpu.unavailable:
            raise SubmissionRejected(f"GPU '{gpu.name}' is unavailable: {gpu.unavailable}; try again later.", 503)
        gpu_types.append(gpu)
    if not content.strip():
        raise SubmissionRejected(f"'{file_name}' is empty.")
    if (size := len(content) if size is None else size) > settings.MAX_SUBMISSION_BYTES:
        raise SubmissionRejected(f"'{file_name}' is {size} bytes; the limit is "
                                 f"{settings.MAX_SUBMISSION_BYTES} bytes.", 413)
    try:
        code = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SubmissionRejected(f"'{file_name}' is not UTF-8 text (invalid byte at offset {exc.start}).") from exc
    if "\x00" in code:
        raise SubmissionRejected(f"'{file_name}' contains NUL bytes; submit source text.")
    check_may_submit(user, leaderboard, mode)
    file_name = file_name[:255]
    # last: the only check that costs more than a lookup, and only for what passed the others
    findings = precheck.check_precheck(mode, file_name, code)
    return SubmissionRequest(leaderboard, list(dict.fromkeys(gpu_types)), mode, file_name, code, findings)


def serving_gpu_types(leaderboard: Leaderboard) -> dict[str, GpuType]:
    """The leaderboard's GPU types by lower-cased name, each with `unavailable`: None when a pool takes its runs,
    else why not (no pool serves it, or its pools fail their health check); kept ≤ 2 s per process like the other
    settings read on every submission."""
    def compute() -> dict[str, GpuType]:
        gpu_types = {g.name.lower(): g for g in leaderboard.gpu_types.all()}
        availability = gpu_availability([g.pk for g in gpu_types.values()])
        for gpu in gpu_types.values():
            gpu.unavailable = availability[gpu.pk]
        return gpu_types
    return cached(key("serving", leaderboard.pk), compute)


@counts_refusals
def do_submit(user, request: SubmissionRequest) -> Submission:
    """Writes the code, the submission and its queued runs atomically and enqueues the runs after commit.
    The new runs (with their GPU types) are on `submission.new_runs`, to report without another query."""
    if not hasattr(user, "profile"):
        Profile.objects.get_or_create(user=user, defaults={"display_name": user.get_username()})
    insert = _insert_in_one_statement if connection.vendor == "postgresql" else _insert_with_orm
    try:
        with transaction.atomic():
            lock_quota(user, request.leaderboard, request.mode)  # the quota counted again, one at a time
            submission = insert(user, request, Code.digest(request.code), timezone.now())
    except IntegrityError as exc:  # the leaderboard, problem or GPU type was deleted after check_submission
        raise SubmissionRejected(f"Leaderboard '{request.leaderboard.name}' changed while your submission was "
                                 "being saved; submit again.", 409) from exc
    for run in submission.new_runs:
        lifecycle.dispatch_on_commit(run.pk)
    return submission


def do_delete_leaderboard(leaderboard: Leaderboard, *, force: bool = False) -> int:
    """Delete a leaderboard with its entries (and, with `force`, its submissions and runs); the number of
    submissions deleted. Refused (409) when it has submissions and `force` is not given."""
    with transaction.atomic():
        count = leaderboard.submissions.count()
        if count and not force:
            raise SubmissionRejected(f"Leaderboard '{leaderboard.name}' has {count} submissions; pass force to "
                                     "delete them too.", 409)
        leaderboard.delete()
    return count


def _on_finish(request: SubmissionRequest) -> str:
    return RANK_HOOK if request.mode == SubmissionMode.LEADERBOARD else ""


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
            file_name=request.file_name, code_id=code_id, mode=request.mode, precheck=request.precheck)])
        deadline = Run.deadline_for(RunStatus.QUEUED)
        submission.new_runs = Run.objects.bulk_create([
            Run(submission=submission, gpu_type=gpu_type, secret=secret, status_deadline=deadline, queued_at=now,
                first_queued_at=now, on_finish=_on_finish(request))
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
  INSERT INTO {Submission._meta.db_table} (user_id, leaderboard_id, problem_id, file_name, code_id, mode, created,
    precheck)
  SELECT %(user_id)s, %(leaderboard_id)s, %(problem_id)s, %(file_name)s, code.id, %(mode)s, %(now)s,
    %(precheck)s::jsonb FROM code
  RETURNING id, code_id
), runs AS (
  INSERT INTO {Run._meta.db_table} (submission_id, gpu_type_id, secret, status, attempt, status_deadline, queued_at,
    first_queued_at, runner, verdict, error, result, system_info, stdout, stderr, progress, infra_failures, on_finish)
  SELECT submission.id, new.gpu_type_id, new.secret, %(status)s, 0, %(deadline)s, %(now)s, %(now)s,
    '', '', '', '{{}}', '{{}}', '', '', '{{}}', 0, %(on_finish)s
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
              "active": sorted(ACTIVE_STATUSES), "on_finish": _on_finish(request),
              "precheck": json.dumps(request.precheck)}
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
                            mode=request.mode, created=now, precheck=request.precheck)
    gpu_types = {gpu_type.pk: gpu_type for gpu_type in request.gpu_types}
    submission.new_runs = []
    for _, _, run_id, gpu_type_id, secret, ahead in rows:
        run = Run(pk=run_id, submission=submission, gpu_type=gpu_types[gpu_type_id], secret=secret,
                  status_deadline=params["deadline"], queued_at=now, first_queued_at=now,
                  on_finish=params["on_finish"])
        run.queued_ahead = ahead
        submission.new_runs.append(run)
    return submission


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
            enqueue_on_commit(RECOMPUTE_TASK, leaderboard.pk, gpu_type.pk)
    return changed


def do_delete_submission(submission: Submission) -> None:
    """Cancel what is still running, take it off its boards, delete it and rebuild the boards it held an entry or
    a record on (another submission may take its place in either). The final standings' re-runs, and the submissions
    they re-run, stay until the standings are published, and an entry of published standings stays for good
    (`finals.check_may_delete`)."""
    finals.check_may_delete(submission)
    with transaction.atomic():
        boards = do_take_off_boards(submission.pk)
        for run in submission.runs.filter(status__in=ACTIVE_STATUSES):
            lifecycle.do_cancel_run(run, "submission deleted")
        submission.delete()
        for leaderboard_id, gpu_type_id in boards:
            enqueue_on_commit(RECOMPUTE_TASK, leaderboard_id, gpu_type_id)
