"""API v1: leaderboards, paged rankings, submissions (create, status, list, delete, progress stream).
Thin: who sees what is `access.authority`, validation and writes are `actions`, runs render from
`serializers.run_out`; shapes are `schemas`."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, StreamingHttpResponse
from ninja import File, Form, Router
from ninja.errors import HttpError
from ninja.files import UploadedFile

from kernelbot.api_errors import check_offset
from kernelbot.cli.directives import parse_directives
from kernelbot.errors import ErrorOut
from kernelbot.inputs import Text

from . import actions, finals, local_run
from .access import actions as access
from .access.api import optional_token_auth, token_auth
from .access.authority import RunView, access_leaderboard, access_submission, run_view
from .models import BoardEntry, Leaderboard, Run, Submission
from .popcorn import wire
from .progress import in_pool, run_snapshots, sse
from .schemas import (
    DeletedOut,
    LeaderboardOut,
    LocalTaskOut,
    RankingPageOut,
    StandingsOut,
    SubmissionOut,
    SubmissionPageOut,
)
from .serializers import job_state, run_out, submission_scores, submission_standing

router = Router(tags=["leaderboards"])
MAX_PAGE = 10**6
ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 404: ErrorOut, 413: ErrorOut, 429: ErrorOut, 503: ErrorOut}


def leaderboard_out(b: Leaderboard) -> dict[str, Any]:
    task = wire.public_task(b)
    return {"id": b.pk, "name": b.name, "description": b.description, "deadline": b.deadline,
            "is_open": b.is_open, "gpu_types": [g.name for g in b.gpu_types.all()], "lang": b.problem.lang,
            "ranking_by": b.ranking_by, "templates": task.get("templates", {}), "task": task}


def visible(request: HttpRequest, name: str) -> Leaderboard:
    return access_leaderboard(request.auth, name, queryset=Leaderboard.objects.select_related("problem")
                              .prefetch_related("gpu_types"))


@router.get("/leaderboards", response={200: list[LeaderboardOut], 401: ErrorOut}, auth=optional_token_auth)
def list_leaderboards(request):
    """Public leaderboards, and the closed ones the caller is a member of, with GPU types, deadlines and
    templates. The token is optional."""
    boards = Leaderboard.objects.listed_for(request.auth).select_related("problem").prefetch_related("gpu_types")
    return [leaderboard_out(b) for b in boards]


@router.get("/leaderboards/{name}", response={200: LeaderboardOut, 401: ErrorOut, 404: ErrorOut},
            auth=optional_token_auth)
def get_leaderboard(request, name: str):
    return leaderboard_out(visible(request, name))


@router.get("/leaderboards/{name}/local", response={200: LocalTaskOut, 401: ErrorOut, 404: ErrorOut},
            auth=optional_token_auth)
def local_task(request, name: str):
    """What `kernelbot run` needs to run this leaderboard's task on the caller's machine as the platform does: the
    task's files, per mode (test, benchmark) the platform's harness job with the task's public seed (never the
    secret one), and the harness tarball's URL and version."""
    return local_run.local_task(visible(request, name))


@router.get("/leaderboards/{name}/rankings/{gpu}", response={200: RankingPageOut, 400: ErrorOut, 401: ErrorOut,
                                                             404: ErrorOut},
            auth=optional_token_auth)
def rankings(request, name: str, gpu: str, page: int = 1, page_size: int = 50):
    """One board (leaderboard × GPU type), best first; `page` from 1, `page_size` up to 200."""
    board = visible(request, name)
    gpu_type = next((g for g in board.gpu_types.all() if g.name.lower() == gpu.lower()), None)
    if gpu_type is None:
        raise HttpError(404, f"Leaderboard '{name}' does not run on GPU '{gpu}'.")
    if not 1 <= page <= MAX_PAGE:
        raise HttpError(400, f"page must be between 1 and {MAX_PAGE}; got {page}.")
    page_size = max(1, min(page_size, 200))
    entries = BoardEntry.objects.for_board(board, gpu_type).select_related("user")
    start = (page - 1) * page_size
    return {"leaderboard": board.name, "gpu": gpu_type.name, "count": entries.count(), "page": page,
            "page_size": page_size, "results": [
                {"rank": e.rank, "user": e.user.get_username(), "score": e.score, "ratio": e.ratio,
                 "ratio_low": e.ratio_low, "ratio_high": e.ratio_high, "tied": e.tied,
                 "submission_id": e.submission_id, "submitted_at": e.submitted_at}
                for e in entries.page(start, start + page_size)]}


@router.get("/leaderboards/{name}/final", response={200: StandingsOut, 401: ErrorOut, 404: ErrorOut},
            auth=optional_token_auth)
def final_standings(request, name: str):
    """The final standings (the top entries re-run on fresh inputs after the deadline), and whether the board's
    ranks are still provisional."""
    board = visible(request, name)
    shown = finals.standings(board)
    return {"leaderboard": board.name, "provisional": shown.provisional,
            "published": finals.final_out(shown.published, request.auth) if shown.published else None,
            "running": {"done": shown.done, "total": shown.total} if shown.running else None}


def queue_out(submission: Submission, runs: list[Run] | None = None) -> dict[str, Any] | None:
    estimate = access.queue_estimate(submission, runs)
    return estimate.__dict__ if estimate else None


def case(c: dict) -> dict[str, Any]:
    mean = c.get("mean")
    return {"spec": str(c.get("spec", "")), "status": str(c.get("status", "")),
            "mean": float(mean) if isinstance(mean, int | float) else None,
            "message": str(c["message"]) if c.get("message") else None}


def submission_out(submission: Submission, runs: list[Run], view: RunView, queue: dict | None = None) \
        -> dict[str, Any]:
    done, status, _ = job_state(runs, view)
    shown = [run_out(r, view) for r in runs]
    scores = submission_scores(submission.mode, runs)  # the page's and the board's, per GPU type
    return {"id": submission.pk, "leaderboard": submission.leaderboard.name, "file_name": submission.file_name,
            "mode": submission.mode, "created": submission.created, "done": done, "status": status,
            "rerun_of": finals.rerun_of(submission), "score": min(scores.values(), default=None), "scores": scores,
            "standing": submission_standing(submission, runs),
            "runs": [{**r, "tests": [case(c) for c in r["tests"]], "benchmarks": [case(c) for c in r["benchmarks"]]}
                     for r in shown], "queue": queue}


# `Text = Form(default)`: written as `Form[Text] = default`, ninja loses the default
@router.post("/submissions", response={201: SubmissionOut, **ERRORS}, auth=token_auth)
def create_submission(request, file: File[UploadedFile], leaderboard: Text = Form(""),  # noqa: B008
                      gpu: Text = Form(""), mode: Text = Form("leaderboard")):  # noqa: B008
    """Submit a file (multipart). `leaderboard` and `gpu` default to the file's `#!POPCORN` directives."""
    content = file.read(settings.MAX_SUBMISSION_BYTES + 1)
    found = parse_directives(content.decode("utf-8", errors="replace"))
    leaderboard = leaderboard or found.get("leaderboard", "")
    gpus = [g for g in (gpu or found.get("gpu", "")).split(",") if g.strip()]
    if not leaderboard:
        raise HttpError(400, "Name a leaderboard (form field or a #!POPCORN leaderboard line).")
    checked = actions.check_submission(request.auth, leaderboard, gpus, mode, file.name or "submission",
                                       content, file.size)
    submission = actions.do_submit(request.auth, checked)
    return 201, submission_out(submission, submission.new_runs, RunView.DETAILS,
                               queue_out(submission, submission.new_runs))


@router.get("/submissions", response=SubmissionPageOut, auth=token_auth)
def list_submissions(request, leaderboard: str = "", limit: int = 50, offset: int = 0):
    """The caller's submissions, newest first."""
    qs = Submission.objects.made_by(request.auth).select_related("leaderboard").prefetch_related(
        "runs__gpu_type")
    if leaderboard:
        qs = qs.filter(leaderboard__name=leaderboard)
    check_offset(offset)
    limit = max(1, min(limit, 200))
    rows = []
    for s in qs[offset:offset + limit]:
        runs = list(s.runs.all())
        done, status, _ = job_state(runs, RunView.DETAILS)
        scores = submission_scores(s.mode, runs).values()  # per GPU type, as its board entries rank it
        rows.append({"id": s.pk, "leaderboard": s.leaderboard.name, "file_name": s.file_name, "mode": s.mode,
                     "created": s.created, "done": done, "status": status, "score": min(scores, default=None)})
    return {"count": qs.count(), "results": rows}


@router.get("/submissions/{submission_id}", response={200: SubmissionOut, 404: ErrorOut}, auth=token_auth)
def get_submission(request, submission_id: int):
    """Status with per-phase (tests, benchmarks) results of each run."""
    submission = access_submission(request.auth, submission_id, queryset=Submission.objects.select_related(
        "leaderboard", "final_entry"))
    runs = list(submission.runs.select_related("gpu_type", "submission"))
    return submission_out(submission, runs, run_view(request.auth, submission), queue_out(submission, runs))


@router.delete("/submissions/{submission_id}", response={200: DeletedOut, 404: ErrorOut}, auth=token_auth)
def delete_submission(request, submission_id: int):
    """Delete one of your submissions (its unfinished runs are cancelled)."""
    actions.do_delete_submission(access_submission(request.auth, submission_id, for_change=True))
    return {"status": "ok", "submission_id": submission_id}


@router.get("/submissions/{submission_id}/events", auth=token_auth,
            response={200: None, 404: ErrorOut}, openapi_extra={"responses": {200: {
                "description": "text/event-stream: `event: submission` snapshots (as GET /submissions/{id}), "
                               "then `event: done`; `: keepalive` comments every 15 s.",
                "content": {"text/event-stream": {"schema": {"type": "string"}}}}}})
def submission_events(request, submission_id: int):
    """Server-sent progress of one submission until all its runs finish."""
    access_submission(request.auth, submission_id)
    # this request's thread would otherwise keep its database connection until the stream ends
    connection.close()
    response = StreamingHttpResponse(progress_stream(submission_id, request.auth), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def progress_stream(submission_id: int, viewer, heartbeat: float = 15.0):
    version = 0
    async for submission, runs, changed in run_snapshots(submission_id, heartbeat):
        if submission is None:
            yield sse("error", {"detail": "The submission was deleted."})
            return
        if not changed:
            yield b": keepalive\n\n"
            continue
        version += 1
        queue = None if all(r.is_terminal for r in runs) else await in_pool(queue_out, submission, runs)
        shown = await in_pool(submission_out, submission, runs, run_view(viewer, submission), queue)  # reads ranks
        yield sse("submission", {"version": version, **shown})
    yield sse("done", {"submission_id": submission_id})
