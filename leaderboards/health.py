"""Pool health checks: a tiny known problem (`health_check/`) submitted through the normal run path, one run per GPU
type a pool serves, each pinned to that pool (`Run.pool`, read by dispatch) and recorded the moment it ends (its
`on_finish` hook is `do_finish_pool_checks`). Local pools also have their devices compared with this machine's probe,
whose sandbox facts are recorded on their nodes. A round also checks the nodes when there is something to say about
them: each node's memory containment from its last probe (`runners.pools.containment`) fails the pool where
KERNELBOT_SANDBOX=require meets no usable memory cgroup (the node would refuse every run), and is a warning in the
check's detail where runs get per-process memory limits only. A pool whose latest round failed takes no runs until a
round passes. The check's leaderboard is internal: never shown, listed, ranked or counted (`Leaderboard.internal`).

`tick` (scheduled every minute) settles finished checks and starts a round for every enabled pool not checked for
`POOL_CHECK_INTERVAL`; the admin starts one at once with `do_start_pool_check`."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from runners.actions import do_check_node_sandbox, local_pool_health, node_containment
from runners.harness.device import BUSY_PREFIX
from runners.models import CheckOutcome, GpuPool, GpuType, Node, NodeService, PoolCheck, PoolHealth
from runners.pools import containment
from taskspec.loader import load_task

from . import actions, lifecycle
from .models import Leaderboard, Problem, Run, RunAttempt, RunStatus, Submission, SubmissionMode, Visibility

log = logging.getLogger(__name__)
CHECK_DIR = Path(__file__).resolve().parent / "health_check"
CHECK_BOARD = "_pool-health-check"
CHECK_USER = "kernelbot-health-check"
CHECK_HOOK = "leaderboards.health.do_finish_pool_checks"  # a check's run calls it with its id when it ends
OWN_CHECK = "a node's own check (its agent registered): running"  # a pending check not part of a round
WAITING = "waiting its turn in the round's wave"  # a node's pending check without a run yet (`_advance_wave`)
LATE_PREFIX = "the runner did not report back"  # a reaped attempt (lifecycle): a late platform, or a silent node
RETRY = "retry"  # `_verdict`: the check was late through no fault of the node's: its node waits its turn again


def check_user():
    user, created = get_user_model().objects.get_or_create(username=CHECK_USER, defaults={"is_active": False})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def check_leaderboard(gpu_types: list[GpuType]) -> Leaderboard:
    """The internal leaderboard of the checks, on the current version of the check problem, created on demand."""
    task = load_task(CHECK_DIR)
    problem = Problem.objects.filter(name=task.name, content_hash=task.content_hash).first()
    if problem is None:
        version = (Problem.objects.filter(name=task.name).aggregate(v=Max("version"))["v"] or 0) + 1
        problem = Problem.objects.create(name=task.name, version=version, content_hash=task.content_hash,
                                         lang=task.lang, description=task.description, definition=task.to_json())
    board, _ = Leaderboard.objects.get_or_create(name=CHECK_BOARD, defaults={
        "problem": problem, "deadline": timezone.now() + timedelta(days=365 * 100), "internal": True,
        "visibility": Visibility.CLOSED, "description": "Pool health checks (internal)."})
    if not board.internal:
        raise RuntimeError(f"a leaderboard named {CHECK_BOARD} exists that is not the internal check board")
    if board.problem_id != problem.pk:
        board.problem = problem
        board.save(update_fields=["problem"])
    board.gpu_types.add(*gpu_types)
    return board


def do_start_pool_check(pool: GpuPool) -> list[PoolCheck]:
    """Start a round of checks of `pool` unless one is running; returns the new checks (none when one was)."""
    try:
        with transaction.atomic():
            return _start_round(GpuPool.objects.select_for_update().get(pk=pool.pk))
    except IntegrityError:  # another process created the check problem or board at the same moment: try once more
        with transaction.atomic():
            return _start_round(GpuPool.objects.select_for_update().get(pk=pool.pk))


def do_start_node_check(node: Node) -> list[PoolCheck]:
    """Check one node of a node agents' pool now (its agent registered while its pool fails or after it failed a check):
    a check run of each of its GPU types pinned to it, unless one is running or the node cannot take it. Its pass
    brings the node, and a pool failing for want of one, back at once (`do_finish_pool_checks`)."""
    for tries in (1, 2):
        try:
            with transaction.atomic():
                pool = GpuPool.objects.select_for_update().get(pk=node.pool_id)
                node = Node.objects.get(pk=node.pk)
                if not pool.is_local or not node.enabled or node.service == NodeService.SANDBOX or \
                        pool.checks.filter(node=node, outcome=CheckOutcome.PENDING).exists():
                    return []
                gpu_types = list(GpuType.objects.filter(gpus__node=node, gpus__enabled=True).distinct().order_by(
                    "name"))
                checks = _check_runs(pool, gpu_types, node, timezone.now()) if gpu_types else []
                PoolCheck.objects.filter(pk__in=[c.pk for c in checks]).update(detail=OWN_CHECK)
                return checks
        except IntegrityError:  # the check problem or board was created at the same moment: once more
            if tries == 2:
                raise
    return []


def _start_round(pool: GpuPool) -> list[PoolCheck]:
    if pool.checks.filter(outcome=CheckOutcome.PENDING).exclude(detail=OWN_CHECK).exists():
        return []
    now = timezone.now()
    checks = _node_checks(pool, now) if pool.is_local else _remote_checks(pool, now)
    _advance_wave(pool)
    if _settle(pool):
        transaction.on_commit(lifecycle.do_resend_queued_runs)
    return checks


def _check_runs(pool: GpuPool, gpu_types: list[GpuType], node: Node | None, now) -> list[PoolCheck]:
    """A check submission with one run per GPU type, pinned to the pool (and the node), its runs dispatched after
    commit."""
    request = actions.SubmissionRequest(check_leaderboard(gpu_types), gpu_types, SubmissionMode.TEST,
                                        "submission.py", (CHECK_DIR / "submission.py").read_text())
    submission = actions.do_submit(check_user(), request)
    Run.objects.filter(pk__in=[run.pk for run in submission.new_runs]).update(pool=pool, node=node,
                                                                               on_finish=CHECK_HOOK)
    return [PoolCheck.objects.create(pool=pool, node=node, gpu_type=run.gpu_type, run_id=run.pk, started_at=now,
                                     detail=f"run {run.pk} queued") for run in submission.new_runs]


def _node_checks(pool: GpuPool, now) -> list[PoolCheck]:
    """A node agents' pool is checked node by node: a node without a live agent, or whose sandbox cannot satisfy its
    mode, is out of service with the reason; every other node waits its turn in the round's rolling wave
    (`_advance_wave`) for a check run of each of its GPU types pinned to it (its outcome puts the node out of
    service or back)."""
    nodes = list(pool.nodes.filter(enabled=True, gpus__enabled=True).distinct().order_by("hostname"))
    own = set(pool.checks.filter(outcome=CheckOutcome.PENDING).values_list("node_id", flat=True))
    if not nodes:
        return [PoolCheck.objects.create(pool=pool, started_at=now, finished_at=now, outcome=CheckOutcome.FAILING,
                                         detail="no enabled device to check")]
    checks = []
    for node in nodes:
        found = containment(node.hostname, node.sandbox)
        if not node.agent_live():
            if owner := Node.objects.filter(hostname=node.hostname, pool__backend=pool.backend).exclude(
                    pool=pool).select_related("pool").first():  # a machine serves one pool: no second agent for it
                why = (f"{node.hostname} belongs to pool {owner.pool.name} already, whose agent serves it: a machine "
                       "serves one pool; remove it from this pool")
            else:
                why = (f"no agent on {node.hostname} (start `python -m runners.harness.node --pool {pool.name}` "
                       "there: docs/operations.md); its devices get no run")
            node.set_service(NodeService.NO_AGENT, why)
        elif found.problem:
            why = found.problem
            node.set_service(NodeService.SANDBOX, why)
        elif node.pk in own:  # its own check runs: that one checks it
            continue
        else:
            do_check_node_sandbox(node)
            checks.append(PoolCheck.objects.create(
                pool=pool, node=node, started_at=now, finished_at=now, outcome=CheckOutcome.OK,
                detail="; ".join(filter(None, [f"agent live on {node.hostname}", found.warning,
                                               device_full(pool, node, now)]))))
            checks.append(PoolCheck.objects.create(pool=pool, node=node, started_at=now, detail=WAITING))
            continue
        checks.append(PoolCheck.objects.create(pool=pool, node=node, started_at=now, finished_at=now,
                                               outcome=CheckOutcome.FAILING, detail=why))
    return checks


def _advance_wave(pool: GpuPool, now=None) -> int:
    """Start the check runs of the nodes waiting their turn in the pool's round, oldest first, while fewer than
    POOL_CHECK_WAVE nodes' checks run and no sooner than the round's pace allows (`_paced`): a round over a thousand
    nodes is a bounded number of check runs at a time, spread over POOL_CHECK_SPREAD, not a thousand at once. A node
    whose agent went away meanwhile is out of service, as at the round's start. Called when a round starts, when one
    of its checks ends and by `tick`. Returns the nodes started."""
    waiting = pool.checks.filter(outcome=CheckOutcome.PENDING, run_id__isnull=True, node__isnull=False).order_by("pk")
    running = pool.checks.filter(outcome=CheckOutcome.PENDING, run_id__isnull=False, node__isnull=False).values(
        "node_id").distinct().count()
    room = settings.POOL_CHECK_WAVE - running
    if room > 0 and (first := waiting.values_list("started_at", flat=True).first()) is not None:
        room = min(room, _paced(pool, first, now or timezone.now()))
    started = 0
    for turn in waiting.select_related("node")[:max(0, room)]:
        node, now = turn.node, timezone.now()
        gpu_types = list(GpuType.objects.filter(gpus__node=node, gpus__enabled=True).distinct().order_by("name"))
        if turn.gpu_type_id:  # a late check's retry: its own type only
            gpu_types = [t for t in gpu_types if t.pk == turn.gpu_type_id]
        if not node.agent_live() or not node.enabled or not gpu_types:
            why = f"no agent on {node.hostname} when its turn came" if node.enabled and gpu_types else \
                "disabled, or no enabled device, when its turn came"
            if not node.agent_live():
                node.set_service(NodeService.NO_AGENT, why)
            PoolCheck.objects.filter(pk=turn.pk).update(outcome=CheckOutcome.FAILING, finished_at=now, detail=why)
            continue
        _check_runs(pool, gpu_types, node, turn.started_at)  # of the same round
        turn.delete()
        started += 1
    return started


def _paced(pool: GpuPool, round_started, now) -> int:
    """How many more of the round's nodes may start now: its first POOL_CHECK_WAVE at once, the others evenly over
    POOL_CHECK_SPREAD seconds from its start (0: no pace), so a large pool's round costs the platform a steady trickle
    of check runs (a thousand nodes over the default 12 minutes: 1.4 a second), not its wave's fill rate."""
    if not settings.POOL_CHECK_SPREAD:
        return settings.POOL_CHECK_WAVE
    of_round = pool.checks.filter(started_at=round_started, node__isnull=False)
    nodes = of_round.values("node_id").distinct().count()
    started = of_round.filter(run_id__isnull=False).values("node_id").distinct().count()
    elapsed = max(0.0, (now - round_started).total_seconds())
    return settings.POOL_CHECK_WAVE + int(elapsed * nodes / settings.POOL_CHECK_SPREAD) - started


def device_full(pool: GpuPool, node: Node, now) -> str:
    """A warning when runs on `node` ran out of device memory that other processes held since its last check (the
    runs were retried; the attempts' reasons name the holders)."""
    since = PoolCheck.objects.filter(pool=pool, node=node, started_at__lt=now).aggregate(last=Max("started_at"))[
        "last"] or now - timedelta(days=1)
    busy = RunAttempt.objects.filter(external_id__startswith=f"node:{node.pk}:", finished_at__gte=since,
                                     reason__startswith=BUSY_PREFIX).order_by("-finished_at")
    if not (count := busy.count()):
        return ""
    latest = busy.first().reason.removeprefix(BUSY_PREFIX).split(". Not the", 1)[0].strip()
    return (f"warning: {count} run(s) on {node.hostname} ran out of device memory that other processes held since "
            f"{since:%Y-%m-%d %H:%M} UTC (retried; latest: {latest})")


def _remote_checks(pool: GpuPool, now) -> list[PoolCheck]:
    """A remote pool is checked as a whole (its service picks the node): a run per GPU type, and its registered
    nodes' memory containment."""
    checks = []
    failing, passing = [], []
    for node in node_containment(pool):
        if node.problem:
            failing.append(node.problem)
        elif node.warning:
            passing.append(node.warning)
    if failing or passing:
        checks.append(PoolCheck.objects.create(
            pool=pool, started_at=now, finished_at=now, outcome=CheckOutcome.FAILING if failing else CheckOutcome.OK,
            detail="; ".join(failing or passing)))
    gpu_types = list(GpuType.objects.filter(gpus__node__pool=pool, gpus__enabled=True, gpus__node__enabled=True)
                     .distinct().order_by("name"))
    if not gpu_types:
        checks.append(PoolCheck.objects.create(pool=pool, started_at=now, finished_at=now,
                                               outcome=CheckOutcome.FAILING, detail="no enabled device to check"))
    else:
        checks += _check_runs(pool, gpu_types, None, now)
    return checks


def do_finish_pool_checks(run_id: int | None = None, *, now=None) -> int:
    """Record the outcome of every running check (only run `run_id`'s: the check run's `on_finish` hook) whose run
    finished, failed an attempt or ran past POOL_CHECK_TIMEOUT; a node's check puts it out of service or back;
    settle each pool's health. Idempotent."""
    now = now or timezone.now()
    finished = 0
    back = False
    pending = PoolCheck.objects.filter(outcome=CheckOutcome.PENDING, run_id__isnull=False)
    if run_id is not None:
        pending = pending.filter(run_id=run_id)
    waves = set() if run_id is not None else set(PoolCheck.objects.filter(
        outcome=CheckOutcome.PENDING, run_id__isnull=True, node__isnull=False).values_list("pool_id", flat=True))
    for check_id in pending.values_list("pk", flat=True):
        with transaction.atomic():
            check = PoolCheck.objects.select_for_update(of=("self",)).select_related("pool", "gpu_type", "node") \
                .filter(pk=check_id, outcome=CheckOutcome.PENDING).first()
            if check is None:
                continue
            outcome, detail = _verdict(check, now)
            if outcome == RETRY:  # late, not the node's fault: it waits its turn again
                PoolCheck.objects.filter(pk=check.pk).update(run_id=None, detail=f"{WAITING} again: {detail}")
                waves.add(check.pool_id)
                continue
            if outcome is None:
                continue
            if check.node is not None:
                waves.add(check.pool_id)
            check.outcome, check.detail, check.finished_at = outcome, detail, now
            check.save(update_fields=["outcome", "detail", "finished_at"])
            if check.node is not None and outcome == CheckOutcome.FAILING:
                check.node.set_service(NodeService.FAILED_CHECK, f"its health check failed: {detail}")
            elif check.node is not None and check.node.service == NodeService.FAILED_CHECK:
                back |= check.node.set_service(NodeService.IN_SERVICE)
            back |= _settle(GpuPool.objects.select_for_update().get(pk=check.pool_id))
            finished += 1
    for pool_id in waves:
        with transaction.atomic():
            _advance_wave(GpuPool.objects.select_for_update().get(pk=pool_id), now)
    if back:
        lifecycle.do_resend_queued_runs()  # runs waiting for a node or pool of their type go now
    return finished


def _verdict(check: PoolCheck, now) -> tuple[str | None, str]:
    run = Run.objects.select_related("gpu_type").filter(pk=check.run_id).first()
    if run is None:
        return CheckOutcome.FAILING, "its run was deleted"
    on = f" (node {check.node.hostname})" if check.node else ""
    if run.status == RunStatus.SUCCEEDED:
        device = str(run.system_info.get("device", ""))
        if mismatch := lifecycle.gpu_mismatch(run.gpu_type, run.system_info):
            return CheckOutcome.FAILING, f"run {run.pk}{on} passed, but {mismatch}"
        memory = (run.system_info.get("sandbox") or {}).get("memory") or {}
        uncontained = (f", with per-process memory limits only ({memory['per_process_only']})"
                       if isinstance(memory, dict) and memory.get("per_process_only") else "")
        return CheckOutcome.OK, f"run {run.pk}{on} passed on {device or 'the CPU'}{uncontained}"
    retried = RunAttempt.objects.filter(run=run, outcome="retried").order_by("number")
    failed = retried.exclude(reason__startswith=LATE_PREFIX).first()
    late = failed is None and retried.exists()  # reaped past its deadline: a platform behind or a silent node
    if run.is_terminal and late and run.status == RunStatus.ERROR and _agent_live(check):
        return RETRY, f"run {run.pk}{on} ended Error after its attempts were reaped late while its agent was live"
    if run.is_terminal:
        last = run.attempts.exclude(reason="").order_by("-number").first()
        why = last.reason if run.status == RunStatus.ERROR and last else run.error or run.verdict
        return CheckOutcome.FAILING, f"run {run.pk}{on} ended {run.get_status_display()}: {why}"
    timeout = settings.POOL_CHECK_TIMEOUT
    if failed is None and now - run.first_queued_at < timedelta(seconds=timeout):
        return None, ""
    if failed is None and (run.status != RunStatus.RUNNING or late) and _agent_live(check):
        lifecycle.do_cancel_run(run, "pool health check run late: its node was busy or the platform behind; retried")
        return RETRY, f"run {run.pk}{on} was {run.get_status_display()} after {timeout} s"
    why = (f"attempt {failed.number} failed: {failed.reason}" if failed else
           f"no result within {timeout} s (the run was {run.get_status_display()})")
    lifecycle.do_cancel_run(run, f"pool health check failed: {why}")
    return CheckOutcome.FAILING, f"run {run.pk}{on}: {why}"


def _agent_live(check: PoolCheck) -> bool:
    """A node's check whose agent is live: its late check run is then the platform's (or the queue's, or competitors'
    runs') doing, not the node's. A remote pool's late check fails, as its service is what is late."""
    return check.node_id is not None and Node.objects.get(pk=check.node_id).agent_live()


def _settle(pool: GpuPool) -> bool:
    """The pool's health is its latest round's: a remote pool's is failing when any check of it failed, OK when all
    passed, unchanged while some still run. A node agents' pool is failing only while none of its nodes is in
    service (its detail says why of each), else OK once the round is done (or at once when it was failing), with its
    nodes out of service named. Returns whether it recovered (the queued runs are then sent again)."""
    started = pool.checks.aggregate(latest=Max("started_at"))["latest"]
    if started is None:
        return False
    latest = list(pool.checks.filter(started_at=started).select_related("gpu_type", "node"))
    failing = [c for c in latest if c.outcome == CheckOutcome.FAILING]
    done = [c.finished_at for c in latest if c.finished_at is not None]
    if pool.is_local:
        if not done:
            return False
        health, pool.health_detail = local_pool_health(pool)
        if health == PoolHealth.FAILING:
            pool.health_detail = pool.health_detail or "; ".join(c.detail for c in failing)
        elif len(done) < len(latest) and pool.health != PoolHealth.FAILING:
            return False  # OK once the round is done (the nodes already decide where runs go)
        else:
            pool.last_ok_at = max(done)
    elif failing:
        health = PoolHealth.FAILING
        pool.health_detail = "; ".join(f"{c.gpu_type or 'nodes'}: {c.detail}" for c in failing)
    elif all(c.outcome == CheckOutcome.OK for c in latest):
        health, pool.health_detail, pool.last_ok_at = PoolHealth.OK, "", max(done)
    else:
        return False
    recovered = pool.health == PoolHealth.FAILING and health == PoolHealth.OK
    pool.health, pool.last_checked_at = health, max(done)
    pool.save(update_fields=["health", "health_detail", "last_checked_at", "last_ok_at"])
    return recovered


def do_prune_pool_checks(now=None) -> int:
    """Forget checks (and their internal submissions) older than POOL_CHECK_KEEP_DAYS."""
    before = (now or timezone.now()) - timedelta(days=settings.POOL_CHECK_KEEP_DAYS)
    old = PoolCheck.objects.filter(started_at__lt=before).exclude(outcome=CheckOutcome.PENDING)
    run_ids = [r for r in old.values_list("run_id", flat=True) if r is not None]
    Submission.objects.filter(leaderboard__internal=True, runs__in=run_ids).delete()
    return old.delete()[0]


def tick(now=None) -> int:
    """Scheduled every minute: settle finished checks, then start a round for each enabled pool whose last check is
    older than POOL_CHECK_INTERVAL (0: none); returns the rounds started."""
    now = now or timezone.now()
    do_finish_pool_checks(now=now)
    do_prune_pool_checks(now)
    if not settings.POOL_CHECK_INTERVAL:  # 0: scheduled checks are off
        return 0
    due = now - timedelta(seconds=settings.POOL_CHECK_INTERVAL)
    started = 0
    for pool in GpuPool.objects.filter(enabled=True).exclude(last_checked_at__gte=due):
        try:
            started += bool(do_start_pool_check(pool))
        except Exception:  # one broken pool must not stop the others' checks
            log.exception("could not start the health check of pool %s", pool.name)
    return started
