from django.contrib import admin, messages
from django.http import HttpRequest
from django.shortcuts import redirect, render
from django.urls import path
from django.utils.html import format_html

from . import actions, lifecycle
from .access.models import ApiToken, Ban, Invite, JobSwitch, Membership, PendingLogin, SubmissionQuota
from .forms import ProblemUploadForm
from .importing import ImportRejected, do_import_task
from .models import (
    Board,
    BoardEntry,
    Code,
    Competition,
    Leaderboard,
    LiveEvent,
    Problem,
    Profile,
    Run,
    RunAttempt,
    Submission,
)
from .taskfile import TaskFileError, load_task_from_zip


class NoAddAdmin(admin.ModelAdmin):
    """Rows made only by an action or an import (a submission, a run, a problem version, a ranking): the admin's
    blank "add" form could only fail or bypass the rules, so it is not offered."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ["user", "display_name"]
    search_fields = ["user__username", "display_name"]


@admin.register(Competition)
class CompetitionAdmin(admin.ModelAdmin):
    list_display = ["name", "deadline"]


@admin.register(Problem)
class ProblemAdmin(NoAddAdmin):  # problems come from "Import problem (zip)" or import_problems
    list_display = ["name", "version", "lang", "harness", "short_hash", "created"]
    list_filter = ["lang", "harness"]
    search_fields = ["name"]
    readonly_fields = ["name", "version", "content_hash", "lang", "definition", "created"]
    change_list_template = "admin/leaderboards/problem/change_list.html"

    @admin.display(description="content hash")
    def short_hash(self, problem: Problem) -> str:
        return problem.content_hash[:12]

    def get_urls(self):
        return [path("upload/", self.admin_site.admin_view(self.upload), name="leaderboards_problem_upload"),
                *super().get_urls()]

    def upload(self, request):
        form = ProblemUploadForm(request.POST or None, request.FILES or None)
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            try:
                task = load_task_from_zip(data["archive"].read())
                report = do_import_task(task, leaderboard=data["leaderboard"] or None, deadline=data["deadline"],
                                        gpus=data["gpu_names"] or None, harness=data["harness"],
                                        force=data["force"])
            except TaskFileError as exc:
                form.add_error("archive", str(exc))
            except ImportRejected as exc:
                form.add_error(None, "; ".join(exc.errors))
            else:
                self.message_user(request, f"Imported {task.name}: {'; '.join(report.lines)}", messages.SUCCESS)
                return redirect("admin:leaderboards_problem_changelist")
        context = {**self.admin_site.each_context(request), "form": form, "title": "Import a problem",
                   "opts": self.model._meta}
        return render(request, "admin/leaderboards/problem/upload.html", context,
                      status=400 if request.method == "POST" else 200)


@admin.register(Leaderboard)
class LeaderboardAdmin(admin.ModelAdmin):
    list_display = ["name", "problem", "deadline", "ranking_by", "visibility", "gpus"]
    list_filter = ["visibility", "ranking_by", "competition"]
    search_fields = ["name"]
    filter_horizontal = ["gpu_types"]
    actions = ["rescore"]

    @admin.display(description="GPU types")
    def gpus(self, leaderboard: Leaderboard) -> str:
        return ", ".join(g.name for g in leaderboard.gpu_types.all())

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("problem").prefetch_related("gpu_types")

    @admin.action(description="Rescore with the current ranking rule")
    def rescore(self, request, queryset):
        for leaderboard in queryset:
            changed = actions.do_rescore_leaderboard(leaderboard)
            self.message_user(request, f"{leaderboard}: {changed} scores changed; ranks are being recomputed.")


def stamp(field: str, label: str):
    """A read-only column showing a run's timestamp to the millisecond."""
    @admin.display(description=label)
    def show(self, run: Run) -> str:
        value = getattr(run, field)
        return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] if value else "-"
    return show


class RunInline(admin.TabularInline):
    model = Run
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["gpu_type", "secret", "status", "attempt", "verdict", "score_us", "queued", "dispatched", "started",
              "finished", "error"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="score (µs)")
    def score_us(self, run: Run) -> str:
        return "-" if run.score is None else f"{run.score * 1e6:.3f}"

    queued, dispatched, started, finished = (
        stamp(f"{step}_at", step) for step in ("queued", "dispatched", "started", "finished"))


@admin.register(Submission)
class SubmissionAdmin(NoAddAdmin):
    list_display = ["id", "user", "leaderboard", "mode", "file_name", "created"]
    list_filter = ["mode", "leaderboard"]
    search_fields = ["user__username", "file_name"]
    readonly_fields = ["user", "leaderboard", "problem", "file_name", "mode", "created", "source"]
    exclude = ["code"]
    inlines = [RunInline]

    @admin.display(description="code")
    def source(self, submission: Submission) -> str:
        return format_html("<pre>{}</pre>", submission.code.text)


class RunAttemptInline(admin.TabularInline):
    """Every dispatch of the run with how it ended: a retried attempt's reason stays after the retry succeeds."""

    model = RunAttempt
    extra = 0
    can_delete = False
    fields = ["number", "runner", "external_id", "dispatched", "finished", "outcome", "reason"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    dispatched, finished = stamp("dispatched_at", "dispatched"), stamp("finished_at", "finished")


@admin.register(Run)
class RunAdmin(NoAddAdmin):
    list_display = ["id", "submission", "gpu_type", "secret", "status", "attempt", "verdict", "score",
                    "queued_at", "finished_at"]
    list_filter = ["status", "secret", "gpu_type", "submission__mode"]
    search_fields = ["submission__user__username", "submission__leaderboard__name"]
    readonly_fields = [f.name for f in Run._meta.fields]
    inlines = [RunAttemptInline]
    actions = ["requeue", "cancel"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("submission__leaderboard", "gpu_type")

    @admin.action(description="Requeue (run again)")
    def requeue(self, request, queryset):
        for run in queryset:
            lifecycle.do_requeue_run(run)
        self.message_user(request, f"Requeued {queryset.count()} runs.")

    @admin.action(description="Cancel")
    def cancel(self, request, queryset):
        cancelled = sum(lifecycle.do_cancel_run(run) for run in queryset)
        self.message_user(request, f"Cancelled {cancelled} runs; finished runs were left alone.")


@admin.register(BoardEntry)
class BoardEntryAdmin(NoAddAdmin):
    list_display = ["leaderboard", "gpu_type", "rank", "user", "score", "submission", "submitted_at"]
    list_filter = ["leaderboard", "gpu_type"]
    ordering = ["leaderboard", "gpu_type", "rank"]


@admin.register(Board)
class BoardAdmin(NoAddAdmin):
    list_display = ["leaderboard", "gpu_type", "version", "updated"]


admin.site.register(Code, NoAddAdmin)


@admin.register(LiveEvent)
class LiveEventAdmin(NoAddAdmin):  # the live-update outbox, written and pruned by the platform
    list_display = ["group", "origin", "created"]
    readonly_fields = ["group", "payload", "origin", "created"]


# --- API access, quotas and invitations ----------------------------------------------------------
@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["user", "name", "hint", "created", "expires", "last_used", "revoked"]
    search_fields = ["user__username", "name", "hint"]
    readonly_fields = ["digest", "hint", "created", "last_used"]


@admin.register(PendingLogin)
class PendingLoginAdmin(admin.ModelAdmin):
    list_display = ["provider", "created", "token"]
    readonly_fields = ["digest"]


@admin.register(SubmissionQuota)
class SubmissionQuotaAdmin(admin.ModelAdmin):
    list_display = ["leaderboard", "kind", "max_submissions", "window_seconds"]
    list_filter = ["kind"]


@admin.register(Invite)
class InviteAdmin(admin.ModelAdmin):
    list_display = ["code", "leaderboard", "uses", "max_uses", "expires", "created"]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["leaderboard", "user", "joined"]
    search_fields = ["user__username"]


@admin.register(Ban)
class BanAdmin(admin.ModelAdmin):
    list_display = ["user", "leaderboard", "reason", "created"]
    search_fields = ["user__username"]


@admin.register(JobSwitch)
class JobSwitchAdmin(admin.ModelAdmin):
    """The one switch (pk=1): edited in place; saving it takes effect at once (its post_save forgets the cache)."""

    list_display = ["accepting", "reason", "changed"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return not JobSwitch.objects.exists()

    def has_delete_permission(self, request: HttpRequest, obj: JobSwitch | None = None) -> bool:
        return False
