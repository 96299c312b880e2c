"""The popcorn protocol, for problems that ship their own `eval.py` (gpu-mode reference-kernels format).

WEAKER THAN THE KERNELBOT PROTOCOL, by construction: the problem's `eval.py` runs in the same process as
the submission, so the submission can patch its clock and checker, read POPCORN_SEED, and write forged
`key: value` lines on POPCORN_FD. The harness only sandboxes the process, parses defensively (unknown
keys ignored, size caps, a duplicated key means forgery) and marks every result with the flag
`popcorn:untrusted-eval`. Port problems to the kernelbot interface to get trustworthy rankings.

Run: `python <main> <mode> <cases-file>` with POPCORN_FD (a pipe), POPCORN_SEED (derived from the job
seed, never the seed itself) and POPCORN_GPUS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import threading

from .job import Job
from .problem import derive_seed, format_spec
from .result import CaseResult, Emitter, Result, tail
from .sandbox import Sandbox
from .stats import Summary, t975

CASES_FILE = "_popcorn_cases.txt"
FLAG = "popcorn:untrusted-eval"
MAX_BYTES = 1 << 20
MAX_LINES = 20_000
KEY = re.compile(
    r"check|test-count|benchmark-count"
    r"|(?:test|benchmark)\.\d{1,5}\.(?:spec|status|error|message|runs|mean|std|err|best|worst)"
)
PHASE = {"test": "test", "benchmark": "benchmark", "leaderboard": "ranked"}


class PopcornError(ValueError):
    """The POPCORN_FD output cannot be trusted even as far as popcorn goes (e.g. duplicated keys)."""


def parse_lines(text: str) -> dict[str, str]:
    """`key: value` lines -> dict. Garbage lines and unknown keys are ignored; a repeated key raises."""
    fields: dict[str, str] = {}
    for line in text[:MAX_BYTES].splitlines()[:MAX_LINES]:
        key, sep, value = line.partition(":")
        key = key.strip()
        if not sep or not KEY.fullmatch(key):
            continue
        if key in fields:
            raise PopcornError(f"duplicated key {key!r} on POPCORN_FD (forged output?)")
        fields[key] = value.strip()[:4000]
    return fields


def _count(fields: dict[str, str], key: str) -> int:
    try:
        return max(0, min(int(fields.get(key, "0")), 10_000))
    except ValueError:
        return 0


def _float(fields: dict[str, str], key: str) -> float:
    try:
        return float(fields[key])
    except (KeyError, ValueError):
        return float("nan")


def cases_from(fields: dict[str, str], prefix: str) -> list[CaseResult]:
    out = []
    for i in range(_count(fields, f"{prefix}-count")):
        get = fields.get
        p = f"{prefix}.{i}."
        error = get(p + "error", "")
        status = get(p + "status", "fail" if error else "pass")
        case = CaseResult(get(p + "spec", ""), "pass" if status == "pass" and not error else "fail",
                          error or get(p + "message", ""))
        if prefix == "benchmark" and p + "mean" in fields:
            runs = int(_float(fields, p + "runs")) if _float(fields, p + "runs") > 0 else 0
            mean, err = _float(fields, p + "mean"), _float(fields, p + "err")
            half = t975(runs - 1) * err if runs > 1 else float("nan")
            case.timing = Summary(runs, mean, _float(fields, p + "std"), err, _float(fields, p + "best"),
                                  _float(fields, p + "worst"), mean - half, mean + half)
            case.stop_reason = "eval.py"
        out.append(case)
    return out


def verdict_from(fields: dict[str, str], result: Result, returncode: int | None, stderr: str) -> None:
    """Fill `result` from parsed fields (pure apart from mutating `result`)."""
    result.tests = cases_from(fields, "test")
    benchmarks = cases_from(fields, "benchmark")
    if result.mode == "leaderboard":
        result.ranked = benchmarks
    else:
        result.benchmarks = benchmarks
    check = fields.get("check")
    if check == "pass":
        if returncode not in (0, None):
            result.fail("crash", f"eval.py reported pass but exited with code {returncode}:\n{tail(stderr)}")
    elif check == "fail":
        failed = next((c for c in result.tests + benchmarks if c.status != "pass"), None)
        result.fail("fail", f"{failed.spec}: {failed.message}" if failed else "eval.py reported check: fail")
    else:
        result.fail("crash", f"eval.py reported no result (exit code {returncode}):\n{tail(stderr)}")


def run(job: Job, emitter: Emitter) -> Result:
    result = Result(mode=job.mode, protocol="popcorn", flags=[FLAG])
    if job.mode == "profile":
        return result.fail("fail", "profiling is not available for popcorn (eval.py) problems on this runner")
    if not os.path.isfile(os.path.join(job.workdir, job.main)):
        return result.fail("crash", f"{job.main} not found in the working directory")
    phase = PHASE[job.mode]
    cases = job.tests if job.mode == "test" else job.benchmarks
    with open(os.path.join(job.workdir, CASES_FILE), "w") as f:
        f.write("".join(format_spec(c) + "\n" for c in cases))
    read_fd, write_fd = os.pipe()
    env = {"POPCORN_FD": str(write_fd), "POPCORN_SEED": str(derive_seed(job.seed, "popcorn", 0, 0)),
           "POPCORN_GPUS": ",".join(job.gpus), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    limits = dataclasses.replace(job.sandbox_limits(), wall_seconds=job.timeout(phase))
    sandbox = Sandbox(job.workdir, limits, devices=list(job.gpus) if job.gpus else None, uid=job.sandbox_uid)
    result.sandbox = sandbox.describe()
    emitter.progress(phase, 0, len(cases))
    proc = sandbox.start([sys.executable, job.main, job.mode, CASES_FILE], env=env, pass_fds=(write_fd,))
    os.close(write_fd)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_fd, chunks), daemon=True)
    reader.start()
    outcome = proc.wait()
    reader.join(5)
    os.close(read_fd)
    result.stdout, result.stderr = outcome.stdout, outcome.stderr
    emitter.progress(phase, len(cases), len(cases))
    if outcome.timed_out:
        return result.fail("timeout", f"timed out in the {phase} phase (limit {job.timeout(phase):g} s)")
    try:
        fields = parse_lines(b"".join(chunks).decode(errors="replace"))
    except PopcornError as exc:
        return result.fail("hacked", str(exc))
    verdict_from(fields, result, outcome.returncode, outcome.stderr)
    return result


def _drain(fd: int, chunks: list[bytes]) -> None:
    size = 0
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 1 << 16):
            if size < MAX_BYTES:
                chunks.append(chunk)
            size += len(chunk)
