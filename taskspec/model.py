"""The formats kernelbot imports, as typed models: every key, its type, its default and what it means.

- `TaskFile`: a problem's `task.yml`, in gpu-mode/reference-kernels' format.
- `CompetitionFile`: a competition file (`problems/<set>.yaml`) listing problem directories as leaderboards.
- `TaskDefinition`: what a problem version stores and runs (`Problem.definition`): the task with its files read.

The models do no I/O: `taskspec.loader` reads the files and passes, in the validation context, `read` (a path
relative to task.yml -> its text) and `task_dir` (a competition's problem directory -> the checked path); without
them sources and directories stay as written. Messages are written for organisers; the loader prefixes the file,
the key path and the problem: `demo/softmax_py/task.yml: tests[2].seed: expected int, ..., got null`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from datetime import UTC, date, datetime, time
from functools import cached_property
from typing import Annotated, Any, ClassVar, NamedTuple

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    computed_field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

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
CU_CONFIG_KEYS = "sources, include_dirs, defines, compile_flags"
# Cases travel to the harness as "k: v; k: v" lines, so values must not contain separators.
_CASE_VALUE = re.compile(r"[A-Za-z0-9_.+-]+")
# A plain file name: files are written side by side into the run's working directory.
_FILE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # Django's SlugField: what a leaderboard URL can name
# The forms KernelBot's problem sync accepts ("%Y-%m-%d %H:%M", "%Y-%m-%d"; strptime takes "6:59"), read as UTC.
_DEADLINE_FORMATS = ("%Y-%m-%d %H:%M", "%Y-%m-%d")
_ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "absent"})()

CaseValue = int | str | bool | list[int | str | bool]
Loc = tuple[str | int, ...]


def kind(value: Any) -> str:
    names = {type(None): "null", bool: "bool", str: "str", list: "list", dict: "mapping"}
    return names.get(type(value), type(value).__name__)


def show(value: Any) -> str:
    """Type name, plus the value when it is a short scalar."""
    if isinstance(value, bool | int | float | str) and len(repr(value)) <= 40:
        return f"{kind(value)} {value!r}"
    return kind(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def refusal(message: str) -> PydanticCustomError:
    return PydanticCustomError("taskfile", "{message}", {"message": message})


def message(error: dict) -> str:
    if error["type"] == "missing":
        return "required key is missing"
    return error.get("ctx", {}).get("message", error["msg"])


def refuse(handler: Callable[[Any], Any] | None, value: Any, found: list[tuple[Loc, str]], *, first: bool = False,
           order: Any = None) -> Any:
    """`handler(value)` (None: nothing more to validate), failing with its errors and `found` (location, message)
    together: `found` first, else in the order of the items of `order` (default: `value`) they are about."""
    errors = []
    try:
        result = handler(value) if handler else value
    except ValidationError as exc:
        errors = exc.errors()
    if not found and not errors:
        return result
    lines = [{"type": refusal(text), "loc": loc, "input": None} for loc, text in found]
    lines += [{"type": refusal(message(e)), "loc": e["loc"], "input": e["input"]} for e in errors
              if not (first and e["type"] == "missing" and len(e["loc"]) == 1)]
    if not first:
        order = value if order is None else order
        position = {k: i for i, k in enumerate(order)} if isinstance(order, dict) else {}
        lines.sort(key=lambda line: position.get(line["loc"][0], line["loc"][0]) if line["loc"] else -1)
    raise ValidationError.from_exception_data("taskfile", lines)


def checked(check: Callable[[Any], str | None]) -> PlainValidator:
    """Keep a value `check` finds nothing wrong with; else refuse it with what `check` says."""
    def validate(value: Any) -> Any:
        if (text := check(value)) is not None:
            raise refusal(text)
        return value
    return PlainValidator(validate)


def one_of(*choices: str) -> PlainValidator:
    return checked(lambda v: None if v in choices else f"expected one of {', '.join(choices)}, got {show(v)}")


def _text(value: Any, max_length: int | None = None, allow_empty: bool = False) -> str | None:
    if not isinstance(value, str) or (not allow_empty and not value.strip()):
        return f"expected a non-empty string, got {show(value)}"
    if max_length is not None and len(value) > max_length:
        return f"at most {max_length} characters, got {len(value)}"
    return None


def _names(value: Any) -> str | None:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        return f"expected a list of non-empty strings, got {show(value)}"
    return None


def _non_empty(what: str) -> AfterValidator:
    def validate(value: list) -> list:
        if not value:
            raise refusal(f"must list at least one {what}")
        return value
    return AfterValidator(validate)


def _case_value(value: Any, in_list: bool = False) -> str | None:
    """Case values pass through to the harness as KernelBot passes them (ints, strings, booleans, flat lists);
    anything `case_line` cannot write unambiguously on one line is refused."""
    if isinstance(value, str):
        return None if _CASE_VALUE.fullmatch(value) else f"string {value!r} may only contain letters, digits and _.+-"
    if isinstance(value, int):  # bool included
        return None
    if isinstance(value, list) and not in_list:
        errors = [e for item in value if (e := _case_value(item, in_list=True))]
        return f"list item: {errors[0]}" if errors else None
    return f"expected {'int, str or bool' if in_list else 'int, str, bool or a list of them'}, got {kind(value)}"


def _a(what: str, test: Callable[[Any], bool]) -> BeforeValidator:
    """Refuse, before looking inside, a value that is not `what`."""
    def validate(value: Any) -> Any:
        if not test(value):
            raise refusal(f"expected {what}, got {kind(value)}")
        return value
    return BeforeValidator(validate)


def leaderboard_name_error(name: str) -> str | None:
    """Why `name` cannot name a leaderboard (its URL is /lb/<name>/), or None."""
    if not _SLUG.fullmatch(name):
        return f"{name!r} is not a valid leaderboard name: use only letters, digits, - and _"
    if len(name) > MAX_LEADERBOARD_NAME:
        return f"leaderboard names are at most {MAX_LEADERBOARD_NAME} characters, got {len(name)}"
    return None


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
        raise ValueError(f"expected a date and time like \"2025-06-30 23:59\", got {kind(value)}")
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


def _deadline(value: Any) -> datetime | None:
    try:
        return parse_deadline(value)
    except ValueError as exc:
        raise refusal(str(exc)) from None


def _relative_path(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return f"expected a relative path, got {kind(value)}"
    if value.startswith("/") or "\\" in value:
        return f"{value}: absolute paths and backslashes are not allowed"
    return None


class Inlined(NamedTuple):
    path: str
    text: str


def _source(value: Any, info: ValidationInfo, submission_allowed: bool = True) -> str | Inlined:
    if submission_allowed and value == SUBMISSION:
        return value
    if (text := _relative_path(value)) is not None:
        raise refusal(text)
    read = (info.context or {}).get("read")
    return Inlined(value, read(value)) if read else value


def _directory(value: Any, info: ValidationInfo) -> str:
    if (text := _relative_path(value)) is not None:
        raise refusal(text)
    resolve = (info.context or {}).get("task_dir")
    return resolve(value) if resolve else value


Text = Annotated[str, checked(_text)]
Names = Annotated[list[str], checked(_names)]
Timeout = Annotated[int, checked(lambda v: None if _is_int(v) and 0 < v <= MAX_TIMEOUT else
                                 f"expected a positive int of seconds up to {MAX_TIMEOUT} (24 h), got {show(v)}")]
Deadline = Annotated[datetime | None, PlainValidator(_deadline)]
Source = Annotated[str | Inlined, PlainValidator(_source)]
Case = Annotated[
    dict[Annotated[str, checked(lambda n: None if isinstance(n, str) and n.isidentifier() and n.isascii() else
                                f"parameter name {show(n)} is not an identifier")],
         Annotated[CaseValue, checked(_case_value)]],
    _a("a non-empty mapping of parameters", lambda v: isinstance(v, dict) and bool(v))]
Cases = Annotated[list[Case], _a("a non-empty list of cases", lambda v: isinstance(v, list) and bool(v))]


class Strict(BaseModel):
    """A mapping whose unknown keys, then missing ones, are reported first, listing the keys it accepts."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    expected: ClassVar[str] = "a mapping"

    @model_validator(mode="wrap")
    @classmethod
    def _known_keys(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        if not isinstance(data, dict):
            raise refusal(f"expected {cls.expected}, got {kind(data)}")
        fields = cls.model_fields
        accepted = ", ".join(sorted(fields))
        found: list[tuple[Loc, str]] = [((str(key),), f"unknown key; expected one of {accepted}")
                                        for key in data if key not in fields]
        found += [((key,), "required key is missing") for key in sorted(fields)
                  if fields[key].is_required() and key not in data]
        return refuse(handler, data, found, first=True)


class FileEntry(Strict):
    expected: ClassVar[str] = "a mapping with name and source"
    name: Annotated[str, checked(lambda v: None if isinstance(v, str) and _FILE_NAME.fullmatch(v) else
                                 f"expected a plain file name like eval.py (no directory), got {show(v)}")] = Field(
        description="The file's name in the run's working directory (no directory part).")
    source: Source = Field(description=f"Where it comes from, relative to task.yml: anywhere inside the problem "
                                       f"collection (../utils.py), or {SUBMISSION} for the competitor's code "
                                       "(exactly one entry).")


class PyConfig(Strict):
    main: Text = Field(description="The task's own evaluator (eval.py) among its files: the popcorn protocol "
                                   "runs it; without config the trusted harness runs the task.")


class CuConfig(Strict):
    sources: Annotated[Names, _non_empty("file")] = Field(description="The files nvcc compiles (of `files`).")
    defines: Annotated[
        dict[Annotated[str, checked(lambda m: None if isinstance(m, str) and m.isidentifier() else
                                    f"macro name {show(m)} is not an identifier")],
             Annotated[str | int, checked(lambda v: None if _is_int(v) or isinstance(v, str) else
                                          f"expected str or int, got {kind(v)}")]],
        _a("a mapping of macro name to str or int", lambda v: isinstance(v, dict))] = Field(
        {}, description="-D macros: name -> str or int.")
    include_dirs: Names = Field([], description="nvcc -I directories.")
    compile_flags: Names = Field([], description="Extra nvcc flags.")

    @field_validator("sources")
    @classmethod
    def _among_files(cls, sources: list[str], info: ValidationInfo) -> list[str]:
        names = (info.context or {}).get("files")
        found = [((i,), f"{source} is not one of the files") for i, source in enumerate(sources)
                 if names is not None and source not in names]
        return refuse(None, sources, found)


class TaskSettings(Strict):
    """The keys of task.yml a problem version keeps as written."""

    lang: Annotated[str, one_of(*LANGS)] = Field(description="py: a Python submission; cu: CUDA source nvcc builds.")
    description: Text = Field(description="Shown to competitors (Markdown).")
    multi_gpu: Annotated[bool, checked(lambda v: None if isinstance(v, bool) else
                                       f"expected true or false, got {kind(v)}")] = Field(
        False, description="Every case then names its world_size (devices on one node).")
    seed: Annotated[int | None, checked(lambda v: None if v is None or _is_int(v) else
                                        f"expected int, got {kind(v)}")] = Field(
        None, description="Base of the public runs' input seeds.")
    tests: Cases = Field(description="Correctness cases: mappings of parameter name to int, str (letters, digits, "
                                     "_.+-), bool or a flat list of them, passed to the harness as `k: v; k: v`.")
    benchmarks: Cases = Field(description="Timed cases, the same form as tests.")
    ranking_by: Annotated[str, one_of(*RANKINGS)] = Field(
        "last", description="How benchmark times make a score: the last case's, their mean or geometric mean.")
    test_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the test phase.")
    benchmark_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the benchmark phase.")
    ranked_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the ranked phase.")
    gpus: Names = Field([], description="GPU types its leaderboard runs on, unless the competition file says.")

    @field_validator("tests", "benchmarks", mode="wrap")
    @classmethod
    def _world_sizes(cls, cases: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> Any:
        found: list[tuple[Loc, str]] = []
        for i, case in enumerate(cases if info.data.get("multi_gpu") is True and isinstance(cases, list) else []):
            if not isinstance(case, dict) or not case:
                continue
            size = case.get("world_size")
            if not (_is_int(size) and size >= 1) and ("world_size" not in case or _case_value(size) is None):
                got = f"got {show(size)}" if "world_size" in case else "missing"
                found.append(((i, "world_size"), f"multi_gpu needs an int >= 1 in every case, {got}"))
        return refuse(handler, cases, found)


class TaskFile(TaskSettings):
    """A problem's task.yml."""

    files: Annotated[list[FileEntry], _a("a non-empty list of {name, source}",
                                         lambda v: isinstance(v, list) and bool(v))] = Field(
        description=f"The files of a run's working directory; one entry is {SUBMISSION}.")
    config: Any = Field(_ABSENT, validate_default=True, description=f"py: {{main}} (`PyConfig`); cu, required: "
                        f"{{{CU_CONFIG_KEYS}}} (`CuConfig`).")
    templates: Annotated[dict[str, Annotated[str | Inlined, PlainValidator(
        lambda v, info: _source(v, info, submission_allowed=False))]],
        _a("a mapping of language to path", lambda v: isinstance(v, dict))] = Field(
        {}, description=f"Starting points shown to competitors: language ({', '.join(TEMPLATE_LANGS)}) -> path.")

    @field_validator("files", mode="wrap")
    @classmethod
    def _one_submission(cls, entries: Any, handler: Callable[[Any], Any]) -> Any:
        found: list[tuple[Loc, str]] = []
        names: set[str] = set()
        submissions = 0
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            if not isinstance(entry, dict):
                continue
            if isinstance(name := entry.get("name"), str) and _FILE_NAME.fullmatch(name):
                if name in names:
                    found.append(((i, "name"), f"duplicate file name {name}"))
                names.add(name)
            if entry.get("source") == SUBMISSION:
                submissions += 1
                if submissions > 1:
                    found.append(((i, "source"), f"more than one {SUBMISSION} entry"))
        if entries and isinstance(entries, list) and not submissions:
            found.append(((), f"no entry has source {SUBMISSION}; exactly one is required"))
        return refuse(handler, entries, found)

    @field_validator("config")
    @classmethod
    def _config_of_lang(cls, config: Any, info: ValidationInfo) -> PyConfig | CuConfig | None:
        lang = info.data.get("lang")
        if config is _ABSENT:
            if lang == "cu":
                raise refusal(f"required for cu tasks ({CU_CONFIG_KEYS})")
            return None
        if not isinstance(config, dict):
            raise refusal(f"expected a mapping, got {kind(config)}")
        if lang == "py":
            return PyConfig.model_validate(config)
        files = info.data.get("files")
        names = {entry.name for entry in files} if files is not None else None
        return CuConfig.model_validate(config, context={"files": names}) if lang == "cu" else None

    @field_validator("templates", mode="wrap")
    @classmethod
    def _known_languages(cls, templates: Any, handler: Callable[[Any], Any]) -> Any:
        if not isinstance(templates, dict):
            return handler(templates)
        found = [((str(lang),), f"unknown language; expected {', '.join(TEMPLATE_LANGS)}")
                 for lang in templates if lang not in TEMPLATE_LANGS]
        return refuse(handler, {k: v for k, v in templates.items() if k in TEMPLATE_LANGS}, found, order=templates)


class TaskDefinition(TaskSettings):
    """A problem version as stored and evaluated: task.yml's settings, its files read, named by its directory."""

    name: str
    files: dict[str, str] = Field(description="name -> text, the submission left out.")
    submission_name: str = Field(description=f"The file name of the {SUBMISSION} entry.")
    main: str | None = Field(description="config.main of a py task, else None.")
    config: dict[str, Any] = Field(description="The config as validated, with CuConfig's defaults; {} if none.")
    templates: dict[str, str] = Field(description="language -> text.")

    @classmethod
    def from_file(cls, name: str, task: TaskFile) -> TaskDefinition:
        config = task.config.model_dump() if task.config is not None else {}
        submission = next(e.name for e in task.files if e.source == SUBMISSION)
        return cls.model_construct(
            name=name, files={e.name: e.source.text for e in task.files if isinstance(e.source, Inlined)},
            submission_name=submission, main=config.get("main"), config=config,
            templates={lang: source.text for lang, source in task.templates.items()},
            **{key: getattr(task, key) for key in TaskSettings.model_fields})

    @computed_field
    @cached_property
    def content_hash(self) -> str:
        """sha256 of everything that changes how a submission is evaluated, and nothing else."""
        evaluated = self.model_dump(include={"files", "submission_name", "lang", "config", "tests", "benchmarks",
                                             "ranking_by", "test_timeout", "benchmark_timeout", "ranked_timeout",
                                             "seed", "multi_gpu"})
        canonical = json.dumps(evaluated, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canonical.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TaskDefinition:
        """The hash is recomputed, never trusted from `data`."""
        return cls.model_validate({k: v for k, v in data.items() if k != "content_hash"})


def has_own_evaluator(task: TaskDefinition) -> bool:
    """Whether the task brings its own evaluator (config.main's eval.py among its files, or a cu task's eval.cu):
    what the `auto` harness runs it under the popcorn protocol for, else the trusted harness."""
    return (task.main is not None and task.main in task.files) or task.lang == "cu"


def case_line(case: dict[str, CaseValue]) -> str:
    """One case as KernelBot writes it for eval.py: `f"{k}: {v}"` joined by "; " (True, [128, 256])."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


class ProblemEntry(Strict):
    """One leaderboard of a competition."""

    name: Annotated[str, checked(lambda v: _text(v) or leaderboard_name_error(v))] = Field(
        description="The leaderboard's name (its URL: letters, digits, - and _).")
    harness: Annotated[str, one_of(*HARNESSES)] = Field(
        "auto", description="kernelbot: the trusted harness; popcorn: the task's own evaluator; auto: popcorn when "
                            "the task brings one.")
    deadline: Deadline = Field(None, description="UTC unless a zone is given; default: the competition's.")
    gpus: Annotated[list[str] | None, checked(_names), _non_empty("GPU")] = Field(
        None, description="GPU types; default: the task's.")
    directory: Annotated[str, PlainValidator(_directory)] = Field(
        description="The task directory (holding task.yml), relative to the competition file.")


class CompetitionFile(Strict):
    """A competition file: problems/<set>.yaml."""

    name: Annotated[str, checked(lambda v: _text(v, MAX_COMPETITION_NAME))] = Field(description="Shown on its page.")
    description: Annotated[str, checked(lambda v: _text(v, allow_empty=True))] = Field("", description="Markdown.")
    deadline: Deadline = Field(None, description="\"2025-06-30\", \"2025-06-30 23:59\" or ISO 8601; UTC unless a "
                                                 "zone is given; empty: the importer uses its problems' latest.")
    problems: Annotated[list[ProblemEntry], _a("a non-empty list of problems",
                                               lambda v: isinstance(v, list) and bool(v))]

    @field_validator("problems", mode="wrap")
    @classmethod
    def _unique_names(cls, entries: Any, handler: Callable[[Any], Any]) -> Any:
        seen: dict[str, int] = {}
        found: list[tuple[Loc, str]] = []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            name = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(name, str) and not _text(name) and not leaderboard_name_error(name):
                if name in seen:
                    found.append(((i, "name"), f"duplicate name (also problems[{seen[name]}])"))
                seen.setdefault(name, i)
        return refuse(handler, entries, found)
