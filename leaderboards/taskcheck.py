"""What a task's Python code asks of the machine that runs it, read with `ast` and never imported or run: the
names the trusted harness calls in reference.py, the names the task's files import from each other, and whether
(and in which modes) the code needs a CUDA device. Pure Python (no Django),
so the importer, the models and the pages all ask the same question the same way.

Both checks lean towards accepting: what cannot be known without running the code (a star import, a module
`__getattr__`, a CUDA use inside `if torch.cuda.is_available()` or a `try`) counts as fine."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

REFERENCE = "reference.py"
TRUSTED_NAMES = ("generate_input", "ref_kernel", "check_implementation")  # runners/harness/problem.py's Problem
MODES = ("test", "benchmark", "leaderboard", "profile")  # leaderboards.models.SubmissionMode

_CUDA_DEVICE = re.compile(r"cuda(:\d+)?")
# torch.cuda calls that answer (or do nothing) on a machine without CUDA; any other torch.cuda call raises there.
_HARMLESS_CUDA_CALLS = {"is_available", "device_count", "is_initialized", "manual_seed", "manual_seed_all", "seed",
                        "seed_all", "empty_cache", "memory_allocated", "max_memory_allocated", "memory_reserved",
                        "max_memory_reserved", "is_bf16_supported", "amp"}
_UNKNOWABLE_CALLS = {"globals", "vars", "exec"}  # may define module names no parse can see


def missing_trusted_names(reference: str) -> list[str]:
    """The names the trusted harness needs that reference.py does not define at module level (in its own body, by
    assignment, or imported: `from utils import check_implementation` counts). Raises SyntaxError."""
    defined = _module_names(ast.parse(reference, REFERENCE))
    return [] if defined is None else [name for name in TRUSTED_NAMES if name not in defined]


def missing_imported_names(files: dict[str, str], entry: str | None, submission: str) -> list[str]:
    """Where the code a protocol runs (`entry` and the task's files it imports, in turn) imports a name from one of
    the task's files that does not define it (`from reference import generate_inputs`): that import fails in every
    run. The submission's file is the competitor's, so what is imported from it is not checked; a file that does not
    parse, or whose names cannot be known, is not either."""
    found: list[str] = []
    defined: dict[str, set[str] | None] = {}
    todo, seen = [entry] if entry else [], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in files or name == submission:
            continue
        seen.add(name)
        try:
            tree = ast.parse(files[name], name)
        except SyntaxError:
            continue
        todo.extend(f"{module}.py" for module in _imported_modules(tree))
        for node in ast.walk(tree):
            source = f"{node.module}.py" if isinstance(node, ast.ImportFrom) and node.module else ""
            if source not in files or source == submission or "." in node.module:
                continue
            if source not in defined:
                try:
                    defined[source] = _module_names(ast.parse(files[source], source))
                except SyntaxError:
                    defined[source] = None
            names = defined[source]
            found.extend(f"{name} line {node.lineno} imports {alias.name} from {source}, which does not define it"
                         for alias in node.names if names is not None and alias.name != "*" and alias.name not in names)
    return found


def _module_names(tree: ast.Module) -> set[str] | None:
    """Names a module defines at its top level, conditional ones included; None when they cannot be known."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):  # a function that declares it global may define it
            names.update(node.names)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _UNKNOWABLE_CALLS:
            return None
    statements = list(tree.body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == "__getattr__":
                return None
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.Assign):
            names.update(_targets(*node.targets))
        elif isinstance(node, ast.For | ast.AsyncFor) or isinstance(node, ast.AnnAssign) and node.value is not None:
            names.update(_targets(node.target))
        elif isinstance(node, ast.With | ast.AsyncWith):
            names.update(_targets(*(item.optional_vars for item in node.items if item.optional_vars)))
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):  # their bodies run later
            for block in ("body", "orelse", "finalbody"):  # if/try/with/for/while bodies run at import
                statements.extend(getattr(node, block, []))
            statements.extend(s for part in getattr(node, "handlers", []) + getattr(node, "cases", [])
                              for s in part.body)
    return names


def _targets(*targets: ast.expr) -> set[str]:
    return {n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name)}


@dataclass(frozen=True)
class CudaRequest:
    """One place in a task's code that needs a CUDA device."""

    file: str
    line: int  # 0: the whole task (a cu task)
    code: str
    modes: tuple[str, ...] = field(default=MODES, compare=False)  # the submission modes whose runs reach it

    def __str__(self) -> str:
        return f"{self.file} line {self.line}: {self.code}" if self.line else f"{self.file}: {self.code}"


def entry_file(protocol: str, main: str | None) -> str | None:
    """The file a protocol runs first: the trusted harness imports reference.py, popcorn runs config.main."""
    return REFERENCE if protocol == "kernelbot" else main


def cuda_requests(files: dict[str, str], lang: str, entry: str | None) -> list[CudaRequest]:
    """Where the code a protocol runs asks for CUDA unconditionally: `entry` (reference.py for the trusted harness,
    config.main's eval.py for popcorn) and the task's files it imports, in turn. A cu task is compiled by nvcc."""
    if lang == "cu":
        return [CudaRequest("task.yml", 0, "lang: cu (compiled with nvcc for a CUDA GPU)")]
    found: list[CudaRequest] = []
    todo, seen = [entry] if entry else [], set()
    while todo:
        name = todo.pop(0)
        if name in seen or name not in files:
            continue
        seen.add(name)
        try:
            tree = ast.parse(files[name], name)
        except SyntaxError:
            continue  # not this check's to report: the run says where it fails
        todo.extend(f"{module}.py" for module in _imported_modules(tree))
        finder = _CudaFinder()
        finder.visit(tree)
        lines = files[name].splitlines()
        modes = _modes_by_function(tree) if name == entry else {}
        found.extend(CudaRequest(name, line, _shorten(lines[line - 1].strip()), _modes_at(tree, line, modes))
                     for line in sorted(finder.lines))
    return found


def _modes_by_function(tree: ast.Module) -> dict[str, set[str]]:
    """For an entry file that dispatches on the mode (`if mode == "benchmark": return run_benchmarking(...)`, as
    reference-kernels' eval.py does): each of its top-level functions → the modes whose branch calls it, directly or
    through its other functions, and the modes it has no branch for (where they lead cannot be told). Empty when it
    does not dispatch."""
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)}

    def called(nodes: list[ast.stmt]) -> set[str]:
        found = {n.func.id for node in nodes for n in ast.walk(node)
                 if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions}
        todo = list(found)
        while todo:
            for n in ast.walk(functions[todo.pop()]):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in set(functions) - found:
                    found.add(n.func.id)
                    todo.append(n.func.id)
        return found

    reached: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            for mode in {c.value for c in ast.walk(node.test) if isinstance(c, ast.Constant) and c.value in MODES}:
                for function in called(node.body):
                    reached.setdefault(function, set()).add(mode)
    dispatched = {mode for modes in reached.values() for mode in modes}
    return {function: modes | (set(MODES) - dispatched) for function, modes in reached.items()}  # others: unknown


def _modes_at(tree: ast.Module, line: int, modes: dict[str, set[str]]) -> tuple[str, ...]:
    """The modes that reach `line`: those whose branch calls the top-level function it lies in; every mode for a
    line outside functions, in a function no branch calls (main's shared code), or where nothing dispatches."""
    for function in tree.body:
        if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and \
                function.lineno <= line <= (function.end_lineno or function.lineno) and function.name in modes:
            return tuple(m for m in MODES if m in modes[function.name])
    return MODES


def cuda_shortfall(files: dict[str, str], lang: str, entry: str | None,
                   gpu_types: list[Any]) -> tuple[list[str], list[CudaRequest]]:
    """The names of the GPU types (runners.models.GpuType: `name`, `runs_cuda`) the code cannot run on for want of
    CUDA, and where it asks for it; ([], []) when it runs on every one."""
    lacking = [g.name for g in gpu_types if not g.runs_cuda]
    requests = cuda_requests(files, lang, entry) if lacking else []
    return (lacking, requests) if requests else ([], [])


def cuda_warning(lacking: list[str], requests: list[CudaRequest]) -> str:
    names = ", ".join(lacking)
    return (f"{needing_modes(requests)}runs on {names} will fail: the problem's code asks for a CUDA GPU "
            f"({describe(requests)}) and {names} {'has' if len(lacking) == 1 else 'have'} none")


def needing_modes(requests: list[CudaRequest]) -> str:
    """"benchmark and leaderboard " when only those modes' runs reach the code that needs CUDA, else ""."""
    modes = [m for m in MODES if any(m in r.modes for r in requests)]
    if len(modes) == len(MODES):
        return ""
    return (", ".join(modes[:-1]) + " and " + modes[-1] if len(modes) > 1 else modes[0]) + " "


def describe(requests: list[CudaRequest], shown: int = 2) -> str:
    """The first few places, for a message: `reference.py line 3: x.cuda(); utils.py line 9: … (and 4 more)`."""
    more = len(requests) - shown
    return "; ".join(map(str, requests[:shown])) + (f" (and {more} more)" if more > 0 else "")


def _shorten(code: str, limit: int = 80) -> str:
    return code if len(code) <= limit else code[:limit - 1] + "…"


def _imported_modules(tree: ast.Module) -> list[str]:
    modules = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.extend(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.module:
                modules.append(node.module.split(".")[0])
            else:  # from . import utils
                modules.extend(alias.name for alias in node.names)
    return modules


def _mentions_cuda(node: ast.AST) -> bool:
    return "cuda" in ast.unparse(node).lower()


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


class _CudaFinder(ast.NodeVisitor):
    """Lines that need CUDA whatever the machine: a "cuda" device string, `.cuda()`, a torch.cuda call that raises
    without CUDA. Code behind a test that mentions CUDA (`if torch.cuda.is_available()`, `x if device == "cuda"
    else y`) or inside a `try` with handlers is a fallback, and so is a comparison with "cuda"."""

    def __init__(self) -> None:
        self.lines: set[int] = set()

    def visit_If(self, node: ast.If | ast.While | ast.IfExp) -> None:
        if not _mentions_cuda(node.test):
            self.generic_visit(node)

    visit_While = visit_IfExp = visit_If

    def visit_BoolOp(self, node: ast.BoolOp) -> None:  # torch.cuda.is_available() and x.cuda()
        if not _mentions_cuda(node.values[0]):
            self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        guarded = bool(node.handlers)
        for child in ([] if guarded else node.body) + node.handlers + node.orelse + node.finalbody:
            self.visit(child)

    visit_TryStar = visit_Try

    def visit_Compare(self, node: ast.Compare) -> None:
        pass

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and _CUDA_DEVICE.fullmatch(node.value):
            self.lines.add(node.lineno)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:  # f"cuda:{rank}"
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and re.match(r"cuda(:|$)", first.value):
            self.lines.add(node.lineno)
        for value in node.values:
            if isinstance(value, ast.FormattedValue):
                self.visit(value.value)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        if isinstance(node.func, ast.Attribute) and node.func.attr == "cuda" or \
                name.startswith("torch.cuda.") and name.split(".")[2] not in _HARMLESS_CUDA_CALLS:
            self.lines.add(node.lineno)
        self.generic_visit(node)
