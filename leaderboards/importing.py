"""Storing parsed task definitions and competition files: all-or-nothing, versioned by content hash."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import transaction
from django.utils import timezone

from runners.models import GpuType
from taskspec.model import CompetitionFile, TaskDefinition, has_own_evaluator, leaderboard_name_error

from .actions import do_rescore_leaderboard
from .models import Competition, HarnessProtocol, Leaderboard, Problem, RankingRule
from .taskcheck import (
    REFERENCE,
    TRUSTED_NAMES,
    cuda_shortfall,
    cuda_warning,
    describe,
    entry_file,
    missing_imported_names,
    missing_trusted_names,
    needing_modes,
)

DEFAULT_OPEN_DAYS = 365  # no deadline given anywhere: open a year, as KernelBot's problem sync does


@dataclass(frozen=True)
class Hints:
    """How the organiser asks for what a refusal suggests, in the front-end they import from (the command line's
    flags; the admin form's fields)."""

    force: str = "pass --force"
    gpu: str = "--gpu"
    past_deadline: str = "pass --past-deadline"
    harness: str = "--harness {protocol}"
    reset: str = "pass --reset"

    def use(self, protocol: str) -> str:
        return self.harness.format(protocol=protocol, label=HarnessProtocol(protocol).label)


COMMAND_LINE = Hints()
ADMIN_FORM = Hints(force="tick “Force” below", gpu="the GPU types field",
                   past_deadline="tick “The deadline is in the past on purpose”", harness="choose “{label}” as Harness",
                   reset="tick “Take these values”")


class ImportRejected(Exception):
    def __init__(self, errors: list[str]):
        super().__init__("; ".join(errors))
        self.errors = errors


@dataclass
class ImportReport:
    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)  # one per leaderboard or problem, for the organiser
    changes: dict[str, list[str]] = field(default_factory=dict)  # leaderboard → what the import changes on it

    def __str__(self) -> str:
        return "\n".join(self.lines) or "nothing to import"

    def add(self, status: list[str], name: str, line: str) -> None:
        status.append(name)
        verb = "created" if status is self.created else "updated" if status is self.updated else "unchanged"
        self.lines.append(f"{verb} {line}")


_HARNESS_NAMES = {HarnessProtocol.KERNELBOT: "trusted harness (reference.py)",
                  HarnessProtocol.POPCORN: "popcorn protocol"}


def describe_harness(problem: Problem) -> str:
    name = _HARNESS_NAMES[HarnessProtocol(problem.harness)]
    if problem.harness != HarnessProtocol.POPCORN:
        return name
    definition = problem.definition
    return f"{name} ({definition.get('main') or ' + '.join(definition.get('config', {}).get('sources', []))})"


def resolve_harness(task: TaskDefinition, harness: str, hints: Hints = COMMAND_LINE) -> str:
    """The protocol a problem runs under, checked against what that protocol needs from its files.
    auto: the problem's own evaluator (config.main's eval.py among its files, or a cu task's eval.cu),
    else the trusted harness."""
    names = set(task.files) | {task.submission_name}
    own_evaluator = has_own_evaluator(task)
    if harness not in (*HarnessProtocol.values, "auto"):
        raise ImportRejected([f"problem {task.name}: unknown harness {harness!r}; expected auto, "
                              f"{', '.join(HarnessProtocol.values)}"])
    if harness == "auto":
        harness = HarnessProtocol.POPCORN if own_evaluator else HarnessProtocol.KERNELBOT
    if harness == HarnessProtocol.POPCORN and not own_evaluator:
        what = f"config.main {task.main} is not one of the files" if task.main else "there is no config.main"
        raise ImportRejected([f"problem {task.name}: the popcorn protocol runs the problem's own eval.py, but "
                              f"{what}; add it to files, or use the trusted harness ({hints.use('kernelbot')})"])
    if harness == HarnessProtocol.KERNELBOT and task.lang == "cu":
        raise ImportRejected([f"problem {task.name}: a cu task runs its own eval.cu (the popcorn protocol); "
                              "the kernelbot harness needs a Python problem"])
    if harness == HarnessProtocol.KERNELBOT:
        missing = [f for f in ("reference.py", "submission.py") if f not in names]
        if missing:
            hint = " or name config.main's eval.py among the files" if task.main else ""
            raise ImportRejected([f"problem {task.name}: the trusted harness needs {' and '.join(missing)} among "
                                  f"the files (reference.py defines generate_input, ref_kernel and "
                                  f"check_implementation; the submission is submission.py){hint}"])
        check_reference_interface(task, own_evaluator, hints)
        if task.multi_gpu:
            raise ImportRejected([f"problem {task.name}: multi_gpu: the trusted harness runs one device per run and "
                                  "never reads world_size, so every run would fail; run it under its own eval.py "
                                  f"(config.main, among the files: {hints.use('popcorn')}), or drop multi_gpu"])
    missing = missing_imported_names(task.files, task.main, task.submission_name) \
        if harness == HarnessProtocol.POPCORN and task.lang == "py" else []
    if missing:
        raise ImportRejected([f"problem {task.name}: {m}; every run would crash there (the popcorn protocol runs the "
                              "task's own eval.py)" for m in missing])
    return harness


def check_reference_interface(task: TaskDefinition, own_evaluator: bool, hints: Hints) -> None:
    """The trusted harness imports reference.py and calls TRUSTED_NAMES from it: read, never run, here, so a task
    written for its own eval.py is refused at import instead of failing every run."""
    try:
        missing = missing_trusted_names(task.files[REFERENCE])
    except SyntaxError as exc:
        raise ImportRejected([f"problem {task.name}: reference.py does not parse (line {exc.lineno}: {exc.msg}); "
                              "the trusted harness imports it"]) from None
    if not missing:
        return
    if own_evaluator:
        hint = f"keep the task's own {task.main} (the popcorn protocol): {hints.use('popcorn')}, or auto"
    else:
        hint = ("define them in reference.py (or import them there from one of the task's files), or give the task "
                "its own eval.py (config.main, among the files) to run under the popcorn protocol")
    raise ImportRejected([f"problem {task.name}: the trusted harness calls {', '.join(TRUSTED_NAMES)} from "
                          f"reference.py, which does not define {', '.join(missing)}; {hint}"])


def store_problem(task: TaskDefinition, harness: str = "auto", collection: str = "",
                  hints: Hints = COMMAND_LINE) -> tuple[Problem, bool]:
    """The version of `task.name` in `collection` with this content and protocol if there is one, else a new version
    of that collection's problem. Collections reuse directory names (demo/matmul_py, pmpp_v2/matmul_py): importing
    one never adds a version to another's problem."""
    protocol = resolve_harness(task, harness, hints)
    versions = Problem.objects.filter(collection=collection, name=task.name).order_by("-version")
    same = versions.filter(content_hash=task.content_hash, harness=protocol).first()
    if same:
        if same.description != task.description or same.definition != task.to_json():
            same.description, same.definition = task.description, task.to_json()
            same.save(update_fields=["description", "definition"])
        return same, False
    latest = versions.first()
    problem = Problem.objects.create(
        collection=collection, name=task.name, version=(latest.version + 1) if latest else 1,
        content_hash=task.content_hash, lang=task.lang, description=task.description, definition=task.to_json(),
        harness=protocol)
    return problem, True


def gpu_types_named(names: list[str], where: str) -> list[GpuType]:
    known = {g.name.lower(): g for g in GpuType.objects.all()}
    missing = [n for n in names if n.lower() not in known]
    if missing:
        raise ImportRejected([f"{where}: unknown GPU type(s) {', '.join(missing)} (known: "
                              f"{', '.join(sorted(g.name for g in known.values())) or 'none'}); "
                              "create them in the admin under GPU types first"])
    return [known[n.lower()] for n in names]


def _changes(existing: Leaderboard, values: dict, gpu_types: list[GpuType]) -> list[str]:
    """What an import changes on an existing leaderboard, as the organiser reads it (the preview and the report)."""
    shown = {"problem": "problem", "deadline": "deadline", "ranking_by": "ranking rule", "competition": "competition",
             "run_spread": "between-run spread"}
    found = []
    for key, label in shown.items():
        if key not in values:
            continue
        before, after = getattr(existing, key), values[key]
        if before == after:
            continue
        if key == "deadline":
            before, after = (f"{v.astimezone(UTC):%Y-%m-%d %H:%M} UTC" for v in (before, after))
        elif key == "ranking_by":
            before, after = RankingRule(before).label.lower(), RankingRule(after).label.lower()
        found.append(f"{label} {before or 'none'} → {after or 'none'}")
    old_gpus = sorted(g.name for g in existing.gpu_types.all())
    if old_gpus != sorted(g.name for g in gpu_types):
        found.append(f"GPU types {', '.join(old_gpus) or 'none'} → {', '.join(sorted(g.name for g in gpu_types))}")
    return found


def _as_json(key: str, value) -> object:
    """A file-named value as `Leaderboard.imported` keeps it."""
    if key == "deadline":
        return value.astimezone(UTC).isoformat()
    return sorted(g.name for g in value) if key == "gpus" else value


_LABELS = {"deadline": "deadline", "gpus": "GPU types", "run_spread": "between-run spread"}


def _shown(key: str, value: object) -> str:
    if key == "deadline":
        return f"{datetime.fromisoformat(value):%Y-%m-%d %H:%M} UTC"
    return ", ".join(value) if key == "gpus" else "none" if value is None else str(value)


def _board_value(board: Leaderboard, key: str) -> object:
    if key == "gpus":
        return _as_json(key, board.gpu_types.all())
    return _as_json(key, board.deadline) if key == "deadline" else board.run_spread


def upsert_leaderboard(name: str, task: TaskDefinition, deadline: datetime | None, gpu_names: list[str] | None, *,
                       harness: str = "auto", competition: Competition | None = None, collection: str = "",
                       run_spread: float | None = None, reset: bool = False,
                       force: bool = False, past_deadline: bool = False, hints: Hints = COMMAND_LINE,
                       report: ImportReport) -> Leaderboard:
    """Create or update leaderboard `name`. What the organiser set stays: `deadline` None keeps an existing board's
    deadline (a new one opens for a year), `gpu_names` None its GPU types (a new one takes the task's), `run_spread`
    None its spread; and a value the import does name (deadline, GPU types, spread) is written only to a new board,
    when it differs from the value the board's last import named (`Leaderboard.imported`: the file changed), or with
    `reset` (take the file's values). So re-importing an unchanged file (`./dev serve` re-imports the demo at every
    start) never undoes an edit in the admin; a board imported before `imported` existed keeps its values until the
    file changes or `reset`. A ranking rule changed in the admin stays (one still equal to its problem's follows the
    task, and a changed rule rescores the board). No board is ever left without a GPU type. A standalone import (no
    `competition`) keeps the board's competition; a competition import refuses a board another competition owns
    unless forced. A deadline in the past that the board does not have already is refused unless `past_deadline`
    (the board would be closed at once). The problem is stored in the competition's collection; a standalone import
    onto a board whose problem has the task's name adds a version of that problem, else it is stored in
    `collection`."""
    if message := leaderboard_name_error(name):
        raise ImportRejected([f"leaderboard {name[:120]}: {message}"])
    existing = Leaderboard.objects.select_related("problem", "competition").filter(name=name).first()
    deadline_given = deadline is not None
    named = {k: v for k, v in {"deadline": deadline, "run_spread": run_spread,
                               "gpus": gpu_types_named(gpu_names, f"leaderboard {name}") if gpu_names else None
                               }.items() if v is not None}
    last = existing.imported if existing else {}
    imported = {**last, **{k: _as_json(k, v) for k, v in named.items()}}
    kept = []
    for key in list(named) if existing and not reset else ():
        if key in last and last[key] != imported[key]:
            continue  # the file's value changed since the board's last import: it applies
        del named[key]
        if _board_value(existing, key) != imported[key]:
            kept.append(f"{_LABELS[key]} {_shown(key, _board_value(existing, key))}, not the file's "
                        f"{_shown(key, imported[key])}")
    deadline, run_spread = named.get("deadline"), named.get("run_spread")
    gpu_types = named.get("gpus") or (list(existing.gpu_types.all()) if existing else []) or \
        gpu_types_named(task.gpus, f"leaderboard {name}")
    if not gpu_types:
        raise ImportRejected([f"leaderboard {name}: no GPU type to run on: name at least one ({hints.gpu}), or list "
                              "gpus in task.yml"])
    if deadline is not None and deadline <= timezone.now() and not past_deadline and \
            (existing is None or existing.deadline != deadline):
        raise ImportRejected([f"leaderboard {name}: deadline {deadline.astimezone(UTC):%Y-%m-%d %H:%M} UTC is in the "
                              f"past: the leaderboard would be closed at once; correct it, or {hints.past_deadline}"])
    if existing and competition and existing.competition not in (None, competition) and not force:
        raise ImportRejected([f"leaderboard {name} belongs to the competition {existing.competition.name!r}; "
                              f"importing {competition.name!r} would take it over. Rename it in this file, or "
                              f"{hints.force} to move it into this competition"])
    if existing and existing.problem.content_hash != task.content_hash and existing.is_open \
            and existing.submissions.exists() and not force:
        raise ImportRejected([f"leaderboard {name} is running with {existing.submissions.count()} submissions; "
                              f"changing its files or benchmarks needs an explicit force: {hints.force}"])
    protocol = resolve_harness(task, harness, hints)
    lacking, requests = cuda_shortfall(task.files, task.lang, entry_file(protocol, task.main), gpu_types)
    if lacking and len(lacking) == len(gpu_types) and not force:
        raise ImportRejected([f"leaderboard {name}: the problem's code asks for a CUDA GPU ({describe(requests)}), but "
                              f"its GPU types ({', '.join(lacking)}) have none, so every {needing_modes(requests)}run "
                              f"would fail: choose a GPU type with CUDA ({hints.gpu}), or make that code fall back to "
                              f"the CPU (behind torch.cuda.is_available()); {hints.force} to import it anyway"])
    if competition:
        collection = competition.name
    elif existing and existing.problem.name == task.name:
        collection = existing.problem.collection
    problem, _ = store_problem(task, protocol, collection, hints)
    note = ""
    if deadline is None:
        deadline = existing.deadline if existing else timezone.now() + timedelta(days=DEFAULT_OPEN_DAYS)
    if not deadline_given:
        note = " (none given: kept)" if existing else f" (none given: {DEFAULT_OPEN_DAYS} days from now)"
    ranking_by = task.ranking_by
    if existing and existing.ranking_by != existing.problem.definition.get("ranking_by", RankingRule.LAST):
        ranking_by = existing.ranking_by  # an organiser's choice in the admin outlives the task's default
    # The problem carries its description; a leaderboard's own description holds organisers' extra notes.
    values = {"problem": problem, "deadline": deadline, "ranking_by": ranking_by, "imported": imported,
              "competition": competition or (existing.competition if existing else None)}
    if run_spread is not None:  # else an existing board keeps what the organiser set
        values["run_spread"] = float(run_spread)
    changes: list[str] = []
    if existing is None:
        leaderboard = Leaderboard.objects.create(name=name, **values)
        status = report.created
    else:
        leaderboard = existing
        changes = _changes(existing, values, gpu_types)
        rule_changed = existing.ranking_by != ranking_by
        for k, v in values.items():
            setattr(leaderboard, k, v)
        leaderboard.save()
        status = report.updated if changes else report.unchanged
    leaderboard.gpu_types.set(gpu_types)
    if existing is not None and rule_changed:
        do_rescore_leaderboard(leaderboard)
        changes.append("its scores are recomputed with the new rule")
    report.changes[name] = changes
    report.add(status, name, f"leaderboard {name}: problem {problem}, {describe_harness(problem)}, deadline "
                             f"{deadline.astimezone(UTC):%Y-%m-%d %H:%M} UTC{note}, GPUs "
                             f"{', '.join(g.name for g in gpu_types)}"
                             + (f" (changed: {'; '.join(changes)})" if changes else "")
                             + (f" (kept as set since the last import: {'; '.join(kept)}; {hints.reset} to take "
                                "the file's values)" if kept else ""))
    if lacking:
        report.lines.append(f"warning: leaderboard {name}: {cuda_warning(lacking, requests)}")
    return leaderboard


class _Preview(Exception):
    """Raised inside a preview's transaction to roll back what it wrote."""


def previewed(do_import, *args, **kwargs) -> ImportReport:
    """What `do_import` (do_import_task or do_import_competition) would do, without doing it: it runs in a
    transaction rolled back at the end, so the preview checks and reports exactly as the import would."""
    try:
        with transaction.atomic():
            report = do_import(*args, **kwargs)
            raise _Preview(report)
    except _Preview as done:
        return done.args[0]


def do_import_competition(definition: CompetitionFile, *, force: bool = False, past_deadline: bool = False,
                          reset: bool = False, hints: Hints = COMMAND_LINE) -> ImportReport:
    report = ImportReport()
    with transaction.atomic():
        competition = Competition.objects.filter(name=definition.name).first()
        # A placeholder until its boards' deadlines are known when the file gives none.
        deadline = definition.deadline or (competition.deadline if competition else timezone.now())
        competition, _ = Competition.objects.update_or_create(
            name=definition.name, defaults={"description": definition.description, "deadline": deadline})
        errors = []
        boards = []
        for entry in definition.problems:
            try:
                with transaction.atomic():
                    boards.append(upsert_leaderboard(
                        entry.name, entry.task, entry.deadline, entry.gpus, harness=entry.harness,
                        run_spread=entry.run_spread, reset=reset,
                        competition=competition, force=force, past_deadline=past_deadline, hints=hints,
                        report=report))
            except ImportRejected as exc:
                errors.extend(exc.errors)
        if errors:
            raise ImportRejected(errors)  # rolls back every leaderboard of the file
        if definition.deadline is None and boards:
            competition.deadline = max(board.deadline for board in boards)
            competition.save(update_fields=["deadline"])
        report.lines.insert(0, f"competition {competition.name}: deadline "
                               f"{competition.deadline.astimezone(UTC):%Y-%m-%d %H:%M} UTC"
                               + ("" if definition.deadline else " (none given: its latest leaderboard's)"))
    return report


def do_import_task(task: TaskDefinition, *, leaderboard: str | None = None, deadline: datetime | None = None,
                   gpus: list[str] | None = None, harness: str = "auto", force: bool = False,
                   past_deadline: bool = False, reset: bool = False, hints: Hints = COMMAND_LINE,
                   collection: str = "") -> ImportReport:
    """`gpus` None (or empty): a new leaderboard takes the task's GPU types, an existing one keeps its own.
    `collection`: the folder the task was read from ("" for an uploaded archive); see upsert_leaderboard."""
    report = ImportReport()
    with transaction.atomic():
        if leaderboard:
            upsert_leaderboard(leaderboard, task, deadline, gpus or None, harness=harness, collection=collection,
                               force=force, past_deadline=past_deadline, reset=reset, hints=hints, report=report)
        else:
            problem, created = store_problem(task, harness, collection, hints)
            report.add(report.created if created else report.unchanged, str(problem),
                       f"problem {problem}: {describe_harness(problem)} (no leaderboard)")
    return report
