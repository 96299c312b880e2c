"""GPU inventory: which devices exist, on which node, and which runner backend reaches them."""

from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Case, OuterRef, Subquery, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone


class GpuVendor(models.TextChoices):
    NVIDIA = "nvidia", "NVIDIA"
    AMD = "amd", "AMD"
    INTEL = "intel", "Intel"
    CPU = "cpu", "CPU (no accelerator)"


class GpuType(models.Model):
    name = models.CharField(max_length=40, unique=True, help_text="As users type it, e.g. H100, MI300, CPU.")
    vendor = models.CharField(max_length=16, choices=GpuVendor.choices, default=GpuVendor.NVIDIA)
    architecture = models.CharField(max_length=40, blank=True, help_text="e.g. sm_90, gfx942, x86_64.")

    class Meta:
        verbose_name = "GPU type"
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_cpu(self) -> bool:
        return self.vendor == GpuVendor.CPU

    @property
    def runs_cuda(self) -> bool:
        """Whether torch's "cuda" device exists there: NVIDIA GPUs, and AMD's under ROCm, which answers to that name."""
        return self.vendor in (GpuVendor.NVIDIA, GpuVendor.AMD)


class RunnerBackendName(models.TextChoices):
    LOCAL = "local", "Node agents"
    GITHUB = "github", "GitHub Actions"
    MODAL = "modal", "Modal"
    SLURM = "slurm", "Slurm"


class PoolHealth(models.TextChoices):
    UNKNOWN = "unknown", "Not checked yet"
    OK = "ok", "OK"
    FAILING = "failing", "Failing"


class NodeService(models.TextChoices):
    """Whether a node of a local pool takes runs, and why not. Out of service, it takes only the health-check runs
    pinned to it (how it proves itself again), none at all while its sandbox cannot hold a run."""

    IN_SERVICE = "in_service", "In service"
    NO_AGENT = "no_agent", "No live agent"
    SANDBOX = "sandbox", "Cannot satisfy the pool's sandbox mode"
    FAILED_CHECK = "failed_check", "Failed its health check"


class GpuPoolQuerySet(models.QuerySet):
    def serving(self, gpu_type: GpuType) -> "GpuPoolQuerySet":
        """Enabled, with an enabled device of `gpu_type` on an enabled node: an EXISTS per pool, not a join over every
        device made distinct (30+ ms of the database's time per dispatch at 8,000 devices)."""
        devices = Gpu.objects.filter(node__pool=models.OuterRef("pk"), node__enabled=True, enabled=True,
                                     gpu_type=gpu_type)
        return self.filter(models.Exists(devices), enabled=True)

    def taking_runs(self, gpu_type: GpuType) -> "GpuPoolQuerySet":
        """Serving `gpu_type` and not failing its health check (a pool not checked yet takes runs); a node agents' pool
        also needs one of its nodes with a device of the type in service (it fails its check only when none is)."""
        in_service = Node.objects.filter(pool=models.OuterRef("pk"), enabled=True, service=NodeService.IN_SERVICE,
                                         gpus__enabled=True, gpus__gpu_type=gpu_type)
        return self.serving(gpu_type).exclude(health=PoolHealth.FAILING).filter(
            ~models.Q(backend=RunnerBackendName.LOCAL) | models.Exists(in_service))

    def with_failing_since(self) -> "GpuPoolQuerySet":
        """`failing_since`: when the pool's current failure began, the end of the first check that failed after its
        last pass (the oldest kept, `POOL_CHECK_KEEP_DAYS`); None for a pool whose last check passed."""
        first = PoolCheck.objects.filter(
            pool=OuterRef("pk"), outcome=CheckOutcome.FAILING, finished_at__isnull=False,
            finished_at__gt=Coalesce(OuterRef("last_ok_at"), Value(datetime.min.replace(tzinfo=UTC))))
        return self.annotate(failing_since=Case(When(health=PoolHealth.FAILING, then=Subquery(
            first.order_by("finished_at").values("finished_at")[:1]))))


class GpuPool(models.Model):
    name = models.CharField(max_length=60, unique=True)
    backend = models.CharField(max_length=16, choices=RunnerBackendName.choices, default=RunnerBackendName.LOCAL)
    settings = models.JSONField(default=dict, blank=True, help_text="Backend settings (no secrets: those come "
                                "from the environment).")
    enabled = models.BooleanField(default=True, help_text="A disabled pool takes no runs (a health check may still "
                                  "run on it, to try it before enabling it).")
    health = models.CharField(max_length=8, choices=PoolHealth.choices, default=PoolHealth.UNKNOWN, editable=False,
                              help_text="The last health check's outcome; a failing pool takes no runs until a "
                              "check passes.")
    health_detail = models.TextField(blank=True, editable=False)
    last_checked_at = models.DateTimeField("last checked", null=True, blank=True, editable=False)
    last_ok_at = models.DateTimeField("last passed", null=True, blank=True, editable=False)
    memory_limit_mib = models.PositiveIntegerField(
        "memory limit (MiB)", null=True, blank=True,
        validators=[MinValueValidator(1024, "At least 1024 MiB: importing torch alone takes several hundred."),
                    MaxValueValidator(1 << 24, "At most 16 TiB (16777216 MiB).")],
        help_text="Memory one run's whole process tree may use on a node of this pool (a memory cgroup). Empty: "
                  "min(8 GiB, 40 % of the node's memory, its share: physical memory minus max(2 GiB, 20 %) divided by "
                  "its enabled devices). A node never grants more than that total, whatever is set here.")
    disk_limit_mib = models.PositiveIntegerField(
        "disk limit (MiB)", null=True, blank=True,
        validators=[MinValueValidator(64, "At least 64 MiB: the run's own files and caches live there."),
                    MaxValueValidator(1 << 24, "At most 16 TiB (16777216 MiB).")],
        help_text="What one run's files in its working directory may take together (measured; the run is killed "
                  "past it). Empty: 1024 MiB.")
    cpus_per_device = models.PositiveSmallIntegerField(
        "CPU cores per device", null=True, blank=True,
        validators=[MinValueValidator(1, "At least 1 core."), MaxValueValidator(1024, "At most 1024 cores.")],
        help_text="CPU cores one run may use per device it holds on a node of this pool (its cpu cgroup's quota; "
                  "never more than the node has). Empty: its devices' share of the node's cores less max(1, 1/8) "
                  "kept for the host, at least one core.")

    objects = GpuPoolQuerySet.as_manager()

    class Meta:
        verbose_name = "GPU pool"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.get_backend_display()})"

    @property
    def is_local(self) -> bool:
        return self.backend == RunnerBackendName.LOCAL


def agents_live_since():
    """A node whose agent asked for work since this moment has a live agent (KERNELBOT_AGENT_DEADLINE)."""
    return timezone.now() - timedelta(seconds=settings.AGENT_DEADLINE)


def node_state(service: str, agent_seen_at: datetime | None, live_since: datetime) -> str:
    """The one reading of a local pool's node that the admin, the health API and /metrics show: its `service`, but no
    agent for a node in service whose agent was not heard from since `live_since` (`agents_live_since`), which the
    reaper also records on the row within seconds (`lifecycle.do_mark_silent_nodes`)."""
    if service == NodeService.IN_SERVICE and (agent_seen_at is None or agent_seen_at < live_since):
        return NodeService.NO_AGENT
    return service


NO_AGENT_HEARD = "no agent heard from on {hostname} within {seconds} s: its devices get no run"


class Node(models.Model):
    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=120)
    enabled = models.BooleanField(default=True)
    sandbox = models.JSONField(default=dict, blank=True, editable=False,
                               help_text="The sandbox facts of its last probe (`runners.harness.probe`: mode, backend, "
                                         "the memory cgroup runs are nested in or why none is usable); empty: never "
                                         "probed.")
    probed_at = models.DateTimeField("probed", null=True, blank=True, editable=False,
                                     help_text="When its sandbox facts were reported (its agent's registration, or "
                                               "`manage.py register_node`).")
    agent_seen_at = models.DateTimeField("agent last seen", null=True, blank=True, editable=False,
                                         help_text="When the node's agent (`python -m runners.harness.node`) last "
                                                   "asked for work; a node whose agent is not live gets no run.")
    agent = models.JSONField(default=dict, blank=True, editable=False,
                             help_text="What its agent said when it registered: pid, python, harness version, the "
                                       "device indices it found, when it started.")
    samples = models.JSONField(default=list, blank=True, editable=False,
                               help_text="Its devices' utilisation and memory as its agent last sampled them "
                                         "(nvidia-smi): [{index, utilization, memory_used, memory_total}], bytes.")
    service = models.CharField(max_length=16, choices=NodeService.choices, default=NodeService.IN_SERVICE,
                               editable=False, help_text="Out of service, a node of a local pool takes no run but "
                               "its health check's; its pool takes runs while another node serves the GPU type.")
    service_detail = models.TextField("out of service because", blank=True, editable=False)
    service_since = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["pool", "hostname"], name="node_unique_per_pool")]
        ordering = ["pool", "hostname"]

    def __str__(self) -> str:
        return self.hostname

    def agent_live(self) -> bool:
        return self.agent_seen_at is not None and self.agent_seen_at >= agents_live_since()

    @property
    def in_service(self) -> bool:
        return self.service == NodeService.IN_SERVICE

    @property
    def state(self) -> str:
        """`node_state`: its service as everything shows it."""
        return node_state(self.service, self.agent_seen_at, agents_live_since())

    @property
    def state_detail(self) -> str:
        if self.state == self.service:
            return self.service_detail
        return NO_AGENT_HEARD.format(hostname=self.hostname, seconds=settings.AGENT_DEADLINE)

    def set_service(self, service: str, detail: str = "") -> bool:
        """Record whether the node is in service and why not (its row only); True when that changed."""
        if (self.service, self.service_detail) == (service, detail):
            return False
        if service != self.service:
            self.service_since = timezone.now()
        self.service, self.service_detail = service, detail
        Node.objects.filter(pk=self.pk).update(service=service, service_detail=detail,
                                               service_since=self.service_since)
        return True


class Gpu(models.Model):
    """One physical device, so reservations and scheduling can lock real hardware."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    gpu_type = models.ForeignKey(GpuType, on_delete=models.PROTECT, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="Device index on the node (CUDA_VISIBLE_DEVICES).")
    uuid = models.CharField("UUID", max_length=64, blank=True, help_text="As the node reports it (filled in by a "
                            "device check).")
    device_name = models.CharField("device", max_length=120, blank=True,
                                   help_text="The device's own name, e.g. NVIDIA H100 80GB HBM3 (from a device check).")
    memory_mib = models.PositiveIntegerField("memory (MiB)", null=True, blank=True)
    checked_at = models.DateTimeField("checked", null=True, blank=True,
                                      help_text="When a device check last found this device as claimed.")
    enabled = models.BooleanField(default=True)

    class Meta:
        verbose_name = "GPU"
        constraints = [models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index_per_node")]
        ordering = ["node", "index"]

    def __str__(self) -> str:
        return f"{self.gpu_type} #{self.index} on {self.node}"


class CheckOutcome(models.TextChoices):
    PENDING = "pending", "Running"
    OK = "ok", "Passed"
    FAILING = "failing", "Failed"


class PoolCheck(models.Model):
    """One health check of a pool: a device check of its nodes, or a tiny known run of one GPU type pinned to it
    (on a node agents' pool, to one node). Checks started together are one round; the pool's health is its latest
    round's outcome (a node agents' pool: failing only while none of its nodes is in service)."""

    pool = models.ForeignKey(GpuPool, on_delete=models.CASCADE, related_name="checks")
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="checks")
    gpu_type = models.ForeignKey(GpuType, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    run_id = models.PositiveBigIntegerField(null=True, blank=True, unique=True,
                                            help_text="The check's run (an internal, hidden leaderboard's).")
    started_at = models.DateTimeField(default=timezone.now, db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=8, choices=CheckOutcome.choices, default=CheckOutcome.PENDING)
    detail = models.TextField(blank=True)

    class Meta:
        verbose_name = "pool health check"
        ordering = ["-started_at", "-pk"]

    def __str__(self) -> str:
        return f"{self.pool.name} {self.gpu_type or 'nodes'} {self.get_outcome_display()}"
