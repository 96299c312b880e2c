"""Parse and validate problems in the gpu-mode reference-kernels `task.yml` format, and competition
files that list them. Pure Python (stdlib + PyYAML): the harness and the importer both use it.

API:

    load_task(task_dir, *, root=None) -> TaskDefinition
    load_task_from_zip(data, *, name=None) -> TaskDefinition
    load_competition(path, *, root=None) -> CompetitionDefinition
    parse_deadline(value) -> datetime (UTC) | None
    case_line(case) -> "k: v; k: v"

Every problem is reported as a `TaskFileError` (a ValueError) listing all issues found in the file(s):
`<path>: <key>: <message> (problem <name>)`, one per line in `str(err)` and `err.errors`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import stat
import tempfile
import unicodedata
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

SUBMISSION = "@SUBMISSION@"
LANGS = ("py", "cu")
TEMPLATE_LANGS = ("Python", "Triton", "CUDA", "HIP", "CuteDSL")
RANKINGS = ("last", "mean", "geom")
HARNESSES = ("kernelbot", "popcorn", "auto")
DEFAULT_TIMEOUT = 180
MAX_TIMEOUT = 24 * 3600
# The columns these names are stored in (leaderboards.models): checked here so a long name is an import error.
MAX_PROBLEM_NAME = 100
MAX_LEADERBOARD_NAME = 100
MAX_COMPETITION_NAME = 120
MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 8 << 20
MAX_ZIP_MEMBERS = 200
MAX_ZIP_BYTES = 16 << 20

_TASK_KEYS = {
    "files", "lang", "description", "config", "templates", "tests", "benchmarks", "ranking_by",
    "test_timeout", "benchmark_timeout", "ranked_timeout", "seed", "multi_gpu", "gpus",
}
_CU_CONFIG_KEYS = {"sources", "include_dirs", "defines", "compile_flags"}
_COMPETITION_KEYS = {"name", "description", "deadline", "problems"}
_PROBLEM_KEYS = {"name", "directory", "deadline", "gpus", "harness"}
# Cases travel to the harness as "k: v; k: v" lines, so values must not contain separators.
_CASE_VALUE = re.compile(r"[A-Za-z0-9_.+-]+")
# A plain file name: files are written side by side into the run's working directory.
_FILE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # Django's SlugField: what a leaderboard URL can name
# The forms KernelBot's problem sync accepts ("%Y-%m-%d %H:%M", "%Y-%m-%d"; strptime takes "6:59"), read as UTC.
_DEADLINE_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d")
_MISSING = object()


CaseValue = int | str | bool | list[int | str | bool]


@dataclass(frozen=True)
class Issue:
    path: Path
    key: str | None
    message: str
    problem: str | None

    def __str__(self) -> str:
        where = f"{self.path}: {self.key}: " if self.key else f"{self.path}: "
        return where + self.message + (f" (problem {self.problem})" if self.problem else "")


class TaskFileError(ValueError):
    """All issues found; `path`, `key` and `problem` describe the first."""

    def __init__(self, issues: list[Issue]):
        self.issues = list(issues)
        self.errors = [str(issue) for issue in self.issues]
        first = self.issues[0]
        self.path, self.key, self.problem = first.path, first.key, first.problem
        super().__init__("\n".join(self.errors))


class CompetitionError(TaskFileError):
    """Issues across a competition file and all the tasks it lists."""


class _Report:
    def __init__(self, path: Path, problem: str | None):
        self.path, self.problem, self.issues = path, problem, []

    def add(self, key: str | None, message: str) -> None:
        self.issues.append(Issue(self.path, key, message, self.problem))

    def check(self, error: type[TaskFileError] = TaskFileError) -> None:
        if self.issues:
            raise error(self.issues)


@dataclass(frozen=True)
class TaskDefinition:
    name: str
    lang: str
    description: str
    files: dict[str, str]  # name -> text, without the submission
    submission_name: str
    main: str | None
    config: dict[str, Any]
    templates: dict[str, str]
    tests: list[dict[str, CaseValue]]
    benchmarks: list[dict[str, CaseValue]]
    ranking_by: str = "last"
    test_timeout: int = DEFAULT_TIMEOUT
    benchmark_timeout: int = DEFAULT_TIMEOUT
    ranked_timeout: int = DEFAULT_TIMEOUT
    seed: int | None = None
    multi_gpu: bool = False
    gpus: list[str] = field(default_factory=list)
    content_hash: str = field(init=False)

    def __post_init__(self) -> None:
        # Everything that changes how a submission is evaluated, and nothing else.
        evaluated = {
            "files": self.files, "submission_name": self.submission_name, "lang": self.lang,
            "config": self.config, "tests": self.tests, "benchmarks": self.benchmarks,
            "ranking_by": self.ranking_by, "test_timeout": self.test_timeout,
            "benchmark_timeout": self.benchmark_timeout, "ranked_timeout": self.ranked_timeout,
            "seed": self.seed, "multi_gpu": self.multi_gpu,
        }
        canonical = json.dumps(evaluated, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        object.__setattr__(self, "content_hash", hashlib.sha256(canonical.encode()).hexdigest())

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskDefinition:
        """The hash is recomputed, never trusted from `data`."""
        return cls(**{k: v for k, v in data.items() if k != "content_hash"})


@dataclass(frozen=True)
class CompetitionProblem:
    name: str
    task: TaskDefinition
    deadline: datetime | None  # None: none given here nor for the competition (the importer picks one)
    gpus: list[str]
    harness: str = "auto"


@dataclass(frozen=True)
class CompetitionDefinition:
    name: str
    description: str
    deadline: datetime | None  # None: `deadline: ""` or absent (the importer uses its problems' latest)
    problems: list[CompetitionProblem]


def has_own_evaluator(task: TaskDefinition) -> bool:
    """Whether the task brings its own evaluator (config.main's eval.py among its files, or a cu task's eval.cu):
    what the `auto` harness runs it under the popcorn protocol for, else the trusted harness."""
    return (task.main is not None and task.main in task.files) or task.lang == "cu"


def case_line(case: dict[str, CaseValue]) -> str:
    """One case as KernelBot writes it for eval.py: `f"{k}: {v}"` joined by "; " (True, [128, 256])."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def parse_deadline(value: Any) -> datetime | None:
    """A deadline as KernelBot's problem sync reads it, in UTC: "2025-06-30" (midnight), "2025-11-29 6:59",
    or ISO 8601 ("2027-01-31T23:59Z"); naive means UTC. Empty or None: no deadline given (None).
    Raises ValueError for anything else."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, datetime):
        parsed = value
    elif isinstance(value, date):  # an unquoted YAML date
        parsed = datetime.combine(value, time())
    elif isinstance(value, str):
        parsed = _parse_deadline_text(value.strip())
    else:
        raise ValueError(f"expected a date and time like \"2025-06-30 23:59\", got {_kind(value)}")
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)


def _parse_deadline_text(text: str) -> datetime:
    for fmt in _DEADLINE_FORMATS:
        try:
            return datetime.strptime(text, fmt)
        except ValueError:
            pass
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a date and time; use \"2025-06-30\" (00:00 UTC), "
                         "\"2025-06-30 23:59\" or ISO 8601 like \"2025-06-30T23:59:00Z\"") from None


def collection_root(task_dir: Path, *, within: Path | None = None) -> Path:
    """The problem collection a task belongs to: the nearest ancestor holding a competition file (a YAML
    file with a `problems:` list), else the task's parent directory; never above `within`."""
    task_dir = Path(task_dir).resolve()
    within = Path(within).resolve() if within is not None else None
    for folder in task_dir.parents:
        if within is not None and not folder.is_relative_to(within):
            break
        if any(_is_competition_file(f) for f in sorted(folder.glob("*.y*ml"))):
            return folder
    return task_dir.parent


def _is_competition_file(path: Path) -> bool:
    try:
        if path.suffix not in (".yaml", ".yml") or not path.is_file() or path.stat().st_size > MAX_FILE_BYTES:
            return False
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(raw, dict) and isinstance(raw.get("problems"), list)


def load_task(task_dir: Path, *, root: Path | None = None) -> TaskDefinition:
    """Load `task_dir/task.yml`; referenced files must stay inside `root` (default: `collection_root`)."""
    task_dir = Path(task_dir).resolve()
    root = Path(root).resolve() if root is not None else collection_root(task_dir)
    hint = (f"files may come from anywhere inside the problem collection {root.name}/ (pass --root with a "
            "directory that holds both the task and the file)")
    return _load_task(task_dir, root, task_dir.name, lambda p: p.relative_to(root.parent), hint)


def load_task_from_zip(data: bytes, *, name: str | None = None, filename: str | None = None) -> TaskDefinition:
    """Load an uploaded archive holding one `task.yml` (at the top or in a folder, with shared files
    anywhere in the archive). `name` defaults to the task's folder name, or "upload"; errors name the archive
    `filename` (the uploaded file's name), else `<name>.zip`."""
    label = Path(Path(filename).name if filename else f"{name or 'upload'}.zip")
    report = _Report(label, name or "upload")
    with tempfile.TemporaryDirectory(prefix="kernelbot-task-") as tmp:
        top = Path(tmp).resolve()
        _extract_zip(data, top, report)
        found = sorted(top.rglob("task.yml"))
        if len(found) != 1:
            listed = ", ".join(str(p.relative_to(top)) for p in found) or "none"
            report.add(None, f"the archive must contain exactly one task.yml, found {listed}: zip one problem "
                             "folder (with the shared files it names); a whole collection is imported from its "
                             "competition file (import_problems set.yaml)")
            report.check()
        task_dir = found[0].parent
        problem = name or (task_dir.name if task_dir != top else "upload")
        if task_dir == top:  # a flat zip: nothing can sit above task.yml
            hint = ("task.yml is at the top of this archive, so ../ leads out of it: put the problem in a folder "
                    "(vectoradd/task.yml) and each shared file where its ../ path then points (../utils.py: "
                    "utils.py beside that folder), and zip both")
        else:
            hint = ("files must come from inside the archive: zip the folder that holds both the problem and its "
                    "shared files")
        return _load_task(task_dir, top, problem, lambda p: label / p.relative_to(top), hint)


def load_competition(path: Path, *, root: Path | None = None) -> CompetitionDefinition:
    """Load a competition file and every task it lists; raises one CompetitionError for all issues.
    Task directories and their files must stay inside `root` (default: the competition file's directory)."""
    path = Path(path).resolve()
    comp_dir = Path(root).resolve() if root is not None else path.parent
    if not path.is_relative_to(comp_dir):
        raise CompetitionError([Issue(path, None, f"the competition file is outside the root {comp_dir}", None)])
    report = _Report(path.relative_to(comp_dir.parent), None)
    raw = _read_yaml(path, report)
    report.check(CompetitionError)
    if not isinstance(raw, dict):
        report.add(None, f"expected a mapping at the top level, got {_kind(raw)}")
        report.check(CompetitionError)

    _check_keys(report, raw, _COMPETITION_KEYS, {"name", "problems"}, "")
    name = _string(report, raw, "name", max_length=MAX_COMPETITION_NAME)
    description = _string(report, raw, "description", allow_empty=True) or ""
    deadline = _deadline(report, "deadline", raw.get("deadline"))
    entries = raw.get("problems", [])
    if "problems" in raw and (not isinstance(entries, list) or not entries):
        report.add("problems", f"expected a non-empty list of problems, got {_kind(entries)}")
        entries = []

    issues: list[Issue] = []
    problems: list[CompetitionProblem] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        key = f"problems[{i}]"
        if not isinstance(entry, dict):
            report.add(key, f"expected a mapping, got {_kind(entry)}")
            continue
        entry_report = _Report(report.path, entry["name"] if isinstance(entry.get("name"), str) else None)
        _check_keys(entry_report, entry, _PROBLEM_KEYS, {"name", "directory"}, key + ".")
        problem_name = _string(entry_report, entry, "name", prefix=key + ".")
        if problem_name is not None and (message := leaderboard_name_error(problem_name)):
            entry_report.add(f"{key}.name", message)
        elif problem_name is not None:
            if problem_name in seen:
                entry_report.add(f"{key}.name", f"duplicate name (also problems[{seen[problem_name]}])")
            seen.setdefault(problem_name, i)
        harness = _choice(entry_report, entry, "harness", HARNESSES, "auto", prefix=key + ".")
        problem_deadline = _deadline(entry_report, f"{key}.deadline", entry.get("deadline")) or deadline
        gpus = _string_list(entry_report, entry, "gpus", prefix=key + ".")
        task = None
        task_dir = _problem_dir(entry_report, f"{key}.directory", entry.get("directory"), comp_dir)
        if task_dir is not None:
            try:
                task = load_task(task_dir, root=comp_dir)
            except TaskFileError as exc:
                issues.extend(exc.issues)
        if "gpus" not in entry and task is not None:
            gpus = task.gpus
            if not gpus:
                entry_report.add(f"{key}.gpus", "required because the task does not list gpus")
        elif gpus == []:
            entry_report.add(f"{key}.gpus", "must list at least one GPU")
        report.issues.extend(entry_report.issues)
        if task is not None and not entry_report.issues:
            problems.append(CompetitionProblem(problem_name, task, problem_deadline, list(gpus), harness))

    report.issues.extend(issues)
    report.check(CompetitionError)
    return CompetitionDefinition(name, description, deadline, problems)


def leaderboard_name_error(name: str) -> str | None:
    """Why `name` cannot name a leaderboard (its URL is /lb/<name>/), or None."""
    if not _SLUG.fullmatch(name):
        return f"{name!r} is not a valid leaderboard name: use only letters, digits, - and _"
    if len(name) > MAX_LEADERBOARD_NAME:
        return f"leaderboard names are at most {MAX_LEADERBOARD_NAME} characters, got {len(name)}"
    return None


_UNSEEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format (bidi overrides, zero widths), no glyph


def _unseen(ch: str) -> bool:
    return unicodedata.category(ch) in _UNSEEN


def _visible(text: str) -> str:
    """`text` with every character that shows as nothing or reorders what follows written as its \\u escape."""
    return "".join(f"\\u{ord(c):04x}" if _unseen(c) else c for c in text)


def _load_task(task_dir: Path, root: Path, name: str, shown: Callable[[Path], Path], hint: str) -> TaskDefinition:
    yml = task_dir / "task.yml"
    if bad := next((c for c in name if _unseen(c)), None):  # e.g. U+202E from a zip folder: a name that lies
        where = shown(yml) if task_dir.is_relative_to(root) else yml
        raise TaskFileError([Issue(Path(_visible(str(where))), None, (
            f"the problem name (its directory name) '{_visible(name)}' holds U+{ord(bad):04X} "
            f"{unicodedata.name(bad, 'a control character')}: control and bidirectional formatting characters make "
            "a name read as another; rename the folder with visible characters only"), None)])
    if not task_dir.is_relative_to(root):
        raise TaskFileError([Issue(yml, None, f"the task directory is outside the root {root}", name)])
    report = _Report(shown(yml), name)
    if len(name) > MAX_PROBLEM_NAME:
        report.add(None, f"the problem name (its directory name) is {len(name)} characters; "
                         f"at most {MAX_PROBLEM_NAME} are allowed")
        report.check()
    if not yml.resolve().is_relative_to(root):
        report.add(None, f"task.yml resolves outside the problem collection; {hint}")
        report.check()
    raw = _read_yaml(yml, report)
    report.check()
    if not isinstance(raw, dict):
        report.add(None, f"expected a mapping at the top level, got {_kind(raw)}")
        report.check()

    _check_keys(report, raw, _TASK_KEYS, {"files", "lang", "description", "tests", "benchmarks"}, "")
    inline = _Inliner(report, task_dir, root, hint)
    lang = _choice(report, raw, "lang", LANGS, None)
    description = _string(report, raw, "description")
    before = len(report.issues)
    files, submission_name = _files(report, raw.get("files", _MISSING), inline)
    names = (set(files) | {submission_name}) if len(report.issues) == before else None  # else cascades
    config, main = _config(report, raw.get("config", _MISSING), lang, names)
    templates = {}
    value = raw.get("templates", _MISSING)
    if value is not _MISSING and not isinstance(value, dict):
        report.add("templates", f"expected a mapping of language to path, got {_kind(value)}")
    elif isinstance(value, dict):
        for language, source in value.items():
            if language not in TEMPLATE_LANGS:
                report.add(f"templates.{language}", f"unknown language; expected {', '.join(TEMPLATE_LANGS)}")
            elif (text := inline(f"templates.{language}", source)) is not None:
                templates[language] = text
    multi_gpu = raw.get("multi_gpu", False)
    if not isinstance(multi_gpu, bool):
        report.add("multi_gpu", f"expected true or false, got {_kind(multi_gpu)}")
        multi_gpu = False
    seed = raw.get("seed")
    if seed is not None and not _is_int(seed):
        report.add("seed", f"expected int, got {_kind(seed)}")
    definition = dict(
        name=name, lang=lang, description=description, files=files, submission_name=submission_name,
        main=main, config=config, templates=templates,
        tests=_cases(report, raw, "tests", multi_gpu),
        benchmarks=_cases(report, raw, "benchmarks", multi_gpu),
        ranking_by=_choice(report, raw, "ranking_by", RANKINGS, "last"),
        test_timeout=_timeout(report, raw, "test_timeout"),
        benchmark_timeout=_timeout(report, raw, "benchmark_timeout"),
        ranked_timeout=_timeout(report, raw, "ranked_timeout"),
        seed=seed, multi_gpu=multi_gpu, gpus=_string_list(report, raw, "gpus") or [],
    )
    report.check()
    return TaskDefinition(**definition)


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen = set()
        for key_node, _ in node.value:
            if (key_node.tag, key_node.value) in seen:
                raise yaml.constructor.ConstructorError(  # located at the duplicate, not the mapping's start
                    None, None, f"found duplicate key {key_node.value!r}", key_node.start_mark)
            seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path, report: _Report) -> Any:
    text = _read_text(report, None, path, path.name)
    if text is None:
        return None
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        report.add(None, f"invalid YAML {_yaml_error_text(exc)}")
    except yaml.YAMLError as exc:
        report.add(None, f"invalid YAML: {exc}")
    return None


def _yaml_error_text(exc: yaml.MarkedYAMLError) -> str:
    """Located where the mistake starts: an unclosed bracket or quote is only noticed lines later (often at the end
    of the file), so those are reported at their opening; anything else where the parser stopped."""
    def at(mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"
    start, found = exc.context_mark, exc.problem_mark
    context = re.sub(r"^while (parsing|scanning) ", "", exc.context or "")
    if start is not None and found is not None and (start.line, start.column) != (found.line, found.column):
        if "flow" in context or "quoted" in context:
            return f"at {at(start)}: {context} that is never closed ({exc.problem} at {at(found)})"
        return f"at {at(found)}: {exc.problem} ({context} that starts at {at(start)})"
    mark = found or start
    return (f"at {at(mark)}: " if mark else ": ") + str(exc.problem or exc.context)


def _read_text(report: _Report, key: str | None, path: Path, shown: str) -> str | None:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        report.add(key, f"file not found: {shown}")
        return None
    except IsADirectoryError:
        report.add(key, f"{shown} is a directory, not a file")
        return None
    except OSError as exc:
        report.add(key, f"cannot read {shown}: {exc.strerror}")
        return None
    if len(data) > MAX_FILE_BYTES:
        report.add(key, f"{shown} is larger than the {MAX_FILE_BYTES >> 20} MiB limit")
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        report.add(key, f"{shown} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})")
        return None


@dataclass
class _Inliner:
    """Reads files referenced from task.yml: relative to the task dir, confined to root, size-capped."""

    report: _Report
    task_dir: Path
    root: Path
    hint: str
    total: int = 0

    def __call__(self, key: str, source: Any) -> str | None:
        if not isinstance(source, str) or not source:
            self.report.add(key, f"expected a relative path, got {_kind(source)}")
            return None
        if PurePosixPath(source).is_absolute() or "\\" in source:
            self.report.add(key, f"{source}: absolute paths and backslashes are not allowed")
            return None
        target = (self.task_dir / source).resolve()
        if not target.is_relative_to(self.root):
            self.report.add(key, f"{source} resolves outside the problem collection; {self.hint}")
            return None
        text = _read_text(self.report, key, target, source)
        if text is not None:
            self.total += len(text.encode())
            if self.total > MAX_TOTAL_BYTES:
                limit = MAX_TOTAL_BYTES >> 20
                self.report.add(key, f"{source} takes the inlined files past {limit} MiB in total")
                return None
        return text


def _files(report: _Report, value: Any, inline: _Inliner) -> tuple[dict[str, str], str]:
    files: dict[str, str] = {}
    names: set[str] = set()
    submission = None
    if value is _MISSING:
        return files, ""
    if not isinstance(value, list) or not value:
        report.add("files", f"expected a non-empty list of {{name, source}}, got {_kind(value)}")
        return files, ""
    for i, entry in enumerate(value):
        key = f"files[{i}]"
        if not isinstance(entry, dict):
            report.add(key, f"expected a mapping with name and source, got {_kind(entry)}")
            continue
        _check_keys(report, entry, {"name", "source"}, {"name", "source"}, key + ".")
        name, source = entry.get("name"), entry.get("source")
        if "name" in entry:
            if not isinstance(name, str) or not _FILE_NAME.fullmatch(name):
                report.add(f"{key}.name", f"expected a plain file name like eval.py (no directory), "
                                          f"got {_show(name)}")
                name = None
            elif name in names:
                report.add(f"{key}.name", f"duplicate file name {name}")
                name = None
            else:
                names.add(name)
        if source == SUBMISSION:
            if submission is not None:
                report.add(f"{key}.source", f"more than one {SUBMISSION} entry")
            submission = submission or name
        elif "source" in entry:
            text = inline(f"{key}.source", source)
            if name is not None and text is not None:
                files[name] = text
    if submission is None and not any(e.get("source") == SUBMISSION for e in value if isinstance(e, dict)):
        report.add("files", f"no entry has source {SUBMISSION}; exactly one is required")
    return files, submission or ""


def _config(report: _Report, value: Any, lang: str | None, names: set[str] | None) -> tuple[dict, str | None]:
    """`config.main` is not checked against the files: only the popcorn protocol runs it, and the importer
    decides the protocol (see leaderboards.importing.resolve_harness)."""
    if value is _MISSING:
        if lang == "cu":
            report.add("config", "required for cu tasks (sources, include_dirs, defines, compile_flags)")
        return {}, None
    if not isinstance(value, dict):
        report.add("config", f"expected a mapping, got {_kind(value)}")
        return {}, None
    if lang == "py":
        _check_keys(report, value, {"main"}, {"main"}, "config.")
        main = _string(report, value, "main", prefix="config.")
        return ({"main": main}, main) if main is not None else ({}, None)
    if lang != "cu":
        return {}, None
    _check_keys(report, value, _CU_CONFIG_KEYS, {"sources"}, "config.")
    sources = _string_list(report, value, "sources", prefix="config.")
    if "sources" in value and sources is not None and not sources:
        report.add("config.sources", "must list at least one file")
    for i, source in enumerate(sources or []):
        if names is not None and source not in names:
            report.add(f"config.sources[{i}]", f"{source} is not one of the files")
    defines = value.get("defines", {})
    if not isinstance(defines, dict):
        report.add("config.defines", f"expected a mapping of macro name to str or int, got {_kind(defines)}")
        defines = {}
    for macro, macro_value in defines.items():
        if not isinstance(macro, str) or not macro.isidentifier():
            report.add("config.defines", f"macro name {_show(macro)} is not an identifier")
        elif not (_is_int(macro_value) or isinstance(macro_value, str)):
            report.add(f"config.defines.{macro}", f"expected str or int, got {_kind(macro_value)}")
    config = {
        "sources": sources or [],
        "include_dirs": _string_list(report, value, "include_dirs", prefix="config.") or [],
        "defines": dict(defines),
        "compile_flags": _string_list(report, value, "compile_flags", prefix="config.") or [],
    }
    return config, None


def _cases(report: _Report, raw: dict, key: str, multi_gpu: bool) -> list[dict[str, CaseValue]]:
    value = raw.get(key, _MISSING)
    if value is _MISSING:
        return []
    if not isinstance(value, list) or not value:
        report.add(key, f"expected a non-empty list of cases, got {_kind(value)}")
        return []
    for i, case in enumerate(value):
        where = f"{key}[{i}]"
        if not isinstance(case, dict) or not case:
            report.add(where, f"expected a non-empty mapping of parameters, got {_kind(case)}")
            continue
        valid = set()
        for name, v in case.items():
            if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
                report.add(where, f"parameter name {_show(name)} is not an identifier")
            elif (message := _case_value_error(v)) is not None:
                report.add(f"{where}.{name}", message)
            else:
                valid.add(name)
        world_size = case.get("world_size")
        checked = "world_size" in valid or "world_size" not in case  # else already reported
        if multi_gpu and checked and not (_is_int(world_size) and world_size >= 1):
            got = f"got {_show(world_size)}" if "world_size" in case else "missing"
            report.add(f"{where}.world_size", f"multi_gpu needs an int >= 1 in every case, {got}")
    return [dict(case) for case in value if isinstance(case, dict)]


def _case_value_error(value: Any, in_list: bool = False) -> str | None:
    """Case values pass through to the harness as KernelBot passes them (ints, strings, booleans, flat
    lists); anything `case_line` cannot write unambiguously on one line is refused."""
    if isinstance(value, str):
        return None if _CASE_VALUE.fullmatch(value) else f"string {value!r} may only contain letters, digits and _.+-"
    if isinstance(value, int):  # bool included
        return None
    if isinstance(value, list) and not in_list:
        errors = [e for item in value if (e := _case_value_error(item, in_list=True))]
        return f"list item: {errors[0]}" if errors else None
    expected = "int, str or bool" if in_list else "int, str, bool or a list of them"
    return f"expected {expected}, got {_kind(value)}"


def _problem_dir(report: _Report, key: str, directory: Any, comp_dir: Path) -> Path | None:
    if directory is None:
        return None  # already reported as missing, or null
    if not isinstance(directory, str) or not directory:
        report.add(key, f"expected a relative path, got {_kind(directory)}")
        return None
    if PurePosixPath(directory).is_absolute() or "\\" in directory:
        report.add(key, f"{directory}: absolute paths and backslashes are not allowed")
        return None
    task_dir = (comp_dir / directory).resolve()
    if not task_dir.is_relative_to(comp_dir):
        report.add(key, f"{directory} resolves outside the competition directory")
    elif not (task_dir / "task.yml").is_file():
        report.add(key, f"{directory} has no task.yml")
    else:
        return task_dir
    return None


def _deadline(report: _Report, key: str, value: Any) -> datetime | None:
    try:
        return parse_deadline(value)
    except ValueError as exc:
        report.add(key, str(exc))
    return None


def _check_keys(report: _Report, data: dict, allowed: set[str], required: set[str], prefix: str) -> None:
    for key in data:
        if key not in allowed:
            report.add(f"{prefix}{key}", f"unknown key; expected one of {', '.join(sorted(allowed))}")
    for key in sorted(required - data.keys()):
        report.add(f"{prefix}{key}", "required key is missing")


def _string(report: _Report, data: dict, key: str, *, allow_empty: bool = False,
            prefix: str = "", max_length: int | None = None) -> str | None:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        return None  # reported by _check_keys when required
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        report.add(prefix + key, f"expected a non-empty string, got {_show(value)}")
        return None
    if max_length is not None and len(value) > max_length:
        report.add(prefix + key, f"at most {max_length} characters, got {len(value)}")
        return None
    return value


def _string_list(report: _Report, data: dict, key: str, *, prefix: str = "") -> list[str] | None:
    value = data.get(key, _MISSING)
    if value is _MISSING:
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        report.add(prefix + key, f"expected a list of non-empty strings, got {_show(value)}")
        return None
    return list(value)


def _choice(report: _Report, data: dict, key: str, choices: tuple[str, ...], default: str | None,
            *, prefix: str = "") -> str | None:
    value = data.get(key, default)
    if value not in choices:
        if key in data:
            report.add(prefix + key, f"expected one of {', '.join(choices)}, got {_show(value)}")
        return default
    return value


def _timeout(report: _Report, raw: dict, key: str) -> int:
    value = raw.get(key, DEFAULT_TIMEOUT)
    if not _is_int(value) or not 0 < value <= MAX_TIMEOUT:
        report.add(key, f"expected a positive int of seconds up to {MAX_TIMEOUT} (24 h), got {_show(value)}")
        return DEFAULT_TIMEOUT
    return value


def _extract_zip(data: bytes, dest: Path, report: _Report) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        report.add(None, f"not a valid zip archive ({exc})")
        report.check()
    with archive:
        members = archive.infolist()
        if len(members) > MAX_ZIP_MEMBERS:
            report.add(None, f"{len(members)} members; the limit is {MAX_ZIP_MEMBERS}")
        if sum(m.file_size for m in members) > MAX_ZIP_BYTES:
            report.add(None, f"uncompressed size exceeds the {MAX_ZIP_BYTES >> 20} MiB limit")
        report.check()
        targets = []
        for member in members:
            name = member.filename.replace("\\", "/")
            parts = PurePosixPath(name).parts
            if not parts or name.startswith("/") or re.match(r"[A-Za-z]:", name) or ".." in parts:
                report.add(None, f"unsafe member path {member.filename!r}")
            elif stat.S_ISLNK(member.external_attr >> 16):
                report.add(None, f"member {member.filename!r} is a symlink")
            elif member.flag_bits & 0x1:
                report.add(None, f"member {member.filename!r} is encrypted")
            targets.append(dest.joinpath(*parts))
        report.check()
        written = 0  # counted while streaming: declared sizes in the headers can lie
        for member, target in zip(members, targets, strict=True):
            try:
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, target.open("wb") as out:
                    while chunk := src.read(1 << 16):
                        written += len(chunk)
                        if written > MAX_ZIP_BYTES:
                            report.add(None, f"uncompressed size exceeds the {MAX_ZIP_BYTES >> 20} MiB limit")
                            report.check()
                        out.write(chunk)
            except (OSError, zipfile.BadZipFile, NotImplementedError) as exc:
                report.add(None, f"cannot extract {member.filename!r} ({exc})")
                report.check()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    names = {type(None): "null", bool: "bool", str: "str", list: "list", dict: "mapping"}
    return names.get(type(value), type(value).__name__)


def _show(value: Any) -> str:
    """Type name, plus the value when it is a short scalar."""
    if isinstance(value, bool | int | float | str) and len(repr(value)) <= 40:
        return f"{_kind(value)} {value!r}"
    return _kind(value)
