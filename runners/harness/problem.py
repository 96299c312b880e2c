"""The trusted view of a problem: a private snapshot of its files, its reference and checker, seeds, specs.

The snapshot is taken before the submission's code runs (the sandboxed child may already be up, running only the
harness's own child script), so a submission that rewrites `reference.py` (or `utils.py`) in the shared working
directory cannot change what the parent imports later.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from . import child, device
from .job import Case

SUBMISSION = "submission.py"
_INT = re.compile(r"[+-]?[0-9]+")


def format_spec(case: Case) -> str:
    """A case as KernelBot writes it for eval.py, one line: `f"{k}: {v}"` joined by "; " (True, [128, 256])."""
    return "; ".join(f"{k}: {v}" for k, v in case.items())


def case_args(case: Case) -> dict[str, Any]:
    """What `generate_input` receives under KernelBot, where eval.py parses the line `format_spec` wrote:
    a value that reads as an integer becomes an int, `[1, 2]` a tuple of ints, anything else stays the
    text it was written as (so `True` arrives as the string "True", as it does there)."""
    return {k: _parsed(str(v)) for k, v in case.items()}


def _parsed(text: str) -> Any:
    if _INT.fullmatch(text):
        return int(text)
    if text[:1] + text[-1:] in ("[]", "()"):
        inner = text[1:-1].strip()
        try:
            return tuple(int(x.strip()) for x in inner.split(",")) if inner else ()
        except ValueError:
            pass
    return text


def derive_seed(secret: int, phase: str, case_index: int, call_index: int, public: object = None) -> int:
    """A per-call seed the child cannot predict without the secret (32 bits: numpy/random-compatible)."""
    digest = hashlib.sha256(f"{secret}|{phase}|{case_index}|{call_index}|{public}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple | list):
        return type(obj)(clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


class ProblemError(Exception):
    """The problem's own code raised in the trusted parent: the problem is broken, not the submission."""

    def __init__(self, where: str, exc: BaseException):
        super().__init__(f"the problem's own code failed: {where}: {type(exc).__name__}: {str(exc)[:500]}")
        self.where, self.cause = where, exc
        self.blame: device.Blame | None = None  # of an out-of-memory error, judged while the run's child lived
        self.traceback = "".join(traceback.format_exception(exc, limit=-12))[-8000:]


def backend_flags() -> dict[str, bool]:
    """This process's torch backend switches (TF32 and friends), to start the child from the same."""
    flags = {}
    for name in child.BACKEND_FLAGS:
        owner, attr = name.rsplit(".", 1)
        obj: Any = torch
        with contextlib.suppress(AttributeError):
            for part in owner.split(".")[1:]:
                obj = getattr(obj, part)
            value = getattr(obj, attr)
            if isinstance(value, bool):
                flags[name] = value
    return flags


def _normalise_check(result: Any) -> tuple[bool, str]:
    if isinstance(result, tuple) and len(result) == 2:
        return bool(result[0]), str(result[1] or "")
    if isinstance(result, str):
        return result == "", result
    return bool(result), "" if result else "check_implementation returned False"


def scratch_dir(prefix: str, workdir: str) -> str:
    """A private directory (mode 0700) beside the run's workdir: the parent a node agent makes for each run and removes
    after it (and sweeps at its start), so nothing is left behind even when this process is killed; in the system's
    temporary directory where that parent is not writable (a remote runner's checkout)."""
    try:
        return tempfile.mkdtemp(prefix=prefix, dir=os.path.dirname(os.path.abspath(workdir)))
    except OSError:
        return tempfile.mkdtemp(prefix=prefix)


class Problem:
    """The reference module, imported from a private snapshot of the working directory. Every call into the
    problem's own code raises ProblemError when that code fails, so a broken problem is never blamed on a
    submission (or retried as the runner's fault)."""

    def __init__(self, workdir: str):
        self.seconds = {"generate": 0.0, "check": 0.0}  # spent in the problem's own code, for the run's breakdown
        self.snapshot = scratch_dir("harness-problem-", workdir)
        shutil.copytree(workdir, self.snapshot, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(SUBMISSION, "__pycache__"))
        sys.path.insert(0, self.snapshot)
        sys.dont_write_bytecode = True
        try:
            module = importlib.import_module("reference")
            self.generate_input: Callable[..., Any] = module.generate_input
            self.ref_kernel: Callable[[Any], Any] = module.ref_kernel
            self._check: Callable[[Any, Any], Any] = module.check_implementation
        except Exception as exc:
            self.close()
            raise ProblemError("importing reference.py", exc) from exc

    def close(self) -> None:
        shutil.rmtree(self.snapshot, ignore_errors=True)

    def generate(self, case: Case, seed: int) -> Any:
        started = time.perf_counter()
        try:
            return self.generate_input(**{**case_args(case), "seed": seed})
        except Exception as exc:
            raise ProblemError("generate_input", exc) from exc
        finally:
            self.seconds["generate"] += time.perf_counter() - started

    def reference(self, data: Any) -> Any:
        """ref_kernel on `data` itself (callers pass fresh inputs or a copy)."""
        try:
            return self.ref_kernel(data)
        except Exception as exc:
            raise ProblemError("ref_kernel", exc) from exc

    def check(self, pristine: Any, output: Any) -> tuple[bool, str]:
        """Compare `output` with the reference computed on a copy of the pristine inputs. A checker that raises
        is asked again about the reference's own output: if it raises there too the problem is broken,
        otherwise the output made it fail."""
        started = time.perf_counter()
        try:
            return _normalise_check(self._check(clone(pristine), output))
        except Exception as exc:
            try:
                self._check(clone(pristine), self.reference(clone(pristine)))
            except ProblemError:
                raise
            except Exception as again:
                raise ProblemError("check_implementation", again) from again
            return False, f"the checker rejected the output: {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            self.seconds["check"] += time.perf_counter() - started


def snapshot_exists(workdir: str, name: str) -> bool:
    return os.path.isfile(os.path.join(workdir, name))
