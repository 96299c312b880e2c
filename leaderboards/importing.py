"""Storing parsed task definitions and competition files: all-or-nothing, versioned by content hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction

from runners.models import GpuType

from .models import Competition, HarnessProtocol, Leaderboard, Problem
from .taskfile import CompetitionDefinition, TaskDefinition


class ImportRejected(Exception):
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (f"created: {', '.join(self.created) or '-'}; updated: {', '.join(self.updated) or '-'}; "
                f"unchanged: {', '.join(self.unchanged) or '-'}")


def resolve_harness(task: TaskDefinition, harness: str) -> str:
    own_evaluator = bool(task.main) or task.lang == "cu"  # an eval.py, or a cu task's eval.cu
    if harness == "auto":
        return HarnessProtocol.POPCORN if own_evaluator else HarnessProtocol.KERNELBOT
    if harness == HarnessProtocol.POPCORN and not own_evaluator:
        raise ImportRejected([f"problem {task.name}: the popcorn protocol needs config.main (an eval.py)"])
    if harness == HarnessProtocol.KERNELBOT and task.lang == "cu":
        raise ImportRejected([f"problem {task.name}: a cu task runs its own eval.cu (the popcorn protocol); "
                              "the kernelbot harness needs a Python problem"])
    if harness not in HarnessProtocol.values:
        raise ImportRejected([f"problem {task.name}: unknown harness '{harness}'"])
    return harness


def store_problem(task: TaskDefinition, harness: str = "auto") -> tuple[Problem, bool]:
    """The latest version of `task.name` if its content is unchanged, else a new version."""
    protocol = resolve_harness(task, harness)
    latest = Problem.objects.filter(name=task.name).order_by("-version").first()
    if latest and latest.content_hash == task.content_hash and latest.harness == protocol:
        if latest.description != task.description or latest.definition != task.to_json():
            latest.description, latest.definition = task.description, task.to_json()
            latest.save(update_fields=["description", "definition"])
        return latest, False
    problem = Problem.objects.create(
        name=task.name, version=(latest.version + 1) if latest else 1, content_hash=task.content_hash,
        lang=task.lang, description=task.description, definition=task.to_json(), harness=protocol)
    return problem, True


def gpu_types_named(names: list[str], where: str) -> list[GpuType]:
    known = {g.name.lower(): g for g in GpuType.objects.all()}
    missing = [n for n in names if n.lower() not in known]
    if missing:
        raise ImportRejected([f"{where}: unknown GPU type(s) {', '.join(missing)} (known: "
                              f"{', '.join(sorted(g.name for g in known.values())) or 'none'}); "
                              "create them in the admin under GPU types first"])
    return [known[n.lower()] for n in names]


def upsert_leaderboard(name: str, task: TaskDefinition, deadline: datetime, gpu_names: list[str], *,
                       harness: str = "auto", competition: Competition | None = None, force: bool = False,
                       report: ImportReport) -> Leaderboard:
    gpu_types = gpu_types_named(gpu_names, f"leaderboard {name}")
    existing = Leaderboard.objects.select_related("problem").filter(name=name).first()
    if existing and existing.problem.content_hash != task.content_hash and existing.is_open \
            and existing.submissions.exists() and not force:
        raise ImportRejected([f"leaderboard {name} is running with {existing.submissions.count()} submissions; "
                              "changing its files or benchmarks needs an explicit force (--force)"])
    problem, _ = store_problem(task, harness)
    # The problem carries its description; a leaderboard's own description holds organisers' extra notes.
    values = {"problem": problem, "deadline": deadline, "ranking_by": task.ranking_by, "competition": competition}
    if existing is None:
        leaderboard = Leaderboard.objects.create(name=name, **values)
        report.created.append(name)
    else:
        leaderboard = existing
        changed = any(getattr(leaderboard, k) != v for k, v in values.items()) or \
            set(leaderboard.gpu_types.all()) != set(gpu_types)
        for k, v in values.items():
            setattr(leaderboard, k, v)
        leaderboard.save()
        (report.updated if changed else report.unchanged).append(name)
    leaderboard.gpu_types.set(gpu_types)
    return leaderboard


def do_import_competition(definition: CompetitionDefinition, *, force: bool = False) -> ImportReport:
    report = ImportReport()
    with transaction.atomic():
        competition, _ = Competition.objects.update_or_create(
            name=definition.name, defaults={"description": definition.description, "deadline": definition.deadline})
        errors = []
        for entry in definition.problems:
            try:
                with transaction.atomic():
                    upsert_leaderboard(entry.name, entry.task, entry.deadline, entry.gpus, harness=entry.harness,
                                       competition=competition, force=force, report=report)
            except ImportRejected as exc:
                errors.extend(exc.errors)
        if errors:
            raise ImportRejected(errors)  # rolls back every leaderboard of the file
    return report


def do_import_task(task: TaskDefinition, *, leaderboard: str | None = None, deadline: datetime | None = None,
                   gpus: list[str] | None = None, harness: str = "auto", force: bool = False) -> ImportReport:
    report = ImportReport()
    with transaction.atomic():
        if leaderboard:
            if deadline is None:
                raise ImportRejected([f"leaderboard {leaderboard}: a deadline is required"])
            upsert_leaderboard(leaderboard, task, deadline, gpus or task.gpus, harness=harness, force=force,
                               report=report)
        else:
            problem, created = store_problem(task, harness)
            (report.created if created else report.unchanged).append(str(problem))
    return report
