"""KernelBot's /verify-task: a task directory under the problems directory is loaded and its import previewed
(nothing is imported), then each file in its solutions/ is submitted through the normal run path on an internal board,
as upstream's does; one named wrong… must fail, every other one pass. The report comes when every run has ended."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from leaderboards import actions, health
from leaderboards.importing import (
    ImportRejected,
    describe_harness,
    do_import_task,
    gpu_types_named,
    previewed,
    store_problem,
)
from leaderboards.models import Leaderboard, Problem, RunStatus, Submission, SubmissionMode, Visibility
from runners.models import GpuType
from taskspec.loader import TaskFileError, collection_root, load_task
from taskspec.model import TaskDefinition

from .service import EXTENSIONS, BotError, Member, require_organiser

VERIFY_BOARD = "_verify-task"
MODES = {"test": [SubmissionMode.TEST], "benchmark": [SubmissionMode.BENCHMARK],
         "leaderboard": [SubmissionMode.LEADERBOARD],
         "all": [SubmissionMode.TEST, SubmissionMode.BENCHMARK, SubmissionMode.LEADERBOARD]}


@dataclass
class Check:
    submission_id: int
    label: str  # solutions/correct.py test
    should_pass: bool


@dataclass
class Verification:
    text: str
    checks: list[Check]


def task_dirs(current: str) -> list[str]:
    root = settings.PROBLEMS_DIR.resolve()
    found = sorted(str(p.parent.relative_to(root)) for p in root.glob("**/task.yml"))
    return [name for name in found if current.strip().lower() in name.lower()][:25]


def _task_dir(task: str) -> Path:
    root = settings.PROBLEMS_DIR.resolve()
    target = (root / task.strip()).resolve()
    if not target.is_relative_to(root) or not (target / "task.yml").is_file():
        raise BotError(f"'{task[:200]}' is not a task directory under the problems directory (a folder holding "
                       "task.yml, e.g. demo/vectoradd_py).")
    return target


def _board(problem: Problem, gpu_types: list[GpuType]) -> Leaderboard:
    board, _ = Leaderboard.objects.get_or_create(name=VERIFY_BOARD, defaults={
        "problem": problem, "deadline": timezone.now() + timedelta(days=365 * 100), "internal": True,
        "visibility": Visibility.CLOSED, "description": "/verify-task runs (internal)."})
    if not board.internal:
        raise BotError(f"A leaderboard named {VERIFY_BOARD} exists that is not the internal verification board.")
    board.problem = problem
    board.save(update_fields=["problem"])
    board.gpu_types.add(*gpu_types)
    return board


def _should_pass(relative: Path) -> bool:
    return not any(part.lower().startswith("wrong") for part in relative.with_suffix("").parts)


def start(member: Member, task: str, mode: str, gpu: str | None) -> Verification:
    require_organiser(member)
    target = _task_dir(task)
    collection = target.parent.name
    try:
        definition: TaskDefinition = load_task(target, root=collection_root(target, within=settings.PROBLEMS_DIR))
        previewed(do_import_task, definition, collection=collection)
    except TaskFileError as exc:
        raise BotError(f"❌ {task} does not load:\n" + "\n".join(exc.errors)) from exc
    except ImportRejected as exc:
        raise BotError(f"❌ {task} would not import:\n" + "\n".join(exc.errors)) from exc
    folder = target / "solutions"
    solutions = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix in EXTENSIONS[definition.lang]) \
        if folder.is_dir() else []
    if not solutions:
        return Verification(f"✅ {task} loads and would import; it has no solutions/ to run.", [])
    names = [g.strip() for g in (gpu or "").split(",") if g.strip()] or definition.gpus
    if not names:
        raise BotError("Name the GPU type(s) to run on (gpu:), or list gpus in the task's task.yml.")
    try:
        gpu_types = gpu_types_named(names, task)
    except ImportRejected as exc:
        raise BotError(exc.errors[0]) from exc
    checks = []
    with transaction.atomic():
        problem, _ = store_problem(definition, "auto", collection)
        board = _board(problem, gpu_types)
        for path in solutions:
            code = path.read_text(encoding="utf-8")
            for run_mode in MODES[mode]:
                request = actions.SubmissionRequest(board, gpu_types, run_mode, path.name, code)
                submission = actions.do_submit(health.check_user(), request)
                checks.append(Check(submission.pk, f"{path.relative_to(target)} {run_mode}",
                                    _should_pass(path.relative_to(folder))))
    return Verification(
        f"✅ {task} loads and would import ({problem}, {describe_harness(problem)}). Running {len(checks)} "
        f"submission(s) of its solutions on {', '.join(g.name for g in gpu_types)}: "
        f"{', '.join(f'#{c.submission_id}' for c in checks)}; the report follows when they end.", checks)


def report(checks: list[Check], final: bool = False) -> str | None:
    """The report once every run has ended (None before); `final`: now, with what has not ended named."""
    submissions = {s.pk: s for s in Submission.objects.filter(pk__in=[c.submission_id for c in checks])
                   .prefetch_related("runs__gpu_type")}
    runs = {pk: list(s.runs.all()) for pk, s in submissions.items()}
    if not final and any(not r.is_terminal for rs in runs.values() for r in rs):
        return None
    lines = []
    for check in checks:
        done = runs.get(check.submission_id, [])
        if not done or any(not r.is_terminal for r in done):
            lines.append(f"⏳ {check.label}: not finished (#{check.submission_id})")
            continue
        passed = all(r.status == RunStatus.SUCCEEDED and r.passed for r in done)
        why = "; ".join(f"{r.gpu_type.name} {r.get_status_display().lower()}: {(r.error or r.verdict)[:120]}"
                        for r in done if not (r.status == RunStatus.SUCCEEDED and r.passed))
        if passed == check.should_pass:
            lines.append(f"✅ {check.label}: {'passed' if passed else 'failed'}, as expected")
        else:
            lines.append(f"❌ {check.label}: {'passed' if passed else 'failed'}, expected to "
                         f"{'pass' if check.should_pass else 'fail'}" + (f" ({why})" if why else ""))
    return "Report:\n" + "\n".join(sorted(lines, key=lambda line: line[2:]))
