"""Public pages. Thin: who sees what is `access.authority`, runs render from `serializers.run_out`, reads go
through querysets, the one write (submit) through `actions`."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone

from kernelbot.cli.directives import with_header
from runners.actions import gpu_availability

from . import actions, dataset, finals, spread
from .access.actions import accepting_jobs
from .access.authority import RunView, access_leaderboard, access_submission, may_see_run_details, run_view
from .board_rows import PAGE_ROWS, attach_breakdown, interval_text, name_of, records_html, row_html
from .errors import AccessDenied, Refused, SubmissionRejected
from .health import CHECK_USER
from .history import board_history
from .models import Board, BoardEntry, FinalEntry, FinalStatus, Leaderboard, Run, Submission, number_rows
from .serializers import (
    Outcome,
    phase_line,
    run_out,
    score_rule,
    submission_results,
    submission_scores,
    submission_standing,
)
from .web_forms import SubmitForm

LOG_PREVIEW = 8 * 1024


def refusals_as_pages(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The site's one mapping of the authority's refusals: 404 → the not-found page, others → their status."""
    @wraps(view)
    def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        try:
            return view(request, *args, **kwargs)
        except AccessDenied as exc:
            if exc.status == 404:
                raise Http404(exc.message) from exc
            return HttpResponse(exc.message, status=exc.status, content_type="text/plain; charset=utf-8")
    return wrapper


def home(request: HttpRequest) -> HttpResponse:
    leaderboards = list(Leaderboard.objects.listed_for(request.user).select_related("competition")
                        .prefetch_related("gpu_types").annotate(entrants=Count("entries__user", distinct=True))
                        .order_by("deadline", "name"))  # soonest deadline first
    leaders = {e.leaderboard_id: e for e in BoardEntry.objects.leaders().select_related(
        "user__profile", "gpu_type").order_by("score")}
    # a board whose final standings are published is led by their first, not by the board before the re-runs
    now = timezone.now()
    if finished := [lb for lb in leaderboards if lb.deadline <= now]:
        leaders |= {e.final.leaderboard_id: e for e in FinalEntry.objects.filter(
            final__status=FinalStatus.PUBLISHED, final__leaderboard__in=finished, rank=1)
            .select_related("final", "user__profile", "gpu_type").order_by("-score")}
    for leaderboard in leaderboards:
        leaderboard.leader = leaders.get(leaderboard.pk)
    return render(request, "leaderboards/home.html", {
        "upcoming": [lb for lb in leaderboards if lb.starts_at and lb.starts_at > now],
        "active": [lb for lb in leaderboards if lb.deadline > now and not (lb.starts_at and lb.starts_at > now)],
        "past": [lb for lb in leaderboards if lb.deadline <= now][::-1],
    })


@refusals_as_pages
def leaderboard(request: HttpRequest, name: str) -> HttpResponse:
    lb = access_leaderboard(request.user, name, queryset=Leaderboard.objects.select_related("problem")
                            .prefetch_related("gpu_types"))
    gpu_types = list(lb.gpu_types.all())
    if not gpu_types:
        raise Http404("This leaderboard has no GPU types yet.")
    gpu = next((g for g in gpu_types if g.name.lower() == request.GET.get("gpu", "").lower()), gpu_types[0])
    version, on_ratio = Board.objects.filter(leaderboard=lb, gpu_type=gpu).values_list(
        "version", "ranks_on_ratio").first() or (0, None)
    page = Paginator(BoardEntry.objects.for_board(lb, gpu).select_related("user__profile").with_breakdown(),
                     PAGE_ROWS).get_page(request.GET.get("page"))
    entries = number_rows(list(page.object_list), page.start_index() - 1)
    attach_breakdown(entries)
    history = board_history(lb.pk, gpu.pk, [e.user_id for e in entries])
    chart = {"records": history["records"], "onRatio": bool(on_ratio),
             "names": {str(k): v for k, v in history["names"].items()},
             "users": {str(e.user_id): history["users"].get(e.user_id, []) for e in entries},
             "userNames": {str(e.user_id): name_of(e.user) for e in entries}}
    definition = lb.problem.definition
    standings = finals.standings(lb)
    final_rows = [{**finals.entry_out(e, request.user), "interval": interval_text(e.ratio, e.ratio_low, e.ratio_high)}
                  for e in finals.final_entries(standings.published) if e.gpu_type_id == gpu.pk] \
        if standings.published else []
    return render(request, "leaderboards/leaderboard.html", {
        "standings": standings, "final_rows": final_rows, "dataset": dataset.public_to_everyone(lb),
        "lb": lb, "gpu": gpu, "gpu_types": gpu_types, "page": page, "entries": entries,
        "rows": [row_html(e) for e in entries], "version": version,
        # the harness times the reference with every submission: a board ranks on the ratio unless its results say
        # otherwise, so a new board's header reads as it will once results arrive
        "header_on_ratio": on_ratio is not False,
        "records_html": records_html(history["records"], bool(on_ratio)),
        "chart": chart, "templates": sorted((definition.get("templates") or {}).keys()),
        "files": sorted((definition.get("files") or {}).keys()), "live": page.number == 1,
        "spread": spread.board_spread(lb, gpu),
    })


@refusals_as_pages
def leaderboard_dataset(request: HttpRequest, name: str) -> HttpResponse:
    """The board's submissions dataset (parquet), once its deadline has passed and its code is public."""
    lb = access_leaderboard(request.user, name)
    if not dataset.public_to_everyone(lb):
        raise AccessDenied(f"The submissions of '{lb.name}' are published once its deadline has passed, if its code is "
                      "made public then.", 404)
    response = HttpResponse(dataset.parquet_bytes([lb]), content_type="application/vnd.apache.parquet")
    response["Content-Disposition"] = f'attachment; filename="{dataset.file_name([lb])}"'
    return response


@refusals_as_pages
def leaderboard_file(request: HttpRequest, name: str, kind: str, key: str) -> HttpResponse:
    """Download a template (`kind=template`, key = language) or a public task file (`kind=file`).
    Only what `definition['templates']`/`['files']` hold is served; the secret seed lives elsewhere."""
    if kind not in ("template", "file"):
        raise Http404("No such file.")
    lb = access_leaderboard(request.user, name, queryset=Leaderboard.objects.select_related("problem"))
    source = (lb.problem.definition.get("templates" if kind == "template" else "files") or {})
    if key not in source:
        raise Http404("No such file.")
    filename = (lb.problem.definition.get("submission_name") or "submission.py") if kind == "template" else key
    text = with_header(source[key], filename, lb.name, [g.name for g in lb.gpu_types.all()]) \
        if kind == "template" else source[key]
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename.replace(chr(34), "")}"'
    return response


@refusals_as_pages
def submission(request: HttpRequest, pk: int) -> HttpResponse:
    sub = access_submission(request.user, pk, queryset=Submission.objects.select_related(
        "leaderboard", "user__profile", "code", "final_entry__final"))
    view = run_view(request.user, sub)
    runs = list(sub.runs.select_related("gpu_type"))
    for run in runs:
        run.shown = shown = run_out(run, view)
        shown["stdout_preview"], shown["stderr_preview"] = shown["stdout"][:LOG_PREVIEW], shown["stderr"][:LOG_PREVIEW]
        shown["log_truncated"] = len(shown["stdout"]) > LOG_PREVIEW or len(shown["stderr"]) > LOG_PREVIEW
        shown["outcome_text"] = Outcome.TEXT.get(shown["outcome"], "")
        shown["seconds_line"] = phase_line(shown["seconds"])
    return render(request, "leaderboards/submission.html", {
        "sub": sub, "runs": runs, "scores": submission_scores(sub.mode, runs), "score_rule": score_rule(sub.mode),
        "show_code": view >= RunView.DETAILS, "staff_view": view is RunView.ALL,
        "done": all(r.is_terminal for r in runs),
        "standing": {gpu: {**row, "interval": interval_text(row["ratio"], row["ratio_low"], row["ratio_high"])}
                     for gpu, row in submission_standing(sub, runs).items() if row["ratio"] is not None},
    })


@refusals_as_pages
def submission_log(request: HttpRequest, pk: int, run_id: int, stream: str) -> HttpResponse:
    sub = access_submission(request.user, pk)
    run = get_object_or_404(Run, pk=run_id, submission=sub)
    if stream not in ("stdout", "stderr") or not may_see_run_details(run_view(request.user, sub), run):
        raise Http404("No such log.")
    response = HttpResponse(getattr(run, stream), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="run-{run.pk}-{stream}.txt"'
    return response


@refusals_as_pages
def submission_code(request: HttpRequest, pk: int) -> HttpResponse:
    sub = access_submission(request.user, pk, for_code=True,
                            queryset=Submission.objects.select_related("leaderboard", "code"))
    response = HttpResponse(sub.code.text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{sub.file_name.replace(chr(34), "")}"'
    return response


def user_page(request: HttpRequest, username: str) -> HttpResponse:
    person = get_object_or_404(get_user_model().objects.select_related("profile").exclude(username=CHECK_USER),
                               username=username)  # the platform's own health-check user has no public page
    subs = Submission.objects.visible_to(request.user).made_by(person).select_related("leaderboard")
    scored = Run.objects.filter(passed=True, score__isnull=False).select_related("gpu_type")
    page = Paginator(subs.prefetch_related(Prefetch("runs", queryset=scored, to_attr="scored_runs"))
                     .order_by("-created"), 50).get_page(request.GET.get("page"))
    for sub in page:
        sub.scores = submission_scores(sub.mode, sub.scored_runs)
    ranks = BoardEntry.objects.filter(user=person, leaderboard__in=Leaderboard.objects.visible_to(request.user)) \
        .with_rank().select_related("leaderboard", "gpu_type").order_by("leaderboard")
    ranks = list(ranks)
    published = {(e.final.leaderboard_id, e.gpu_type_id): e for e in FinalEntry.objects.filter(
        user=person, final__status=FinalStatus.PUBLISHED, final__leaderboard__in=[
            e.leaderboard_id for e in ranks if e.leaderboard.is_finished]).select_related("final")} \
        if any(e.leaderboard.is_finished for e in ranks) else {}
    for entry in ranks:  # its place in the board's published final standings, which outrank the board's
        entry.final = published.pop((entry.leaderboard_id, entry.gpu_type_id), None)
    history = (Run.objects.ranked().filter(submission__user=person, passed=True, score__isnull=False,
                                           submission__leaderboard__in=Leaderboard.objects.visible_to(request.user))
               .select_related("gpu_type", "submission__leaderboard").order_by("submission__created", "pk")
               .only("secret", "passed", "score", "ratio", "ratio_low", "ratio_high", "gpu_type__name",
                     "submission__created", "submission__mode", "submission__leaderboard__name")[:4000])
    by_submission: dict[int, list[Run]] = {}
    for run in history:
        by_submission.setdefault(run.submission_id, []).append(run)
    times: dict[str, list] = {}
    ratios: dict[str, list] = {}
    for runs in by_submission.values():  # the same score as everywhere else: the slower of public and secret
        sub = runs[0].submission
        for gpu, (score, ratio) in submission_results(sub.mode, runs).items():
            times.setdefault(f"{sub.leaderboard.name} · {gpu}", []).append([sub.created.isoformat(), score])
            if ratio is not None:
                ratios.setdefault(f"{sub.leaderboard.name} · {gpu}", []).append([sub.created.isoformat(), ratio.value])
    # the ratio to the reference, what the boards rank on, when every point has one (else the time): the chart's
    # label says which
    on_ratio = bool(ratios) and all(len(ratios.get(k, ())) == len(v) for k, v in times.items())
    history = {"onRatio": on_ratio, "series": ratios if on_ratio else times}
    return render(request, "leaderboards/user.html", {"person": person, "page": page, "ranks": ranks,
                                                      "history": history, "ranked_rule": score_rule("leaderboard"),
                                                      "other_rule": score_rule("test")})


@login_required
def submit(request: HttpRequest) -> HttpResponse:
    choices = list(Leaderboard.objects.visible_to(request.user).open().prefetch_related("gpu_types"))
    gpu_types = {g.pk: g.name for lb in choices for g in lb.gpu_types.all()}
    unavailable = {gpu_types[pk]: why for pk, why in gpu_availability(list(gpu_types)).items() if why}
    asked, refused = request.GET.get("leaderboard", ""), ""
    if asked and asked not in {lb.name for lb in choices}:  # say why (closed, not open yet, unknown): never another
        try:
            asked = access_leaderboard(request.user, asked, for_submit=True).name  # names match case-insensitively
        except SubmissionRejected as exc:
            refused = exc.message
    form = SubmitForm(request.POST or None, request.FILES or None, leaderboards=choices, unavailable=unavailable,
                      initial={"leaderboard": asked, "gpu": request.GET.get("gpu")})
    status, paused = 200, False
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            checked = actions.check_submission(request.user, data["leaderboard"], [data["gpu"]], data["mode"],
                                               data["file_name"], data["content"], data.get("size"))
        except Refused as exc:
            form.add_error(None, exc.message)
            status = exc.status
            paused = status == 503 and not accepting_jobs().accepting  # the banner says why, once
        else:
            sub = actions.do_submit(request.user, checked)
            messages.success(request, f"Submission #{sub.pk} is queued.", extra_tags="queued-note")
            return redirect("submission", pk=sub.pk)
    elif request.method == "POST":
        status = 400
    return render(request, "leaderboards/submit.html", {"form": form, "leaderboards": choices, "paused_refusal": paused,
                                                        "unavailable": sorted(unavailable.items()),
                                                        "refused_board": refused}, status=status)
