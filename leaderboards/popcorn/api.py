"""popcorn-cli's wire contract, served under /popcorn (users set POPCORN_API_URL=https://host/popcorn).

Paths have no trailing slash, there is no CSRF (no cookies are read), every error is {"detail": "..."}.
Each endpoint is thin: the same actions as the site and our own /api/v1 do the work."""

from __future__ import annotations

import io
import zipfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import DataError, transaction
from django.db.models import Count, Q
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from ninja import NinjaAPI, Schema
from ninja.errors import HttpError, ValidationError

from kernelbot.cli.directives import parse_directives
from leaderboards import actions
from leaderboards.access import actions as access
from leaderboards.access.models import Invite
from leaderboards.importing import ImportRejected, do_import_task
from leaderboards.models import Leaderboard, Run, Submission, Visibility
from leaderboards.taskfile import TaskFileError, collection_root, load_competition, load_task, load_task_from_zip

from . import wire

api = NinjaAPI(title="popcorn-cli compatibility", version="popcorn", urls_namespace="popcorn", docs_url=None,
               openapi_url=None)


def detail(request, message: str, status: int, **headers: str) -> HttpResponse:
    response = api.create_response(request, {"detail": message}, status=status)
    for name, value in headers.items():
        response[name] = value
    return response


@api.exception_handler(actions.SubmissionRejected)
def submission_rejected(request, exc: actions.SubmissionRejected):
    extra = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    return detail(request, exc.message, exc.status, **extra)


@api.exception_handler(access.AccessDenied)
def access_denied(request, exc: access.AccessDenied):
    return detail(request, exc.message, exc.status)


@api.exception_handler(HttpError)
def http_error(request, exc: HttpError):
    return detail(request, str(exc.message), exc.status_code)


@api.exception_handler(ValidationError)
def validation_error(request, exc: ValidationError):
    parts = [f"{'.'.join(str(p) for p in e.get('loc', [])[1:]) or 'request'}: {e.get('msg')}" for e in exc.errors]
    return detail(request, "Invalid request: " + "; ".join(parts), 400)


@api.exception_handler(DataError)
def data_error(request, exc: DataError):
    return detail(request, "The request holds characters that cannot be stored or looked up (such as NUL bytes).",
                  400)


@api.exception_handler(Http404)
def not_found(request, exc: Http404):
    return detail(request, str(exc) or "Not found.", 404)


@api.exception_handler(Exception)
def server_error(request, exc: Exception):
    import logging

    logging.getLogger(__name__).exception("popcorn API error")
    return detail(request, "Internal server error; the organisers have been notified.", 500)


# --- authentication -------------------------------------------------------------------------------
def cli_user(request: HttpRequest):
    raw = request.headers.get("X-Popcorn-Cli-Id", "").strip()
    if not raw:
        raise HttpError(401, "Missing X-Popcorn-Cli-Id header: run `popcorn-cli register discord` (or set "
                        "cli_id in ~/.popcorn.yaml to a token from this site's account page).")
    user = access.authenticate_token(raw)
    if user is None:
        if access.is_pending_login(raw):
            link = request.build_absolute_uri(reverse("access:link-cli"))
            raise HttpError(401, f"This CLI id is not linked to an account yet: log in at {link} and paste it.")
        raise HttpError(401, "Invalid, expired or revoked CLI id: register again or create a new token.")
    return user


def require_admin(request: HttpRequest) -> None:
    scheme, _, presented = request.headers.get("Authorization", "").partition(" ")
    if not settings.ADMIN_TOKEN:
        raise HttpError(403, "Admin commands are disabled: the server has no ADMIN_TOKEN.")
    if scheme.lower() != "bearer" or not access.admin_token_matches(presented.strip()):
        raise HttpError(401, "Missing or wrong admin token (Authorization: Bearer <ADMIN_TOKEN>).")


def visible_leaderboard(user, name: str) -> Leaderboard:
    leaderboard = Leaderboard.objects.select_related("problem").filter(name=name).first() or \
        Leaderboard.objects.select_related("problem").filter(name__iexact=name).first()
    if leaderboard is None or not access.can_see(user, leaderboard):
        raise Http404(f"Unknown leaderboard '{name}'.")
    return leaderboard


# --- competitor routes ----------------------------------------------------------------------------
@api.get("/leaderboards")
def list_leaderboards(request):
    user = cli_user(request) if request.headers.get("X-Popcorn-Cli-Id") else None
    query = Q(visibility=Visibility.PUBLIC)
    if user is not None:
        query |= Q(members__user=user)
    boards = Leaderboard.objects.filter(query).distinct().select_related("problem").prefetch_related("gpu_types")
    return [wire.leaderboard_item(b) for b in boards]


@api.get("/gpus/{leaderboard}")
def list_gpus(request, leaderboard: str):
    user = cli_user(request) if request.headers.get("X-Popcorn-Cli-Id") else None
    board = visible_leaderboard(user or _anonymous(), leaderboard)
    return [g.name for g in board.gpu_types.all()]


def _anonymous():
    from django.contrib.auth.models import AnonymousUser

    return AnonymousUser()


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
    request = actions.check_submission(user, leaderboard, [gpu], mode.lower(), file_name, content)
    return actions.do_submit(user, request)


def runner_queue(submission: Submission, runs: list[Run]) -> dict[str, Any] | None:
    estimate = access.queue_estimate(submission, runs)
    if estimate is None:
        return None
    return {"runner": estimate.runner, "gpu": estimate.gpu, "queued_jobs": estimate.queued_jobs,
            "position": estimate.position, "eta_seconds": estimate.eta_seconds}


@api.post("/submission/{leaderboard}/{gpu}/{mode}")
def submit(request, leaderboard: str, gpu: str, mode: str):
    user = cli_user(request)
    file_name, content = read_upload(request)
    submission = accept(user, leaderboard, gpu, mode, file_name, content)
    return {"details": {"id": submission.pk}, "status": "accepted",
            "runner_queue": runner_queue(submission, submission.new_runs)}


def owned_submission(user, submission_id: int) -> Submission:
    submission = Submission.objects.select_related("leaderboard", "code").filter(pk=submission_id).first()
    if submission is None or (submission.user_id != user.pk and not user.is_staff):
        raise Http404(f"Submission {submission_id} not found.")
    return submission


def detail_of(submission: Submission) -> dict[str, Any]:
    runs = list(submission.runs.select_related("gpu_type", "submission").order_by("gpu_type", "secret"))
    return wire.submission_detail(submission, runs, runner_queue(submission, runs))


@api.get("/user/submissions/{submission_id}")
def get_submission(request, submission_id: int):
    return detail_of(owned_submission(cli_user(request), submission_id))


@api.get("/user/submissions")
def list_submissions(request, leaderboard: str | None = None, limit: int = 50, offset: int = 0):
    user = cli_user(request)
    qs = Submission.objects.filter(user=user).select_related("leaderboard").prefetch_related("runs__gpu_type",
                                                                                             "runs__submission")
    if leaderboard:
        qs = qs.filter(leaderboard__name=leaderboard)
    limit = max(1, min(limit, 200))
    rows = []
    for s in qs[max(0, offset): max(0, offset) + limit]:
        runs = list(s.runs.all())
        rows.append({"id": s.pk, "leaderboard_name": s.leaderboard.name, "file_name": s.file_name,
                     "submission_time": s.created.isoformat(), "mode": s.mode, "done": wire.job_state(runs)[0],
                     "runs": [{"gpu_type": r.gpu_type.name, "score": None if r.secret else r.score,
                               "secret": r.secret, "status": r.status, "passed": r.passed} for r in runs]})
    return rows


@api.delete("/user/submissions/{submission_id}")
def delete_submission(request, submission_id: int):
    user = cli_user(request)
    submission = owned_submission(user, submission_id)
    if submission.user_id != user.pk:
        raise Http404(f"Submission {submission_id} not found.")
    actions.do_delete_submission(submission)
    return {"status": "ok", "submission_id": submission_id}


class JoinIn(Schema):
    code: str


@api.post("/user/join")
def join(request, body: JoinIn):
    membership = access.do_join(cli_user(request), body.code)
    return {"status": "ok", "leaderboard": membership.leaderboard.name}


# --- registration ---------------------------------------------------------------------------------
@api.get("/auth/init")
def auth_init(request, provider: str):
    return {"state": access.do_start_cli_login(provider)}


@api.get("/auth/cli/{provider}")
def auth_callback(request, provider: str, code: str, state: str):
    from .oauth import user_from_oauth

    user = user_from_oauth(provider, code, request.build_absolute_uri(request.path))
    access.do_bind_cli_login(user, state)
    return {"status": "ok", "user_id": str(user.pk), "user_name": user.get_username(), "is_reset": False}


# --- admin (Authorization: Bearer <ADMIN_TOKEN>) --------------------------------------------------
class SwitchIn(Schema):
    reason: str = ""


@api.post("/admin/start")
def admin_start(request):
    require_admin(request)
    access.do_set_accepting_jobs(True)
    return {"status": "ok", "accepting_jobs": True}


@api.post("/admin/stop")
def admin_stop(request):
    require_admin(request)
    access.do_set_accepting_jobs(False, "stopped by an administrator")
    return {"status": "ok", "accepting_jobs": False}


@api.get("/admin/stats")
def admin_stats(request, last_day_only: bool = False):
    require_admin(request)
    since = timezone.now() - timedelta(days=1) if last_day_only else None
    subs = Submission.objects.filter(created__gte=since) if since else Submission.objects.all()
    runs = Run.objects.filter(submission__in=subs)
    return {"accepting_jobs": access.accepting_jobs().accepting, "num_submissions": subs.count(),
            "num_users": subs.values("user").distinct().count(), "num_leaderboards": Leaderboard.objects.count(),
            "runs_by_status": dict(runs.values_list("status").annotate(n=Count("pk")).order_by()),
            "num_unique_codes": subs.values("code").distinct().count()}


@api.get("/admin/submissions/{submission_id}")
def admin_get_submission(request, submission_id: int):
    require_admin(request)
    submission = Submission.objects.select_related("leaderboard", "code").filter(pk=submission_id).first()
    if submission is None:
        raise Http404(f"Submission {submission_id} not found.")
    return detail_of(submission)


@api.delete("/admin/submissions/{submission_id}")
def admin_delete_submission(request, submission_id: int):
    require_admin(request)
    submission = Submission.objects.filter(pk=submission_id).first()
    if submission is None:
        raise Http404(f"Submission {submission_id} not found.")
    actions.do_delete_submission(submission)
    return {"status": "ok", "submission_id": submission_id}


class CreateLeaderboardIn(Schema):
    directory: str
    name: str | None = None
    deadline: datetime | None = None
    gpus: list[str] | None = None
    force: bool = False


def inside_problems_dir(relative: str) -> Path:
    root = settings.PROBLEMS_DIR.resolve()
    target = (root / relative).resolve()
    if root != target and root not in target.parents:
        raise HttpError(400, f"'{relative}' is outside the problems directory.")
    if not target.exists():
        raise HttpError(404, f"'{relative}' does not exist under the problems directory.")
    return target


@api.post("/admin/leaderboards")
def admin_create_leaderboard(request, body: CreateLeaderboardIn):
    require_admin(request)
    target = inside_problems_dir(body.directory)
    try:
        task = load_task(target, root=collection_root(target, within=settings.PROBLEMS_DIR))
        deadline = body.deadline or (timezone.now() + timedelta(days=365))
        if deadline.tzinfo is None:
            deadline = deadline.replace(tzinfo=UTC)
        report = do_import_task(task, leaderboard=body.name or target.name.replace("_", "-"), deadline=deadline,
                                gpus=body.gpus, force=body.force)
    except TaskFileError as exc:
        raise HttpError(400, str(exc)) from exc
    except ImportRejected as exc:
        raise HttpError(400, "; ".join(exc.errors)) from exc
    return {"status": "ok", "created": report.created, "updated": report.updated, "unchanged": report.unchanged}


@api.delete("/admin/leaderboards/{name}")
def admin_delete_leaderboard(request, name: str, force: bool = False):
    require_admin(request)
    leaderboard = Leaderboard.objects.filter(name=name).first()
    if leaderboard is None:
        raise Http404(f"Unknown leaderboard '{name}'.")
    count = leaderboard.submissions.count()
    if count and not force:
        raise HttpError(409, f"Leaderboard '{name}' has {count} submissions; pass force=true to delete them too.")
    with transaction.atomic():
        leaderboard.delete()
    return {"status": "ok", "leaderboard": name, "deleted_submissions": count}


@api.post("/admin/update-problems")
def admin_update_problems(request, force: bool = False, directory: str | None = None):
    """From a competition file / problem tree under the problems directory, or an uploaded zip (`file`)."""
    require_admin(request)
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
            load_task(p, root=collection_root(p, within=within)), force=force))]
    return [(p.stem, lambda force, p=p: do_import_competition(load_competition(p), force=force)) for p in files]


def _zip_sources(data: bytes):
    zipfile.ZipFile(io.BytesIO(data)).testzip()
    task = load_task_from_zip(data)
    return [(task.name, lambda force: do_import_task(task, force=force))]


class InviteIn(Schema):
    leaderboard: str
    max_uses: int = 1
    expires_days: int | None = None


@api.post("/admin/invites")
def admin_create_invite(request, body: InviteIn):
    require_admin(request)
    leaderboard = Leaderboard.objects.filter(name=body.leaderboard).first()
    if leaderboard is None:
        raise Http404(f"Unknown leaderboard '{body.leaderboard}'.")
    invite = access.do_create_invite(leaderboard, body.max_uses, body.expires_days)
    return {"code": invite.code, "leaderboard": leaderboard.name, "max_uses": invite.max_uses}


@api.get("/admin/leaderboards/{leaderboard}/invites")
def admin_list_invites(request, leaderboard: str):
    require_admin(request)
    return [{"code": i.code, "uses": i.uses, "max_uses": i.max_uses, "expires": wire.iso(i.expires)}
            for i in Invite.objects.filter(leaderboard__name=leaderboard).order_by("created")]


@api.delete("/admin/invites/{code}")
def admin_delete_invite(request, code: str):
    require_admin(request)
    deleted, _ = Invite.objects.filter(code=code).delete()
    if not deleted:
        raise Http404(f"Unknown invite '{code}'.")
    return {"status": "ok", "code": code}


class BanIn(Schema):
    user: str
    leaderboard: str | None = None
    reason: str = ""


def _ban_target(body: BanIn):
    user = get_user_model().objects.filter(Q(username=body.user) | Q(pk__in=[body.user] if body.user.isdigit()
                                                                       else [])).first()
    if user is None:
        raise Http404(f"Unknown user '{body.user}'.")
    leaderboard = None
    if body.leaderboard:
        leaderboard = Leaderboard.objects.filter(name=body.leaderboard).first()
        if leaderboard is None:
            raise Http404(f"Unknown leaderboard '{body.leaderboard}'.")
    return user, leaderboard


@api.post("/admin/bans")
def admin_ban(request, body: BanIn):
    require_admin(request)
    user, leaderboard = _ban_target(body)
    access.do_ban(user, leaderboard, body.reason)
    return {"status": "ok", "user": user.get_username(), "leaderboard": body.leaderboard}


@api.post("/admin/unban")
def admin_unban(request, body: BanIn):
    require_admin(request)
    user, leaderboard = _ban_target(body)
    return {"status": "ok", "removed": access.do_unban(user, leaderboard)}
