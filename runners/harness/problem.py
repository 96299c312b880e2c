"""The trusted view of a problem: a private snapshot of its files, its reference and checker, seeds, specs.

The snapshot is taken before any untrusted process starts, so a submission that rewrites `reference.py`
(or `utils.py`) in the shared working directory cannot change what the parent imports later.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import torch

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


def serialize(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def clone(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, tuple | list):
        return type(obj)(clone(o) for o in obj)
    if isinstance(obj, dict):
        return {k: clone(v) for k, v in obj.items()}
    return obj


class OutputError(ValueError):
    """What the child sent back is not an acceptable output (wrong type, aliasing, undecodable)."""


def _check_tensor(t: Any) -> None:
    if type(t) is not torch.Tensor:
        raise OutputError(f"the output must be a plain torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided or t.is_quantized or t.is_meta:
        raise OutputError(f"the output must be a dense strided tensor, got layout {t.layout}")
    if any(st == 0 and sz > 1 for st, sz in zip(t.stride(), t.shape, strict=True)) or (
        torch._debug_has_internal_overlap(t) == 1
    ):
        raise OutputError("the output has overlapping memory (an expanded/strided alias), no own storage")


def load_output(payload: bytes, expect_sequence: bool) -> Any:
    """Decode an output the (untrusted) child sent: weights_only, plain tensors, no self-aliasing."""
    try:
        out = torch.load(io.BytesIO(payload), weights_only=True)
    except Exception as exc:
        raise OutputError(f"the output could not be decoded as plain tensors: {str(exc)[:300]}") from None
    items = list(out) if isinstance(out, tuple | list) and expect_sequence else [out]
    for t in items:
        _check_tensor(t)
    return out


def _normalise_check(result: Any) -> tuple[bool, str]:
    if isinstance(result, tuple) and len(result) == 2:
        return bool(result[0]), str(result[1] or "")
    if isinstance(result, str):
        return result == "", result
    return bool(result), "" if result else "check_implementation returned False"


class Problem:
    """The reference module, imported from a private snapshot of the working directory."""

    def __init__(self, workdir: str):
        self.snapshot = tempfile.mkdtemp(prefix="harness-problem-")
        shutil.copytree(workdir, self.snapshot, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(SUBMISSION, "__pycache__"))
        sys.path.insert(0, self.snapshot)
        sys.dont_write_bytecode = True
        self.reference = importlib.import_module("reference")
        self.generate_input: Callable[..., Any] = self.reference.generate_input
        self.ref_kernel: Callable[[Any], Any] = self.reference.ref_kernel
        self._check: Callable[[Any, Any], Any] = self.reference.check_implementation

    def close(self) -> None:
        shutil.rmtree(self.snapshot, ignore_errors=True)

    def generate(self, case: Case, seed: int) -> Any:
        return self.generate_input(**{**case_args(case), "seed": seed})

    def expects_sequence(self, data: Any) -> bool:
        return isinstance(self.ref_kernel(clone(data)), tuple | list)

    def check(self, pristine: Any, output: Any) -> tuple[bool, str]:
        """Compare `output` with the reference computed on a copy of the pristine inputs."""
        try:
            return _normalise_check(self._check(clone(pristine), output))
        except Exception as exc:  # a malformed output may crash the checker: that is the output's fault
            return False, f"the checker rejected the output: {type(exc).__name__}: {str(exc)[:300]}"


def snapshot_exists(workdir: str, name: str) -> bool:
    return os.path.isfile(os.path.join(workdir, name))
