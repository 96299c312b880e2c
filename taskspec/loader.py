"""Read problems from disk or an uploaded zip into `taskspec.model`: the files, the `files:` sources inside the problem
collection, the zip's limits. Every problem is reported as a `TaskFileError` (a ValueError) listing all issues
found in the file(s): `<path>: <key>: <message> (problem <name>)`, one per line in `str(err)` and `err.errors`."""

import io
import re
import stat
import tempfile
import unicodedata
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

from .model import MAX_PROBLEM_NAME, CompetitionFile, Inlined, TaskDefinition, TaskFile, kind, message, refusal

MAX_FILE_BYTES = 1 << 20
MAX_TOTAL_BYTES = 8 << 20
MAX_ZIP_MEMBERS = 200
MAX_ZIP_BYTES = 16 << 20
_UNSEEN = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}  # controls, format (bidi overrides, zero widths), no glyph


class Issue(NamedTuple):
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
        self.path, self.key, _, self.problem = self.issues[0]
        super().__init__("\n".join(self.errors))


class CompetitionError(TaskFileError):
    """Issues across a competition file and all the tasks it lists."""


def validate(model: type[BaseModel], raw: Any, path: Path, problem: Callable[[tuple], str | None],
             context: dict) -> tuple[Any, list[Issue]]:
    """`raw` as `model`, or the issues: each at its key path, ("tests", 2, "seed") -> "tests[2].seed" (a refused
    mapping key at the mapping)."""
    if not isinstance(raw, dict):
        return None, [Issue(path, None, f"expected a mapping at the top level, got {kind(raw)}", problem(()))]
    try:
        return model.model_validate(raw, context=context), []
    except ValidationError as exc:
        issues = []
        for e in exc.errors():
            loc = e["loc"][:-2] if e["loc"][-1:] == ("[key]",) else e["loc"]
            key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc)
            issues.append(Issue(path, key[1:] if key.startswith(".") else key or None, message(e), problem(e["loc"])))
        return None, issues


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
        raw = yaml.safe_load(_read_text(path, path.name)) if path.suffix in (".yaml", ".yml") else None
    except (ValueError, yaml.YAMLError):  # unreadable (a refusal), too large, not UTF-8, not YAML
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
        if task_dir == top:  # a flat zip: nothing can sit above task.yml
            hint = ("task.yml is at the top of this archive, so ../ leads out of it: put the problem in a folder "
                    "(vectoradd/task.yml) and each shared file where its ../ path then points (../utils.py: "
                    "utils.py beside that folder), and zip both")
        else:
            hint = ("files must come from inside the archive: zip the folder that holds both the problem and its "
                    "shared files")
        problem = name or (task_dir.name if task_dir != top else "upload")
        return _load_task(task_dir, top, problem, lambda p: label / p.relative_to(top), hint)


def load_competition(path: Path, *, root: Path | None = None) -> CompetitionFile:
    """Load a competition file and every task it lists; raises one CompetitionError for all issues.
    Task directories and their files must stay inside `root` (default: the competition file's directory)."""
    path = Path(path).resolve()
    comp_dir = Path(root).resolve() if root is not None else path.parent
    if not path.is_relative_to(comp_dir):
        raise CompetitionError([Issue(path, None, f"the competition file is outside the root {comp_dir}", None)])
    shown = path.relative_to(comp_dir.parent)
    raw, issues = _read_yaml(path, shown, None)
    entries = raw.get("problems") if isinstance(raw, dict) and isinstance(raw.get("problems"), list) else []
    task_issues: list[Issue] = []

    def problem(loc: tuple) -> str | None:
        entry = entries[loc[1]] if loc[:1] == ("problems",) and len(loc) > 1 else None
        return entry["name"] if isinstance(entry, dict) and isinstance(entry.get("name"), str) else None

    def task(directory: str) -> TaskDefinition | None:
        found = (comp_dir / directory).resolve()
        if not found.is_relative_to(comp_dir):
            raise refusal(f"{directory} resolves outside the competition directory")
        if not (found / "task.yml").is_file():
            raise refusal(f"{directory} has no task.yml")
        try:
            return load_task(found, root=comp_dir)
        except TaskFileError as exc:
            task_issues.extend(exc.issues)
            return None
    if not issues:
        competition, issues = validate(CompetitionFile, raw, shown, problem, {"task_dir": task})
    if issues or task_issues:
        raise CompetitionError(issues + task_issues)
    return competition.model_copy(update={"problems": [
        p.model_copy(update={"deadline": p.deadline or competition.deadline}) for p in competition.problems]})


def _visible(text: str) -> str:
    """`text` with every character that shows as nothing or reorders what follows written as its \\u escape."""
    return "".join(f"\\u{ord(c):04x}" if unicodedata.category(c) in _UNSEEN else c for c in text)


def _load_task(task_dir: Path, root: Path, name: str, shown: Callable[[Path], Path], hint: str) -> TaskDefinition:
    yml = task_dir / "task.yml"
    if bad := next((c for c in name if unicodedata.category(c) in _UNSEEN), None):  # a name that lies: U+202E
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
    total = 0

    def read(source: str) -> Inlined:
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
    raw, issues = _read_yaml(yml, shown(yml), name)
    if not issues:
        task, issues = validate(TaskFile, raw, shown(yml), lambda loc: name, {"read": read})
    if issues:
        raise TaskFileError(issues)
    return TaskDefinition.from_file(name, task)


class _Loader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate mapping keys instead of keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        self.flatten_mapping(node)
        seen = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode):  # a list or mapping as a key: SafeLoader refuses it as unhashable
                if (key.tag, key.value) in seen:  # located at the duplicate, not the mapping's start
                    raise yaml.constructor.ConstructorError(None, None, f"found duplicate key {key.value!r}",
                                                            key.start_mark)
                seen.add((key.tag, key.value))
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
    def at(mark: Any) -> str:
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
    """The file's text; refused (`refusal`, the message for the organiser) when unreadable, too large or not UTF-8."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise refusal({FileNotFoundError: f"file not found: {shown}", IsADirectoryError: f"{shown} is a directory, "
                       "not a file"}.get(type(exc), f"cannot read {shown}: {exc.strerror}")) from None
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
        too_big = f"uncompressed size exceeds the {MAX_ZIP_BYTES >> 20} MiB limit"
        problems = [f"{len(members)} members; the limit is {MAX_ZIP_MEMBERS}"] * (len(members) > MAX_ZIP_MEMBERS)
        problems += [too_big] * (sum(m.file_size for m in members) > MAX_ZIP_BYTES)
        for member in members if not problems else []:  # each member's own problems, once the totals are fine
            name = member.filename.replace("\\", "/")
            if not PurePosixPath(name).parts or name.startswith("/") or re.match(r"[A-Za-z]:", name) or ".." in \
                    PurePosixPath(name).parts:
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
