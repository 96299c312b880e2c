"""A run's life, in one place: dispatch to a pool's backend, the attempt's reports (running, progress, result,
failure, heartbeat), polling remote runs, deadlines (the reaper), retries on another pool, cancellation.

Backends get plain data (`Dispatch`) and an `AttemptReporter`; remote harnesses reach the same functions through the
runner API (`leaderboards.runner_api`). Every report names its attempt: a stale or repeated one changes nothing.
What the competition does with a finished run is the run's `on_finish` task (set by `do_submit`), not known here.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Case, F, Q, Value, When
from django.db.models.functions import Coalesce
from django.utils import timezone
from django.utils.module_loading import import_string

from runners import wakeups
from runners.actions import do_fail_pool, do_node_back_in_service
from runners.backends.base import (
    BackendUnavailable,
    Dispatch,
    Poll,
    RemoteState,
    RunnerBackend,
    attempt_token,
    backend_for,
    platform_url,
    queue_timeout,
)
from runners.harness.device import OOM_UNKNOWN_FLAG, UNKNOWN_PREFIX
from runners.harness.probe import device_is
from runners.harness.result import NEEDS_CUDA, NEEDS_CUDA_FLAG, PROBLEM_BROKEN, PROBLEM_ERROR_FLAG
from runners.jobs import gpu_count, job_payload, run_limits, sandbox_uid, total_timeout
from runners.models import (
    NO_AGENT_HEARD,
    Gpu,
    GpuPool,
    GpuType,
    Node,
    NodeService,
    RunnerBackendName,
    agents_live_since,
)
from runners.queue import enqueue, enqueue_on_commit
from runners.reservations import allocator

from . import events, ranks
from .models import RUN_HOOK_TASK, Problem, Run, RunAttempt, RunStatus, SubmissionMode
from .placement import agent_serves, candidate_pools
from .scoring import final_progress, phase_totals, ratio_fields, ratio_from_result, score_from_result
from .serializers import problem_error_of

log = logging.getLogger(__name__)
DISPATCH_TASK = "leaderboards.tasks.dispatch_run"
CANCEL_TASK = "leaderboards.tasks.cancel_remote_job"
POLL_TASK = "leaderboards.tasks.poll_attempt"
FAILING_VERDICT_STATUS = {"timeout": RunStatus.TIMED_OUT, "hacked": RunStatus.HACKED}
# what a competitor reads of an infrastructure failure; its detail is the attempt's reason (Admin → Runs)
INFRA_RETRYING = "a runner failed while running it (not your code's fault); it is being run again"
INFRA_GAVE_UP = ("the runners failed {failures} times while running it (not your code's fault); the organisers can see "
                 "why")
MISCONFIGURED = "its runners are misconfigured (not your code's fault); the organisers can see why"
CLAIM_ORDER = ("first_queued_at", "pk")  # which dispatched run a node agent claims first: a retry keeps its place
# internal runs (health checks) yield to competitors' runs in a claim
INTERNAL_LAST = Case(When(submission__leaderboard__internal=True, then=Value(1)), default=Value(0))
PROBLEM_TEXTS = ("submission__problem__definition", "submission__problem__description",
                 "submission__problem__broken_error")
WAITS_FOR_FIX = "its runners are misconfigured (not your code's fault); it runs once they are fixed"


def _locked_run(run_id: int) -> Run:
    """The run's row, locked; its submission, leaderboard and GPU type come along unlocked (locked, every result of
    a leaderboard or a GPU type waited on the others)."""
    return Run.objects.select_for_update(of=("self",)).select_related("submission__leaderboard", "gpu_type").get(
        pk=run_id)


def _attempt(run: Run) -> RunAttempt | None:
    return RunAttempt.objects.select_related("pool").filter(run=run, number=run.attempt).first()


# --- dispatch ----------------------------------------------------------------------------------------------------

def dispatch_on_commit(run_id: int) -> None:
    """Once the transaction commits, hand the queued run over (`dispatch_here`)."""
    transaction.on_commit(lambda: dispatch_here(run_id))


def dispatch_here(run_id: int) -> None:
    """A run bound for a node agents' pool is dispatched in this process, now: that is a few queries and a wake-up
    (no network; its agents claim it), so a submission is claimable as soon as it is written, not once a worker
    has taken the task from the queue (seconds behind a burst). A run for a remote backend, and one that could not
    be handed over here, goes to the workers (`DISPATCH_TASK`); the reaper re-sends a queued run that neither
    reached (its message lost)."""
    try:
        if dispatch_run(run_id, local_only=True):
            return
    except Exception:  # after commit: the submission is saved, so whatever went wrong here is the workers' to retry
        log.exception("run %s: could not dispatch it here; the workers will", run_id)
    enqueue(DISPATCH_TASK, run_id)


def dispatch_run(run_id: int, *, local_only: bool = False) -> bool:
    """Hand a queued run to a pool's backend (the django-q task): a remote backend submits and returns; on a local
    pool the run waits, dispatched, for one of the pool's node agents to claim it (`do_claim_runs`). Never runs the
    harness here. Idempotent: anything but a queued run is left alone. `local_only`: a run whose pool is remote is
    left queued and False returned (the caller sends it to the workers); True otherwise."""
    with transaction.atomic():
        run = Run.objects.select_for_update(of=("self",)).select_related("gpu_type").filter(pk=run_id).first()
        if run is None or run.status != RunStatus.QUEUED:
            return True
        pools = candidate_pools(run)
        if not pools and not run.pool_id and GpuPool.objects.serving(run.gpu_type).exists():
            return True  # every pool of its type fails its health check: it waits queued; one passing sends it again
        if not pools:
            pinned = f" on pool #{run.pool_id}" if run.pool_id else ""
            run.update_status(RunStatus.ERROR, error=f"no enabled GPU pool serves {run.gpu_type}{pinned}")
            return True
        pool = pools[0]
        if local_only and not pool.is_local:
            return False
        try:
            backend = backend_for(pool)
        except BackendUnavailable as exc:  # configuration, not chance: the pool's, which fails until a check passes
            log.warning("pool %s is unusable: %s", pool.name, exc)
            do_fail_pool(pool, f"its backend is unusable here: {exc}")
            if run.pool_id:  # a check's (internal) run: its check fails, saying why; other runs wait for a pool
                run.update_status(RunStatus.ERROR, error=str(exc))
            return True
        deadline, nonce = queue_timeout(pool), secrets.token_hex(16)
        run.update_status(RunStatus.DISPATCHED, attempt=run.attempt + 1, runner=str(pool)[:60],
                          deadline_seconds=deadline, attempt_fields={"pool": pool, "nonce": nonce})
        attempt = run.attempt
        if pool.is_local and run.node_id:  # pinned (a node's health check, an A/A run): only its node's agent can
            wakeups.node_changed(run.node_id)  # claim it, so that one asks, not the pool's longest waiter
        elif pool.is_local:
            wakeups.run_dispatched(pool.pk, run.gpu_type_id)  # on commit: a waiting node agent claims it
        if not backend.remote:  # nothing to start: the run waits for a node agent's claim, which builds its job
            return True
        job = Dispatch(run_id=run.pk, attempt=attempt, nonce=nonce, token=attempt_token(pool, run.pk, attempt, nonce),
                       platform_url=platform_url(pool),
                       gpu_type=run.gpu_type, gpu_count=gpu_count(_with_definition(run)),
                       timeout_s=total_timeout(run), label=f"kernelbot run {run.pk} attempt {attempt}",
                       user_id=run.submission.user_id, project=run.submission.leaderboard.name)
    reporter = AttemptReporter(run_id, attempt)
    try:
        external_id = backend.dispatch(job, reporter)
    except BackendUnavailable as exc:  # the service refused the pool's configuration: retrying would not help
        log.warning("dispatch of run %s attempt %s refused: %s", run_id, attempt, exc)
        do_fail_pool(pool, f"{pool.get_backend_display()} refused the pool's configuration: {exc}")
        do_fail_configuration(run_id, attempt, str(exc))
        return True
    except Exception as exc:
        log.exception("dispatch of run %s attempt %s failed", run_id, attempt)
        reporter.failure(f"dispatch to {pool} failed: {type(exc).__name__}: {exc}")
        return True
    _store_external_id(backend, run_id, attempt, external_id or "")
    return True


def _with_definition(run: Run) -> Run:
    return Run.objects.select_related("submission__problem", "gpu_type").get(pk=run.pk)


def _store_external_id(backend: RunnerBackend, run_id: int, attempt: int, external_id: str) -> None:
    with transaction.atomic():
        run = _locked_run(run_id)
        RunAttempt.objects.filter(run_id=run_id, number=attempt).update(external_id=external_id[:200])
        gone = run.attempt != attempt or run.is_terminal or run.status == RunStatus.QUEUED
    if gone and external_id:  # cancelled or retried while we were submitting: the job must not linger
        _cancel_quietly(backend, external_id)


def _cancel_quietly(backend: RunnerBackend, external_id: str) -> None:
    try:
        backend.cancel(external_id)
    except Exception:
        log.exception("cancelling %s on %s failed", external_id, backend.pool)


def cancel_remote_job(pool_id: int, external_id: str) -> None:
    """Cancel a remote job (a django-q task: network calls stay out of the run's transaction)."""
    pool = GpuPool.objects.filter(pk=pool_id).first()
    if pool is None or not external_id:
        return
    try:
        backend = backend_for(pool)
    except BackendUnavailable:
        log.warning("cannot cancel %s: %s's backend is unavailable", external_id, pool)
        return
    _cancel_quietly(backend, external_id)


def _cancel_attempt_after_commit(attempt: RunAttempt | None) -> None:
    if attempt is not None and attempt.pool_id and attempt.external_id:
        enqueue_on_commit(CANCEL_TASK, attempt.pool_id, attempt.external_id)


# --- an attempt's reports ----------------------------------------------------------------------------------------

@dataclass
class AttemptReporter:
    """`runners.backends.base.Reporter` for one attempt. A remote attempt's deadline follows its agent's word
    (`remote_deadline`: silence, within its budget); a node agent's follows its heartbeats."""

    run_id: int
    attempt: int
    remote: bool = True

    def running(self) -> bool:
        return do_mark_running(self.run_id, self.attempt, remote=self.remote)

    def progress(self, event: dict) -> None:
        do_record_progress(self.run_id, self.attempt, event, remote=self.remote)

    def result(self, result: dict) -> bool:
        return do_ingest_result(self.run_id, self.attempt, result)

    def failure(self, reason: str) -> bool:
        return do_report_failure(self.run_id, self.attempt, reason)

    def heartbeat(self) -> bool:
        return do_heartbeat(self.run_id, self.attempt, remote=self.remote)

    def job(self, pool: GpuPool | None = None) -> dict:
        """The attempt's job; `pool`, the attempt's, when the caller has it (else read for a remote attempt)."""
        run = Run.objects.select_related("submission__problem", "submission__leaderboard", "submission__code",
                                         "gpu_type").get(pk=self.run_id)
        return job_payload(run, pool or (_attempt(run).pool if self.remote else None))


def running_deadline(run: Run, remote: bool) -> int:
    """Seconds from a run's start to its RUNNING deadline: a node agent's heartbeat deadline; for a remote run
    KERNELBOT_REMOTE_SILENCE (its agent beats every 20 s), within its budget + KERNELBOT_REMOTE_MARGIN."""
    return min(settings.RUN_REMOTE_SILENCE, remote_budget(run)) if remote else settings.RUN_HEARTBEAT_DEADLINE


def remote_budget(run: Run) -> int:
    """The most seconds a remote run may spend RUNNING: its time budget plus KERNELBOT_REMOTE_MARGIN."""
    return total_timeout(run) + settings.RUN_REMOTE_MARGIN


def remote_deadline(run: Run, now) -> datetime:
    """A remote RUNNING run's deadline after word from its agent at `now`: KERNELBOT_REMOTE_SILENCE s on, so a node
    that went silent is noticed then even while its service still calls the job running, but never past the run's
    start + `remote_budget`: beating does not buy time."""
    return min(now + timedelta(seconds=settings.RUN_REMOTE_SILENCE),
               (run.started_at or now) + timedelta(seconds=remote_budget(run)))


def do_mark_running(run_id: int, attempt: int, *, deadline_seconds: int | None = None, remote: bool = False,
                    placement: tuple[str, list[int]] | None = None, claimed: bool | None = None) -> bool:
    """The attempt's harness started. True while the attempt is current and running (repeats are harmless).
    `placement`: the host and device indices a remote job's scheduler gave it, held for the run where the pool's
    inventory has them (allocator.hold_placement). `claimed`: whether a node agent claimed the attempt, when the
    caller knows (None: read it)."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status not in (RunStatus.DISPATCHED, RunStatus.RUNNING):
            return False
        if run.status == RunStatus.RUNNING and run.started_at == run.dispatched_at and (claimed if claimed is not None
                else RunAttempt.objects.filter(run=run, number=attempt, external_id__startswith="node:").exists()):
            # a node agent's claim's job fetched: its heartbeats keep it from now on, not the claim's wait for the
            # fetch (`_claim_one`)
            run.started_at = timezone.now()
            run.status_deadline = run.started_at + timedelta(seconds=settings.RUN_HEARTBEAT_DEADLINE)
            run.save(update_fields=["started_at", "status_deadline"])
            allocator.renew_attempt_holds(run.pk, attempt, allocator.run_lease_seconds())
        if run.status == RunStatus.DISPATCHED:
            run.update_status(RunStatus.RUNNING, deadline_seconds=deadline_seconds or running_deadline(run, remote))
            if remote and placement and placement[1]:
                run = Run.objects.select_related("submission__leaderboard", "submission__problem").get(pk=run.pk)
                allocator.hold_placement(_attempt(run).pool, *placement, run_id=run.pk, attempt=attempt,
                                         user_id=run.submission.user_id, leaderboard=run.submission.leaderboard.name,
                                         seconds=remote_budget(run))
        _news(run)
        return True


def do_record_progress(run_id: int, attempt: int, progress: dict, *, remote: bool = False) -> bool:
    """Live progress of the attempt; it is also a heartbeat (a remote run's deadline moves to `remote_deadline`).
    False when the attempt is no longer the running one."""
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status != RunStatus.RUNNING:
            return False
        fields = ["progress", "status_deadline"]
        run.progress = scrub(progress)
        if not remote:  # a node agent's run: a progress post is a heartbeat
            run.status_deadline = timezone.now() + timedelta(seconds=settings.RUN_HEARTBEAT_DEADLINE)
            allocator.renew_attempt_holds(run_id, attempt, allocator.run_lease_seconds())
        else:
            run.status_deadline = remote_deadline(run, timezone.now())
        run.save(update_fields=fields)
        _news(run)
        transaction.on_commit(lambda: events.run_changed(run))
        return True


def do_heartbeat(run_id: int, attempt: int, status: str | None = None, *, remote: bool = False) -> bool:
    """The runner still holds this attempt (in `status`, default: dispatched or running): a local run's deadline
    moves a heartbeat ahead, so a runner that dies is known within seconds; a remote running one's to
    `remote_deadline` (a dispatched one's at least RUN_REMOTE_MARGIN s ahead). False when the run moved on
    (cancelled, reaped, requeued) and the runner should stop."""
    statuses = [status] if status else [RunStatus.DISPATCHED, RunStatus.RUNNING]
    runs = Run.objects.filter(pk=run_id, attempt=attempt, status__in=statuses)
    now = timezone.now()
    if not remote:
        alive = runs.update(status_deadline=now + timedelta(seconds=settings.RUN_HEARTBEAT_DEADLINE)) == 1
        if alive:
            allocator.renew_attempt_holds(run_id, attempt, allocator.run_lease_seconds())
        return alive
    running = runs.filter(status=RunStatus.RUNNING).select_related("submission__problem").first()
    if running is not None:  # its start and budget do not change while it runs: no lock needed
        runs.filter(status=RunStatus.RUNNING).update(status_deadline=remote_deadline(running, now))
    else:
        later = now + timedelta(seconds=settings.RUN_REMOTE_MARGIN)
        runs.filter(status_deadline__lt=later).update(status_deadline=later)
    RunAttempt.objects.filter(run_id=run_id, number=attempt).update(last_news_at=now)
    return runs.exists()


# --- node agents -------------------------------------------------------------------------------------------------

def agent_job_id(node: Node, devices: list[int]) -> str:
    """A node agent's attempt's `external_id`: which node and devices hold it."""
    return f"node:{node.pk}:{','.join(map(str, devices))}"


def do_claim_runs(node: Node, free: list[int]) -> list[dict]:
    """A node's agent asks for work for its `free` device indices (it is also the node's heartbeat). Each claim is
    the oldest run dispatched to the node's pool that a free device's type serves, with the devices it needs held
    (the allocator: never a held device, nor one a reservation is about to start on); the run is RUNNING from here,
    its deadline moved by the agent's heartbeats. A node out of service takes only the health-check runs pinned to it
    (none while its sandbox cannot hold a run); a run another node is pinned to, or one this node already failed while
    another live node in service could take it, is left to the others. Returns what the agent needs to run each (the
    same per-attempt routes and token as a remote agent)."""
    return claim_on(node, free_gpus(node, free)) if do_node_heartbeat(node, free) else []


def do_node_heartbeat(node: Node, free: list[int], *, record: bool = True) -> bool:
    """The node's agent is live (at most one write a second; `record=False`: the caller batches the write, but a
    node whose agent was not live is written at once); whether it may claim runs for `free` now (not while the node
    is disabled or its sandbox cannot hold a run)."""
    now = timezone.now()
    if record or node.agent_seen_at is None or node.agent_seen_at < agents_live_since():
        Node.objects.filter(pk=node.pk).exclude(agent_seen_at__gt=now - timedelta(seconds=1)).update(
            agent_seen_at=now)
    if node.service == NodeService.NO_AGENT and node.set_service(NodeService.IN_SERVICE):
        node_back_in_service(node)
    return bool(node.enabled and node.service != NodeService.SANDBOX and free)


def free_gpus(node: Node, free: list[int]) -> list[Gpu]:
    """The node's enabled devices among `free`."""
    return list(Gpu.objects.select_related("gpu_type", "node__pool").filter(node=node, enabled=True, index__in=free)
                .order_by("index"))


def claimable(pool_id: int, gpu_type_ids=None, *, unpinned: bool = False) -> bool:
    """A run (of one of these GPU types) waits, dispatched to the pool, for a node agent to claim it (one query: an
    idle node's ask costs no transaction). `unpinned`: one that any node may claim."""
    waiting = _waiting(pool_id).filter(node__isnull=True) if unpinned else _waiting(pool_id)
    return (waiting if gpu_type_ids is None else waiting.filter(gpu_type_id__in=list(gpu_type_ids))).exists()


def waiting_for(pool_id: int) -> dict[int | None, set[int]]:
    """The nodes whose agents a run dispatched to the pool waits for, each with the GPU types of those runs: None
    for a run any node may claim, a node's id for a run pinned to it (one query)."""
    waiting: dict[int | None, set[int]] = {}
    for node_id, gpu_type_id in _waiting(pool_id).order_by().values_list("node_id", "gpu_type_id").distinct():
        waiting.setdefault(node_id, set()).add(gpu_type_id)
    return waiting


def _waiting(pool_id: int):
    return Run.objects.filter(status=RunStatus.DISPATCHED, attempts__number=F("attempt"), attempts__pool_id=pool_id,
                              attempts__external_id="")


def claim_on(node: Node, gpus: list[Gpu], types: set[int] | None = None) -> list[dict]:
    """The node's claims for its free `gpus`. `types`: the GPU types runs wait in its pool for it, read just now
    (`waiting_for`), which spares the query that otherwise keeps an ask with nothing to claim out of a transaction."""
    if types is not None:
        gpus = [g for g in gpus if g.gpu_type_id in types]
    if not gpus or types is None and not claimable(node.pool_id, {g.gpu_type_id for g in gpus}):
        return []
    claims: list[dict] = []
    for gpu_type in {g.gpu_type for g in gpus}:
        while free_of_type := [g for g in gpus if g.gpu_type == gpu_type]:
            claim = _claim_one(node, free_of_type)
            if claim is None:
                break
            claims.append(claim)
            gpus = [g for g in gpus if g.index not in claim["devices"]]
    return claims


def node_back_in_service(node: Node) -> None:
    """Its pool says so, and runs waiting for a node of their type go now."""
    do_node_back_in_service(node)
    do_resend_queued_runs()


def attempt_node(external_id: str) -> int | None:
    """The node a node agent's attempt ran on, from its `external_id` (`agent_job_id`)."""
    kind, _, rest = external_id.partition(":")
    node_id = rest.partition(":")[0]
    return int(node_id) if kind == "node" and node_id.isdigit() else None


def _failed_elsewhere_first(node: Node, runs: list[Run], gpu_type: GpuType) -> set[int]:
    """Of `runs`, those this node already failed that another live node in service of its pool, which has not
    failed them, could take: a retry goes to another node when there is another."""
    runs = [run for run in runs if run.attempt > 1]  # a first attempt failed nowhere: no query for a fresh burst
    if not runs:
        return set()
    failed: dict[int, set[int]] = {}
    retried = RunAttempt.objects.filter(run__in=runs, outcome="retried", external_id__startswith="node:")
    for run_id, external_id in retried.values_list("run_id", "external_id"):
        failed.setdefault(run_id, set()).add(attempt_node(external_id))
    tried_here = [run_id for run_id, nodes in failed.items() if node.pk in nodes]
    if not tried_here:
        return set()
    others = set(Node.objects.filter(pool_id=node.pool_id, enabled=True, service=NodeService.IN_SERVICE,
                                     agent_seen_at__gte=agents_live_since(), gpus__enabled=True,
                                     gpus__gpu_type=gpu_type).exclude(pk=node.pk).values_list("pk", flat=True))
    return {run_id for run_id in tried_here if others - failed[run_id]}


def _claim_one(node: Node, gpus: list[Gpu]) -> dict | None:
    gpu_type = gpus[0].gpu_type
    with transaction.atomic():
        waiting = (_waiting(node.pool_id).select_for_update(of=("self",), skip_locked=True)
                   .select_related("submission__problem", "submission__leaderboard", "gpu_type")
                   .defer(*PROBLEM_TEXTS)  # read for the run it claims only (the files inlined: kilobytes a row)
                   .annotate(attempt_id=F("attempts__id"), attempt_nonce=F("attempts__nonce"))  # the current one's
                   .filter(gpu_type=gpu_type)
                   .filter(Q(node=node) if not node.in_service else Q(node__isnull=True) | Q(node=node))
                   .order_by(INTERNAL_LAST, *CLAIM_ORDER))
        candidates = list(waiting[:20])
        avoid = _failed_elsewhere_first(node, candidates, gpu_type)
        on_node = None
        for run in candidates:  # the oldest that fits the free devices (a multi-GPU run may not)
            if run.pk in avoid:
                continue
            count = gpu_count(run)
            if count > len(gpus):
                if on_node is None:
                    on_node = Gpu.objects.filter(node=node, enabled=True, gpu_type=gpu_type).count()
                if count <= on_node:
                    return None  # it fits this node once enough devices free: nothing younger takes them first
                continue  # this node can never hold it: younger runs go on
            # its agent was heard just now and fetches the job next: one the web tier is slow to serve (a burst) is
            # not its fault, so the claim holds until the agent deadline (a dead agent's run is retried by then, and
            # at once when its agent registers again); the job's heartbeats keep it from there
            first_fetch = max(settings.RUN_HEARTBEAT_DEADLINE, settings.AGENT_DEADLINE)
            holds = allocator.acquire_on_node(
                gpus, count, run_id=run.pk, attempt=run.attempt, user_id=run.submission.user_id,
                leaderboard=run.submission.leaderboard.name, seconds=total_timeout(run),
                lease_seconds=max(allocator.run_lease_seconds(), first_fetch))
            if not holds:
                return None  # the free devices are promised to a reservation: nothing fits now
            held = sorted(h.gpu_id for h in holds)
            devices = [g.index for g in gpus if g.pk in held]
            now = timezone.now()
            RunAttempt.objects.filter(pk=run.attempt_id).update(external_id=agent_job_id(node, devices),
                                                                last_news_at=now)
            # its devices are chosen now: the wait for them was its queue (`dispatched_at` stamped when it was handed
            # to the pool, before any device was free); `started_at` moves on when the agent fetches the job
            run.update_status(RunStatus.RUNNING, deadline_seconds=first_fetch, at=now, dispatched_at=now,
                              runner=f"{node.pool.name} / {node.hostname}"[:60])
            first = next(g for g in gpus if g.pk == held[0])
            return {"run": run.pk, "attempt": run.attempt, "nonce": run.attempt_nonce, "devices": devices,
                    "token": attempt_token(node.pool, run.pk, run.attempt, run.attempt_nonce),
                    "gpus": [] if gpu_type.is_cpu else devices,
                    "job": {"limits": run_limits(first), "sandbox_uid": sandbox_uid(first)},
                    "heartbeat_s": max(0.5, settings.RUN_HEARTBEAT_DEADLINE / 4)}
    return None


def do_node_restarted(node: Node) -> int:
    """A node's agent (re)registered holding nothing: the runs a previous agent there held are retried now, not at
    their heartbeat deadline. Returns how many."""
    attempts = RunAttempt.objects.filter(pool_id=node.pool_id, external_id__startswith=f"node:{node.pk}:",
                                         number=F("run__attempt"),
                                         run__status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING])
    retried = 0
    for run_id, number in attempts.values_list("run_id", "number"):
        retried += do_report_failure(run_id, number, f"the agent on {node.hostname} restarted while running it")
    return retried


def _news(run: Run) -> None:
    RunAttempt.objects.filter(run=run, number=run.attempt).update(last_news_at=timezone.now())


def gpu_mismatch(gpu_type: GpuType, system: dict) -> str:
    """Why a result's system info contradicts the run's GPU type ("" when it does not): a result computed on the
    wrong hardware is no result for this GPU type. The same check as a node's (`runners.harness.probe.device_is`)."""
    device = str((system or {}).get("device") or "").strip()
    if device_is(gpu_type.name, gpu_type.vendor, device):
        return ""
    if not device or device.lower() == "cpu":
        return f"the runner has no {gpu_type.name} (it reported device {device or 'none'!r}); not a {gpu_type} result"
    return f"the runner's device {device!r} is not a {gpu_type.get_vendor_display()} {gpu_type.name}"


def scrub(value):
    """JSON without NUL characters (PostgreSQL refuses them in text and jsonb; a child's output may hold some)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {scrub(k): scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def do_ingest_result(run_id: int, attempt: int, result: dict) -> bool:
    """The only way a runner's result enters the database. Stale or repeated reports are ignored."""
    result = scrub(result)
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.status not in (RunStatus.DISPATCHED, RunStatus.RUNNING):
            log.info("ignoring result for run %s attempt %s (now %s, attempt %s)",
                     run_id, attempt, run.status, run.attempt)
            return False
        if not isinstance(result, dict):
            _infrastructure_failure(run, "the runner sent a result that is not a JSON object")
            return True
        if result.get("status") != "ok" and PROBLEM_ERROR_FLAG in (result.get("flags") or []):
            _problem_error(run, result)
            return True
        if result.get("status") != "ok" and NEEDS_CUDA_FLAG in (result.get("flags") or []):
            # the problem cannot run on this runner at all: retrying here only repeats it (not the user's fault)
            run.update_status(RunStatus.ERROR, infra_failures=run.infra_failures + 1, reason=result["error"],
                              error=str(result.get("error") or NEEDS_CUDA), result=result,
                              system_info=result.get("system", {}))
            return True
        if result.get("status") != "ok" and OOM_UNKNOWN_FLAG in (result.get("flags") or []) and run.attempts.filter(
                outcome="retried", reason__startswith=UNKNOWN_PREFIX).exists():  # tried once more: charged to no one
            run.update_status(RunStatus.ERROR, infra_failures=run.infra_failures + 1, error=str(result.get("error")),
                              result=result, system_info=result.get("system") or {})
            return True
        if result.get("status") != "ok":
            _infrastructure_failure(run, result.get("error") or "the runner reported an error")
            return True
        if mismatch := gpu_mismatch(run.gpu_type, result.get("system") or {}):
            _infrastructure_failure(run, mismatch, system_info=result.get("system") or {})
            return True
        leaderboard = run.submission.leaderboard
        verdict = str(result.get("verdict", "fail"))
        passed = bool(result.get("passed")) and verdict == "pass"
        score, ratio, error = None, None, "" if passed else str(result.get("error") or f"verdict: {verdict}")
        if passed and run.mode in (SubmissionMode.LEADERBOARD, SubmissionMode.BENCHMARK):
            try:
                score = score_from_result(result, run.mode, leaderboard.ranking_by)
                ratio = ratio_from_result(result, run.mode, leaderboard.ranking_by)
            except ValueError as exc:
                passed, verdict, error = False, "fail", f"unusable timings: {exc}"
        run.update_status(
            RunStatus.SUCCEEDED if passed else FAILING_VERDICT_STATUS.get(verdict, RunStatus.FAILED),
            verdict=verdict, passed=passed, score=score, **ratio_fields(ratio), error=error, result=result,
            progress=final_progress(result, run.mode, phase_totals(run)),
            system_info=result.get("system", {}), stdout=str(result.get("stdout", "")),
            stderr=str(result.get("stderr", "")))
        return True


def _problem_error(run: Run, result: dict) -> None:
    """The problem's own code (generate_input, ref_kernel or check_implementation) raised in the harness's trusted
    parent: neither the submission's fault nor the runner's, and another attempt would only raise again. The run
    ends once, in ERROR with `problem_error` set (never retried, never charged to the user's quota); its `error` is
    the plain PROBLEM_BROKEN that competitors read, while the harness's error and traceback stay in `result` and on
    the problem version, marked broken for the organisers (the admin; the Discord bot's report channel)."""
    detail = problem_error_of(result)
    error = str(result.get("error") or "the problem's own code failed")
    run.update_status(RunStatus.ERROR, problem_error=True, error=PROBLEM_BROKEN, reason=error, result=result,
                      system_info=result.get("system") or {})
    traceback = str(detail.get("traceback") or "")
    Problem.objects.filter(pk=run.submission.problem_id).update(  # broken since the first error; the latest error
        broken_since=Coalesce("broken_since", Value(timezone.now())), broken_error=f"{error}\n\n{traceback}".strip(),
        broken_run=run)
    log.warning("run %s: problem %s is broken: %s", run.pk, run.submission.problem_id, error)


def do_report_failure(run_id: int, attempt: int, reason: str) -> bool:
    """A runner could not run the job at all (not the submission's fault)."""
    reason = scrub(reason)
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.is_terminal or run.status == RunStatus.QUEUED:
            return False
        _infrastructure_failure(run, reason)
        return True


def do_fail_configuration(run_id: int, attempt: int, reason: str) -> bool:
    """The pool's service refused the job as configured (bad credentials, unknown host, repository or app): the pool's
    failure, not the run's (never charged, not retried into the same refusal). The service's message is the
    attempt's reason, for organisers; the run waits queued for a pool that takes runs (`dispatch_run`), unless it is
    pinned to this pool (a health check's: it ends in ERROR, and the competitor would read MISCONFIGURED); the
    competitor reads WAITS_FOR_FIX meanwhile."""
    reason = scrub(reason)
    with transaction.atomic():
        run = _locked_run(run_id)
        if run.attempt != attempt or run.is_terminal or run.status == RunStatus.QUEUED:
            return False
        if run.pool_id:
            run.update_status(RunStatus.ERROR, error=MISCONFIGURED, reason=reason)
        else:
            run.update_status(RunStatus.QUEUED, error=WAITS_FOR_FIX, reason=reason)
            enqueue_on_commit(DISPATCH_TASK, run.pk)
        return True


def _infrastructure_failure(run: Run, reason: str, **fields) -> None:
    """Not the submission's fault: retried up to RUN_MAX_ATTEMPTS. What broke (a runner's traceback, a server's paths)
    is the attempt's reason, for organisers; the competitor reads a plain sentence."""
    failures = run.infra_failures + 1
    if failures < settings.RUN_MAX_ATTEMPTS:
        log.warning("run %s attempt %s failed on infrastructure (%s); retrying", run.pk, run.attempt, reason)
        run.update_status(RunStatus.QUEUED, infra_failures=failures, error=INFRA_RETRYING, reason=reason, **fields)
        dispatch_on_commit(run.pk)
    else:
        run.update_status(RunStatus.ERROR, infra_failures=failures, reason=reason,
                          error=INFRA_GAVE_UP.format(failures=failures), **fields)


# --- polling and deadlines ---------------------------------------------------------------------------------------

def _remote_attempts(runs) -> list[RunAttempt]:
    """The current attempts of `runs` that a remote backend holds (they have an external id)."""
    return list(RunAttempt.objects.select_related("pool").filter(
        run__in=runs, number=F("run__attempt"), external_id__gt="", pool__isnull=False).exclude(
        pool__backend=RunnerBackendName.LOCAL))  # node agents beat their runs: a silent one is late, not polled


def poll_remote_runs(now=None) -> int:
    """Ask the backends about remote runs we have heard nothing of for RUN_POLL_AFTER seconds (ticked every few
    seconds by `manage.py workers`). Returns how many were polled."""
    now = now or timezone.now()
    quiet = now - timedelta(seconds=settings.RUN_POLL_AFTER)
    runs = Run.objects.filter(status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING])
    attempts = [a for a in _remote_attempts(runs)
                if (a.last_news_at or a.dispatched_at) < quiet]
    for attempt in attempts:
        poll = _poll(attempt)
        if poll is not None:
            apply_poll(attempt, poll)
    return len(attempts)


def _poll(attempt: RunAttempt) -> Poll | None:
    try:
        return backend_for(attempt.pool).poll(attempt.external_id)
    except Exception as exc:  # the service may be down for a moment; the deadline decides
        log.warning("polling %s (run %s attempt %s) failed: %s", attempt.external_id, attempt.run_id,
                    attempt.number, exc)
        RunAttempt.objects.filter(pk=attempt.pk).update(last_news_at=timezone.now())
        return None


def remote_news_received(sender: GpuPool, external_ids: list[str], **kwargs) -> int:
    """A service says these jobs of pool `sender` changed (`runners.signals.remote_news`, e.g. GitHub's workflow_run
    webhook): poll their runs' current attempts now rather than at the next scheduled poll. Returns how many."""
    attempts = RunAttempt.objects.filter(pool=sender, external_id__in=external_ids, number=F("run__attempt"),
                                         run__status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING])
    ids = list(attempts.values_list("pk", flat=True))
    for attempt_id in ids:
        enqueue_on_commit(POLL_TASK, attempt_id)
    return len(ids)


def poll_attempt(attempt_id: int) -> bool:
    """Poll one remote attempt if it is still its run's current, unfinished one (idempotent: a repeat or a late
    poll of a finished run changes nothing)."""
    attempt = RunAttempt.objects.select_related("pool").filter(
        pk=attempt_id, number=F("run__attempt"), run__status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING],
        external_id__gt="", pool__isnull=False).first()
    if attempt is None:
        return False
    if (poll := _poll(attempt)) is not None:
        apply_poll(attempt, poll)
    return True


def apply_poll(attempt: RunAttempt, poll: Poll) -> None:
    reporter = AttemptReporter(attempt.run_id, attempt.number)
    RunAttempt.objects.filter(pk=attempt.pk).update(last_news_at=timezone.now())
    if poll.state == RemoteState.RUNNING:
        reporter.running()
    elif poll.state == RemoteState.FINISHED and poll.result is not None:
        reporter.result(poll.result)
    elif poll.state == RemoteState.FINISHED:
        reporter.failure(f"the remote job finished without reporting a result{_detail(poll)}")
    elif poll.state in (RemoteState.FAILED, RemoteState.LOST, RemoteState.CANCELLED):
        reporter.failure(f"the remote job {poll.state}{_detail(poll)}")


def _detail(poll: Poll) -> str:
    return f" ({poll.detail})" if poll.detail else ""


def do_reap_overdue_runs(now=None) -> int:
    """Retry or fail every run that sat in a non-terminal state past its deadline. A remote run is polled first; its
    job is cancelled and the run retried (an infrastructure failure, never charged) unless the service says it is
    still running while its agent has not yet been heard from since it started (it may still be starting): then its
    deadline is extended once. An agent that went silent, or that beats past the run's budget, gets no extension:
    a dead node's job often still looks running."""
    now = now or timezone.now()
    reaped = 0
    overdue = Run.objects.overdue(now)
    polls = {a.run_id: (a, _poll(a)) for a in _remote_attempts(overdue)}
    lost = []
    for run_id in overdue.values_list("pk", flat=True):
        with transaction.atomic():
            run = _locked_run(run_id)
            if run.is_terminal or run.status_deadline is None or run.status_deadline >= now:
                continue
            if run.status == RunStatus.QUEUED:
                lost += _requeue_lost(run, now)
                reaped += 1
                continue
            attempt, poll = polls.get(run.pk, (None, None))
            if attempt is not None and attempt.number != run.attempt:
                continue  # moved on since we polled
            if run.status == RunStatus.DISPATCHED and _waits_its_turn(run, now):
                continue
            silence = _remote_silence(run, attempt, now)
            if (attempt is not None and poll is not None and poll.state == RemoteState.RUNNING
                    and not attempt.extended and run.status == RunStatus.RUNNING and silence == ""):
                run.status_deadline = remote_deadline(run, now)
                run.save(update_fields=["status_deadline"])
                RunAttempt.objects.filter(pk=attempt.pk).update(extended=True, last_news_at=now)
                continue
            if attempt is None:
                attempt = _attempt(run)
            _cancel_attempt_after_commit(attempt)
            detail = f"; the service says {poll.state}{_detail(poll)}" if poll is not None else ""
            why = f" ({silence})" if silence else ""
            _infrastructure_failure(run, f"the runner did not report back while {run.status}{why}{detail}")
            reaped += 1
    for run_id in lost:
        dispatch_run(run_id)
    do_resend_run_hooks(now)
    do_mark_silent_nodes()  # agents' liveness is read against the clock, whatever `now` the reaper was given
    return reaped


def do_mark_silent_nodes(now=None) -> int:
    """Every node of a local pool in service whose agent was heard from once but not within KERNELBOT_AGENT_DEADLINE
    is out of service, no agent (what `Node.state` already reads), and the runs its agent held are retried now: the
    row, the admin, the health API and /metrics agree within a reaper's tick. Its agent's next ask puts it back
    (`do_node_heartbeat`). When every agent of several went silent at once, the platform (its web tier, database or
    Redis) is what stalled: nothing is marked. Returns how many nodes."""
    live = (now or timezone.now()) - timedelta(seconds=settings.AGENT_DEADLINE)
    silent = list(Node.objects.filter(pool__backend=RunnerBackendName.LOCAL, service=NodeService.IN_SERVICE,
                                      agent_seen_at__lt=live))
    if len(silent) > 1 and not Node.objects.filter(pool__backend=RunnerBackendName.LOCAL,
                                                   agent_seen_at__gte=live).exists():
        log.warning("no node agent heard from within %s s: the platform is behind, not %s agents at once; no node "
                    "is put out of service for it", settings.AGENT_DEADLINE, len(silent))
        return 0
    for node in silent:
        if not Node.objects.filter(pk=node.pk, service=NodeService.IN_SERVICE, agent_seen_at__lt=live).update(
                service=NodeService.NO_AGENT, service_since=now or timezone.now(),
                service_detail=NO_AGENT_HEARD.format(hostname=node.hostname, seconds=settings.AGENT_DEADLINE)):
            continue  # its agent asked meanwhile
        held = RunAttempt.objects.filter(pool_id=node.pool_id, external_id__startswith=f"node:{node.pk}:",
                                         number=F("run__attempt"),
                                         run__status__in=[RunStatus.DISPATCHED, RunStatus.RUNNING])
        for run_id, number in held.values_list("run_id", "number"):
            do_report_failure(run_id, number, f"the agent on {node.hostname} was not heard from within "
                                              f"{settings.AGENT_DEADLINE} s while running it")
    return len(silent)


def do_run_hook(run_id: int):
    """A run ended (or an ended run was requeued): call its `on_finish` task with its id, then mark the task done,
    unless the run moved on meanwhile (its next change sent the task again and owes it)."""
    row = Run.objects.filter(pk=run_id).values_list("on_finish", "hook_due").first()
    if row is None or not row[0]:
        return None
    done = import_string(row[0])(run_id)
    Run.objects.filter(pk=run_id, hook_due=row[1]).update(hook_due=None)
    return done


HOOK_RESEND_BATCH = 500
HOOK_RESEND_MAX = 3600  # seconds: a hook that keeps failing is still tried hourly, never dropped


def do_resend_run_hooks(now=None) -> int:
    """Send again the `on_finish` task of every run whose task is past due: its message was lost (sent while the
    broker was away or hanging, or taken by a worker that was killed). Due again RUN_HOOK_RESEND later while the
    broker does not take it, so it goes soon after the broker is back; once taken and still not done (the hook
    itself fails), after as long as it has been owed since the run ended, at most an hour: never dropped, not tried
    every few seconds for ever. The hooks are idempotent."""
    now = now or timezone.now()
    due = list(Run.objects.filter(hook_due__lt=now).order_by("hook_due").values_list("pk", "finished_at")
               [:HOOK_RESEND_BATCH])
    for run_id, finished_at in due:
        owed = (now - finished_at).total_seconds() if finished_at else 0
        log.log(logging.INFO if owed < HOOK_RESEND_MAX else logging.WARNING,
                "run %s: its on_finish task was not done in time (owed for %.0f s); sending it again", run_id, owed)
        wait = min(max(settings.RUN_HOOK_RESEND, owed), HOOK_RESEND_MAX) if enqueue(RUN_HOOK_TASK, run_id) else \
            settings.RUN_HOOK_RESEND
        Run.objects.filter(pk=run_id, hook_due__lt=now).update(hook_due=now + timedelta(seconds=wait))
    return len(due)


def _remote_silence(run: Run, attempt: RunAttempt | None, now) -> str:
    """Why an overdue remote RUNNING run's agent is not worth waiting for: silent since its last word (its deadline
    is `remote_deadline` of that word), or past its budget; "" when it was not heard from since the run started (a
    service's poll may mark a run running before its agent fetched the job), or for other runs."""
    if run.status != RunStatus.RUNNING or attempt is None or attempt.pool is None or attempt.pool.is_local \
            or run.started_at is None:
        return ""
    budget = remote_budget(run)
    if run.status_deadline >= run.started_at + timedelta(seconds=budget - 1):
        return f"past its budget of {budget - settings.RUN_REMOTE_MARGIN} s + {settings.RUN_REMOTE_MARGIN} s"
    last_word = run.status_deadline - timedelta(seconds=settings.RUN_REMOTE_SILENCE)
    if last_word <= run.started_at + timedelta(seconds=1):  # the deadline its start set: nothing heard since
        return ""
    return f"its agent was silent for {(now - last_word).total_seconds():.0f} s"


def _waits_its_turn(run: Run, now) -> bool:
    """A run dispatched to a local pool waits for a device of its node agents: while a live agent serves its type it
    is only waiting its turn (its deadline moves on, nothing is charged), up to KERNELBOT_MAX_QUEUED_SECONDS."""
    attempt = _attempt(run)
    if attempt is None or attempt.pool is None or not attempt.pool.is_local or attempt.external_id:
        return False
    if now - run.queued_at > timedelta(seconds=settings.RUN_MAX_QUEUED_SECONDS) \
            or not agent_serves(attempt.pool, run.gpu_type):
        return False
    run.status_deadline = now + timedelta(seconds=queue_timeout(attempt.pool))
    run.save(update_fields=["status_deadline"])
    return True


def _requeue_lost(run: Run, now) -> list[int]:
    """A queued run past its deadline may have lost its broker message (the broker was away when it was sent, or
    restarted empty): the reaper dispatches it itself (no new message: the broker holds at most one per queued run),
    and looks again after the long queued deadline. Waiting is not the user's fault, so it is not charged."""
    if now - run.queued_at > timedelta(seconds=settings.RUN_MAX_QUEUED_SECONDS):
        run.update_status(RunStatus.ERROR, error=f"no runner picked the run up within "
                          f"{settings.RUN_MAX_QUEUED_SECONDS // 3600} h")
        return []
    run.update_status(RunStatus.QUEUED, deadline_seconds=settings.RUN_QUEUED_DEADLINE)
    return [run.pk]


def count_queued_runs(queued_after, queued_before) -> int:
    """Runs queued in the window that were the workers' to dispatch, whatever became of them since: the supervisor's
    evidence that messages were sent to a cluster that started no task after (the reaper may have dispatched those
    runs itself meanwhile). That is a remote pool's run, or one still queued; a node agents' run that the process
    which wrote it dispatched (`dispatch_here`) sent the cluster nothing, so a stream of submissions while no task
    is due is not a wedge."""
    remote = Q(attempts__number=F("attempt")) & ~Q(attempts__pool__backend=RunnerBackendName.LOCAL)
    return Run.objects.filter(Q(status=RunStatus.QUEUED) | remote, queued_at__gte=queued_after,
                              queued_at__lt=queued_before).distinct().count()


def do_resend_queued_runs(queued_before=None, queued_after=None) -> int:
    """Dispatch every queued run (those queued before `queued_before`) here, without the broker: a killed or wedged
    worker cluster takes the messages it had already pulled with it, and a copy per run per restart would fill the
    broker. Dispatch is short (a local pool's agents pull their runs) and idempotent."""
    runs = Run.objects.filter(status=RunStatus.QUEUED)
    if queued_before is not None:
        runs = runs.filter(queued_at__lt=queued_before)
    if queued_after is not None:
        runs = runs.filter(queued_at__gte=queued_after)
    run_ids = list(runs.order_by("first_queued_at", "pk").values_list("pk", flat=True))  # a retry keeps its place
    for run_id in run_ids:
        dispatch_run(run_id)
    return len(run_ids)


# --- organisers and owners ---------------------------------------------------------------------------------------

def do_requeue_run(run: Run, reason: str = "requeued by an organiser") -> None:
    with transaction.atomic():
        run = _locked_run(run.pk)
        if run.status in (RunStatus.DISPATCHED, RunStatus.RUNNING):
            _cancel_attempt_after_commit(_attempt(run))
        if run.passed:  # its board hears of it through `on_finish`, but only a rebuild finds its new rank key
            for board in ranks.ratioless_boards(run.submission_id):
                if board[1] == run.gpu_type_id:
                    enqueue_on_commit(ranks.RECOMPUTE_TASK, *board)
        # the previous attempt's results go (its reason stays in RunAttempt): no page shows them as this run's
        run.update_status(RunStatus.QUEUED, infra_failures=0, problem_error=False, error=reason, verdict="",
                          first_queued_at=timezone.now(),
                          passed=None, score=None, **ratio_fields(None), progress={}, result={}, system_info={},
                          stdout="", stderr="")
        enqueue_on_commit(DISPATCH_TASK, run.pk)


def do_mark_problem_fixed(problem: Problem) -> bool:
    """An organiser dealt with a broken problem version: the mark goes (a later problem error marks it again and
    tells the organisers again). Runs it ended stay ended; requeue them to run them again. False if not marked."""
    return Problem.objects.filter(pk=problem.pk, broken_since__isnull=False).update(
        broken_since=None, broken_error="", broken_run=None) == 1


def do_cancel_run(run: Run, reason: str = "cancelled by an organiser") -> bool:
    """End an unfinished run; a remote job it has is cancelled at its service after commit."""
    with transaction.atomic():
        run = _locked_run(run.pk)
        if run.is_terminal:
            return False
        if run.status in (RunStatus.DISPATCHED, RunStatus.RUNNING):
            _cancel_attempt_after_commit(_attempt(run))
        run.update_status(RunStatus.CANCELLED, error=reason)
        return True

