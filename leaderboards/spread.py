"""The between-run spread of identical code, measured per (problem, GPU type) instead of guessed.

An A/A measurement submits the problem's reference as a submission (`reference.py` plus `custom_kernel =
ref_kernel`) to an internal board of that problem (`Leaderboard.internal`: never shown, listed or ranked), in
leaderboard mode, so each run is timed exactly as a competitor's is (a public and a secret run per submission).
Where nodes serve the GPU type, the runs are pinned to them in turn, so a node whose A/A is far off the others' shows.
When the last run ends (its `on_finish` hook is `do_record_spread`), 1.96 sd of their log ratios about 1.00x
(`off_one`) replaces the figure in `RunSpread`, which widens every interval of that problem on that GPU type
(`runners.jobs.run_timing`) unless its board sets its own `run_spread`. Started by `manage.py measure_spread` or
the admin, within the number of runs the operator gives (KERNELBOT_SPREAD_RUNS per pair by default), and by the
workers on their own (`do_measure_due_spreads`, every minute): a pair of an open board that was never measured, or
not for KERNELBOT_SPREAD_REFRESH_DAYS, is measured while no competitor's run of its GPU type waits, one pair at a
time."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from runners.models import GpuPool, GpuType, Node, NodeService
from runners.queue import enqueue_on_commit

from . import lifecycle
from .errors import SubmissionRejected
from .models import (
    ACTIVE_STATUSES,
    Code,
    Leaderboard,
    Problem,
    Run,
    RunSpread,
    RunStatus,
    Submission,
    SubmissionMode,
    Visibility,
)

AA_USER = "kernelbot-aa"
AA_HOOK = "leaderboards.spread.do_record_spread"  # an A/A run calls it with its id when it ends
MIN_SAMPLES = 4  # the fewest passed A/A runs a figure is made from
NODE_FLOOR = 0.02  # a node is flagged only when its A/A is off the others' by more than this too (relative)


def board_spreads(leaderboard: Leaderboard) -> dict[int, tuple[float, str]]:
    """Per GPU type id of the board: the spread its runs are widened by and its source (`RunSpread.for_board`), the
    platform's default where "provisional"."""
    spreads = {}
    for gpu_type in leaderboard.gpu_types.all():
        value, source = RunSpread.for_board(leaderboard, leaderboard.problem_id, gpu_type.pk)
        spreads[gpu_type.pk] = (settings.HARNESS_TIMING["run_spread"] if value is None else value, source)
    return spreads


def board_spread(leaderboard: Leaderboard, gpu_type: GpuType) -> dict:
    """What the board page says of the spread its intervals include (as `RunSpread.for_board`, in one query): value,
    percent, source ("board", "measured", "provisional") and, where measured, its `record`."""
    record = None if leaderboard.run_spread is not None else RunSpread.objects.filter(
        problem_id=leaderboard.problem_id, gpu_type=gpu_type, spread__isnull=False).first()
    value, source = ((leaderboard.run_spread, "board") if leaderboard.run_spread is not None else
                     (record.spread, "measured") if record else (settings.HARNESS_TIMING["run_spread"], "provisional"))
    return {"value": value, "percent": value * 100, "source": source, "record": record}


def aa_code(problem: Problem) -> str:
    """The problem's reference as a submission; refused where there is no Python reference to time."""
    reference = (problem.definition.get("files") or {}).get("reference.py")
    if problem.lang != "py" or not reference:
        raise SubmissionRejected(f"Problem '{problem.name}' has no Python reference.py to time against itself.", 400)
    return f"{reference}\n\ncustom_kernel = ref_kernel\n"


def aa_user():
    user, created = get_user_model().objects.get_or_create(username=AA_USER, defaults={"is_active": False})
    if created:
        user.set_unusable_password()
        user.save(update_fields=["password"])
    return user


def aa_leaderboard(problem: Problem, gpu_type: GpuType) -> Leaderboard:
    board, _ = Leaderboard.objects.get_or_create(name=f"_aa-{problem.pk}", defaults={
        "problem": problem, "deadline": timezone.now() + timedelta(days=365 * 100), "internal": True,
        "visibility": Visibility.CLOSED, "ranking_by": problem.definition.get("ranking_by") or "last",
        "description": f"A/A runs measuring the between-run spread of {problem.name} (internal)."})
    if not board.internal:
        raise SubmissionRejected(f"A leaderboard named {board.name} exists that is not internal.", 409)
    board.gpu_types.add(gpu_type)
    return board


def serving_nodes(gpu_type: GpuType) -> list[Node]:
    return list(Node.objects.filter(enabled=True, service=NodeService.IN_SERVICE, pool__enabled=True,
                                    gpus__gpu_type=gpu_type, gpus__enabled=True)
                .select_related("pool").distinct().order_by("pool__name", "hostname"))


def do_measure_spread(problem: Problem, gpu_type: GpuType, runs: int | None = None) -> list[Run]:
    """Queue `runs` A/A runs (rounded up to whole submissions of two) of `problem` on `gpu_type`; refused (409) while
    a measurement of the pair is under way."""
    runs = runs or settings.SPREAD_RUNS
    if runs < MIN_SAMPLES:
        raise SubmissionRejected(f"An A/A measurement needs at least {MIN_SAMPLES} runs, not {runs}.", 400)
    code = aa_code(problem)
    with transaction.atomic():
        record, _ = RunSpread.objects.get_or_create(problem=problem, gpu_type=gpu_type)
        record = RunSpread.objects.select_for_update().get(pk=record.pk)
        if record.pending_since is not None:
            raise SubmissionRejected(f"The spread of {record} is being measured since "
                                     f"{record.pending_since:%Y-%m-%d %H:%M} UTC.", 409)
        board, user, nodes = aa_leaderboard(problem, gpu_type), aa_user(), serving_nodes(gpu_type)
        code_row, _ = Code.objects.get_or_create(sha256=Code.digest(code), defaults={"text": code})
        now, deadline, created = timezone.now(), Run.deadline_for(RunStatus.QUEUED), []
        for i in range(math.ceil(runs / 2)):
            submission = Submission.objects.create(user=user, leaderboard=board, problem=problem, code=code_row,
                                                   file_name="submission.py", mode=SubmissionMode.LEADERBOARD)
            node = nodes[i % len(nodes)] if nodes else None
            created += [Run.objects.create(submission=submission, gpu_type=gpu_type, secret=secret, on_finish=AA_HOOK,
                                           status_deadline=deadline, queued_at=now, first_queued_at=now,
                                           node=node, pool=node.pool if node else None) for secret in (False, True)]
        record.pending_since = now
        record.save(update_fields=["pending_since"])
        for run in created:
            enqueue_on_commit(lifecycle.DISPATCH_TASK, run.pk)
    return created


def due_pairs(now=None) -> list[tuple[Problem, GpuType]]:
    """The (problem, GPU type) pairs of the open public boards, served by a pool taking runs, that need a measurement:
    never measured, or last measured (or tried: a measurement that kept too few runs) over
    KERNELBOT_SPREAD_REFRESH_DAYS ago; none while one is under way."""
    now = now or timezone.now()
    if not settings.SPREAD_REFRESH_DAYS or RunSpread.objects.filter(pending_since__isnull=False).exists():
        return []
    stale = now - timedelta(days=settings.SPREAD_REFRESH_DAYS)
    boards = [b for b in Leaderboard.objects.filter(internal=False, deadline__gt=now).select_related("problem")
              .prefetch_related("gpu_types") if b.is_open]
    records = {(r.problem_id, r.gpu_type_id): r for r in RunSpread.objects.all()}
    attempts = (Run.objects.filter(submission__leaderboard__internal=True, submission__user__username=AA_USER)
                .values("submission__problem_id", "gpu_type_id").order_by().annotate(last=Max("first_queued_at")))
    tried = {(a["submission__problem_id"], a["gpu_type_id"]): a["last"] for a in attempts}
    due = []
    for board in boards:
        for gpu_type in board.gpu_types.all():
            record = records.get((board.problem_id, gpu_type.pk))
            last = max(filter(None, [record and record.measured_at, tried.get((board.problem_id, gpu_type.pk))]),
                       default=None)
            if (last is None or last < stale) and GpuPool.objects.taking_runs(gpu_type).exists():
                due.append((board.problem, gpu_type))
    return sorted(set(due), key=lambda p: (p[0].name, p[0].version, p[1].name))


def do_measure_due_spreads(now=None) -> int:
    """Every minute (the workers' schedule): the first due pair (`due_pairs`) whose GPU type no competitor's run waits
    for is measured (its A/A runs also yield to competitors' in the nodes' claims); the runs queued."""
    for problem, gpu_type in due_pairs(now):
        if Run.objects.filter(gpu_type=gpu_type, submission__leaderboard__internal=False,
                              status__in=[RunStatus.QUEUED, RunStatus.DISPATCHED]).exists():
            continue
        try:
            return len(do_measure_spread(problem, gpu_type))
        except SubmissionRejected:  # no Python reference to time (a problem of its own evaluator), or one started
            continue
    return 0


def measurement_runs(record: RunSpread):
    return Run.objects.filter(submission__leaderboard__internal=True, submission__problem_id=record.problem_id,
                              submission__user__username=AA_USER, gpu_type_id=record.gpu_type_id,
                              first_queued_at__gte=record.pending_since)


def do_record_spread(run_id: int | None = None) -> int:
    """Replace the figure of every measurement whose A/A runs have all ended (only `run_id`'s: the `on_finish` hook);
    the number recorded. Idempotent."""
    pending = RunSpread.objects.filter(pending_since__isnull=False)
    if run_id is not None:
        run = Run.objects.select_related("submission").filter(pk=run_id).first()
        if run is None:
            return 0
        pending = pending.filter(problem_id=run.submission.problem_id, gpu_type_id=run.gpu_type_id)
    recorded = 0
    for pk in pending.values_list("pk", flat=True):
        with transaction.atomic():
            record = RunSpread.objects.select_for_update().filter(pk=pk, pending_since__isnull=False).first()
            if record is None or measurement_runs(record).filter(status__in=ACTIVE_STATUSES).exists():
                continue
            _record(record, list(measurement_runs(record).select_related("node")))
            recorded += 1
    return recorded


def _record(record: RunSpread, runs: list[Run]) -> None:
    samples = [(run.node.hostname if run.node else "", math.log(run.ratio)) for run in runs
               if run.passed and run.ratio and run.ratio > 0]
    fields = {"pending_since": None}
    if len(samples) < MIN_SAMPLES:
        fields["warning"] = (f"The measurement of {record.pending_since:%Y-%m-%d %H:%M} UTC kept {len(samples)} of "
                             f"{len(runs)} runs (fewer than {MIN_SAMPLES} passed): the figure is unchanged.")
    else:
        by_node: dict[str, list[float]] = defaultdict(list)
        for host, value in samples:
            by_node[host].append(value)
        fields.update(spread=round(1.96 * off_one([v for _, v in samples]), 4), samples=len(samples),
                      measured_at=timezone.now(), warning=node_warning(by_node),
                      nodes={host or "(any)": {"runs": len(vs), "ratio": round(math.exp(statistics.fmean(vs)), 4)}
                             for host, vs in sorted(by_node.items())})
    for name, value in fields.items():
        setattr(record, name, value)
    record.save(update_fields=list(fields))


def off_one(logs: list[float]) -> float:
    """How far A/A log ratios lie from 1.00x (log 0), not only from their own mean: a standard deviation about 0
    (n - 1 degrees of freedom, so never below their sd), so a yardstick's bias on a problem (identical code timed
    ~5 % fast) widens its intervals to cover 1 instead of hiding in a narrow sd."""
    return math.sqrt(sum(v * v for v in logs) / (len(logs) - 1))


def node_warning(by_node: dict[str, list[float]]) -> str:
    """The nodes whose mean A/A log ratio is further from the other nodes' than those runs' own spread (1.96 sd)."""
    far = []
    for host, values in by_node.items():
        others = [v for other, vs in by_node.items() if other != host for v in vs]
        if not host or len(others) < 2:
            continue
        gap = statistics.fmean(values) - statistics.fmean(others)
        if abs(gap) > max(1.96 * statistics.stdev(others), NODE_FLOOR):
            far.append(f"{host}: A/A {math.exp(statistics.fmean(values)):.3f}x against the other nodes' "
                       f"{math.exp(statistics.fmean(others)):.3f}x")
    return "; ".join(far)
