"""popcorn-cli's wire contract, served under /popcorn (users set POPCORN_API_URL=https://host/popcorn).

Paths have no trailing slash, there is no CSRF (no cookies are read), every error is {"detail": "..."}.
Each endpoint is thin: the same actions as the site and our own /api/v1 do the work."""

from __future__ import annotations

import asyncio
import base64
import json
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser
from django.db import transaction
from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Max, Q, Sum
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from ninja import Field, NinjaAPI, Router, Schema
from ninja.errors import HttpError
from ninja.security import APIKeyHeader, HttpBearer
from pydantic import ValidationError as PydanticValidationError

from kernelbot.api_errors import check_offset, install_error_handlers
from kernelbot.cli.directives import parse_directives
from kernelbot.errors import AccessDenied
from kernelbot.inputs import Bool, Int, Text
from leaderboards import actions, dataset, repository
from leaderboards.access import actions as access
from leaderboards.access.authority import RunView, access_leaderboard, access_submission, run_view
from leaderboards.access.models import TOKEN_PREFIX, Invite, QuotaKind, SubmissionQuota
from leaderboards.board_rows import name_of
from leaderboards.importing import ImportRejected, do_import_task
from leaderboards.models import ACTIVE_STATUSES, BoardEntry, Leaderboard, Run, RunAttempt, RunStatus, Submission
from leaderboards.repository import RepositoryError, do_import_repository
from leaderboards.serializers import job_state, run_out
from runners.models import GpuPool, GpuType
from taskspec.loader import TaskFileError, collection_root, load_competition, load_task, load_task_from_zip

from . import wire
from .oauth import oauth_app, oauth_username


# --- authentication -------------------------------------------------------------------------------
def cli_user(request: HttpRequest):
    """The user of the `X-Popcorn-Cli-Id` header (a token or a linked pending id), or what to do: 400 without the
    header, 401 (403 declined) with one that names no one, as KernelBot answers."""
    raw = request.headers.get("X-Popcorn-Cli-Id", "").strip()
    if not raw:
        raise HttpError(400, "Missing X-Popcorn-Cli-Id header: run `popcorn-cli register discord` (or set "
                        "cli_id in ~/.popcorn.yaml to a token from this site's account page).")
    user = access.authenticate_token(raw)
    if user is None:
        state = access.pending_login_state(raw)
        if state == "declined":
            raise HttpError(403, access.DECLINED_CLI_ID)
        if state:
            link = request.build_absolute_uri(reverse("access:link-cli"))
            raise HttpError(401, f"This CLI id is not linked to an account yet: log in at {link} and paste it.")
        raise HttpError(401, "Invalid, expired or revoked CLI id: register again or create a new token.")
    return user


class CliAuth(APIKeyHeader):
    param_name = "X-Popcorn-Cli-Id"

    def authenticate(self, request, key: str | None):
        return cli_user(request)


class OptionalCliAuth(CliAuth):
    """Public reads: anonymous without the header, the header's user (or a 401) with it."""

    def authenticate(self, request, key: str | None):
        return cli_user(request) if key is not None else AnonymousUser()


class AdminAuth(HttpBearer):
    """`Authorization: Bearer <ADMIN_TOKEN>`, compared in constant time; no ADMIN_TOKEN: admin is off."""

    def __call__(self, request):
        if not settings.ADMIN_TOKEN:
            raise HttpError(403, "Admin commands are disabled: the server has no ADMIN_TOKEN.")
        return super().__call__(request) or self.refuse()

    def authenticate(self, request, token: str):
        return access.admin_token_matches(token.strip()) or self.refuse()

    @staticmethod
    def refuse():
        raise HttpError(401, "Missing or wrong admin token (Authorization: Bearer <ADMIN_TOKEN>).")


api = NinjaAPI(title="popcorn-cli compatibility", version="popcorn", urls_namespace="popcorn", docs_url=None,
               openapi_url=None, auth=CliAuth())
install_error_handlers(api, validation_status=400)
admin = Router(auth=AdminAuth())
optional_cli = OptionalCliAuth()


@api.get("/health", auth=None)
def health(request):
    return {"status": "ok"}


# --- competitor routes (X-Popcorn-Cli-Id) -----------------------------------------------------------
@api.get("/leaderboards", auth=optional_cli)
def list_leaderboards(request):
    boards = Leaderboard.objects.listed_for(request.auth).select_related("problem").prefetch_related("gpu_types")
    return [wire.leaderboard_item(b) for b in boards]


@api.get("/gpus/{leaderboard}", auth=optional_cli)
def list_gpus(request, leaderboard: str):
    board = access_leaderboard(request.auth, leaderboard, queryset=Leaderboard.objects.prefetch_related("gpu_types"))
    return [g.name for g in board.gpu_types.all()]


def read_upload(request: HttpRequest) -> tuple[str, bytes]:
    upload = request.FILES.get("file")
    if upload is None:
        raise HttpError(400, "Send the submission as a multipart part named 'file'.")
    if upload.size > settings.MAX_SUBMISSION_BYTES:
        raise actions.SubmissionRejected(f"'{upload.name}' is {upload.size} bytes; the limit is "
                                         f"{settings.MAX_SUBMISSION_BYTES} bytes.", 413)
    return Path(upload.name or "submission.py").name, upload.read()


def check_directives(content: bytes, leaderboard: str, gpu: str) -> None:
    found = parse_directives(content.decode("utf-8", errors="replace"))
    if "leaderboard" in found and found["leaderboard"].lower() != leaderboard.lower():
        raise HttpError(400, f"The file's #!POPCORN leaderboard is '{found['leaderboard']}' but you submitted to "
                        f"'{leaderboard}'; change one of them.")
    wanted = [g.strip().lower() for g in found.get("gpu", "").split(",") if g.strip()]
    if wanted and gpu.lower() not in wanted:
        raise HttpError(400, f"The file's #!POPCORN gpu is '{found['gpu']}' but you submitted for '{gpu}'; "
                        "change one of them.")


def accept(user, leaderboard: str, gpu: str, mode: str, file_name: str, content: bytes) -> Submission:
    check_directives(content, leaderboard, gpu)
    request = actions.check_submission(user, leaderboard, [gpu], mode, file_name, content)
    return actions.do_submit(user, request)


def queue_status(gpu_type: GpuType) -> dict[str, Any]:
    """KernelBot's RunnerQueueStatus of a GPU type (runner, gpu, queued_jobs, running_jobs, available_runners,
    status, error) and ours: the devices serving it and a rough wait."""
    counts = dict(Run.objects.filter(gpu_type=gpu_type, status__in=ACTIVE_STATUSES).values_list("status")
                  .annotate(n=Count("pk")).order_by())
    devices, seconds = access.eta_inputs(gpu_type.pk)
    waiting = sum(n for status, n in counts.items() if status != RunStatus.RUNNING)
    pools = list(GpuPool.objects.taking_runs(gpu_type).order_by("name").values_list("name", flat=True))
    return {"runner": ", ".join(pools) or "none", "gpu": gpu_type.name, "queued_jobs": waiting,
            "running_jobs": counts.get(RunStatus.RUNNING, 0), "available_runners": devices if pools else 0,
            "status": "available" if pools else "unavailable",
            "error": None if pools else f"no pool takes {gpu_type.name} runs now",
            "devices": devices, "eta_seconds": round((waiting // devices + 1) * seconds)}


def runner_queue(submission: Submission, runs: list[Run]) -> dict[str, Any] | None:
    """As KernelBot: the queue of the submission's first run's GPU type while it has runs (null without), with where
    its first unfinished run stands in it."""
    if not runs:
        return None
    first = min(runs, key=lambda run: run.pk)
    status = queue_status(first.gpu_type)
    if estimate := access.queue_estimate(submission, runs):
        status.update(queued_jobs=estimate.queued_jobs, position=estimate.position, eta_seconds=estimate.eta_seconds)
    return status


@api.post("/submission/{leaderboard}/{gpu}/{mode}")
def submit(request, leaderboard: str, gpu: str, mode: str):
    file_name, content = read_upload(request)
    submission = accept(request.auth, leaderboard, gpu, mode, file_name, content)
    return JsonResponse({"details": {"id": submission.pk}, "status": "accepted",
                         "runner_queue": runner_queue(submission, submission.new_runs)}, status=202)


@api.get("/runner_queue/{gpu}", auth=None)
def runner_queue_of(request, gpu: str):
    """KernelBot's queue status of a GPU type; an unknown one is, as there, a 200 with status "unavailable"."""
    gpu_type = GpuType.objects.filter(name__iexact=gpu).first()
    if gpu_type is None:
        return {"runner": "unknown", "gpu": gpu, "queued_jobs": None, "running_jobs": None,
                "available_runners": None, "status": "unavailable", "error": "unknown gpu"}
    return queue_status(gpu_type)


def _board_entries(request, leaderboard: str, gpu: str):
    board = access_leaderboard(request.auth, leaderboard)
    gpu_type = board.gpu_types.filter(name=gpu).first()
    if gpu_type is None:
        raise Http404(f"Leaderboard '{board.name}' has no GPU type '{gpu}'.")
    return board, gpu_type, BoardEntry.objects.for_board(board, gpu_type)


@api.get("/submissions/{leaderboard}/{gpu}", auth=optional_cli)
def board_submissions(request, leaderboard: str, gpu: str, limit: int | None = None, offset: int = 0):
    """The ranked entries of a board (KernelBot's LeaderboardRankedEntry), best first."""
    board, gpu_type, entries = _board_entries(request, leaderboard, gpu)
    check_offset(offset)
    limit = max(1, min(limit or 100, 1000))
    rows = entries.select_related("user__profile", "submission").page(offset, offset + limit)
    return [{"submission_id": e.submission_id, "user_id": e.user_id, "user_name": name_of(e.user),
             "submission_name": e.submission.file_name, "submission_time": wire.iso(e.submitted_at),
             "submission_score": e.score, "ratio": e.ratio, "rank": e.rank, "leaderboard_name": board.name,
             "gpu_type": gpu_type.name} for e in rows]


@api.get("/submission_count/{leaderboard}/{gpu}", auth=optional_cli)
def board_submission_count(request, leaderboard: str, gpu: str, user_id: str | None = None):
    _, _, entries = _board_entries(request, leaderboard, gpu)
    if user_id is not None:
        entries = entries.filter(user_id=int(user_id)) if user_id.isdigit() else entries.none()
    return {"count": entries.count()}


@csrf_exempt
def not_found(request: HttpRequest, rest: str = "") -> JsonResponse:
    """Any path not served, with any method: a JSON 404 in popcorn's error format (no CSRF page: no cookie is read)."""
    return JsonResponse({"detail": "Not Found"}, status=404)



def last_heartbeat(submission: Submission) -> datetime | None:
    """KernelBot's job heartbeat: the last news of any of the submission's attempts (a runner's progress or beat, a
    poll), else when the latest was handed to a runner; None before any was."""
    seen = RunAttempt.objects.filter(run__submission=submission).aggregate(news=Max("last_news_at"),
                                                                           sent=Max("dispatched_at"))
    return max((t for t in seen.values() if t is not None), default=None)


def detail_of(submission: Submission, view: RunView) -> dict[str, Any]:
    runs = list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))
    return wire.submission_detail(submission, runs, view, runner_queue(submission, runs), last_heartbeat(submission))


@api.get("/user/submissions/{submission_id}")
def get_submission(request, submission_id: int):
    """The detail holds the code: for whoever may read it (`for_code`)."""
    submission = access_submission(request.auth, submission_id, for_code=True,
                                   queryset=Submission.objects.select_related("leaderboard", "code", "final_entry"))
    return detail_of(submission, run_view(request.auth, submission))


@api.get("/user/submissions")
def list_submissions(request, leaderboard: str | None = None, limit: int = 50, offset: int = 0):
    qs = Submission.objects.made_by(request.auth).select_related("leaderboard").prefetch_related(
        "runs__gpu_type", "runs__submission")
    if leaderboard:
        qs = qs.filter(leaderboard__name=leaderboard)
    if not 1 <= limit <= 100:
        raise HttpError(400, "limit must be between 1 and 100")
    check_offset(offset)
    rows = []
    for s in qs[offset:offset + limit]:
        runs = list(s.runs.all())
        rows.append({"id": s.pk, "leaderboard_name": s.leaderboard.name, "file_name": s.file_name,
                     "submission_time": s.created.isoformat(), "mode": s.mode,
                     "done": job_state(runs, RunView.DETAILS)[0], "runs": [wire.run_row(r, RunView.DETAILS)
                                                                             for r in runs]})
    return rows


@api.delete("/user/submissions/{submission_id}")
def delete_submission(request, submission_id: int):
    actions.do_delete_submission(access_submission(request.auth, submission_id, for_change=True))
    return {"status": "ok", "submission_id": submission_id}


class JoinIn(Schema):
    code: Text


@api.post("/user/join")
def join(request, body: JoinIn):
    try:
        membership = access.do_join(request.auth, body.code)
    except AccessDenied as exc:  # KernelBot: every refused code (unknown, expired, used up) is a 400
        raise HttpError(400, exc.message) from None
    invite = membership.invite
    boards = [membership.leaderboard.name] + ([b.name for b in invite.more_leaderboards.all()] if invite else [])
    return {"status": "ok", "leaderboard": boards[0], "leaderboards": boards}


# --- registration ---------------------------------------------------------------------------------
@api.get("/auth/init", auth=None)
def auth_init(request, provider: str):
    return {"state": access.do_start_cli_login(provider, access.client_address(request))}


def cli_state(state: str) -> tuple[str, bool]:
    """popcorn-cli's OAuth `state`: base64url (unpadded) of {"cli_id": <the id /auth/init gave>, "is_reset": bool},
    decoded as KernelBot decodes it; a bare id of ours (it starts with TOKEN_PREFIX, which no base64 of JSON does) is
    {"cli_id": it, "is_reset": false}."""
    if state.startswith(TOKEN_PREFIX):
        return state, False
    try:  # binascii.Error, a non-ASCII state, bad UTF-8 and bad JSON are all ValueErrors
        data = json.loads(base64.urlsafe_b64decode(state + "=" * (-len(state) % 4)))
    except ValueError as exc:
        raise HttpError(400, f"Invalid state parameter: not base64url-encoded JSON ({exc}).") from None
    if not isinstance(data, dict) or not isinstance(data.get("cli_id"), str) or not data["cli_id"].strip():
        raise HttpError(400, 'Invalid state parameter: expected {"cli_id": "<the id /auth/init gave>", "is_reset": '
                        'true|false}.')
    if not isinstance(is_reset := data.get("is_reset", False), bool):
        raise HttpError(400, "Invalid state parameter: is_reset must be true or false.")
    return data["cli_id"], is_reset


@api.get("/auth/cli/{provider}", auth=None)
def auth_callback(request, provider: str, code: str, state: str):
    """As KernelBot: `register` (is_reset false) makes a new account of the provider's user and links the CLI id
    to it; `reregister` (is_reset true) links it to that existing account in place of its earlier CLI ids."""
    oauth_app(provider)  # a server without one says so whatever the state
    cli_id, is_reset = cli_state(state)
    username = oauth_username(provider, code, request.build_absolute_uri(request.path))
    user = get_user_model().objects.filter(username=username).first()
    if is_reset and user is None:
        raise HttpError(400, f"No account of this {provider} user yet: run `popcorn-cli register {provider}` "
                        "to create one.")
    if not is_reset and user is not None:
        raise HttpError(400, f"This {provider} user has an account already: run `popcorn-cli reregister "
                        f"{provider}` to link a new CLI id to it.")
    user = user or get_user_model().objects.get_or_create(username=username)[0]
    access.do_bind_cli_login(user, cli_id, replace=is_reset)
    return {"status": "success", "message": f"Successfully authenticated via {provider} and linked CLI ID.",
            "user_id": str(user.pk), "user_name": user.get_username(), "is_reset": is_reset}


# --- admin (Authorization: Bearer <ADMIN_TOKEN>) --------------------------------------------------
class SwitchIn(Schema):
    reason: str = ""


@admin.post("/start")
def admin_start(request):
    access.do_set_accepting_jobs(True)
    return {"status": "ok", "accepts_jobs": True, "accepting_jobs": True}


@admin.post("/stop")
def admin_stop(request):
    access.do_set_accepting_jobs(False, "stopped by an administrator")
    return {"status": "ok", "accepts_jobs": False, "accepting_jobs": False}


def _seconds(value: timedelta | None) -> float | None:
    return None if value is None else value.total_seconds()


@admin.get("/stats")
def admin_stats(request, last_day_only: bool = False, leaderboard_name: str | None = None):
    """KernelBot's stats (its names: per runner, i.e. GPU type, `num_run.<gpu>` …; `num_unique_codes` for all time,
    the ten heaviest users' run time `total.<user id>` for the last day), with ours beside them."""
    subs = Submission.objects.filter(leaderboard__internal=False)  # not the pool health checks
    if last_day_only:
        subs = subs.filter(created__gte=timezone.now() - timedelta(days=1))
    if leaderboard_name:
        subs = subs.filter(leaderboard__name=leaderboard_name)
    runs = Run.objects.filter(submission__in=subs)
    active = runs.filter(status__in=ACTIVE_STATUSES)
    stats: dict[str, Any] = {"num_submissions": subs.count(),
                             "sub_waiting": subs.filter(runs__in=active).distinct().count(),
                             "num_users": subs.values("user").distinct().count()}
    delay = ExpressionWrapper(F("started_at") - F("submission__created"), output_field=DurationField())
    runtime = ExpressionWrapper(F("finished_at") - F("started_at"), output_field=DurationField())
    for row in runs.values("gpu_type__name").annotate(
            n=Count("pk"), passed=Count("pk", filter=Q(passed=True)), scored=Count("score"),
            secret=Count("pk", filter=Q(secret=True)), max_delay=Max(delay), avg_delay=Avg(delay),
            total=Sum(runtime)).order_by("gpu_type__name"):
        gpu = row["gpu_type__name"]
        stats |= {f"num_run.{gpu}": row["n"], f"runs_passed.{gpu}": row["passed"], f"runs_scored.{gpu}": row["scored"],
                  f"runs_secret.{gpu}": row["secret"], f"max_delay.{gpu}": _seconds(row["max_delay"]),
                  f"avg_delay.{gpu}": _seconds(row["avg_delay"]), f"total_runtime.{gpu}": _seconds(row["total"])}
    if last_day_only:
        heavy = runs.filter(finished_at__isnull=False, started_at__isnull=False).values("submission__user").annotate(
            total=Sum(runtime)).order_by("-total")[:10]
        stats |= {f"total.{row['submission__user']}": _seconds(row["total"]) for row in heavy}
    else:
        stats["num_unique_codes"] = subs.values("code").distinct().count()
    boards = Leaderboard.objects.filter(internal=False)
    stats |= {"accepting_jobs": access.accepting_jobs().accepting,  # ours
              "num_leaderboards": (boards.filter(name=leaderboard_name) if leaderboard_name else boards).count(),
              "runs_by_status": dict(runs.values_list("status").annotate(n=Count("pk")).order_by())}
    return {"status": "ok", "stats": stats}


@admin.get("/submissions/{submission_id}")
def admin_get_submission(request, submission_id: int):
    submission = Submission.objects.select_related("leaderboard", "code", "final_entry").filter(
        pk=submission_id).first()
    if submission is None:
        raise Http404(f"Submission {submission_id} not found.")
    runs = list(submission.runs.select_related("gpu_type").order_by("gpu_type", "secret"))
    # KernelBot's admin answer holds each run whole (its runs.json): secret runs' errors and logs too
    detail = detail_of(submission, RunView.ALL)
    whole = {**detail, **wire.submission_item(detail, runs)}  # KernelBot's SubmissionItem names beside ours
    return {**detail, "status": "ok", "submission": whole, "runs_json": [run_out(r, RunView.ALL) for r in runs]}


@admin.delete("/submissions/{submission_id}")
def admin_delete_submission(request, submission_id: int):
    submission = Submission.objects.filter(pk=submission_id).first()
    if submission is None:
        raise Http404(f"Submission {submission_id} not found.")
    actions.do_delete_submission(submission)
    return {"status": "ok", "submission_id": submission_id}


@admin.delete("/submissions")
def admin_delete_submissions_of_user(request, leaderboard_id: int, user_name: str):
    """KernelBot's bulk delete: every submission of `user_name` (user name or id) on a leaderboard, with its counts
    (`deleted_job_status`: the submissions that had a job, i.e. runs); an unknown user has none, as there."""
    board = Leaderboard.objects.filter(pk=leaderboard_id).first()
    if board is None:
        raise Http404(f"Unknown leaderboard {leaderboard_id}.")
    user = _user(user_name)
    doomed = list(Submission.objects.filter(leaderboard=board, user=user).annotate(n=Count("runs"))) if user else []
    for submission in doomed:
        actions.do_delete_submission(submission)
    return {"status": "ok", "leaderboard_id": leaderboard_id, "user_name": user_name,
            "deleted_submissions": len(doomed), "deleted_runs": sum(s.n for s in doomed),
            "deleted_job_status": sum(1 for s in doomed if s.n)}


@admin.get("/leaderboards/{leaderboard}/submissions")
def admin_list_board_submissions(request, leaderboard: str, limit: int = 100, offset: int = 0):
    board = Leaderboard.objects.filter(name=leaderboard).first()
    if board is None:
        raise Http404(f"Unknown leaderboard '{leaderboard}'.")
    check_offset(offset)
    limit = max(1, min(limit, 10_000))
    ids = list(Submission.objects.filter(leaderboard=board).order_by("-created", "-pk")  # newest first, as KernelBot
               .values_list("pk", flat=True)[offset:offset + limit])
    return {"status": "ok", "leaderboard": board.name, "limit": limit, "offset": offset, "submission_ids": ids}


@admin.post("/submission/{leaderboard}/{gpu}/{mode}")
def admin_submit_after_deadline(request, leaderboard: str, gpu: str, mode: str):
    """KernelBot's admin path: a submission of the X-Popcorn-Cli-Id user, taken after the board's deadline too."""
    user = cli_user(request)
    file_name, content = read_upload(request)
    check_directives(content, leaderboard, gpu)
    submission = actions.do_submit(user, actions.check_submission(user, leaderboard, [gpu], mode, file_name, content,
                                                                  after_deadline=True))
    return JsonResponse({"details": {"id": submission.pk}, "status": "accepted",
                         "runner_queue": runner_queue(submission, submission.new_runs)}, status=202)


class CreateLeaderboardIn(Schema):
    directory: Text
    name: str | None = None  # do_import_task names what is wrong with it
    deadline: datetime | None = None
    gpus: list[Text] | None = None
    force: Bool = False
    past_deadline: Bool = False  # as the admin form's tick: a deadline in the past closes the board at once
    visibility: Literal["public", "closed"] | None = None  # None: a new board public, an existing one as it is


def inside_problems_dir(relative: str) -> Path:
    if "\x00" in relative:
        raise HttpError(400, "'directory' holds a NUL byte, which no path can contain.")
    root = settings.PROBLEMS_DIR.resolve()
    try:
        target = (root / relative).resolve()
        if root != target and root not in target.parents:
            raise HttpError(400, f"'{relative[:200]}' is outside the problems directory.")
        exists = target.exists()
    except OSError as exc:  # a name longer than the file system allows, …
        raise HttpError(400, f"'directory' is not a usable path: {exc.strerror}.") from None
    if not exists:  # KernelBot: "Invalid problem directory", a 400
        raise HttpError(400, f"'{relative[:200]}' does not exist under the problems directory.")
    return target


@admin.post("/leaderboards")
def admin_create_leaderboard(request, body: CreateLeaderboardIn):
    target = inside_problems_dir(body.directory)
    try:
        task = load_task(target, root=collection_root(target, within=settings.PROBLEMS_DIR))
        deadline = body.deadline or (timezone.now() + timedelta(days=365))
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        if deadline <= timezone.now() and not body.past_deadline:
            raise HttpError(400, f"deadline {deadline:%Y-%m-%d %H:%M} UTC is in the past: the leaderboard would be "
                            "closed at once. Correct it, or send past_deadline=true.")
        name = body.name or f"{target.name}-dev"  # KernelBot's "<directory>-dev"
        with transaction.atomic():
            report = do_import_task(task, leaderboard=name, deadline=deadline, gpus=body.gpus, force=body.force,
                                    past_deadline=body.past_deadline, collection=target.parent.name)
            if body.visibility:  # its post_save receiver forgets the cached board
                board = Leaderboard.objects.get(name=name)
                board.visibility = body.visibility
                board.save(update_fields=["visibility"])
    except TaskFileError as exc:
        raise HttpError(400, str(exc)) from exc
    except ImportRejected as exc:
        raise HttpError(400, "; ".join(exc.errors)) from exc
    return {"status": "ok", "leaderboard": name, "created": report.created, "updated": report.updated,
            "unchanged": report.unchanged, "visibility": Leaderboard.objects.get(name=name).visibility}


@admin.delete("/leaderboards/{name}")
def admin_delete_leaderboard(request, name: str, force: bool = False):
    leaderboard = Leaderboard.objects.filter(name=name).first()
    if leaderboard is None:
        raise Http404(f"Unknown leaderboard '{name}'.")
    count = actions.do_delete_leaderboard(leaderboard, force=force)
    return {"status": "ok", "leaderboard": name, "force": force, "deleted_submissions": count}


class UpdateProblemsIn(Schema):
    """popcorn-cli's `admin update-problems` body: {"repository", "branch", "force"[, "problem_set"][, "visibility":
    "closed"]}: a repository's branch downloaded and imported as the Discord command does."""
    repository: Text = "gpu-mode/reference-kernels"
    branch: Text = "main"
    problem_set: Text | None = None
    force: Bool = False
    visibility: Literal["public", "closed"] = "public"


def _from_repository(request) -> dict[str, Any]:
    try:
        body = UpdateProblemsIn.model_validate_json(request.body or b"{}")
    except PydanticValidationError as exc:
        raise HttpError(400, "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
                                       for e in exc.errors())) from None
    try:
        done = do_import_repository(body.repository, body.branch, body.problem_set, force=body.force,
                                    visibility=body.visibility if body.visibility != "public" else None,
                                    downloaded=getattr(request, "scope", {}).get(PREFETCHED))
    except RepositoryError as exc:
        status = 503 if str(exc).startswith("could not download") else 400
        raise HttpError(status, f"{exc}" + (" This server may have no internet access: put the problems under "
                                             "its problems directory and send `directory`, or upload a zip (`file`)."
                                             if status == 503 else "")) from None
    return {"status": "ok", "created": done.created, "updated": done.updated,
            "skipped": [{"name": n, "reason": "unchanged"} for n in done.unchanged],
            "errors": [{"name": e.split(":", 1)[0], "error": e.split(":", 1)[-1].strip()} for e in done.errors]}


UPDATE_PROBLEMS_PATH = "/popcorn/admin/update-problems"
PREFETCHED = "kernelbot.repository_archive"  # the scope's key for what `prefetch` downloaded


async def prefetch(scope: dict, receive):
    """popcorn-cli's `admin update-problems` (JSON, a valid admin token) downloads the repository's zip here, on a
    thread of its own (repository.download: TIMEOUT, MAX_BYTES), before the request goes to the process's one sync
    thread, which would otherwise wait for the whole download and every other request of the process behind it.
    The CLI prints the synchronous answer, so the import itself still answers the request (`_from_repository`).
    Returns the scope (with the download under PREFETCHED) and a `receive` that replays the body read."""
    headers = dict(scope.get("headers", ()))
    scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
    if (not headers.get(b"content-type", b"").startswith(b"application/json") or scheme.lower() != "bearer"
            or not access.admin_token_matches(token.strip())):
        return scope, receive
    read: list[dict] = []
    size = 0
    while not read or (read[-1]["type"] == "http.request" and read[-1].get("more_body")):
        read.append(await receive())
        size += len(read[-1].get("body", b""))
        if size > 65536:  # not the CLI's: Django reads (and refuses) it
            break

    async def replay():
        return read.pop(0) if read else await receive()

    if size > 65536:
        return scope, replay
    try:
        body = UpdateProblemsIn.model_validate_json(b"".join(m.get("body", b"") for m in read) or b"{}")
        url = repository.archive_url(body.repository, body.branch)
    except (PydanticValidationError, RepositoryError):  # the view says why
        return scope, replay
    try:
        fetched: bytes | RepositoryError = await asyncio.to_thread(repository.download, url)
    except RepositoryError as exc:
        fetched = exc
    return {**scope, PREFETCHED: (url, fetched)}, replay


@admin.post("/update-problems")
def admin_update_problems(request, force: bool = False, directory: str | None = None):
    """From a repository's branch (popcorn-cli's JSON body), a competition file / problem tree under the problems
    directory, or an uploaded zip (`file`)."""
    if request.content_type == "application/json":
        return _from_repository(request)
    created: list[str] = []
    updated: list[str] = []
    skipped: list[dict] = []
    errors: list[dict] = []
    upload = request.FILES.get("file")
    if upload is not None:
        try:
            sources = _zip_sources(upload.read())
        except (zipfile.BadZipFile, TaskFileError) as exc:
            raise HttpError(400, f"Unreadable archive: {exc}") from exc
    else:
        sources = _tree_sources(inside_problems_dir(directory or "."))
    for name, load in sources:
        try:
            report = load(force)
        except (TaskFileError, ImportRejected) as exc:
            errors.append({"name": name, "error": "; ".join(getattr(exc, "errors", [str(exc)]))})
            continue
        created += report.created
        updated += report.updated
        skipped += [{"name": n, "reason": "unchanged"} for n in report.unchanged]
    return {"created": created, "updated": updated, "skipped": skipped, "errors": errors}


def _tree_sources(root: Path):
    from leaderboards.importing import do_import_competition

    if root.is_file():
        return [(root.stem, lambda force, p=root: do_import_competition(load_competition(p), force=force))]
    files = sorted(root.glob("*.yaml")) + sorted(root.glob("*.yml"))
    if (root / "task.yml").exists():
        within = settings.PROBLEMS_DIR
        return [(root.name, lambda force, p=root: do_import_task(
            load_task(p, root=collection_root(p, within=within)), force=force, collection=p.parent.name))]
    return [(p.stem, lambda force, p=p: do_import_competition(load_competition(p), force=force)) for p in files]


def _zip_sources(data: bytes):
    # the loader checks members (paths, encryption, sizes) before reading any; CRCs are checked while extracting
    task = load_task_from_zip(data)
    return [(task.name, lambda force: do_import_task(task, force=force))]


class InviteIn(Schema):
    """popcorn-cli's `admin generate-invites` sends {"leaderboards": [...], "count": N} (KernelBot also takes
    "leaderboard"): N codes, each admitting to every board named."""
    leaderboard: Text | None = None
    leaderboards: list[Text] | None = Field(None, max_length=100)
    count: Int = Field(1, ge=1, le=access.MAX_INVITES)
    max_uses: Int = Field(1, ge=1, le=access.MAX_INVITE_USES)
    expires_days: Int | None = Field(None, ge=1, le=access.MAX_DAYS)


@admin.post("/invites")
def admin_create_invite(request, body: InviteIn):
    names = list(dict.fromkeys(body.leaderboards or ([body.leaderboard] if body.leaderboard else [])))
    if not names:
        raise HttpError(400, "Must provide 'leaderboards' list or 'leaderboard' string.")
    found = Leaderboard.objects.in_bulk(names, field_name="name")
    if missing := [n for n in names if n not in found]:
        raise Http404(f"Unknown leaderboard(s): {', '.join(missing)}.")
    boards = [found[n] for n in names]
    codes = [access.do_create_invite(boards[0], body.max_uses, body.expires_days, boards[1:]).code
             for _ in range(body.count)]
    return {"status": "ok", "leaderboards": names, "codes": codes, "max_uses": body.max_uses,
            **({"code": codes[0], "leaderboard": names[0]} if len(codes) == 1 else {})}


@admin.get("/leaderboards/{leaderboard}/invites")
def admin_list_invites(request, leaderboard: str):
    """KernelBot's shape, which popcorn-cli tabulates: {"invites": [{code, user_id, user_name, created_at}]} (the
    first who joined with it; `uses`/`max_uses` say how many more may)."""
    invites = (Invite.objects.filter(Q(leaderboard__name=leaderboard) | Q(more_leaderboards__name=leaderboard))
               .distinct().order_by("created").prefetch_related("membership_set__user"))
    rows = []
    for invite in invites:
        first = min(invite.membership_set.all(), key=lambda m: m.joined, default=None)
        rows.append({"code": invite.code, "user_id": str(first.user_id) if first else None,
                     "user_name": first.user.get_username() if first else None,
                     "claimed_at": wire.iso(first.joined) if first else None, "created_at": wire.iso(invite.created),
                     "uses": invite.uses, "max_uses": invite.max_uses,
                     "expires": wire.iso(invite.expires)})
    return {"status": "ok", "leaderboard": leaderboard, "invites": rows}


@admin.delete("/invites/{code}")
def admin_delete_invite(request, code: str):
    invite = Invite.objects.filter(code=code).first()
    if invite is None:
        raise Http404(f"Unknown invite '{code}'.")
    invite.delete()
    return {"status": "ok", "code": code, "was_claimed": invite.uses > 0}


class ExportIn(Schema):
    leaderboard_ids: list[Int] = Field(min_length=1, max_length=1000)
    filename: Text = Field(pattern=r"^[\w.-]+\.parquet$")
    private: Bool = True


@admin.post("/export-hf")
def admin_export_hf(request, body: ExportIn):
    """KernelBot's export: `private` a snapshot of the boards (live ones too) to HF_PRIVATE_DATASET, a private
    repository; else the public dataset (closed boards whose code is public) to HF_PUBLIC_DATASET."""
    boards = list(Leaderboard.objects.filter(pk__in=body.leaderboard_ids, internal=False))
    if missing := sorted(set(body.leaderboard_ids) - {b.pk for b in boards}):
        raise Http404(f"Unknown leaderboard id(s): {', '.join(map(str, missing))}.")
    if body.private:
        pushed = dataset.do_push_snapshot(boards, filename=body.filename)
    else:
        if not settings.HF_PUBLIC_DATASET:
            raise HttpError(400, "Set HF_PUBLIC_DATASET for the public export.")
        pushed = dataset.do_push_dataset(boards, settings.HF_PUBLIC_DATASET, body.filename, private=False)
    return {"status": "ok", "leaderboards": [b.name for b in boards], "filename": body.filename, "url": pushed.url,
            "rows": pushed.rows, "repo_id": pushed.repo_id}


MODE_CATEGORIES = {"test": QuotaKind.TEST, "leaderboard": QuotaKind.RANKED}


class RateLimitIn(Schema):
    mode_category: Literal["test", "leaderboard"]
    max_submissions_per_hour: Int = Field(ge=0, le=10**6)


def _rate_limit(quota: SubmissionQuota) -> dict[str, Any]:
    """KernelBot's view of a quota (per hour; 0 = frozen; null = unlimited here) beside this platform's own."""
    per_hour = 0 if quota.frozen else (round(quota.max_submissions * 3600 / quota.window_seconds)
                                       if quota.max_submissions else None)
    return {"id": quota.pk, "leaderboard_id": quota.leaderboard_id, "leaderboard_name": quota.leaderboard.name,
            "leaderboard": quota.leaderboard.name,
            "mode_category": "leaderboard" if quota.kind == QuotaKind.RANKED else "test",
            "max_submissions_per_hour": per_hour, "max_submissions": quota.max_submissions,
            "window_seconds": quota.window_seconds, "frozen": quota.frozen}


def _board(name: str) -> Leaderboard:
    board = Leaderboard.objects.filter(name=name, internal=False).first()
    if board is None:
        raise Http404(f"Unknown leaderboard '{name}'.")
    return board


@admin.get("/leaderboards/{leaderboard}/rate-limits")
def admin_get_rate_limits(request, leaderboard: str):
    board = _board(leaderboard)
    return {"status": "ok", "leaderboard": board.name,
            "rate_limits": [_rate_limit(q) for q in board.quotas.select_related("leaderboard").order_by("kind")]}


@admin.put("/leaderboards/{leaderboard}/rate-limits")
def admin_set_rate_limit(request, leaderboard: str, body: RateLimitIn):
    quota = access.do_set_kernelbot_rate_limit(_board(leaderboard), MODE_CATEGORIES[body.mode_category],
                                               body.max_submissions_per_hour)
    return {"status": "ok", "rate_limit": _rate_limit(quota)}


@admin.delete("/leaderboards/{leaderboard}/rate-limits/{mode_category}")
def admin_delete_rate_limit(request, leaderboard: str, mode_category: str):
    if mode_category not in MODE_CATEGORIES:
        raise HttpError(400, "mode_category must be 'test' or 'leaderboard'.")
    board = _board(leaderboard)
    deleted = [q.delete() for q in board.quotas.filter(kind=MODE_CATEGORIES[mode_category])]  # post_delete: cache
    if not deleted:
        raise Http404(f"No {mode_category} rate limit on '{board.name}'.")
    return {"status": "ok", "leaderboard": board.name, "mode_category": mode_category}


class BanIn(Schema):
    user: Text
    leaderboard: Text | None = None
    reason: Text = ""


def _user(ident: str):
    """A user by id (KernelBot's user_id; ours is the account's number) or user name."""
    return get_user_model().objects.filter(Q(username=ident) | Q(pk__in=[ident] if ident.isdigit() else [])).first()


def _ban_target(body: BanIn):
    user = _user(body.user)
    if user is None:
        raise Http404(f"Unknown user '{body.user}'.")
    leaderboard = None
    if body.leaderboard:
        leaderboard = Leaderboard.objects.filter(name=body.leaderboard).first()
        if leaderboard is None:
            raise Http404(f"Unknown leaderboard '{body.leaderboard}'.")
    return user, leaderboard


@admin.post("/bans")
def admin_ban(request, body: BanIn):
    user, leaderboard = _ban_target(body)
    access.do_ban(user, leaderboard, body.reason)
    return {"status": "ok", "user": user.get_username(), "leaderboard": body.leaderboard}


@admin.post("/unban")
def admin_unban(request, body: BanIn):
    user, leaderboard = _ban_target(body)
    return {"status": "ok", "removed": access.do_unban(user, leaderboard)}


# KernelBot's bans: everywhere, by user id; declared before the three-segment submission route (urls.py)
def _ban_everywhere(user_id: str, banned: bool) -> dict:
    user = _user(user_id)
    if user is None:
        raise Http404(f"User {user_id} not found")
    (access.do_ban if banned else access.do_unban)(user, None)
    return {"status": "ok", "user_id": user_id, "banned": banned}


@admin.post("/ban/{user_id}")
def admin_ban_user(request, user_id: str):
    return _ban_everywhere(user_id, True)


@admin.delete("/ban/{user_id}")
def admin_unban_user(request, user_id: str):
    return _ban_everywhere(user_id, False)


class VisibilityIn(Schema):
    visibility: Literal["public", "closed"]


@admin.post("/leaderboards/{leaderboard}/visibility")
def admin_set_visibility(request, leaderboard: str, body: VisibilityIn):
    board = _board(leaderboard)
    board.visibility = body.visibility
    board.save(update_fields=["visibility"])  # its post_save receiver forgets the cached board
    return {"status": "ok", "leaderboard": board.name, "visibility": body.visibility}


api.add_router("/admin", admin)
