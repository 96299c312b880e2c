"""The popcorn protocol, for problems that ship their own `eval.py` (gpu-mode reference-kernels format).

WEAKER THAN THE KERNELBOT PROTOCOL, by construction: the problem's `eval.py` runs in the same process as
the submission, so the submission can patch its clock and checker, read POPCORN_SEED, and write forged
`key: value` lines on POPCORN_FD. The harness only sandboxes the process, parses defensively (unknown
keys ignored, size caps, a duplicated key means forgery) and marks every result with the flag
`popcorn:untrusted-eval`. Port problems to the kernelbot interface to get trustworthy rankings.

Run: `python <main> <mode> <cases-file>` with POPCORN_FD (a pipe), POPCORN_SEED (derived from the job
seed, never the seed itself) and POPCORN_GPUS (the number of GPUs, as KernelBot sets it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence

from . import device
from .job import Case, Job
from .problem import derive_seed, format_spec
from .result import CaseResult, Emitter, Result, tail
from .sandbox import Limits, Outcome, Sandbox
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
STAGES = {"test": ("test",), "benchmark": ("benchmark",), "leaderboard": ("test", "benchmark", "leaderboard")}


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


def verdict_from(fields: dict[str, str], result: Result, returncode: int | None, stderr: str,
                 program: str = "eval.py") -> None:
    """Fill `result` from parsed fields (pure apart from mutating `result`)."""
    result.tests = cases_from(fields, "test")
    benchmarks = cases_from(fields, "benchmark")
    if result.mode == "leaderboard":
        result.ranked = benchmarks
    else:
        result.benchmarks = benchmarks
    check = fields.get("check")
    failed = next((c for c in result.tests + benchmarks if c.status != "pass"), None)
    if check == "pass":
        if returncode not in (0, None):
            result.fail("crash", f"{program} reported pass but exited with code {returncode}:\n{tail(stderr)}")
    elif check == "fail" or (failed and failed.message and returncode in (0, None)):
        # KernelBot's eval.cu reports a failed ranked run as a failed test without a `check` line
        where = f"{failed.spec}: " if failed and failed.spec else ""
        result.fail("fail", f"{where}{failed.message}" if failed else f"{program} reported check: fail")
    else:
        result.fail("crash", f"{program} reported no result (exit code {returncode}):\n{tail(stderr)}")


def run(job: Job, emitter: Emitter) -> Result:
    result = Result(mode=job.mode, protocol="popcorn", flags=[FLAG])
    if job.mode not in STAGES:
        return result.fail("fail", "profiling is not available for popcorn (eval.py) problems on this runner")
    if not os.path.isfile(os.path.join(job.workdir, job.main)):
        return result.fail("crash", f"{job.main} not found in the working directory")
    devices = list(job.gpus) if job.gpus else None
    failed = run_stages(job, emitter, result, [sys.executable, job.main], derive_seed(job.seed, "popcorn", 0, 0),
                        lambda phase: Sandbox(job.workdir, phase_limits(job, phase), devices=devices,
                                              uid=job.sandbox_uid))
    if failed is None or failed.verdict != "crash":
        return result if failed is None else result.fail(failed.verdict, failed.error)
    # eval.py and the submission share the sandboxed process: nothing trusted says the failure was out of memory
    # (its output and stderr are the submission's to write). Only a stage that crashed (no result, or a nonzero exit:
    # the way a torch out-of-memory error ends the process) can be the device's fault, never a wrong answer eval.py
    # reported: the device's when other processes held at least half of it at the end of the stage (the stage's own
    # memory is gone with its process by then).
    memory = device.measure(list(job.gpus))
    if memory is not None and memory.per_process and (judged := device.blame(memory, None, "submission")).who == \
            "device":
        return result.out_of_memory(judged, failed.error)
    return result.fail(failed.verdict, failed.error)


def run_stages(job: Job, emitter: Emitter, result: Result, argv: list[str], seed: int,
               sandbox_for: Callable[[str], Sandbox], program: str = "eval.py") -> Result | None:
    """Run the program once per stage of the job's mode, in KernelBot's order (a leaderboard run is test,
    benchmark, then leaderboard on the ranked cases), each in a fresh sandbox, stopping at the first stage that
    does not pass. Collects every stage's cases and output into `result`; returns the failed stage, if any."""
    for mode in STAGES[job.mode]:
        phase = PHASE[mode]
        cases = {"test": job.tests, "benchmark": job.benchmarks, "leaderboard": job.ranked_cases}[mode]
        sandbox = sandbox_for(phase)
        result.sandbox = sandbox.describe()
        emitter.progress(phase, 0, len(cases))
        outcome, text = run_program(sandbox, [*argv, mode], cases, job, seed)
        stage = judge(Result(mode=mode, protocol="popcorn"), outcome, text, job.timeout(phase), program)
        done = stage.tests if mode == "test" else stage.benchmarks or stage.ranked
        emitter.progress(phase, sum(case.status == "pass" for case in done), len(cases))
        result.tests += stage.tests
        result.benchmarks += stage.benchmarks
        result.ranked += stage.ranked
        result.stdout, result.stderr = result.stdout + stage.stdout, result.stderr + stage.stderr
        if stage.verdict != "pass":
            return stage
    return None


def phase_limits(job: Job, phase: str) -> Limits:
    return dataclasses.replace(job.sandbox_limits(), wall_seconds=job.timeout(phase))


def run_program(sandbox: Sandbox, argv: list[str], cases: Sequence[Case], job: Job, seed: int) -> tuple[Outcome, str]:
    """Run `argv + [cases-file]` in `sandbox` with POPCORN_FD; (its outcome, what it wrote on the fd)."""
    path = os.path.join(job.workdir, CASES_FILE)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # an earlier phase's program may have left a symlink in its place
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644), "w") as f:
        f.write("".join(format_spec(c) + "\n" for c in cases))
    read_fd, write_fd = os.pipe()
    env = popcorn_env(job, write_fd, seed)
    try:
        proc = sandbox.start([*argv, CASES_FILE], env=env, pass_fds=(write_fd,))
    finally:
        os.close(write_fd)
    chunks: list[bytes] = []
    reader = threading.Thread(target=_drain, args=(read_fd, chunks), daemon=True)
    reader.start()
    outcome = proc.wait()
    reader.join(5)
    os.close(read_fd)
    return outcome, b"".join(chunks).decode(errors="replace")


def popcorn_env(job: Job, fd: int, seed: int) -> dict[str, str]:
    """The program's environment as KernelBot's run_eval sets it: POPCORN_GPUS is the number of GPUs the run has
    (its eval.py sizes a process pool with it), left unset without GPUs (eval.py then assumes 1)."""
    env = {"POPCORN_FD": str(fd), "POPCORN_SEED": str(seed), "PYTHONDONTWRITEBYTECODE": "1", "OMP_NUM_THREADS": "1"}
    if job.gpus:
        env["POPCORN_GPUS"] = str(len(job.gpus))
    return env


def judge(result: Result, outcome: Outcome, text: str, limit: float, program: str = "eval.py") -> Result:
    """The verdict of one program run from its outcome and its POPCORN_FD output."""
    result.stdout, result.stderr = outcome.stdout, outcome.stderr
    if outcome.memory_exceeded:
        return result.fail("memory_limit", outcome.reason)
    if outcome.processes_exceeded:
        return result.fail("crash", outcome.reason)
    if outcome.timed_out:
        phase = PHASE.get(result.mode, result.mode)
        return result.fail("timeout", f"timed out in the {phase} phase (limit {limit:g} s)")
    try:
        fields = parse_lines(text)
    except PopcornError as exc:
        return result.fail("hacked", str(exc))
    verdict_from(fields, result, outcome.returncode, outcome.stderr, program)
    return result


def _drain(fd: int, chunks: list[bytes]) -> None:
    size = 0
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 1 << 16):
            if size < MAX_BYTES:
                chunks.append(chunk)
            size += len(chunk)
