"""Reservations, the device holds that runs and reservations take through the allocator, pool policy, node samples."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.utils import timezone

from runners.models import Gpu, GpuPool, GpuType, Node


class PoolPolicy(models.Model):
    """How a pool is lent: who may take how much, for how long, what stays for competitions, how access is given."""

    pool = models.OneToOneField(GpuPool, on_delete=models.CASCADE, primary_key=True,
                                related_name="reservation_policy")
    reservable = models.BooleanField(default=True, help_text="Off: no new reservations (running ones keep going).")
    max_gpus_per_user = models.PositiveSmallIntegerField(default=8, help_text="GPUs one user may hold or wait for "
                                                         "at once (active + queued).")
    max_gpu_hours_per_user = models.FloatField(default=48, validators=[MinValueValidator(0)],
                                               help_text="GPU-hours one user may have booked at once (active + "
                                               "queued).")
    competition_share = models.FloatField(default=0.25, validators=[MinValueValidator(0), MaxValueValidator(1)],
                                          help_text="Share of the pool's devices reservations never take, so "
                                          "competitions keep running (rounded up).")
    max_duration_minutes = models.PositiveIntegerField(default=24 * 60, validators=[MinValueValidator(1)])
    max_queue_minutes = models.PositiveIntegerField(default=72 * 60, help_text="A request still queued after this "
                                                    "fails.")
    extend_max_delay_minutes = models.PositiveIntegerField(default=0, help_text="An extension may delay each queued "
                                                           "request's start by at most this much.")
    access_note = models.TextField(blank=True, help_text="Shown to the holder while active. Placeholders: "
                                   "{hostname} {gpus} {user} {id} {ends_at}.")
    start_hook = models.CharField(max_length=500, blank=True, help_text="Command run when a reservation starts; "
                                  "gets its details as JSON on stdin and KB_RESERVATION_* variables. Non-zero exit: "
                                  "the reservation fails and its devices are freed. Must be idempotent.")
    end_hook = models.CharField(max_length=500, blank=True, help_text="Command run when a reservation ends.")
    hook_timeout = models.PositiveSmallIntegerField(default=60, validators=[MinValueValidator(1)])

    class Meta:
        verbose_name = "reservation policy"
        verbose_name_plural = "reservation policies"

    def __str__(self) -> str:
        return f"policy of {self.pool.name}"


class ReservationStatus(models.TextChoices):
    PENDING = "pending"
    ACTIVE = "active"
    ENDED = "ended"
    EXPIRED = "expired"
    CANCELLED = "cancelled"
    FAILED = "failed"


TERMINAL = frozenset({ReservationStatus.ENDED, ReservationStatus.EXPIRED, ReservationStatus.CANCELLED,
                      ReservationStatus.FAILED})
OPEN = frozenset({ReservationStatus.PENDING, ReservationStatus.ACTIVE})
TRANSITIONS = {
    ReservationStatus.PENDING: frozenset({ReservationStatus.ACTIVE, ReservationStatus.CANCELLED,
                                          ReservationStatus.FAILED}),
    ReservationStatus.ACTIVE: frozenset({ReservationStatus.ENDED, ReservationStatus.EXPIRED,
                                         ReservationStatus.FAILED}),
}


class InvalidTransition(Exception):
    pass


class ReservationQuerySet(models.QuerySet):
    def open(self) -> ReservationQuerySet:
        return self.filter(status__in=OPEN)

    def queue(self, pool: GpuPool, gpu_type: GpuType) -> ReservationQuerySet:
        """The FCFS order of one pool × GPU type's waiting requests."""
        return self.filter(pool=pool, gpu_type=gpu_type, status=ReservationStatus.PENDING).order_by("created", "pk")


class Reservation(models.Model):
    """GPUs of one type on one node of a pool, for a while. `update_status` is its only state writer."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reservations")
    project = models.CharField(max_length=60, help_text="Label usage reports group by.")
    pool = models.ForeignKey(GpuPool, on_delete=models.PROTECT, related_name="reservations")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="reservations")
    gpu_count = models.PositiveSmallIntegerField(validators=[MinValueValidator(1)], help_text="GPUs on each node.")
    node_count = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)],
                                                  help_text="Nodes, all or nothing, each with gpu_count GPUs.")
    minutes = models.PositiveIntegerField(help_text="Duration, extensions included.")
    status = models.CharField(max_length=10, choices=ReservationStatus.choices, default=ReservationStatus.PENDING,
                              db_index=True)
    status_deadline = models.DateTimeField(null=True, blank=True, db_index=True)
    created = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    node = models.ForeignKey(Node, on_delete=models.PROTECT, null=True, blank=True, related_name="reservations")
    planned_start = models.DateTimeField(null=True, blank=True, help_text="While queued: the planner's start time.")
    planned_gpus = models.JSONField(default=list, blank=True)
    warned_30_at = models.DateTimeField(null=True, blank=True)
    warned_5_at = models.DateTimeField(null=True, blank=True)
    start_hook_done_at = models.DateTimeField(null=True, blank=True)
    end_hook_done_at = models.DateTimeField(null=True, blank=True)
    hook_attempts = models.PositiveSmallIntegerField(default=0)
    access = models.JSONField(default=dict, blank=True, help_text="What the holder needs to attach (note, command).")
    failure = models.TextField(blank=True)

    objects = ReservationQuerySet.as_manager()

    class Meta:
        ordering = ["-created", "-pk"]
        indexes = [models.Index(fields=["pool", "gpu_type", "status", "created"])]

    def __str__(self) -> str:
        return f"reservation {self.pk}: {self.gpu_count}× {self.gpu_type} {self.status}"

    def gpus(self) -> list[Gpu]:
        return list(Gpu.objects.filter(pk__in=self.planned_gpus).select_related("node").order_by(
            "node__hostname", "index")) if self.node_id else []

    def hostnames(self) -> list[str]:
        """Its nodes' names, the first node first (a request over several nodes has one `node`, the first)."""
        names = [g.node.hostname for g in self.gpus()]
        first = [self.node.hostname] if self.node_id else []
        return list(dict.fromkeys(first + sorted(names)))

    @property
    def total_gpus(self) -> int:
        return self.gpu_count * self.node_count

    @property
    def is_open(self) -> bool:
        return self.status in OPEN

    def update_status(self, status: str, now=None, **fields) -> None:
        """Check the transition, stamp its time and the new state's deadline, save (the caller holds the row lock)."""
        if status not in TRANSITIONS.get(self.status, ()):
            raise InvalidTransition(f"reservation {self.pk}: {self.status} → {status}")
        now = now or timezone.now()
        self.status = status
        if status == ReservationStatus.ACTIVE:
            self.started_at = now
            self.ends_at = now + timedelta(minutes=self.minutes)
            self.status_deadline = self.ends_at
        else:
            self.finished_at = now
            self.status_deadline = None
        for name, value in fields.items():
            setattr(self, name, value)
        self.save()


class HoldKind(models.TextChoices):
    RUN = "run"
    RESERVATION = "reservation"


class DeviceHoldQuerySet(models.QuerySet):
    def held(self) -> DeviceHoldQuerySet:
        return self.filter(ended__isnull=True)


class DeviceHold(models.Model):
    """One device given to one run attempt or one reservation for an interval: the allocator's only output, and what
    usage reports add up. At most one open hold per device (a partial unique index), whatever the code above does."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="holds")
    # copied from the device and the holder, so a year of reports reads one table
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="+")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=12, choices=HoldKind.choices)
    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, null=True, blank=True,
                                    related_name="holds")
    run_id = models.BigIntegerField(null=True, blank=True, help_text="For runs (no foreign key: runners sits below "
                                    "leaderboards).")
    run_attempt = models.PositiveIntegerField(null=True, blank=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
                             related_name="+")
    project = models.CharField(max_length=60, blank=True)
    leaderboard = models.CharField(max_length=100, blank=True)
    started = models.DateTimeField()
    ends = models.DateTimeField(help_text="Planned end: a reservation's expiry, a run's time limit.")
    lease_until = models.DateTimeField(null=True, blank=True, help_text="Runs: renewed while the worker lives; a "
                                       "lapsed lease ends the hold.")
    ended = models.DateTimeField(null=True, blank=True)

    objects = DeviceHoldQuerySet.as_manager()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["gpu"], condition=Q(ended__isnull=True),
                                               name="one_open_hold_per_gpu")]
        indexes = [models.Index(fields=["started"]), models.Index(fields=["ended"]),
                   models.Index(fields=["gpu", "ended"])]

    def __str__(self) -> str:
        return f"{self.kind} hold of {self.gpu_id} from {self.started:%Y-%m-%d %H:%M}"


class ReservationEvent(models.Model):
    """What happened to a reservation, in order: the web page's notices, the CLI's messages, the API's log."""

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=16)
    message = models.TextField()
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "pk"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


class UsageDay(models.Model):
    """GPU-seconds of ended holds per UTC day and holder, with the nodes used: added in the transaction that ends each
    hold (`usage.add_hold`, exactly once, as the end itself), so a year's report reads a few rows per day and holder
    instead of every hold. Open holds and the window's partial days are read from the holds themselves."""

    day = models.DateField()
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="+")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=12, choices=HoldKind.choices)
    project = models.CharField(max_length=60, blank=True)
    leaderboard = models.CharField(max_length=100, blank=True)
    user_id = models.BigIntegerField(default=0, help_text="The holder (0: none); no foreign key, so a deleted "
                                     "user's hours stay counted.")
    gpu_seconds = models.FloatField(default=0)
    nodes = models.JSONField(default=list, help_text="Ids of the nodes used that day.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "pool", "gpu_type", "kind", "project", "leaderboard",
                                                       "user_id"], name="one_usage_row_per_day_and_holder")]

    def __str__(self) -> str:
        return f"{self.day} {self.project or self.leaderboard}: {self.gpu_seconds / 3600:.2f} GPU-h"


class NodeSample(models.Model):
    """One device's utilisation as the node agent read it from nvidia-smi, with the holder of the device then (copied
    when it is recorded, so utilisation per holder needs no join against a year of holds)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="samples")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    at = models.DateTimeField()
    utilization = models.FloatField(validators=[MinValueValidator(0), MaxValueValidator(100)])
    memory_used_mib = models.PositiveIntegerField(default=0)
    held = models.BooleanField(default=False, help_text="A run or a reservation held the device.")
    project = models.CharField(max_length=60, blank=True)
    leaderboard = models.CharField(max_length=100, blank=True)
    user_id = models.BigIntegerField(default=0)

    class Meta:
        indexes = [models.Index(fields=["at"])]

    def __str__(self) -> str:
        return f"{self.gpu_id} at {self.at:%Y-%m-%d %H:%M}: {self.utilization:g} %"


class UsagePost(models.Model):
    """One daily usage post to one channel, so the hourly schedule posts each day once."""

    day = models.DateField()
    channel = models.CharField(max_length=40)
    posted = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["day", "channel"], name="one_usage_post_per_day")]

    def __str__(self) -> str:
        return f"{self.channel} {self.day}"


class SlackCommand(models.Model):
    """A signed Slack command already answered: its signature is remembered for the signature's window, so the same
    request sent again is refused (Slack signs each request once, with its time)."""

    signature = models.CharField(max_length=80, unique=True)
    received = models.DateTimeField(default=timezone.now, db_index=True)

    def __str__(self) -> str:
        return f"Slack command at {self.received:%Y-%m-%d %H:%M:%S}"


class SshKeySource(models.TextChoices):
    MANUAL = "manual"
    GITHUB = "github"


class SshKey(models.Model):
    """A user's SSH public key, placed on the nodes of their reservations while they last. `key` is the normalised
    `type base64` pair checked by `keys.parse_key` (no options, no comment), the only part ever written to a node."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="ssh_keys")
    key = models.TextField()
    title = models.CharField(max_length=100, blank=True)
    fingerprint = models.CharField(max_length=60, help_text="SHA256:… as ssh-keygen -l prints it.")
    source = models.CharField(max_length=10, choices=SshKeySource.choices, default=SshKeySource.MANUAL)
    github_login = models.CharField(max_length=39, blank=True, help_text="Imported keys: the GitHub login.")
    created = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["created", "pk"]
        constraints = [models.UniqueConstraint(fields=["user", "fingerprint"], name="one_ssh_key_per_fingerprint")]

    def __str__(self) -> str:
        return f"{self.fingerprint} ({self.title or self.source})"
