"""Evaluator speaking the popcorn protocol, for demo problems that ship their own ``eval.py``.

Usage::

    POPCORN_FD=<fd> [POPCORN_SEED=<int>] [POPCORN_GPUS=<int>] python eval.py <mode> <cases-file>

``mode`` is ``test`` (check every case), ``benchmark`` (check each case once, then time it on the
same input) or ``leaderboard`` (time each case on a fresh input per call and check every call);
``profile`` is not supported. The cases file holds one case per line, ``key: value; key: value``,
values being integers or words. Results go to file descriptor ``POPCORN_FD`` as ``key: value``
lines: ``test-count``, ``test.<i>.spec|status|error``, ``benchmark-count``,
``benchmark.<i>.spec|runs|mean|std|err|best|worst`` (nanoseconds) or
``benchmark.<i>.status|error`` on failure, and finally ``check: pass|fail``.

The directory must also hold ``submission.py`` (``custom_kernel``) and ``reference.py``
(``generate_input``, ``check_implementation``). ``POPCORN_SEED`` seeds the global RNGs and, in
leaderboard mode, salts every case seed so inputs cannot be known in advance. The evaluator is a
single process on the default device; ``POPCORN_GPUS`` is validated but otherwise unused.

Exit codes: 0 all passed, 112 a check failed, 111 no ``POPCORN_FD``, 113 bad cases file,
2 usage error or unsupported mode.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import torch

MAX_RUNS = 100
MIN_RUNS = 3
TARGET_REL_ERR = 0.01
WARMUP_NS = 100_000_000
CASE_BUDGET_NS = 1_000_000_000  # wall time per benchmark case, input generation and checks included
EXIT_FAIL, EXIT_NO_FD, EXIT_BAD_CASES, EXIT_USAGE = 112, 111, 113, 2

_CASE_PART = re.compile(r"\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*([A-Za-z_][A-Za-z0-9_]*|[+-]?[0-9]+)\s*")

sync: Callable[[], None] = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)


@dataclasses.dataclass(frozen=True)
class Case:
    spec: str
    args: dict[str, int | str]


@dataclasses.dataclass(frozen=True)
class Stats:
    runs: int
    mean: float
    std: float
    err: float
    best: float
    worst: float


class Output:
    """``key: value`` lines on the popcorn file descriptor; newlines inside values are escaped."""

    def __init__(self, fd: int) -> None:
        self.file: TextIO = os.fdopen(fd, "w")

    def log(self, key: str, value: object) -> None:
        text = str(value).replace("\\", "\\\\").replace("\n", "\\n")
        print(f"{key}: {text}", file=self.file, flush=True)

    def close(self) -> None:
        self.file.close()


def parse_cases(path: str) -> list[Case]:
    cases = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        args: dict[str, int | str] = {}
        for part in line.split(";"):
            match = _CASE_PART.fullmatch(part)
            if match is None:
                raise ValueError(f"invalid case {line!r}: cannot parse {part!r}")
            key, value = match[1], match[2]
            args[key] = int(value) if value.lstrip("+-").isdigit() else value
        cases.append(Case(spec=line.strip(), args=args))
    if not cases:
        raise ValueError("no cases")
    return cases


def compute_stats(durations: list[int]) -> Stats:
    runs = len(durations)
    mean = sum(durations) / runs
    std = math.sqrt(sum((d - mean) ** 2 for d in durations) / (runs - 1)) if runs > 1 else 0.0
    return Stats(runs, mean, std, std / math.sqrt(runs), float(min(durations)), float(max(durations)))


def clone(data: Any) -> Any:
    if isinstance(data, torch.Tensor):
        return data.clone()
    if isinstance(data, tuple | list):
        return type(data)(clone(x) for x in data)
    if isinstance(data, dict):
        return {k: clone(v) for k, v in data.items()}
    return data


class Evaluator:
    def __init__(self, out: Output, seed: int) -> None:
        from reference import check_implementation, generate_input
        from submission import custom_kernel

        self.out, self.seed = out, seed
        self.kernel, self.generate, self.checker = custom_kernel, generate_input, check_implementation

    def check(self, data: Any, output: Any) -> str | None:
        """None if ``output`` is right for ``data``, else the checker's message."""
        result = self.checker(data, output)
        if isinstance(result, tuple):
            ok, message = result
            return None if ok else (message or "check failed")
        return result or None  # older references return an error string, empty on success

    def run_checked(self, data: Any) -> tuple[str | None, int]:
        """Run the kernel on a copy of ``data``, then check against the pristine ``data``."""
        work = clone(data)
        try:
            sync()
            start = time.perf_counter_ns()
            output = self.kernel(work)
            sync()
            elapsed = time.perf_counter_ns() - start
            return self.check(data, output), elapsed
        except Exception as exc:  # the submission (or its output) is at fault: report, don't crash
            return f"{type(exc).__name__}: {exc}", 0

    def fresh_args(self, case: Case, run: int) -> dict[str, int | str]:
        seed = case.args.get("seed")
        if not isinstance(seed, int):
            return case.args
        return {**case.args, "seed": (seed + 1_000_003 * self.seed + 7_919 * run) % 2**31}

    def test(self, cases: list[Case]) -> bool:
        self.out.log("test-count", len(cases))
        passed = True
        for i, case in enumerate(cases):
            self.out.log(f"test.{i}.spec", case.spec)
            error, _ = self.run_checked(self.generate(**case.args))
            self.out.log(f"test.{i}.status", "fail" if error else "pass")
            if error:
                self.out.log(f"test.{i}.error", error)
                passed = False
        return passed

    def warm_up(self, case: Case) -> None:
        data = self.generate(**case.args)
        deadline = time.perf_counter_ns() + WARMUP_NS
        try:
            while time.perf_counter_ns() < deadline:
                self.kernel(clone(data))
                sync()
        except Exception:
            pass  # the first checked call reports it properly

    def time_case(self, case: Case, recheck: bool) -> Stats | str:
        deadline = time.perf_counter_ns() + CASE_BUDGET_NS
        args = self.fresh_args(case, 0) if recheck else case.args
        data = self.generate(**args)
        error, _ = self.run_checked(data)  # one obligatory check, untimed
        if error:
            return error
        durations: list[int] = []
        for run in range(1, MAX_RUNS + 1):
            if recheck:
                data = self.generate(**self.fresh_args(case, run))
                error, elapsed = self.run_checked(data)
                if error:
                    return error
            else:
                sync()
                start = time.perf_counter_ns()
                self.kernel(data)
                sync()
                elapsed = time.perf_counter_ns() - start
            durations.append(elapsed)
            if len(durations) >= MIN_RUNS:
                stats = compute_stats(durations)
                if stats.err < TARGET_REL_ERR * stats.mean or time.perf_counter_ns() > deadline:
                    break
        return compute_stats(durations)

    def benchmark(self, cases: list[Case], mode: str) -> bool:
        self.warm_up(cases[0])
        self.out.log("benchmark-count", len(cases))
        passed = True
        for i, case in enumerate(cases):
            self.out.log(f"benchmark.{i}.spec", case.spec)
            try:
                result = self.time_case(case, recheck=mode == "leaderboard")
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"
            if isinstance(result, Stats):
                for field in dataclasses.fields(Stats):
                    self.out.log(f"benchmark.{i}.{field.name}", getattr(result, field.name))
            else:
                self.out.log(f"benchmark.{i}.status", "fail")
                self.out.log(f"benchmark.{i}.error", result)
                passed = False
        return passed


def main(argv: list[str]) -> int:
    fd = os.environ.get("POPCORN_FD")
    if not fd:
        print("POPCORN_FD is not set", file=sys.stderr)
        return EXIT_NO_FD
    if len(argv) != 3:
        print("usage: eval.py test|benchmark|leaderboard CASES_FILE", file=sys.stderr)
        return EXIT_USAGE
    mode = argv[1]
    if mode not in ("test", "benchmark", "leaderboard"):
        print(f"unsupported mode {mode!r}", file=sys.stderr)
        return EXIT_USAGE
    try:
        seed = int(os.environ.get("POPCORN_SEED") or 42)
        if int(os.environ.get("POPCORN_GPUS") or 1) < 1:
            raise ValueError("POPCORN_GPUS must be >= 1")
    except ValueError as exc:
        print(f"bad environment: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cases = parse_cases(argv[2])
    except (OSError, ValueError) as exc:
        print(f"bad cases file {argv[2]!r}: {exc}", file=sys.stderr)
        return EXIT_BAD_CASES

    random.seed(seed)
    torch.manual_seed(seed)
    out = Output(int(fd))
    try:
        evaluator = Evaluator(out, seed)
        passed = evaluator.test(cases) if mode == "test" else evaluator.benchmark(cases, mode)
        out.log("check", "pass" if passed else "fail")
    finally:
        out.close()
    return 0 if passed else EXIT_FAIL


if __name__ == "__main__":
    sys.exit(main(sys.argv))
