"""Read problems from disk or an uploaded zip into `taskspec.model`: the files, the `files:` sources inside the problem
collection, the zip's limits. Every problem is reported as a `TaskFileError` (a ValueError) listing all issues
found in the file(s): `<path>: <key>: <message> (problem <name>)`, one per line in `str(err)` and `err.errors`."""

from __future__ import annotations

import io
import re
import stat
import tempfile
import unicodedata
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from .model import MAX_PROBLEM_NAME, CompetitionFile, Inlined, TaskDefinition, TaskFile, kind, message, refusal

MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 8 << 20
MAX_ZIP_MEMBERS = 200
MAX_ZIP_BYTES = 16 << 20


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


def key_path(loc: tuple[str | int, ...]) -> str | None:
    """("tests", 2, "seed") -> "tests[2].seed"; a mapping's key that is refused is reported at the mapping."""
    parts = loc[:-2] if loc and loc[-1] == "[key]" else loc
    text = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in parts)
    return text[1:] if text.startswith(".") else text or None


def validate(model: type[BaseModel], raw: Any, path: Path, problem: Callable[[tuple], str | None],
             context: dict) -> tuple[Any, list[Issue]]:
    if not isinstance(raw, dict):
        return None, [Issue(path, None, f"expected a mapping at the top level, got {kind(raw)}", problem(()))]
    try:
        return model.model_validate(raw, context=context), []
    except ValidationError as exc:
        return None, [Issue(path, key_path(e["loc"]), message(e), problem(e["loc"])) for e in exc.errors()]


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

    def refuse(*texts: str) -> TaskFileError:
        return TaskFileError([Issue(label, None, text, name or "upload") for text in texts])
    with tempfile.TemporaryDirectory(prefix="kernelbot-task-") as tmp:
        top = Path(tmp).resolve()
        _extract_zip(data, top, refuse)
        found = sorted(top.rglob("task.yml"))
        if len(found) != 1:
            listed = ", ".join(str(p.relative_to(top)) for p in found) or "none"
            raise refuse(f"the archive must contain exactly one task.yml, found {listed}: zip one problem folder "
                         "(with the shared files it names); a whole collection is imported from its competition "
                         "file (import_problems set.yaml)")
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
    shown = path.relative_to(comp_dir.parent)
    raw, issues = _read_yaml(path, shown, None)
    if issues:
        raise CompetitionError(issues)
    entries = raw.get("problems") if isinstance(raw, dict) and isinstance(raw.get("problems"), list) else []

    def problem(loc: tuple) -> str | None:
        entry = entries[loc[1]] if loc[:1] == ("problems",) and len(loc) > 1 else None
        return entry["name"] if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None

    task_dirs: dict[str, Path] = {}

    def task_dir(directory: str) -> str:
        found = (comp_dir / directory).resolve()
        if not found.is_relative_to(comp_dir):
            raise refusal(f"{directory} resolves outside the competition directory")
        if not (found / "task.yml").is_file():
            raise refusal(f"{directory} has no task.yml")
        task_dirs[directory] = found
        return directory

    competition, issues = validate(CompetitionFile, raw, shown, problem, {"task_dir": task_dir})
    tasks, task_issues = {}, []
    for i, entry in enumerate(entries):
        if isinstance(entry, dict) and isinstance(entry.get("directory"), str) and entry["directory"] in task_dirs:
            try:
                tasks[i] = load_task(task_dirs[entry["directory"]], root=comp_dir)
            except TaskFileError as exc:
                task_issues.extend(exc.issues)
            if "gpus" not in entry and i in tasks and not tasks[i].gpus:
                issues.append(Issue(shown, f"problems[{i}].gpus", "required because the task does not list gpus",
                                    problem(("problems", i))))
    issues.sort(key=lambda issue: int(m.group(1)) if (m := re.match(r"problems\[(\d+)]", issue.key or "")) else -1)
    if issues or task_issues:
        raise CompetitionError(issues + task_issues)
    return CompetitionDefinition(competition.name, competition.description, competition.deadline, [
        CompetitionProblem(p.name, tasks[i], p.deadline or competition.deadline,
                           list(p.gpus if p.gpus is not None else tasks[i].gpus), p.harness)
        for i, p in enumerate(competition.problems)])


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
    if len(name) > MAX_PROBLEM_NAME:
        raise TaskFileError([Issue(shown(yml), None, f"the problem name (its directory name) is {len(name)} "
                                   f"characters; at most {MAX_PROBLEM_NAME} are allowed", name)])
    if not yml.resolve().is_relative_to(root):
        raise TaskFileError([Issue(shown(yml), None, f"task.yml resolves outside the problem collection; {hint}",
                                   name)])
    raw, issues = _read_yaml(yml, shown(yml), name)
    if issues:
        raise TaskFileError(issues)
    total = 0

    def read(source: str) -> str:
        """A file named in task.yml: relative to the task, confined to the collection, size-capped."""
        nonlocal total
        target = (task_dir / source).resolve()
        if not target.is_relative_to(root):
            raise refusal(f"{source} resolves outside the problem collection; {hint}")
        text = _read_text(target, source)
        total += len(text.encode())
        if total > MAX_TOTAL_BYTES:
            raise refusal(f"{source} takes the inlined files past {MAX_TOTAL_BYTES >> 20} MiB in total")
        return Inlined(source, text)

    task, issues = validate(TaskFile, raw, shown(yml), lambda loc: name, {"read": read})
    if issues:
        raise TaskFileError(issues)
    return TaskDefinition.from_file(name, task)


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key: SafeLoader refuses it as unhashable
            if (key_node.tag, key_node.value) in seen:
                raise yaml.constructor.ConstructorError(  # located at the duplicate, not the mapping's start
                    None, None, f"found duplicate key {key_node.value!r}", key_node.start_mark)
            seen.add((key_node.tag, key_node.value))
        return super().construct_mapping(node, deep)


def _read_yaml(path: Path, shown: Path, problem: str | None) -> tuple[Any, list[Issue]]:
    try:
        return yaml.load(_read_text(path, path.name), Loader=_Loader), []
    except PydanticCustomError as exc:
        text = exc.message()
    except yaml.MarkedYAMLError as exc:
        text = f"invalid YAML {_yaml_error_text(exc)}"
    except yaml.YAMLError as exc:
        text = f"invalid YAML: {exc}"
    return None, [Issue(shown, None, text, problem)]


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


def _read_text(path: Path, shown: str) -> str:
    """The file's text; refused (pydantic's custom error, the message for the organiser) when unreadable."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise refusal(f"file not found: {shown}") from None
    except IsADirectoryError:
        raise refusal(f"{shown} is a directory, not a file") from None
    except OSError as exc:
        raise refusal(f"cannot read {shown}: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise refusal(f"{shown} is larger than the {MAX_FILE_BYTES >> 20} MiB limit")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise refusal(f"{shown} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def _extract_zip(data: bytes, dest: Path, refuse: Callable[..., TaskFileError]) -> None:
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile as exc:
        raise refuse(f"not a valid zip archive ({exc})") from None
    with archive:
        members = archive.infolist()
        problems = [f"{len(members)} members; the limit is {MAX_ZIP_MEMBERS}"] * (len(members) > MAX_ZIP_MEMBERS)
        too_big = f"uncompressed size exceeds the {MAX_ZIP_BYTES >> 20} MiB limit"
        problems += [too_big] * (sum(m.file_size for m in members) > MAX_ZIP_BYTES)
        if not problems:
            for member in members:
                name = member.filename.replace("\\", "/")
                parts = PurePosixPath(name).parts
                if not parts or name.startswith("/") or re.match(r"[A-Za-z]:", name) or ".." in parts:
                    problems.append(f"unsafe member path {member.filename!r}")
                elif stat.S_ISLNK(member.external_attr >> 16):
                    problems.append(f"member {member.filename!r} is a symlink")
                elif member.flag_bits & 0x1:
                    problems.append(f"member {member.filename!r} is encrypted")
        if problems:
            raise refuse(*problems)
        written = 0  # counted while streaming: declared sizes in the headers can lie
        for member in members:
            target = dest.joinpath(*PurePosixPath(member.filename.replace("\\", "/")).parts)
            try:
                if member.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, target.open("wb") as out:
                    while chunk := src.read(1 << 16):
                        written += len(chunk)
                        if written > MAX_ZIP_BYTES:
                            raise refuse(too_big)
                        out.write(chunk)
            except (OSError, zipfile.BadZipFile, NotImplementedError) as exc:
                raise refuse(f"cannot extract {member.filename!r} ({exc})") from None
