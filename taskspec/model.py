"""The formats kernelbot imports, as typed models: every key, its type, its default and what it means.

- `TaskFile`: a problem's `task.yml`, in gpu-mode/reference-kernels' format.
- `CompetitionFile`: a competition file (`problems/<set>.yaml`) listing problem directories as leaderboards.
- `TaskDefinition`: what a problem version stores and runs (`Problem.definition`): the task with its files read.

The models do no I/O: `taskspec.loader` passes, in the validation context, `read` (a path relative to task.yml ->
`Inlined`) and `task_dir` (a competition's problem directory -> its `TaskDefinition`); without them paths stay as
written. Messages are written for organisers; the loader prefixes the file, the key path and the problem:
`demo/softmax_py/task.yml: tests[2].seed: expected int, ..., got null (problem softmax_py)`.
"""

import hashlib
import json
import re
from collections.abc import Callable
from contextlib import suppress
from datetime import UTC, date, datetime, time
from functools import cached_property
from typing import Annotated, Any, ClassVar, Literal, NamedTuple, get_origin

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
TEMPLATE_LANGS = ("Python", "Triton", "CUDA", "HIP", "CuteDSL")
DEFAULT_TIMEOUT = 180
MAX_TIMEOUT = 24 * 3600
# The columns these names are stored in (leaderboards.models): checked here so a long name is an import error.
MAX_PROBLEM_NAME = 100
MAX_LEADERBOARD_NAME = 100
MAX_COMPETITION_NAME = 120
CU_CONFIG_KEYS = "sources, include_dirs, defines, compile_flags"
_CASE_VALUE = re.compile(r"[A-Za-z0-9_.+-]+")  # cases travel to the harness as "k: v; k: v" lines
_FILE_NAME = re.compile(r"[A-Za-z0-9_+-][A-Za-z0-9_.+-]*")  # files are written side by side into the run's directory
_SLUG = re.compile(r"[-a-zA-Z0-9_]+")  # Django's SlugField: what a leaderboard URL can name
_ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "absent"})()

CaseValue = int | str | bool | list[int | str | bool]


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
    """The error every check raises (a ValueError): `message` is what the organiser reads."""
    return PydanticCustomError("taskfile", "{message}", {"message": message})


def message(error: dict) -> str:
    missing = error["type"] == "missing"
    return "required key is missing" if missing else error.get("ctx", {}).get("message", error["msg"])


def check(ok: Callable[[Any], Any], expected: str | Callable[[Any], str], got: Callable[[Any], str] = show,
          mode: Any = PlainValidator) -> Any:
    """Keep a value `ok` accepts, else refuse it: "expected <expected>, got <got(value)>", or `expected(value)`."""
    def validate(value: Any) -> Any:
        if not ok(value):
            raise refusal(expected(value) if callable(expected) else f"expected {expected}, got {got(value)}")
        return value
    return mode(validate)


def _case_value(value: Any, in_list: bool = False) -> str | None:
    """Why a case value cannot pass to the harness as KernelBot passes them (ints, strings, booleans, flat lists)
    on one `case_line`, or None."""
    if isinstance(value, str):
        return None if _CASE_VALUE.fullmatch(value) else f"string {value!r} may only contain letters, digits and _.+-"
    if isinstance(value, int):  # bool included
        return None
    if isinstance(value, list) and not in_list:
        errors = [e for item in value if (e := _case_value(item, in_list=True))]
        return f"list item: {errors[0]}" if errors else None
    return f"expected {'int, str or bool' if in_list else 'int, str, bool or a list of them'}, got {kind(value)}"


def leaderboard_name_error(name: str) -> str | None:
    """Why `name` cannot name a leaderboard (its URL is /lb/<name>/), or None."""
    if not _SLUG.fullmatch(name):
        return f"{name!r} is not a valid leaderboard name: use only letters, digits, - and _"
    if len(name) > MAX_LEADERBOARD_NAME:
        return f"leaderboard names are at most {MAX_LEADERBOARD_NAME} characters, got {len(name)}"
    return None


def parse_deadline(value: Any) -> datetime | None:
    """A deadline as KernelBot's problem sync reads it, in UTC: "2025-06-30" (midnight), "2025-11-29 6:59" (its
    strptime forms), or ISO 8601 ("2027-01-31T23:59Z"); naive means UTC. Empty or None: no deadline given (None).
    Anything else raises a ValueError (`refusal`)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        for form in ("%Y-%m-%d %H:%M", "%Y-%m-%d", "ISO 8601"):
            with suppress(ValueError):
                value = datetime.fromisoformat(text) if form == "ISO 8601" else datetime.strptime(text, form)
                break
        else:
            raise refusal(f"{text!r} is not a date and time; use \"2025-06-30\" (00:00 UTC), \"2025-06-30 23:59\" or "
                          "ISO 8601 like \"2025-06-30T23:59:00Z\"")
    elif isinstance(value, date) and not isinstance(value, datetime):  # an unquoted YAML date
        value = datetime.combine(value, time())
    elif not isinstance(value, datetime):
        raise refusal(f"expected a date and time like \"2025-06-30 23:59\", got {kind(value)}")
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Inlined(NamedTuple):
    path: str
    text: str


def _path(value: Any, info: ValidationInfo, use: str = "read") -> Any:
    """A relative path, passed through the loader's `use` (`read` or `task_dir`) when it gave one."""
    if not isinstance(value, str) or not value:
        raise refusal(f"expected a relative path, got {kind(value)}")
    if value.startswith("/") or "\\" in value:
        raise refusal(f"{value}: absolute paths and backslashes are not allowed")
    resolve = (info.context or {}).get(use)
    return resolve(value) if resolve else value


def _among_files(source: str, info: ValidationInfo) -> str:
    if (names := (info.context or {}).get("files")) is not None and source not in names:
        raise refusal(f"{source} is not one of the files")
    return source


def _listing(what: str) -> AfterValidator:
    return check(bool, lambda v: f"must list at least one {what}", mode=AfterValidator)


def _is(what: str, test: type, empty: bool = False) -> BeforeValidator:
    """Refuse, before pydantic looks inside, a value that is not a `test` (or an empty one, unless `empty`)."""
    return check(lambda v: isinstance(v, test) and (empty or bool(v)), what, kind, BeforeValidator)


Text = Annotated[str, check(lambda v: isinstance(v, str) and v.strip(), "a non-empty string")]
_names = check(lambda v: isinstance(v, list) and all(isinstance(n, str) and n for n in v),
               "a list of non-empty strings", mode=BeforeValidator)
Names = Annotated[list[str], _names]
Timeout = Annotated[int, check(lambda v: _is_int(v) and 0 < v <= MAX_TIMEOUT,
                               f"a positive int of seconds up to {MAX_TIMEOUT} (24 h)")]
Deadline = Annotated[datetime | None, PlainValidator(parse_deadline)]
Case = Annotated[dict[
    Annotated[str, check(lambda n: isinstance(n, str) and n.isidentifier() and n.isascii(),
                         lambda n: f"parameter name {show(n)} is not an identifier")],
    Annotated[CaseValue, check(lambda v: _case_value(v) is None, _case_value)]],
    _is("a non-empty mapping of parameters", dict)]
Cases = Annotated[list[Case], _is("a non-empty list of cases", list)]


def one_of(*choices: str) -> Any:
    return Annotated[Literal[choices], check(lambda v: v in choices, f"one of {', '.join(choices)}")]


Lang = one_of("py", "cu")
Ranking = one_of("last", "mean", "geom")
Harness = one_of("kernelbot", "popcorn", "auto")


class Strict(BaseModel):
    """A mapping that reports all its problems at once: unknown keys, then missing ones (listing the keys it
    accepts), then the others in the order of its fields and, within a list or mapping, of the items written."""

    model_config = ConfigDict(frozen=True, extra="ignore")
    expected: ClassVar[str] = "a mapping"
    report_order: ClassVar[tuple[str, ...]] = ()  # the order of its keys for their problems, when not its fields

    @classmethod
    def _checks(cls, data: dict) -> list[tuple[tuple, str]]:
        """What checking each key alone cannot see, as (location, message)."""
        return []

    @model_validator(mode="wrap")
    @classmethod
    def _report_all(cls, data: Any, handler: Callable[[Any], Any]) -> Any:
        if not isinstance(data, dict):
            raise refusal(f"expected {cls.expected}, got {kind(data)}")
        fields = {field.validation_alias or name: field for name, field in cls.model_fields.items()}
        found = [((str(key),), f"unknown key; expected one of {', '.join(sorted(fields))}")
                 for key in data if key not in fields]
        found += [((key,), "required key is missing") for key in sorted(fields)
                  if fields[key].is_required() and key not in data]
        lines = cls._checks(data)
        try:
            result = handler(data)
        except ValidationError as exc:
            lines += [(e["loc"], message(e)) for e in exc.errors()
                      if not (e["type"] == "missing" and len(e["loc"]) == 1)]
        if not found and not lines:
            return result

        def position(line: tuple) -> tuple:  # its key's, then its item's in a list or a mapping of items
            key, at = line[0][0], line[0][1] if len(line[0]) > 1 else None
            items = data.get(key) if get_origin(fields[key].annotation) is dict else None
            if isinstance(items, dict) and at in items:
                at = list(items).index(at)
            return (cls.report_order or list(fields)).index(key), at if isinstance(at, int) else -1
        raise ValidationError.from_exception_data("taskfile", [{"type": refusal(text), "loc": loc, "input": None}
                                                               for loc, text in found + sorted(lines, key=position)])

    def to_json(self) -> dict[str, Any]:
        return self.model_dump()


class FileEntry(Strict):
    expected: ClassVar[str] = "a mapping with name and source"
    name: Annotated[str, check(lambda v: isinstance(v, str) and _FILE_NAME.fullmatch(v),
                               "a plain file name like eval.py (no directory)")] = Field(
        description="The file's name in the run's working directory (no directory part).")
    source: Annotated[str | Inlined, PlainValidator(lambda v, info: v if v == SUBMISSION else _path(v, info))] = Field(
        description=f"Relative to task.yml, anywhere inside the problem collection (../utils.py); {SUBMISSION} for "
                    "the competitor's code (exactly one entry).")


class PyConfig(Strict):
    main: Text = Field(description="The task's own evaluator (eval.py) among its files: the popcorn protocol "
                                   "runs it; without config the trusted harness runs the task.")


class CuConfig(Strict):
    sources: Annotated[list[Annotated[str, AfterValidator(_among_files)]], _names, _listing("file")] = Field(
        description="The files nvcc compiles (of `files`).")
    defines: Annotated[dict[
        Annotated[str, check(lambda m: isinstance(m, str) and m.isidentifier(),
                             lambda m: f"macro name {show(m)} is not an identifier")],
        Annotated[str | int, check(lambda v: _is_int(v) or isinstance(v, str), "str or int", kind)]],
        _is("a mapping of macro name to str or int", dict, empty=True)] = Field(
        {}, description="-D macros: name -> str or int.")
    include_dirs: Names = Field([], description="nvcc -I directories.")
    compile_flags: Names = Field([], description="Extra nvcc flags.")


class TaskSettings(Strict):
    """The keys of task.yml a problem version keeps as written."""

    lang: Lang = Field(description="py: a Python submission; cu: CUDA source nvcc builds.")
    description: Text = Field(description="Shown to competitors (Markdown).")
    multi_gpu: Annotated[bool, check(lambda v: isinstance(v, bool), "true or false", kind)] = Field(
        False, description="Every case then names its world_size (devices on one node).")
    seed: Annotated[int | None, check(lambda v: v is None or _is_int(v), "int", kind)] = Field(
        None, description="Base of the public runs' input seeds.")
    tests: Cases = Field(description="Correctness cases: mappings of parameter name to int, str (letters, digits, "
                                     "_.+-), bool or a flat list of them, passed to the harness as `k: v; k: v`.")
    benchmarks: Cases = Field(description="Timed cases, the same form as tests.")
    ranking_by: Ranking = Field(
        "last", description="How benchmark times make a score: the last case's, their mean or geometric mean.")
    test_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the test phase.")
    benchmark_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the benchmark phase.")
    ranked_timeout: Timeout = Field(DEFAULT_TIMEOUT, description="Seconds for the ranked phase.")
    gpus: Names = Field([], description="GPU types its leaderboard runs on, unless the competition file says.")

    @classmethod
    def _checks(cls, data: dict) -> list[tuple[tuple, str]]:
        """multi_gpu: each case's world_size (unless its value is refused as a case value anyway)."""
        found = []
        for key in ("tests", "benchmarks") if data.get("multi_gpu") is True else ():
            for i, case in enumerate(data[key] if isinstance(data.get(key), list) else []):
                if not isinstance(case, dict) or not case or (_is_int(size := case.get("world_size")) and size >= 1):
                    continue
                if "world_size" not in case or _case_value(size) is None:
                    got = f"got {show(size)}" if "world_size" in case else "missing"
                    found.append(((key, i, "world_size"), f"multi_gpu needs an int >= 1 in every case, {got}"))
        return found


class TaskFile(TaskSettings):
    """A problem's task.yml."""

    files: Annotated[list[FileEntry], _is("a non-empty list of {name, source}", list)] = Field(
        description=f"The files of a run's working directory; one entry is {SUBMISSION}.")
    config: Any = Field(_ABSENT, validate_default=True, description=f"py: {{main}} (`PyConfig`); cu, required: "
                        f"{{{CU_CONFIG_KEYS}}} (`CuConfig`).")
    templates: Annotated[dict[str, Annotated[str | Inlined, PlainValidator(_path)]],
                         BeforeValidator(lambda v: {k: p for k, p in v.items() if k in TEMPLATE_LANGS}),
                         _is("a mapping of language to path", dict, empty=True)] = Field(
        {}, description=f"Starting points shown to competitors: language ({', '.join(TEMPLATE_LANGS)}) -> path.")

    @classmethod
    def _checks(cls, data: dict) -> list[tuple[tuple, str]]:
        """Unique file names, exactly one submission; templates in known languages."""
        files = data.get("files") if isinstance(data.get("files"), list) else []
        entries = [e if isinstance(e, dict) else {} for e in files]
        names = [e.get("name") for e in entries]
        submissions = [i for i, e in enumerate(entries) if e.get("source") == SUBMISSION]
        found = [(("files", i, "name"), f"duplicate file name {name}") for i, name in enumerate(names)
                 if isinstance(name, str) and _FILE_NAME.fullmatch(name) and name in names[:i]]
        found += [(("files", i, "source"), f"more than one {SUBMISSION} entry") for i in submissions[1:]]
        if entries and not submissions:
            found.append((("files",), f"no entry has source {SUBMISSION}; exactly one is required"))
        templates = data.get("templates") if isinstance(data.get("templates"), dict) else {}
        return super()._checks(data) + found + [
            (("templates", str(lang)), f"unknown language; expected {', '.join(TEMPLATE_LANGS)}")
            for lang in templates if lang not in TEMPLATE_LANGS]

    @field_validator("config")
    @classmethod
    def _config_of_lang(cls, config: Any, info: ValidationInfo) -> PyConfig | CuConfig | None:
        lang, files = info.data.get("lang"), info.data.get("files")
        if config is _ABSENT and lang == "cu":
            raise refusal(f"required for cu tasks ({CU_CONFIG_KEYS})")
        if config is not _ABSENT and not isinstance(config, dict):
            raise refusal(f"expected a mapping, got {kind(config)}")
        model = {"py": PyConfig, "cu": CuConfig}.get(lang) if config is not _ABSENT else None
        if files is not None and ([e.source for e in files].count(SUBMISSION) != 1 or
                                  len({e.name for e in files}) < len(files)):
            files = None  # refused in _checks: sources are not compared with them
        names = {entry.name for entry in files} if files is not None else None
        return model.model_validate(config, context={"files": names}) if model else None


class TaskDefinition(TaskSettings):
    """A problem version as stored and evaluated: task.yml's settings, its files read, named by its directory."""

    name: str
    files: dict[str, str] = Field(description="name -> text, the submission left out.")
    submission_name: str = Field(description=f"The file name of the {SUBMISSION} entry.")
    main: str | None = Field(description="config.main of a py task, else None.")
    config: dict[str, Any] = Field(description="The config as validated, with CuConfig's defaults; {} if none.")
    templates: dict[str, str] = Field(description="language -> text.")

    @classmethod
    def from_file(cls, name: str, task: TaskFile) -> "TaskDefinition":
        config = task.config.model_dump() if task.config is not None else {}
        return cls.model_construct(
            name=name, files={e.name: e.source.text for e in task.files if isinstance(e.source, Inlined)},
            submission_name=next(e.name for e in task.files if e.source == SUBMISSION), main=config.get("main"),
            config=config, templates={lang: source.text for lang, source in task.templates.items()},
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

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TaskDefinition":
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

    report_order: ClassVar = ("name", "harness", "deadline", "gpus", "directory", "run_spread")  # gpus: after the task

    name: Annotated[Text, check(lambda v: not leaderboard_name_error(v), leaderboard_name_error, mode=AfterValidator)
                    ] = Field(description="The leaderboard's name (its URL: letters, digits, - and _).")
    harness: Harness = Field(
        "auto", description="kernelbot: the trusted harness; popcorn: the task's own evaluator; auto: popcorn when "
                            "the task brings one.")
    deadline: Deadline = Field(None, description="UTC unless a zone is given; default: the competition's.")
    task: Annotated[Any, PlainValidator(lambda v, info: _path(v, info, "task_dir"))] = Field(
        validation_alias="directory", description="The key `directory`: the task directory (holding task.yml), "
                                                  "relative to the competition file; the loader reads its task.")
    gpus: Annotated[list[str] | None, _names, _listing("GPU")] = Field(
        _ABSENT, validate_default=True, description="GPU types; default: the task's.")
    run_spread: Annotated[float | None, check(
        lambda v: v is None or (isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 1),
        "a number from 0 to 1")] = Field(
        None, description="The between-run spread of identical code on the board's runners, added to every interval "
                          "(bench/fairness.py --aa measures it); default: the platform's.")

    @field_validator("gpus", mode="wrap")
    @classmethod
    def _task_gpus(cls, gpus: Any, handler: Callable[[Any], Any], info: ValidationInfo) -> list[str] | None:
        if gpus is not _ABSENT:
            return handler(gpus)
        task = info.data.get("task")
        if isinstance(task, TaskDefinition) and not task.gpus:
            raise refusal("required because the task does not list gpus")
        return list(task.gpus) if isinstance(task, TaskDefinition) else None


class CompetitionFile(Strict):
    """A competition file: problems/<set>.yaml. `taskspec.loader.load_competition` gives it with each problem's
    task read and its deadline and gpus defaults applied."""

    name: Annotated[Text, check(lambda v: len(v) <= MAX_COMPETITION_NAME, mode=AfterValidator,
                                expected=lambda v: f"at most {MAX_COMPETITION_NAME} characters, got {len(v)}")] = Field(
        description="Shown on its page.")
    description: Annotated[str, check(lambda v: isinstance(v, str), "a non-empty string")] = Field(
        "", description="Markdown.")
    deadline: Deadline = Field(None, description="\"2025-06-30\", \"2025-06-30 23:59\" or ISO 8601; UTC unless a "
                                                 "zone is given; empty: the importer uses its problems' latest.")
    problems: Annotated[list[ProblemEntry], _is("a non-empty list of problems", list)] = Field(
        description="Its leaderboards, each a `ProblemEntry`.")

    @classmethod
    def _checks(cls, data: dict) -> list[tuple[tuple, str]]:
        """Unique leaderboard names."""
        entries = data.get("problems") if isinstance(data.get("problems"), list) else []
        names = [e.get("name") if isinstance(e, dict) else None for e in entries]
        return [(("problems", i, "name"), f"duplicate name (also problems[{names.index(name)}])")
                for i, name in enumerate(names)
                if isinstance(name, str) and not leaderboard_name_error(name) and name in names[:i]]
