import json
from contextvars import ContextVar
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.utils.html import format_html

from kernelbot.admin_actions import ObjectAction, ObjectActionsMixin, confirmed_list_action
from taskspec.loader import TaskFileError, load_task_from_zip

from . import actions, dataset, finals, lifecycle, spread
from .access import actions as access_actions
from .access.authority import RunView, may_see_precheck
from .access.models import ApiToken, Ban, Invite, JobSwitch, Membership, PendingLogin, SubmissionQuota
from .admin_tables import (
    html_table,
    info_table,
    precheck_text,
    ratio_text,
    raw_json,
    seconds_text,
    tests_table,
    timings_table,
)
from .errors import SubmissionRejected
from .forms import ProblemUploadForm
from .health import CHECK_USER
from .importing import ADMIN_FORM, ImportRejected, do_import_task, previewed
from .models import (
    Board,
    BoardEntry,
    Code,
    Competition,
    Final,
    FinalStatus,
    Leaderboard,
    LiveEvent,
    Problem,
    Profile,
    RankingRule,
    Run,
    RunAttempt,
    RunSpread,
    Submission,
)
from .serializers import job_state, problem_error_detail

_admin_request: ContextVar[HttpRequest] = ContextVar("admin_request")


def public_url(obj: Leaderboard | Submission | Run) -> str:
    """The page the site shows for a leaderboard, a submission or a run (its card on the submission's page)."""
    if isinstance(obj, Leaderboard):
        return reverse("leaderboard", args=[obj.name])
    if isinstance(obj, Run):
        return reverse("submission", args=[obj.submission_id]) + f"#run-{obj.pk}"
    return reverse("submission", args=[obj.pk])


@admin.display(description="public page")
def public_link(self, obj) -> str:
    return format_html('<a href="{}" target="_blank" rel="noopener">open ↗</a>', public_url(obj))


def admin_link(obj, text: str | None = None) -> str:
    opts = obj._meta
    return format_html('<a href="{}">{}</a>', reverse(f"admin:{opts.app_label}_{opts.model_name}_change",
                                                      args=[obj.pk]), text or str(obj))


class OrganisersBoards(admin.RelatedFieldListFilter):
    """A leaderboard list filter without the platform's internal boards (pool health checks)."""

    def field_choices(self, field, request, model_admin):
        return field.get_choices(include_blank=False, limit_choices_to={"internal": False})


class NoInternalBoardsMixin:
    """Leaderboard dropdowns without the internal boards, which organisers never act on."""

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.related_model is Leaderboard:
            kwargs.setdefault("queryset", Leaderboard.objects.filter(internal=False))
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def formfield_for_manytomany(self, db_field, request, **kwargs):
        if db_field.related_model is Leaderboard:
            kwargs.setdefault("queryset", Leaderboard.objects.filter(internal=False))
        return super().formfield_for_manytomany(db_field, request, **kwargs)


class HidesInternalMixin:
    """Lists without the pool health check's rows (its board, problem, user), which organisers never act on; their
    pages stay reachable from a check's runs."""

    def internal_rows(self) -> Q:
        raise NotImplementedError

    def get_queryset(self, request):
        queryset = super().get_queryset(request)
        match = getattr(request, "resolver_match", None)
        return queryset.exclude(self.internal_rows()) if match and (match.url_name or "").endswith("_changelist") \
            else queryset


class NoAddAdmin(admin.ModelAdmin):
    """Rows made only by an action or an import (a submission, a run, a problem version, a ranking): the admin's
    blank "add" form could only fail or bypass the rules, so it is not offered."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False


@admin.register(Profile)
class ProfileAdmin(admin.ModelAdmin):
    list_display = ["user", "display_name", "publish_submissions"]
    list_filter = ["publish_submissions"]
    search_fields = ["user__username", "display_name"]


@admin.register(Competition)
class CompetitionAdmin(admin.ModelAdmin):
    list_display = ["name", "deadline"]


def _mark_fixed(problem: Problem) -> str:
    if lifecycle.do_mark_problem_fixed(problem):
        return f"{problem} is no longer marked broken; a new problem error marks it again."
    return f"{problem} was not marked broken."


MARK_FIXED_CONSEQUENCE = ("The broken mark and its error go. Runs the error ended stay ended (requeue them to run "
                          "them again); a new problem error marks the version again and tells the organisers again.")


@admin.display(description="problem state")
def broken_note(problem: Problem) -> str:
    """The marker organisers look for: this version's own code failed in a run (`Run.problem_error`)."""
    if problem.broken_since is None:
        return "ok"
    return format_html('<strong style="color:#ba2121">⚠ broken</strong> since {} (<a href="{}">error</a>)',
                       problem.broken_since.strftime("%Y-%m-%d %H:%M"),
                       reverse("admin:leaderboards_problem_change", args=[problem.pk]))


@admin.register(Problem)
# problems come from "Import problem (zip)" or import_problems
class ProblemAdmin(HidesInternalMixin, ObjectActionsMixin, NoAddAdmin):
    list_display = ["name", "version", "origin", "lang", "harness", "short_hash", "created", "broken"]
    list_filter = ["collection", "lang", "harness", ("broken_since", admin.EmptyFieldListFilter)]
    search_fields = ["name", "collection"]
    readonly_fields = ["collection", "name", "version", "content_hash", "lang", "definition_text", "created", "broken",
                       "broken_error_text", "broken_run_link"]
    exclude = ["broken_since", "broken_error", "broken_run", "definition"]
    change_list_template = "admin/leaderboards/problem/change_list.html"
    object_actions = (ObjectAction("mark_fixed", "Mark fixed", "Mark {obj} fixed?", MARK_FIXED_CONSEQUENCE,
                                   _mark_fixed, shown=lambda problem: problem.broken_since is not None),)

    def internal_rows(self) -> Q:  # every version of a problem an internal board runs (the health check's)
        return Q(name__in=Leaderboard.objects.filter(internal=True).values("problem__name"))

    @admin.display(description="definition")
    def definition_text(self, problem: Problem) -> str:
        """The parsed task as the harness receives it, indented (its files inline), not one raw JSON line."""
        return format_html('<pre style="white-space:pre-wrap;max-height:40rem;overflow:auto">{}</pre>',
                           json.dumps(problem.definition, indent=2, ensure_ascii=False))

    @admin.display(description="state", ordering="broken_since")
    def broken(self, problem: Problem) -> str:
        return broken_note(problem)

    @admin.display(description="latest problem error")
    def broken_error_text(self, problem: Problem) -> str:
        return format_html("<pre>{}</pre>", problem.broken_error) if problem.broken_error else "–"

    @admin.display(description="latest broken run")
    def broken_run_link(self, problem: Problem) -> str:
        return admin_link(problem.broken_run) if problem.broken_run_id else "–"

    @admin.display(description="came from", ordering="collection")
    def origin(self, problem: Problem) -> str:
        return problem.collection or "– (an upload, or older than collections)"

    @admin.display(description="content hash")
    def short_hash(self, problem: Problem) -> str:
        return problem.content_hash[:12]

    def get_urls(self):
        return [path("upload/", self.admin_site.admin_view(self.upload), name="leaderboards_problem_upload"),
                *super().get_urls()]

    def upload(self, request):
        """Import a zip. One that would change an existing leaderboard is previewed first: the page lists what
        changes, and the organiser confirms (the zip is kept meanwhile) or changes the fields."""
        form = ProblemUploadForm(request.POST or None, request.FILES or None)
        preview = staged = None
        if request.method == "POST" and form.is_valid():
            data = form.cleaned_data
            name = data["leaderboard"] or None
            archive, filename = form.archive_bytes()
            options = {"leaderboard": name, "deadline": data["deadline"], "gpus": data["gpu_names"] or None,
                       "harness": data["harness"], "force": data["force"], "past_deadline": data["past_deadline"],
                       "reset": data["reset"], "hints": ADMIN_FORM}
            try:
                task = load_task_from_zip(archive, filename=filename)
                if name and request.POST.get("confirmed") != "yes":
                    preview = previewed(do_import_task, task, **options)
                    if any(preview.changes.values()):
                        staged = {"token": data.get("staged") or form.stage(archive), "name": filename}
                if not staged:
                    report = do_import_task(task, **options)
                    form.unstage()
                    for line in report.lines:
                        self.message_user(request, self._imported(line, name),
                                          messages.WARNING if line.startswith("warning") else messages.SUCCESS)
                    if name:
                        return redirect("admin:leaderboards_leaderboard_change",
                                        Leaderboard.objects.get(name=name).pk)
                    return redirect("admin:leaderboards_problem_changelist")
            except TaskFileError as exc:
                form.add_error("archive", exc.errors)
            except ImportRejected as exc:
                form.add_error(None, exc.errors)
            if not staged and data.get("staged"):  # refused after a preview: the kept zip stays kept
                staged = {"token": data["staged"], "name": data.get("staged_name") or ""}
        if form.is_bound and not staged:
            form.ask_for_the_file_again()
        context = {**self.admin_site.each_context(request), "form": form, "title": "Import a problem",
                   "opts": self.model._meta, "preview": preview if staged else None, "staged": staged}
        refused = request.method == "POST" and (form.errors or not staged)
        return render(request, "admin/leaderboards/problem/upload.html", context, status=400 if refused else 200)

    @staticmethod
    def _imported(line: str, leaderboard: str | None) -> str:
        """One line of the import report, with the leaderboard's public page to open next."""
        if not leaderboard:
            return line[:1].upper() + line[1:] + "."
        return format_html('{}. <a href="{}" target="_blank" rel="noopener">Open {} on the site ↗</a>',
                           line[:1].upper() + line[1:], reverse("leaderboard", args=[leaderboard]), leaderboard)


def _rescore(leaderboard: Leaderboard) -> str:
    changed = actions.do_rescore_leaderboard(leaderboard)
    return f"{leaderboard}: {changed} scores changed; ranks are being recomputed."


def barred_entries(leaderboard: Leaderboard) -> QuerySet:
    """The board entries of users who may no longer submit there: banned from it (or from everything) or
    deactivated. They stay ranked until an organiser removes them (`_remove_barred`)."""
    banned = Ban.objects.filter(Q(leaderboard=leaderboard) | Q(leaderboard__isnull=True)).values("user")
    return BoardEntry.objects.filter(Q(user__in=banned) | Q(user__is_active=False), leaderboard=leaderboard) \
        .select_related("user")


def _remove_from_rankings(leaderboard: Leaderboard, user_ids: set[int]) -> int:
    subs = list(Submission.objects.made().filter(leaderboard=leaderboard, user_id__in=user_ids))
    for sub in subs:  # all or none: a submission being re-verified for the final standings stays until they are out
        finals.check_may_delete(sub)
    for sub in subs:
        actions.do_delete_submission(sub)
    return len(subs)


def _refusal_text(perform):
    """An object action whose refusal (already running, nothing to re-run) is told as its message, not a 500."""
    def run(*args) -> str:
        try:
            return perform(*args)
        except finals.Refused as exc:
            return f"Not done: {exc.message}"
    return run


@_refusal_text
def _remove_barred(leaderboard: Leaderboard) -> str:
    users = {e.user_id: e.user.get_username() for e in barred_entries(leaderboard)}
    count = _remove_from_rankings(leaderboard, set(users))
    return (f"Removed {', '.join(sorted(users.values())) or 'nobody'} from {leaderboard}'s rankings "
            f"({count} submission{'' if count == 1 else 's'} deleted); the rankings are being rebuilt.")


REVERIFY_CONSEQUENCE = ("The board's top entries of each GPU type (its “final top N”) are re-run “final rounds” times "
                        "on fresh secret inputs, interleaved, one at a time; the new standings wait on their page "
                        "under Final standings, beside the board's ranks and the published ones, until you publish "
                        "them. Nothing on the board changes.")


@_refusal_text
def _reverify(leaderboard: Leaderboard, user) -> str:
    final = finals.do_start_final(leaderboard, requested_by=user, publish_when_done=False)
    return f"Re-verification #{final.pk} of {leaderboard} started ({final.entries.count()} entries)."


REMOVE_BARRED_CONSEQUENCE = ("Every submission to this leaderboard of its banned and deactivated users is deleted "
                             "(unfinished runs are cancelled) and its rankings are rebuilt without them. Their "
                             "accounts and their submissions elsewhere stay.")


RESCORE_CONSEQUENCE = ("Every passing ranked run's score is recomputed from its stored results with the leaderboard's "
                       "current ranking rule, and every ranking of it is rebuilt. Nothing is run again.")


@admin.register(Leaderboard)
class LeaderboardAdmin(HidesInternalMixin, ObjectActionsMixin, admin.ModelAdmin):
    list_display = ["name", "problem_label", "problem_state", "deadline", "ranking_by", "visibility", "gpus",
                    "public_link"]
    list_filter = ["visibility", "ranking_by", "competition"]
    readonly_fields = ["problem_state", "spreads"]
    search_fields = ["name"]
    filter_horizontal = ["gpu_types"]
    actions = ["rescore", "export_dataset"]

    def internal_rows(self) -> Q:
        return Q(internal=True)
    object_actions = (
        ObjectAction("rescore", "Rescore", "Rescore {obj}?", RESCORE_CONSEQUENCE, _rescore),
        ObjectAction("remove-barred", "Remove banned users from the rankings", "Remove {obj}'s banned and "
                     "deactivated users from its rankings?", REMOVE_BARRED_CONSEQUENCE, _remove_barred,
                     shown=lambda leaderboard: barred_entries(leaderboard).exists()),
        ObjectAction("reverify", "Re-verify final standings", "Re-run {obj}'s top entries on fresh inputs?",
                     REVERIFY_CONSEQUENCE, _reverify,
                     shown=lambda leaderboard: not leaderboard.internal and leaderboard.final_top_n > 0,
                     with_user=True),
    )
    public_link = public_link

    @admin.display(description="problem", ordering="problem__name")
    def problem_label(self, leaderboard: Leaderboard) -> str:
        return leaderboard.problem.label

    @admin.display(description="between-run spread in use")
    def spreads(self, leaderboard: Leaderboard) -> str:
        names = {g.pk: g.name for g in leaderboard.gpu_types.all()}
        return "; ".join(f"{names[pk]}: ±{value:.1%} ({source})"
                         for pk, (value, source) in spread.board_spreads(leaderboard).items()) or "-"

    def change_view(self, request, object_id, form_url="", extra_context=None):
        leaderboard = self.get_object(request, object_id) if request.method == "GET" else None
        if leaderboard is not None and leaderboard.cuda_warning:
            self.message_user(request, f"{leaderboard.cuda_warning} Add a GPU type with CUDA below, or import a "
                              "version of the problem that falls back to the CPU.", messages.WARNING)
        if leaderboard is not None and (barred := list(barred_entries(leaderboard).with_rank())):
            self.message_user(request, "Still ranked though they may not submit here: " + ", ".join(
                f"{e.user.get_username()} (#{e.rank} on {e.gpu_type.name}, "
                f"{'deactivated' if not e.user.is_active else 'banned'})" for e in barred)
                + ". “Remove banned users from the rankings” above takes them off.", messages.WARNING)
        return super().change_view(request, object_id, form_url, extra_context)

    def view_on_site(self, leaderboard: Leaderboard) -> str:
        return public_url(leaderboard)

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "problem" and field is not None:
            field.label_from_instance = lambda problem: problem.label  # two collections' matmul_py v1 tell apart
        if db_field.name == "ranking_by" and request.resolver_match and \
                request.resolver_match.url_name.endswith("_add"):
            field.choices = [("", "The problem's own rule (its task.yml ranking_by)"), *RankingRule.choices]
            field.required, field.initial = False, ""
            field.help_text = "Empty: the rule the problem's task.yml names (ranking_by)."
        return field

    def save_model(self, request, leaderboard: Leaderboard, form, change: bool) -> None:
        if not leaderboard.ranking_by:
            leaderboard.ranking_by = leaderboard.problem.definition.get("ranking_by") or RankingRule.LAST
        super().save_model(request, leaderboard, form, change)

    def response_change(self, request, leaderboard: Leaderboard):
        """A changed ranking rule leaves every stored score computed with the old one: offer the rescore at once."""
        form_changed = getattr(request, "_kb_rule_changed", False)
        response = super().response_change(request, leaderboard)
        if form_changed and "_continue" not in request.POST and "_addanother" not in request.POST:
            self.message_user(request, f"The ranking rule of {leaderboard} is now "
                              f"“{leaderboard.get_ranking_by_display().lower()}”; its scores still follow the old "
                              "rule until you rescore.", messages.WARNING)
            return redirect("admin:leaderboards_leaderboard_do", leaderboard.pk, "rescore")
        return response

    def save_form(self, request, form, change: bool):
        request._kb_rule_changed = change and "ranking_by" in form.changed_data
        return super().save_form(request, form, change)

    @admin.display(description="problem state")
    def problem_state(self, leaderboard: Leaderboard) -> str:
        if not leaderboard.problem_id:
            return "–"
        if leaderboard.cuda_warning:
            return format_html('{} · <strong style="color:#ba2121" title="{}">⚠ needs CUDA</strong>',
                               broken_note(leaderboard.problem), leaderboard.cuda_warning)
        return broken_note(leaderboard.problem)

    @admin.display(description="GPU types")
    def gpus(self, leaderboard: Leaderboard) -> str:
        return ", ".join(g.name for g in leaderboard.gpu_types.all())

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("problem").prefetch_related("gpu_types")

    @admin.action(description="Export the submissions dataset (parquet)")
    def export_dataset(self, request, queryset):
        """Downloads the selected closed boards' dataset (`leaderboards.dataset`); nothing is published."""
        boards = list(queryset)
        try:
            data = dataset.parquet_bytes(boards)
        except finals.Refused as exc:
            self.message_user(request, exc.message, messages.ERROR)
            return None
        response = HttpResponse(data, content_type="application/vnd.apache.parquet")
        response["Content-Disposition"] = f'attachment; filename="{dataset.file_name(boards)}"'
        return response

    rescore = admin.action(description="Rescore with the current ranking rule")(confirmed_list_action(
        "Rescore", "Rescore the selected leaderboards?", RESCORE_CONSEQUENCE,
        lambda queryset: " ".join(_rescore(leaderboard) for leaderboard in queryset)))


@admin.register(Final)
class FinalAdmin(ObjectActionsMixin, admin.ModelAdmin):
    """A re-verification of a board's final standings: its entries' board, new and published ranks side by side."""

    list_display = ["__str__", "leaderboard", "status", "created", "finished_at", "published_at"]
    list_filter = ["status"]
    search_fields = ["leaderboard__name"]
    fields = readonly_fields = ["leaderboard", "status", "top_n", "rounds", "requested_by", "publish_when_done",
                                "created", "finished_at", "published_at", "comparison"]
    object_actions = (
        ObjectAction("publish", "Publish", "Publish {obj}?", "These ranks become the board's final standings on its "
                     "page and /api/v1 (replacing any published before) and are announced on Discord.",
                     _refusal_text(lambda final: f"Published {finals.do_publish_final(final)}."),
                     shown=lambda final: final.status == FinalStatus.DONE),
        ObjectAction("cancel", "Cancel", "Cancel {obj}?", "Its runs under way are cancelled; nothing is published.",
                     _refusal_text(lambda final: f"Cancelled {finals.do_cancel_final(final)}."),
                     shown=lambda final: final.status == FinalStatus.RUNNING),
    )

    def has_add_permission(self, request) -> bool:
        return False

    @admin.display(description="ranks: board, these re-runs, published")
    def comparison(self, final: Final) -> str:
        """While the re-runs go on an entry that has not dropped out is "re-running", not "dropped"; in a box that
        scrolls sideways (the admin's rows clip what passes their edge: a phone saw half the table)."""
        running = final.status == FinalStatus.RUNNING
        headers = ["GPU", "User", "Board rank", "New rank", "Published rank", "× reference", "Dropped because"]
        return html_table(headers, [
            [row["gpu"], format_html("<bdi>{}</bdi>", row["user"]), row["board_rank"],
             (f"{row['rank']}{' ≈' if row['tied'] else ''}" if row["rank"] else
              "dropped" if row["reason"] else "re-running" if running else "–"),
             row["published_rank"] or "–", ratio_text(row["ratio"], row["ratio_low"], row["ratio_high"]),
             row["reason"] or ""] for row in finals.compare(final)], {2, 3, 4})


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
    fields = ["gpu_type", "kind", "status", "attempt", "verdict", "score_text", "queued", "finished", "public_link"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="inputs")
    def kind(self, run: Run) -> str:
        return "secret" if run.secret else "public"

    @admin.display(description="score")
    def score_text(self, run: Run) -> str:
        return seconds_text(run.score)

    queued, finished = stamp("queued_at", "queued"), stamp("finished_at", "finished")
    public_link = public_link


class PrecheckFilter(admin.SimpleListFilter):
    title = "KernelGuard pre-check"
    parameter_name = "precheck"

    def lookups(self, request, model_admin):
        return [("flagged", "would be refused"), ("findings", "any finding"), ("failed", "failed"),
                ("clean", "no findings"), ("none", "not run")]

    def queryset(self, request, queryset):
        match self.value():
            case "flagged":
                return queryset.filter(precheck__should_filter=True)
            case "findings":
                return queryset.filter(precheck__findings__0__isnull=False)
            case "failed":
                return queryset.filter(precheck__has_key="error")
            case "clean":
                return queryset.filter(precheck__has_key="findings").exclude(precheck__findings__0__isnull=False)
            case "none":
                return queryset.filter(precheck={})
        return queryset


@admin.display(description="KernelGuard pre-check")
def precheck_field(self, obj: Submission | Run) -> str:
    """Beside the harness's verdict, for staff only (`access.authority.may_see_precheck`; the admin is staff's)."""
    return precheck_text((obj.submission if isinstance(obj, Run) else obj).precheck)


class PrecheckForStaffMixin:
    """Shows the pre-check only to whom the authority allows (the admin's users are staff, so today everyone here;
    the rule stays in one place if it narrows)."""

    def get_readonly_fields(self, request, obj=None):
        fields = super().get_readonly_fields(request, obj)
        return fields if may_see_precheck(request.user) else [f for f in fields if f != "precheck_text"]

    def get_fieldsets(self, request, obj=None):
        fieldsets = super().get_fieldsets(request, obj)
        if may_see_precheck(request.user):
            return fieldsets
        return [(name, {**options, "fields": [f for f in options["fields"] if f != "precheck_text"]})
                for name, options in fieldsets]

    def get_list_filter(self, request):
        filters = super().get_list_filter(request)
        return filters if may_see_precheck(request.user) else [f for f in filters if f is not PrecheckFilter]


class RerunFilter(admin.SimpleListFilter):
    title = "made by"
    parameter_name = "made_by"

    def lookups(self, request, model_admin):
        return [("user", "its user"), ("finals", "the final standings (re-runs)")]

    def queryset(self, request, queryset):
        match self.value():
            case "user":
                return queryset.filter(final_entry__isnull=True)
            case "finals":
                return queryset.filter(final_entry__isnull=False)
        return queryset


@admin.register(Submission)
class SubmissionAdmin(PrecheckForStaffMixin, NoAddAdmin):
    list_display = ["id", "user", "leaderboard", "mode", "rerun", "file_name", "created", "status", "precheck_flag",
                    "public_link"]
    list_filter = ["mode", RerunFilter, ("leaderboard", OrganisersBoards), ("user", admin.RelatedOnlyFieldListFilter),
                   PrecheckFilter]
    search_fields = ["user__username", "file_name"]
    readonly_fields = ["user", "leaderboard", "problem", "file_name", "mode", "rerun", "created", "precheck_text",
                       "source"]
    exclude = ["code", "precheck"]
    inlines = [RunInline]
    public_link = public_link
    precheck_text = precheck_field

    def view_on_site(self, submission: Submission) -> str:
        return public_url(submission)

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("user", "leaderboard", "final_entry") \
            .prefetch_related("runs__gpu_type")

    @admin.display(description="final re-run")
    def rerun(self, submission: Submission) -> str:
        """A final standings' re-run names the submission it re-runs (made by the platform after the deadline)."""
        if not submission.is_rerun:
            return "–"
        entry = submission.final_entry
        return format_html('re-run {} of <a href="{}">#{}</a> for <a href="{}">final standings #{}</a>',
                           submission.final_round + 1,
                           reverse("admin:leaderboards_submission_change", args=[entry.submission_id]),
                           entry.submission_id, reverse("admin:leaderboards_final_change", args=[entry.final_id]),
                           entry.final_id)

    @staticmethod
    def _refusal(submission: Submission) -> str | None:
        try:
            finals.check_may_delete(submission)
        except finals.Refused as exc:
            return exc.message
        return None

    def get_deleted_objects(self, objs, request):
        """The delete pages refuse what the service layer would: re-runs (and what they re-run) until published, and
        the entries of published standings for good."""
        deleted, counts, perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, perms_needed, [*protected, *filter(None, (self._refusal(o) for o in objs))]

    def delete_model(self, request: HttpRequest, submission: Submission) -> None:
        actions.do_delete_submission(submission)  # runs cancelled, boards rebuilt, the finals' rule kept

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet) -> None:
        for submission in queryset:
            actions.do_delete_submission(submission)

    @admin.display(description="status")
    def status(self, submission: Submission) -> str:
        """What its runs came to, as the competitor's CLI and popcorn read it (`serializers.job_state`)."""
        return job_state(list(submission.runs.all()), RunView.ALL)[1]

    def get_list_display(self, request):
        shown = super().get_list_display(request)
        return shown if may_see_precheck(request.user) else [f for f in shown if f != "precheck_flag"]

    @admin.display(description="pre-check")
    def precheck_flag(self, submission: Submission) -> str:
        record = submission.precheck
        if not record:
            return "–"
        if record.get("error"):
            return "failed"
        patterns = sorted({f.get("pattern", "") for f in record.get("findings") or []})
        return f"{record.get('classification', '?')}: {', '.join(patterns)}" if patterns else "clean"

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


def _requeue(run: Run) -> str:
    lifecycle.do_requeue_run(run)
    return f"Requeued run {run.pk}: it runs again from the start."


def _cancel(run: Run) -> str:
    return f"Cancelled run {run.pk}." if lifecycle.do_cancel_run(run) else f"Run {run.pk} had already finished."


def runs_text(count: int) -> str:
    return f"{count} run" if count == 1 else f"{count} runs"


def _requeue_all(queryset: QuerySet) -> str:
    for run in queryset:
        lifecycle.do_requeue_run(run)
    return f"Requeued {runs_text(len(queryset))}."


def _cancel_all(queryset: QuerySet) -> str:
    cancelled = sum(lifecycle.do_cancel_run(run) for run in queryset)
    left = len(queryset) - cancelled
    if not left:
        return f"Cancelled {runs_text(cancelled)}."
    return f"Cancelled {runs_text(cancelled)}; {runs_text(left)} had already finished and stayed as they were."


REQUEUE_CONSEQUENCE = ("The run's verdict, score, timings and output are discarded and it is queued to run again "
                       "from the start; its ranking is recomputed. Earlier attempts stay listed with their reasons.")
CANCEL_CONSEQUENCE = "The run stops where it is and is never scored; its submission stays, and can be requeued."


@admin.register(Run)
class RunAdmin(PrecheckForStaffMixin, ObjectActionsMixin, NoAddAdmin):
    list_display = ["id", "submission", "gpu_type", "kind", "status", "verdict", "score_text", "queued_at",
                    "public_link"]
    list_filter = ["status", ("submission__leaderboard", OrganisersBoards), "secret", "gpu_type", "submission__mode",
                   "problem_error"]
    search_fields = ["submission__user__username", "submission__leaderboard__name"]
    fieldsets = [
        (None, {"fields": ["submission_link", "gpu", "kind", "status", "attempt", "runner", "verdict",
                           "precheck_text", "score_text", "ratio_text", "error_text"]}),
        ("Times (UTC)", {"fields": ["queued", "dispatched", "started", "finished", "deadline"]}),
        ("Results", {"fields": ["tests", "benchmarks", "ranked"]}),
        ("System", {"fields": ["system"]}),
        ("Output", {"fields": ["stdout_text", "stderr_text"]}),
        ("Stored data", {"fields": ["result_json", "system_json", "progress"], "classes": ["collapse"]}),
    ]
    readonly_fields = [name for _, options in fieldsets for name in options["fields"]]
    inlines = [RunAttemptInline]
    actions = ["requeue", "cancel"]
    object_actions = (
        ObjectAction("requeue", "Requeue", "Requeue run {obj.pk}?", REQUEUE_CONSEQUENCE, _requeue),
        ObjectAction("cancel", "Cancel run", "Cancel run {obj.pk}?", CANCEL_CONSEQUENCE, _cancel,
                     shown=lambda run: not run.is_terminal),
    )
    public_link = public_link
    precheck_text = precheck_field

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("submission__leaderboard", "gpu_type")

    def view_on_site(self, run: Run) -> str:
        return public_url(run)

    @admin.display(description="submission")
    def submission_link(self, run: Run) -> str:
        sub = run.submission
        return format_html("{} by {} · {}", admin_link(sub), sub.user, format_html(
            '<a href="{}">public page ↗</a>', public_url(run)))

    @admin.display(description="inputs")
    def kind(self, run: Run) -> str:
        return "secret" if run.secret else "public"

    @admin.display(description="GPU type")
    def gpu(self, run: Run) -> str:
        return run.gpu_type.name

    @admin.display(description="score", ordering="score")
    def score_text(self, run: Run) -> str:
        return seconds_text(run.score)

    @admin.display(description="× reference")
    def ratio_text(self, run: Run) -> str:
        return ratio_text(run.ratio, run.ratio_low, run.ratio_high)

    @admin.display(description="error")
    def error_text(self, run: Run) -> str:
        if shown := problem_error_detail(run):  # competitors read only run.error (PROBLEM_BROKEN); staff read why
            return format_html("<strong>The problem's own code failed</strong> in <code>{}</code> (problem version "
                               "{}); competitors read “{}”.<pre>{}</pre><pre>{}</pre>", shown["where"] or "?",
                               admin_link(run.submission.problem), run.error, shown["error"], shown["traceback"])
        return format_html("<pre>{}</pre>", run.error) if run.error else "–"

    @admin.display(description="tests")
    def tests(self, run: Run) -> str:
        return tests_table(run.result.get("tests") or [])

    @admin.display(description="benchmarks")
    def benchmarks(self, run: Run) -> str:
        return timings_table(run.result.get("benchmarks") or [])

    @admin.display(description="ranked benchmarks")
    def ranked(self, run: Run) -> str:
        return timings_table(run.result.get("ranked") or [])

    @admin.display(description="system info")
    def system(self, run: Run) -> str:
        return info_table(run.system_info)

    @admin.display(description="stdout")
    def stdout_text(self, run: Run) -> str:
        return format_html("<pre>{}</pre>", run.stdout) if run.stdout else "–"

    @admin.display(description="stderr")
    def stderr_text(self, run: Run) -> str:
        return format_html("<pre>{}</pre>", run.stderr) if run.stderr else "–"

    @admin.display(description="result")
    def result_json(self, run: Run) -> str:
        return raw_json(run.result)

    @admin.display(description="system info")
    def system_json(self, run: Run) -> str:
        return raw_json(run.system_info)

    queued, dispatched, started, finished = (
        stamp(f"{step}_at", step) for step in ("queued", "dispatched", "started", "finished"))
    deadline = stamp("status_deadline", "state deadline")

    requeue = admin.action(description="Requeue (run again)")(confirmed_list_action(
        "Requeue", "Requeue the selected runs?", REQUEUE_CONSEQUENCE, _requeue_all))
    cancel = admin.action(description="Cancel")(confirmed_list_action(
        "Cancel runs", "Cancel the selected runs?", CANCEL_CONSEQUENCE, _cancel_all))


@admin.register(BoardEntry)
class BoardEntryAdmin(NoAddAdmin):
    list_display = ["leaderboard", "gpu_type", "rank", "user", "score_text", "submission", "submitted_at",
                    "public_link"]
    list_select_related = ["leaderboard", "gpu_type", "user", "submission__leaderboard"]
    search_fields = ["user__username", "leaderboard__name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).with_rank()

    @admin.display(description="rank", ordering="rank_key")
    def rank(self, entry: BoardEntry) -> int:
        return entry.rank

    @admin.display(description="score", ordering="score")
    def score_text(self, entry: BoardEntry) -> str:
        return seconds_text(entry.score)

    @admin.display(description="public page")
    def public_link(self, entry: BoardEntry) -> str:
        return format_html('<a href="{}?gpu={}" target="_blank" rel="noopener">open ↗</a>',
                           public_url(entry.leaderboard), entry.gpu_type.name)

    list_filter = [("leaderboard", OrganisersBoards), "gpu_type"]
    ordering = ["leaderboard", "gpu_type", "rank_key", "submitted_at", "submission"]


@admin.register(Board)
class BoardAdmin(NoAddAdmin):
    list_display = ["leaderboard", "gpu_type", "version", "updated"]


admin.site.register(Code, NoAddAdmin)


def _measure_again(queryset: QuerySet) -> str:
    queued, refused = 0, []
    for record in queryset.select_related("problem", "gpu_type"):
        try:
            queued += len(spread.do_measure_spread(record.problem, record.gpu_type))
        except SubmissionRejected as exc:
            refused.append(str(exc))
    return " ".join([f"{queued} A/A runs queued.", *refused])


@admin.register(RunSpread)
class RunSpreadAdmin(NoAddAdmin):
    """The between-run spread measured per (problem, GPU type); `manage.py measure_spread` adds pairs."""

    list_display = ["__str__", "spread_text", "samples", "measured_at", "pending_since", "node_warning"]
    list_filter = ["gpu_type"]
    readonly_fields = ["problem", "gpu_type", "spread", "samples", "measured_at", "pending_since", "nodes", "warning"]
    actions = ["measure_again"]
    measure_again = admin.action(description="Measure again (A/A runs, KERNELBOT_SPREAD_RUNS each)")(
        confirmed_list_action("Measure again", "Measure the between-run spread of these again?",
                              "Queues A/A runs on the nodes that serve each GPU type; their figure replaces the "
                              "current one when they end.", _measure_again))

    @admin.display(description="spread")
    def spread_text(self, record: RunSpread) -> str:
        return "provisional (not measured)" if record.spread is None else f"±{record.spread:.1%}"

    @admin.display(description="warning")
    def node_warning(self, record: RunSpread) -> str:
        return f"⚠ {record.warning}" if record.warning else ""


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
class SubmissionQuotaAdmin(NoInternalBoardsMixin, admin.ModelAdmin):
    list_display = ["leaderboard", "kind", "max_submissions", "window_seconds", "frozen"]
    list_filter = ["kind"]


@admin.register(Invite)
class InviteAdmin(NoInternalBoardsMixin, admin.ModelAdmin):
    """Each code's link to the site's join page, absolute, to copy into an invitation. The link needs the request's
    host: the admin's list and form ask for their fields with it, before rendering, in the request's own context."""

    list_display = ["code", "leaderboard", "uses", "max_uses", "expires", "created", "join_link"]
    readonly_fields = ["join_link"]

    def get_list_display(self, request):
        _admin_request.set(request)
        return super().get_list_display(request)

    def get_readonly_fields(self, request, obj=None):
        _admin_request.set(request)
        return super().get_readonly_fields(request, obj)

    @admin.display(description="join link")
    def join_link(self, invite: Invite) -> str:
        if not invite.pk:
            return "–"
        url = _admin_request.get().build_absolute_uri(f"{reverse('invitation')}?{urlencode({'code': invite.code})}")
        return format_html('<a href="{}" class="join-link">{}</a>', url, url)


@admin.register(Membership)
class MembershipAdmin(NoInternalBoardsMixin, admin.ModelAdmin):
    list_display = ["leaderboard", "user", "joined"]
    search_fields = ["user__username"]


@_refusal_text
def _remove_banned(queryset: QuerySet) -> str:
    count = 0
    for ban in queryset.select_related("user", "leaderboard"):
        boards = [ban.leaderboard] if ban.leaderboard_id else Leaderboard.objects.filter(entries__user=ban.user)
        count += sum(_remove_from_rankings(board, {ban.user_id}) for board in set(boards))
    return f"Deleted {count} submission{'' if count == 1 else 's'} of the banned users; the rankings are being rebuilt."


@admin.register(Ban)
class BanAdmin(NoInternalBoardsMixin, admin.ModelAdmin):
    list_display = ["user", "banned_from", "reason", "ranked", "created"]
    list_filter = [("leaderboard", admin.EmptyFieldListFilter)]
    search_fields = ["user__username", "leaderboard__name", "reason"]
    raw_id_fields = ["user"]
    actions = ["remove_from_rankings"]

    def formfield_for_dbfield(self, db_field, request, **kwargs):
        field = super().formfield_for_dbfield(db_field, request, **kwargs)
        if db_field.name == "leaderboard":
            field.empty_label = "— every leaderboard —"
            field.help_text = "Empty: banned from every leaderboard. A ban stops new submissions; the user's " \
                              "entries stay ranked until you remove them (the action on the ban list, or the " \
                              "leaderboard's “Remove banned users from the rankings”)."
        return field

    @admin.display(description="banned from", ordering="leaderboard")
    def banned_from(self, ban: Ban) -> str:
        return ban.leaderboard.name if ban.leaderboard_id else "every leaderboard"

    @admin.display(description="still ranked on")
    def ranked(self, ban: Ban) -> str:
        entries = BoardEntry.objects.filter(user_id=ban.user_id)
        if ban.leaderboard_id:
            entries = entries.filter(leaderboard_id=ban.leaderboard_id)
        return ", ".join(sorted({e.leaderboard.name for e in entries.select_related("leaderboard")})) or "–"

    remove_from_rankings = admin.action(description="Remove from the rankings they are banned from")(
        confirmed_list_action("Remove from rankings", "Remove the selected banned users from the rankings?",
                              "Their submissions to the leaderboards they are banned from (every leaderboard for a "
                              "ban from everything) are deleted, unfinished runs cancelled, and the rankings rebuilt. "
                              "Their accounts stay.", _remove_banned))


def _pause(switch: JobSwitch) -> str:
    access_actions.do_set_accepting_jobs(False, switch.reason)
    return "Submissions are paused on every front-end; every page shows a banner until you resume them."


def _resume(switch: JobSwitch) -> str:
    access_actions.do_set_accepting_jobs(True)
    return "Submissions are accepted again."


@admin.register(JobSwitch)
class JobSwitchAdmin(ObjectActionsMixin, admin.ModelAdmin):
    """The one switch (pk=1): its list opens the switch itself, whose page offers Pause or Resume as a button; saving
    the form takes effect at once too (its post_save forgets the cache)."""

    list_display = ["accepting", "reason", "changed"]
    object_actions = (
        ObjectAction("pause", "Pause submissions", "Pause all new submissions?", "Every front-end (site, API, "
                     "popcorn, Discord) refuses new submissions with the reason until you resume; runs already "
                     "queued go on.", _pause, shown=lambda switch: switch.accepting),
        ObjectAction("resume", "Resume submissions", "Resume submissions?", "Every front-end accepts new "
                     "submissions again.", _resume, shown=lambda switch: not switch.accepting),
    )

    def changelist_view(self, request: HttpRequest, extra_context=None):
        return redirect("admin:leaderboards_jobswitch_change", 1)

    def get_object(self, request: HttpRequest, object_id: str, from_field=None):
        if object_id == "1":
            JobSwitch.objects.get_or_create(pk=1)  # no row reads as accepting; the page needs one to show
        return super().get_object(request, object_id, from_field)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: JobSwitch | None = None) -> bool:
        return False


# --- users: the organiser's deactivate ------------------------------------------------------------
User = get_user_model()


def _deactivate(queryset: QuerySet) -> str:
    count = queryset.filter(is_active=True).exclude(is_superuser=True).update(is_active=False)
    return (f"Deactivated {count} user{'' if count == 1 else 's'} (superusers are left alone): they can no longer log "
            "in or submit. Their entries stay ranked until you remove them (a leaderboard's “Remove banned users "
            "from the rankings”).")


if admin.site.is_registered(User):
    admin.site.unregister(User)


@admin.register(User)
class KernelbotUserAdmin(HidesInternalMixin, UserAdmin):
    def internal_rows(self) -> Q:
        return Q(username=CHECK_USER)

    actions = ["deactivate"]
    deactivate = admin.action(description="Deactivate (no log-in, no submissions)")(confirmed_list_action(
        "Deactivate", "Deactivate the selected users?", "They can no longer log in, submit or use their API tokens. "
        "Their submissions and accounts stay; tick “active” on a user's page to undo it.", _deactivate))
