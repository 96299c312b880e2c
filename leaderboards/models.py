import hashlib
import secrets
from datetime import datetime, timedelta
from functools import cached_property

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models, transaction
from django.db.models import Count, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from runners.models import GpuType
from runners.queue import enqueue_on_commit
from runners.reservations import allocator

# API tokens, CLI logins, quotas, invitations, bans and the jobs switch are defined in access/models.py; the
# import below registers them with this app (and lets `from leaderboards.models import ApiToken` work).
from . import events, taskcheck
from .access.models import (  # noqa: F401
    ApiToken,
    Ban,
    Invite,
    JobSwitch,
    KnownClient,
    Membership,
    PendingLogin,
    QuotaKind,
    SubmissionQuota,
)


def isolated(text: object) -> str:
    """User text between FIRST STRONG ISOLATE and POP DIRECTIONAL ISOLATE: a name with U+202E (right-to-left
    override) cannot reverse the text after it, in admin tables, plain-text messages or chart labels."""
    return f"\u2068{text}\u2069"


def new_secret_seed() -> int:
    return secrets.randbits(62)


class Profile(models.Model):
    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="profile")
    display_name = models.CharField(max_length=80, blank=True)
    publish_submissions = models.BooleanField(
        default=True, help_text="Include my submissions in the published submissions dataset.")

    def __str__(self) -> str:
        return self.display_name or self.user.get_username()


class Competition(models.Model):
    name = models.CharField(max_length=120, unique=True)
    description = models.TextField(blank=True)
    deadline = models.DateTimeField()

    def __str__(self) -> str:
        return self.name


class HarnessProtocol(models.TextChoices):
    KERNELBOT = "kernelbot", "Trusted two-process harness"
    POPCORN = "popcorn", "Problem's own eval.py (reference-kernels protocol)"


class RankingRule(models.TextChoices):
    LAST = "last", "Last benchmark"
    MEAN = "mean", "Arithmetic mean"
    GEOM = "geom", "Geometric mean"


class Problem(models.Model):
    """One immutable version of a task definition; a changed definition is a new row. A problem is its collection
    and name: collections reuse directory names (demo/matmul_py, pmpp_v2/matmul_py), and a version only ever follows
    an earlier one of the same collection."""

    collection = models.CharField(max_length=120, blank=True, help_text=(
        "Where it came from: the competition file's name, or the folder a single task was imported from; empty: an "
        "uploaded archive, or a standalone import from before collections."))
    name = models.CharField(max_length=100)
    version = models.PositiveIntegerField(default=1)
    content_hash = models.CharField(max_length=64)
    lang = models.CharField(max_length=4)
    description = models.TextField()
    definition = models.JSONField(help_text="The parsed task (files inlined), as the harness receives it.")
    harness = models.CharField(max_length=16, choices=HarnessProtocol.choices, default=HarnessProtocol.KERNELBOT)
    created = models.DateTimeField(auto_now_add=True)
    # Set when a run's harness reported that this version's own code raised (lifecycle.do_ingest_result); cleared
    # by an organiser ("mark fixed" in the admin). The Discord bot tells each guild's report channel once per episode.
    broken_since = models.DateTimeField(null=True, blank=True, help_text="When a run first found this version's "
                                        "own code failing (generate_input, ref_kernel or check_implementation).")
    broken_error = models.TextField(blank=True, help_text="The latest problem error and its traceback (staff only).")
    broken_run = models.ForeignKey("Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                                   help_text="The latest run that found it failing.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["collection", "name", "version"],
                                               name="problem_unique_collection_version")]
        ordering = ["name", "collection", "-version"]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    @property
    def label(self) -> str:
        """`str()` with where it came from, for lists where same-named problems of two collections meet."""
        return f"{self} ({self.collection or 'no collection'})"


class Visibility(models.TextChoices):
    PUBLIC = "public", "Public"
    UNLISTED = "unlisted", "Unlisted"
    CLOSED = "closed", "Closed (invite only)"


class LeaderboardQuerySet(models.QuerySet):
    def open(self) -> "LeaderboardQuerySet":
        now = timezone.now()
        return self.filter(Q(starts_at__isnull=True) | Q(starts_at__lte=now), deadline__gt=now)

    def listed(self) -> "LeaderboardQuerySet":
        return self.filter(visibility=Visibility.PUBLIC)

    def visible_to(self, user) -> "LeaderboardQuerySet":
        """What `user` may see (see leaderboards.access.authority): staff everything, members their closed
        leaderboards, everyone the public and unlisted ones; nobody the internal ones (pool health checks)."""
        if user.is_staff:
            return self.filter(internal=False)
        if not user.is_authenticated:
            return self.exclude(visibility=Visibility.CLOSED)
        return self.filter(~Q(visibility=Visibility.CLOSED)
                           | Q(pk__in=Membership.objects.filter(user=user).values("leaderboard")))

    def listed_for(self, user) -> "LeaderboardQuerySet":
        """The public leaderboards and the closed ones `user` is a member of; for staff every one they may open
        (closed and unlisted ones too, never the internal ones)."""
        if user.is_staff:
            return self.visible_to(user)
        if not user.is_authenticated:
            return self.listed()
        return self.filter(Q(visibility=Visibility.PUBLIC)
                           | Q(pk__in=Membership.objects.filter(user=user).values("leaderboard")))


class Leaderboard(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    competition = models.ForeignKey(Competition, null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="leaderboards")
    problem = models.ForeignKey(Problem, on_delete=models.PROTECT, related_name="leaderboards")
    description = models.TextField(blank=True)
    starts_at = models.DateTimeField(null=True, blank=True,
                                     help_text="UTC. Submissions open then; empty: open as soon as it exists.")
    deadline = models.DateTimeField(help_text="UTC. No submissions are accepted after it.")
    ranking_by = models.CharField(max_length=8, choices=RankingRule.choices, default=RankingRule.LAST)
    visibility = models.CharField(max_length=10, choices=Visibility.choices, default=Visibility.PUBLIC)
    gpu_types = models.ManyToManyField(GpuType, related_name="leaderboards")
    secret_seed = models.BigIntegerField(default=new_secret_seed, editable=False)
    code_public_after_deadline = models.BooleanField(
        default=False, help_text="After the deadline, everyone may read every submission's code.")
    internal = models.BooleanField(default=False, editable=False, help_text="Kept by the platform for pool health "
                                   "checks: never shown, listed, ranked or counted on the site or the APIs.")
    final_top_n = models.PositiveIntegerField(
        default=10, help_text="At the deadline, the top N entries of each GPU type are re-run on fresh secret inputs "
        "and the final standings come from those runs (leaderboards/finals.py); 0: no re-verification.")
    final_rounds = models.PositiveIntegerField(
        default=3, help_text="How many times each of the top N is re-run, interleaved A B C … A B C ….")
    run_spread = models.FloatField(
        null=True, blank=True, validators=[MinValueValidator(0.0), MaxValueValidator(1.0)],
        help_text="How far apart identical code scores between runs on this board's runners (relative, e.g. 0.18), "
        "added to every interval a run reports; wins over the measured one. Empty: the spread measured by A/A runs "
        "per GPU type (Run spreads in the admin), else the platform's KERNELBOT_RUN_SPREAD (provisional).")
    imported = models.JSONField(
        default=dict, blank=True, editable=False, help_text="The values the last import named (deadline, gpus, "
        "run_spread): a re-import writes one only where the file's value differs from it (leaderboards/importing.py), "
        "so it never undoes an organiser's edit in the admin.")
    created = models.DateTimeField(auto_now_add=True)

    objects = LeaderboardQuerySet.as_manager()

    class Meta:
        ordering = ["deadline", "name"]

    def __str__(self) -> str:
        return self.name

    @property
    def has_started(self) -> bool:
        return self.starts_at is None or self.starts_at <= timezone.now()

    @property
    def is_finished(self) -> bool:
        return self.deadline <= timezone.now()

    @property
    def is_open(self) -> bool:
        return self.has_started and not self.is_finished

    @cached_property
    def cuda_warning(self) -> str:
        """Why runs on some of this board's GPU types fail before they start: its problem's code asks for CUDA and
        they have none ("" when nothing does). The board page and the admin show it; the importer refuses a board
        where no GPU type has CUDA unless forced."""
        definition = self.problem.definition
        lacking, requests = taskcheck.cuda_shortfall(
            definition.get("files") or {}, definition.get("lang", ""),
            taskcheck.entry_file(self.problem.harness, definition.get("main")), list(self.gpu_types.all()))
        text = taskcheck.cuda_warning(lacking, requests) if lacking else ""
        return text[:1].upper() + text[1:] + "." if text else ""


class Code(models.Model):
    """Submitted source, stored once per distinct content."""

    sha256 = models.CharField(max_length=64, unique=True)
    text = models.TextField()

    def __str__(self) -> str:
        return self.sha256[:12]

    @staticmethod
    def digest(text: str) -> str:
        return hashlib.sha256(text.encode()).hexdigest()


class SubmissionMode(models.TextChoices):
    TEST = "test", "Test"
    BENCHMARK = "benchmark", "Benchmark"
    LEADERBOARD = "leaderboard", "Leaderboard (ranked)"
    PROFILE = "profile", "Profile"


class SubmissionQuerySet(models.QuerySet):
    def visible_to(self, user) -> "SubmissionQuerySet":
        """Staff see every submission, owners their own, others the ranked ones of leaderboards they see (not the
        final standings' re-runs). `access.authority.may_see_submission` for one."""
        if user.is_staff:
            return self.filter(leaderboard__internal=False)
        others = Q(mode=SubmissionMode.LEADERBOARD, final_entry__isnull=True,
                   leaderboard__in=Leaderboard.objects.visible_to(user))
        return self.filter(others | Q(user=user) if user.is_authenticated else others)

    def code_visible_to(self, user) -> "SubmissionQuerySet":
        """Those whose code `user` may read: staff every one they see, owners theirs, everyone the visible ones of
        boards whose code is public (past the deadline). `access.authority.may_see_code` for one."""
        visible = self.visible_to(user)
        if user.is_staff:
            return visible
        public = Q(leaderboard__code_public_after_deadline=True, leaderboard__deadline__lte=timezone.now())
        return visible.filter(public | Q(user=user) if user.is_authenticated else public)

    def made(self) -> "SubmissionQuerySet":
        """Submissions their users made, not the final standings' re-runs of them (which are the finals')."""
        return self.filter(final_entry__isnull=True)

    def made_by(self, user) -> "SubmissionQuerySet":
        """The user's own submissions: what every front-end lists as theirs."""
        return self.made().filter(user=user)


class Submission(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="submissions")
    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="submissions")
    problem = models.ForeignKey(Problem, on_delete=models.PROTECT, related_name="submissions",
                                help_text="The exact problem version the runs evaluate.")
    file_name = models.CharField(max_length=255)
    code = models.ForeignKey(Code, on_delete=models.PROTECT, related_name="submissions")
    mode = models.CharField(max_length=12, choices=SubmissionMode.choices, default=SubmissionMode.LEADERBOARD)
    created = models.DateTimeField(auto_now_add=True, db_index=True)
    precheck = models.JSONField(
        "pre-check", default=dict, blank=True,
        help_text="KernelGuard's findings on the source at submission time ({} when it did not run); staff only.")
    final_entry = models.ForeignKey(
        "FinalEntry", null=True, blank=True, editable=False, on_delete=models.CASCADE, related_name="reruns",
        help_text="A re-run of that entry for the final standings (leaderboards/finals.py): on no board, in no quota.")
    final_round = models.PositiveIntegerField(null=True, blank=True, editable=False)

    objects = SubmissionQuerySet.as_manager()

    class Meta:
        ordering = ["-created"]

    def __str__(self) -> str:
        return f"#{self.pk} {isolated(self.file_name)} on {self.leaderboard}"

    @property
    def done(self) -> bool:
        return all(run.is_terminal for run in self.runs.all())

    @property
    def is_rerun(self) -> bool:
        """A re-run for the final standings (leaderboards/finals.py), not a submission its user made."""
        return self.final_entry_id is not None


class RunStatus(models.TextChoices):
    QUEUED = "queued"
    DISPATCHED = "dispatched"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    HACKED = "hacked"
    ERROR = "error"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.HACKED,
                               RunStatus.ERROR, RunStatus.CANCELLED})
ACTIVE_STATUSES = frozenset({RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.RUNNING})
TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.QUEUED: frozenset({RunStatus.QUEUED, RunStatus.DISPATCHED, RunStatus.CANCELLED, RunStatus.ERROR}),
    RunStatus.DISPATCHED: frozenset({RunStatus.RUNNING, RunStatus.QUEUED, *TERMINAL_STATUSES}),
    RunStatus.RUNNING: frozenset({RunStatus.QUEUED, *TERMINAL_STATUSES}),
    # terminal runs move only through an explicit requeue by an organiser
    **{status: frozenset({RunStatus.QUEUED}) for status in TERMINAL_STATUSES},
}
TIMESTAMP_FIELD = {RunStatus.QUEUED: "queued_at", RunStatus.DISPATCHED: "dispatched_at",
                   RunStatus.RUNNING: "started_at"}


# The task that calls a run's `on_finish` with its id and then marks it done (clears `Run.hook_due`).
RUN_HOOK_TASK = "leaderboards.lifecycle.do_run_hook"


class InvalidTransition(Exception):
    pass


class RunQuerySet(models.QuerySet):
    def active(self) -> "RunQuerySet":
        return self.filter(status__in=ACTIVE_STATUSES)

    def overdue(self, now=None) -> "RunQuerySet":
        return self.active().filter(status_deadline__lt=now or timezone.now())

    def ranked(self) -> "RunQuerySet":
        """Runs of ranked submissions; the final standings' re-runs (`Submission.final_entry`) rank on no board."""
        return self.filter(submission__mode=SubmissionMode.LEADERBOARD, submission__final_entry__isnull=True)


class Run(models.Model):
    """One evaluation: submission × GPU type × public/secret. `update_status` is its only state writer."""

    OUTPUT_CAP = 64 * 1024
    queued_ahead: int | None = None  # not stored: on new runs, the active runs of its GPU type queued before it

    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="runs")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="runs")
    secret = models.BooleanField(default=False)
    status = models.CharField(max_length=12, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True)
    attempt = models.PositiveIntegerField(default=0, help_text="Bumped on each dispatch; stale callbacks are "
                                          "ignored.")
    status_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    queued_at = models.DateTimeField(default=timezone.now)
    first_queued_at = models.DateTimeField(default=timezone.now, help_text="When it was first queued: a retry keeps "
                                           "its place in the queue (agents take the earliest first); set again only "
                                           "by an organiser's requeue.")
    dispatched_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    runner = models.CharField(max_length=60, blank=True, help_text="Pool and backend that ran the last attempt.")
    verdict = models.CharField(max_length=16, blank=True)
    passed = models.BooleanField(null=True)
    score = models.FloatField(null=True, blank=True, help_text="Seconds; lower is better.")
    ratio = models.FloatField(null=True, blank=True, help_text="Time / the reference's time, measured interleaved; "
                              "what boards rank on when every entry has one.")
    ratio_low = models.FloatField(null=True, blank=True, help_text="95 % interval of the ratio.")
    ratio_high = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    result = models.JSONField(default=dict, blank=True)
    system_info = models.JSONField(default=dict, blank=True)
    stdout = models.TextField(blank=True)
    stderr = models.TextField(blank=True)
    progress = models.JSONField(default=dict, blank=True)
    infra_failures = models.PositiveIntegerField(default=0)
    problem_error = models.BooleanField(  # db_default: the one-statement submit (actions.py) inserts runs in SQL
        default=False, db_default=False, help_text="It ended because the problem's own code failed (status error): "
        "not the competitor's failure, never charged to their quota.")
    on_finish = models.CharField(max_length=200, blank=True, help_text="Dotted path of the task called with the "
                                 "run's id after commit whenever the run ends or an ended run is requeued.")
    hook_due = models.DateTimeField(null=True, blank=True, help_text="Its on_finish task was sent and has not run "
                                    "yet: past this moment the reaper sends it again (its message may have been lost, "
                                    "e.g. sent while the broker was away).")
    pool = models.ForeignKey("runners.GpuPool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             help_text="Run only on this pool (health checks); empty: any pool serving the GPU type.")
    node = models.ForeignKey("runners.Node", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                             help_text="Run only on this node of its pool (a node's health check), in service or not.")

    objects = RunQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["submission", "gpu_type", "secret"], name="run_unique")]
        # the reaper's look every few seconds for owed on_finish tasks reads only the runs that owe one
        indexes = [models.Index(fields=["hook_due"], condition=Q(hook_due__isnull=False), name="run_hook_due"),
                   # /metrics' phase histograms read the runs finished in the last hours
                   models.Index(fields=["finished_at"], name="run_finished_at")]
        ordering = ["submission", "gpu_type", "secret"]

    def __str__(self) -> str:
        return f"run {self.pk} ({'secret' if self.secret else 'public'}) {self.status}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def between_run_spread(self) -> float | None:
        """What widens this run's intervals (`RunSpread.for_board`); None: the platform's default."""
        submission = self.submission
        return RunSpread.for_board(submission.leaderboard, submission.problem_id, self.gpu_type_id)[0]

    @property
    def mode(self) -> str:
        return self.submission.mode

    @staticmethod
    def deadline_for(status: str, seconds: int | None = None):
        seconds = seconds or settings.RUN_STATE_DEADLINES.get(status)
        return timezone.now() + timedelta(seconds=seconds) if seconds else None

    def update_status(self, status: str, *, deadline_seconds: int | None = None, reason: str | None = None,
                      attempt_fields: dict | None = None, at: datetime | None = None, **fields) -> None:
        """Move to `status`, stamp the time (`at`, default now) and deadline, record the attempt (a new one gets
        `attempt_fields`), save, and fire what follows after commit (the run's event; its `on_finish` task when it
        ends or an ended run is requeued). `reason` is why the current attempt ended (default: the run's `error`).

        Call inside a transaction holding a row lock (see actions)."""
        if status not in TRANSITIONS[self.status]:
            raise InvalidTransition(f"run {self.pk}: {self.status} → {status} is not allowed")
        now, previous = at or timezone.now(), self.status
        self.status = status
        for name, value in fields.items():
            setattr(self, name, value)
        if status in TIMESTAMP_FIELD and status != previous:
            setattr(self, TIMESTAMP_FIELD[status], now)
        if status == RunStatus.QUEUED:
            self.dispatched_at = self.started_at = self.finished_at = None
        self.status_deadline = self.deadline_for(status, deadline_seconds)
        if status in TERMINAL_STATUSES:
            self.finished_at = now
        hook = bool(self.on_finish) and (status in TERMINAL_STATUSES or previous in TERMINAL_STATUSES)
        if hook:  # saved with the status: the task is owed until it has run (`lifecycle.do_run_hook` clears it)
            self.hook_due = now + timedelta(seconds=settings.RUN_HOOK_RESEND)
        for name in ("stdout", "stderr"):
            value = getattr(self, name)
            if len(value) > self.OUTPUT_CAP:
                setattr(self, name, value[: self.OUTPUT_CAP] + "\n… [truncated]")
        self.save()
        if status == RunStatus.DISPATCHED:
            RunAttempt.objects.create(run=self, number=self.attempt, runner=self.runner, dispatched_at=now,
                                      **(attempt_fields or {}))
        elif previous in (RunStatus.DISPATCHED, RunStatus.RUNNING) and status != RunStatus.RUNNING:
            RunAttempt.objects.filter(run=self, number=self.attempt).update(
                finished_at=now, outcome="retried" if status == RunStatus.QUEUED else status,
                reason=self.error if reason is None else reason)
            allocator.end_attempt_holds(self.pk, self.attempt)  # the attempt left its devices
        transaction.on_commit(lambda: events.run_changed(self))
        if hook:
            enqueue_on_commit(RUN_HOOK_TASK, self.pk)


class RunAttempt(models.Model):
    """One dispatch of a run and how it ended; a retried attempt keeps its reason after the retry succeeds."""

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    runner = models.CharField(max_length=60, blank=True)
    dispatched_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=12, blank=True, help_text="The run's status after it, or 'retried'.")
    reason = models.TextField(blank=True)
    pool = models.ForeignKey("runners.GpuPool", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    nonce = models.CharField(max_length=64, blank=True, help_text="Public; the remote's token is HMAC(runner key, "
                             "'run:attempt:nonce').")
    external_id = models.CharField(max_length=200, blank=True, help_text="The backend's id of the remote job.")
    last_news_at = models.DateTimeField(null=True, blank=True, help_text="When the remote side or a poll last "
                                        "told us anything; runs without recent news are polled.")
    extended = models.BooleanField(default=False, help_text="Its deadline was extended once because the service "
                                   "said it was still running.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "number"], name="run_attempt_unique")]
        ordering = ["run", "number"]

    def __str__(self) -> str:
        return f"run {self.run_id} attempt {self.number} {self.outcome or 'in flight'}"


class Board(models.Model):
    """One ranking (leaderboard × GPU type): the row every rank update locks, and its change counter."""

    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="boards")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="boards")
    version = models.PositiveIntegerField(default=0)
    ranks_on_ratio = models.BooleanField(
        null=True, help_text="No ranked submission lacks a ratio, so entries rank on it (else on time); empty: "
        "the board was never rebuilt with rank keys and records, so its next update rebuilds it.")
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "gpu_type"], name="board_unique")]

    def __str__(self) -> str:
        return f"{self.leaderboard}/{self.gpu_type} v{self.version}"


# A board's order, the ranks' order (a rank is 1 + the entries with a smaller rank_key): index entry_board_order.
BOARD_ORDER = ("rank_key", "submitted_at", "submission_id")


class BoardEntryQuerySet(models.QuerySet):
    def for_board(self, leaderboard: Leaderboard, gpu_type: GpuType) -> "BoardEntryQuerySet":
        return self.filter(leaderboard=leaderboard, gpu_type=gpu_type).order_by(*BOARD_ORDER)

    def ahead_of(self, entry: "BoardEntry") -> "BoardEntryQuerySet":
        """The entries of `entry`'s board with a smaller key: its rank is 1 + their number (an index-only count)."""
        return self.filter(leaderboard_id=entry.leaderboard_id, gpu_type_id=entry.gpu_type_id,
                           rank_key__lt=entry.rank_key)

    def with_rank(self) -> "BoardEntryQuerySet":
        """Annotates each entry's `rank` with one count of the entries ahead of it: for a few entries from anywhere
        (a user's boards, an announcement); a board's pages number their rows with `page`."""
        ahead = (BoardEntry.objects.filter(leaderboard=OuterRef("leaderboard"), gpu_type=OuterRef("gpu_type"),
                                           rank_key__lt=OuterRef("rank_key"))
                 .order_by().values("leaderboard").annotate(n=Count("rank_key")).values("n"))
        return self.annotate(rank=Coalesce(Subquery(ahead), 0) + 1)

    def with_breakdown(self) -> "BoardEntryQuerySet":
        """Annotates `breakdown`: the ranked cases of the entry's public run, which its row shows, in the same query."""
        public = Run.objects.filter(submission_id=OuterRef("submission_id"), gpu_type_id=OuterRef("gpu_type_id"),
                                    secret=False).order_by("-pk")
        return self.annotate(breakdown=Subquery(public.values("result__ranked")[:1]))

    def page(self, start: int, stop: int) -> list["BoardEntry"]:
        """Rows [start, stop) of a `for_board` queryset, ranked (see `number_rows`)."""
        return number_rows(list(self[start:stop]), start)

    def leaders(self) -> "BoardEntryQuerySet":
        """The first entry of every board: one index probe per board."""
        first = (BoardEntry.objects.filter(leaderboard=OuterRef("leaderboard"), gpu_type=OuterRef("gpu_type"))
                 .order_by(*BOARD_ORDER).values("pk")[:1])
        return self.filter(pk__in=Board.objects.values(first=Subquery(first)))


def number_rows(rows: list["BoardEntry"], start: int) -> list["BoardEntry"]:
    """Sets `rank` on consecutive rows of a board's order, the first at position `start` (from 0). Ranks are
    standard competition ranks (1, 1, 3) of `rank_key`, so a row whose key differs from the row above ranks at its
    position + 1, and a row with the key above shares that rank; only a first row that does not open the board
    counts the entries ahead of it. Ranks are not stored: a result that passes 10 k entries writes one row."""
    for position, row in enumerate(rows, start):
        above = rows[position - start - 1] if position > start else None
        if above is not None:
            row.rank = above.rank if above.rank_key == row.rank_key else position + 1
        else:
            row.rank = BoardEntry.objects.ahead_of(row).count() + 1 if position else 1
    return rows


class BoardEntry(models.Model):
    """Materialised ranking row: a user's best passing ranked submission on one board."""

    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="entries")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="entries")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="board_entries")
    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="board_entries")
    score = models.FloatField(help_text="Seconds; lower is better.")
    ratio = models.FloatField(null=True, blank=True, help_text="Time / the reference's time (see Run.ratio).")
    ratio_low = models.FloatField(null=True, blank=True)
    ratio_high = models.FloatField(null=True, blank=True)
    rank_key = models.FloatField(help_text="What the board ranks on: the ratio, or the time when a ranked "
                                 "submission lacks a ratio (Board.ranks_on_ratio). The rank is read from it.")
    tied = models.BooleanField(default=False, help_text="Statistically tied with the entry ranked just above.")
    submitted_at = models.DateTimeField()
    updated = models.DateTimeField(auto_now=True)

    objects = BoardEntryQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "gpu_type", "user"], name="entry_unique")]
        indexes = [# the board's order: pages, a result's new rank, its neighbours and the ranks it moves past
                   models.Index(fields=["leaderboard", "gpu_type", "rank_key", "submitted_at", "submission"],
                                name="entry_board_order")]
        verbose_name_plural = "board entries"

    def __str__(self) -> str:
        return f"{self.leaderboard}/{self.gpu_type} {self.user}"


class Record(models.Model):
    """A ranked submission that beat every earlier one of its user on a board (submission order, on what the board
    ranks on: `score`): the user's progression; `board_best` when it beat every earlier submission on the board, the
    board's record progression, whose lowest point is rank 1. Appended as results arrive (ranks.do_rank_result),
    rebuilt with the board's ranks."""

    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="records")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="records")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="records")
    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="records")
    score = models.FloatField(help_text="What the board ranks on (Board.ranks_on_ratio): the ratio to the reference, "
                              "else seconds; lower is better.")
    submitted_at = models.DateTimeField()
    board_best = models.BooleanField(default=False, help_text="Beat every earlier submission on the board.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["leaderboard", "gpu_type", "submission"],
                                               name="record_unique")]
        indexes = [models.Index(fields=["leaderboard", "gpu_type", "user", "submitted_at", "submission"],
                                name="record_user_order"),
                   models.Index(fields=["leaderboard", "gpu_type", "submitted_at", "submission"],
                                condition=Q(board_best=True), name="record_board_order")]

    def __str__(self) -> str:
        return f"{self.leaderboard}/{self.gpu_type} {isolated(self.user)} {self.score:.3g}s"


PASSING_RANKED = Q(status=RunStatus.SUCCEEDED, passed=True, score__isnull=False)


class LiveEvent(models.Model):
    """Outbox for live updates when the channel layer is per-process (no REDIS_URL): a worker writes the
    event after commit and each ASGI process tails this table and re-sends it on its own layer."""

    group = models.CharField(max_length=100)
    payload = models.JSONField()
    origin = models.CharField(max_length=64, help_text="host:pid of the writer; it already delivered locally.")
    created = models.DateTimeField(auto_now_add=True, db_index=True)

    def __str__(self) -> str:
        return f"{self.group} {self.payload.get('type')}"


class FinalStatus(models.TextChoices):
    RUNNING = "running", "Re-runs in progress"
    DONE = "done", "Done, not published"
    PUBLISHED = "published", "Published"
    SUPERSEDED = "superseded", "Superseded by a later publication"
    CANCELLED = "cancelled", "Cancelled"


class Final(models.Model):
    """One re-verification of a leaderboard's final standings (leaderboards/finals.py): its top N entries of each GPU
    type re-run on inputs from a fresh secret seed, interleaved, and ranked from those runs."""

    leaderboard = models.ForeignKey(Leaderboard, on_delete=models.CASCADE, related_name="finals")
    status = models.CharField(max_length=12, choices=FinalStatus.choices, default=FinalStatus.RUNNING)
    top_n = models.PositiveIntegerField()
    rounds = models.PositiveIntegerField()
    seed = models.BigIntegerField(default=new_secret_seed, editable=False)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="+", help_text="Empty: started at the deadline.")
    publish_when_done = models.BooleanField(default=True, help_text="Publish as soon as the re-runs end (the "
                                            "deadline's); an organiser's re-run waits to be compared and published.")
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        constraints = [models.UniqueConstraint(fields=["leaderboard"], condition=Q(status="running"),
                                               name="final_one_running")]

    def __str__(self) -> str:
        return f"final standings of {self.leaderboard} #{self.pk} ({self.status})"


class FinalEntry(models.Model):
    """One board entry taken into a final re-verification, and where the re-runs put it."""

    final = models.ForeignKey(Final, on_delete=models.CASCADE, related_name="entries")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="+")
    submission = models.ForeignKey(Submission, on_delete=models.CASCADE, related_name="final_entries",
                                   help_text="The entry's submission, whose code is re-run.")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="final_entries")
    board_rank = models.PositiveIntegerField(help_text="Its rank on the board when the re-verification started.")
    position = models.PositiveIntegerField(help_text="Its turn within a round (the board's order).")
    rank = models.PositiveIntegerField(null=True, blank=True, help_text="Final rank; empty while running or dropped.")
    tied = models.BooleanField(default=False, help_text="Statistically tied with the entry ranked just above.")
    score = models.FloatField(null=True, blank=True, help_text="Seconds: geometric mean over the re-runs.")
    ratio = models.FloatField(null=True, blank=True)
    ratio_low = models.FloatField(null=True, blank=True)
    ratio_high = models.FloatField(null=True, blank=True)
    dropped = models.TextField(blank=True, help_text="Why it dropped out (a re-run did not pass); author and "
                               "organisers only.")

    class Meta:
        ordering = ["final", "gpu_type", "position"]
        constraints = [models.UniqueConstraint(fields=["final", "gpu_type", "submission"], name="final_entry_unique")]
        verbose_name_plural = "final entries"

    def __str__(self) -> str:
        return f"{self.final_id}/{self.gpu_type} {self.user}"


REFUSED_TALLY = "submissions_refused:"


class Tally(models.Model):
    """A counter kept in the database, so every web worker counts into the same one (/metrics reads it): e.g.
    `submissions_refused:429`."""

    name = models.CharField(max_length=60, primary_key=True)
    count = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.name} = {self.count}"

    @classmethod
    def add(cls, name: str, n: int = 1) -> None:
        if not cls.objects.filter(name=name).update(count=models.F("count") + n):
            obj, created = cls.objects.get_or_create(name=name, defaults={"count": n})
            if not created:
                cls.objects.filter(name=name).update(count=models.F("count") + n)


class RunSpread(models.Model):
    """The between-run spread of identical code measured for one problem on one GPU type: 1.96 sd of the log ratios
    of A/A runs (the reference timed against itself, run exactly as a submission: leaderboards/spread.py). Widens
    every interval of that problem on that GPU type unless its board sets its own `run_spread`."""

    problem = models.ForeignKey(Problem, on_delete=models.CASCADE, related_name="run_spreads")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="run_spreads")
    spread = models.FloatField(null=True, blank=True, help_text="Relative, 1.96 sd of the A/A runs' log ratios; "
                               "empty until measured (intervals then use KERNELBOT_RUN_SPREAD and are provisional).")
    samples = models.PositiveIntegerField(default=0, help_text="A/A runs the figure comes from.")
    measured_at = models.DateTimeField(null=True, blank=True)
    pending_since = models.DateTimeField(null=True, blank=True, help_text="A measurement's A/A runs were queued "
                                         "then and have not all ended; its figure replaces this one.")
    nodes = models.JSONField(default=dict, blank=True, help_text="Per node of the last measurement: its runs and "
                             "the geometric mean of their ratios.")
    warning = models.TextField(blank=True, help_text="A node whose A/A is far off the others', or a measurement "
                               "that kept too few runs.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["problem", "gpu_type"], name="run_spread_unique")]
        ordering = ["problem", "gpu_type"]

    def __str__(self) -> str:
        return f"{self.problem.name} v{self.problem.version} on {self.gpu_type}"

    @staticmethod
    def for_board(leaderboard: "Leaderboard", problem_id: int, gpu_type_id: int) -> tuple[float | None, str]:
        """The spread a run of `problem_id` on `leaderboard` and `gpu_type_id` is widened by and where it comes from:
        ("board": its organiser's), ("measured": A/A runs), or (None, "provisional"): the platform's default."""
        if leaderboard.run_spread is not None:
            return leaderboard.run_spread, "board"
        measured = RunSpread.objects.filter(problem_id=problem_id, gpu_type_id=gpu_type_id, spread__isnull=False) \
            .values_list("spread", flat=True).first()
        return (measured, "measured") if measured is not None else (None, "provisional")
