"""`python -m runners.harness` (or `python -m harness` when shipped): one JSON job on stdin, JSON lines out.

Input: {"mode": "test|benchmark|leaderboard|profile", "workdir": "/abs", "protocol": "kernelbot|popcorn",
"lang": "py|cu", "main", "tests", "benchmarks", "ranking_by", "seed", "multi_gpu", "gpus", "timeouts",
"limits", "timing", "cuda": {"sources", "headers", "include_dirs", "defines", "compile_flags", "arch"}, "nonce"}
(all but mode/workdir optional).
Output: zero or more {"event": "progress", ...} lines, then exactly one {"event": "result", ...} line.
Exit code 0 whenever the result line was written. status "error" means the harness (or the problem
definition) broke, not the submission: the platform may retry, except with the flag "problem-error" (the
problem's own generate_input, ref_kernel or check_implementation raised: retrying repeats it). A problem whose
own code (reference, generate_input) asks for CUDA on a machine without it ends with status "error", the flag
"needs-cuda" and the error NEEDS_CUDA: the runner, not the submission, is wrong for it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import sys
import traceback

from . import device
from .job import Job, JobError, parse_job
from .problem import ProblemError
from .result import NEEDS_CUDA, NEEDS_CUDA_FLAG, PROBLEM_ERROR_FLAG, Emitter, Result

PR_SET_DUMPABLE = 4


def _harden_self() -> None:
    """Make /proc/<our pid>/mem, environ and fd unreadable to other same-uid processes (the child)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def needs_cuda(exc: BaseException) -> bool:
    """Whether trusted problem code failed because it asked for CUDA where there is none. Only exceptions raised
    in this (trusted) process get here: the child's failures arrive as messages and are judged as such."""
    try:
        import torch

        if torch.cuda.is_available():
            return False
    except Exception:  # no usable torch: nothing to judge by
        return False
    seen: BaseException | None = exc
    while seen is not None:
        if re.search(r"\bcuda\b|nvidia", f"{type(seen).__name__}: {seen}", re.IGNORECASE):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def preflight_popcorn(job: Job) -> None:
    """eval.py generates its inputs inside the sandbox, where a CUDA request would end in a raw traceback. On a
    machine without CUDA, generate the first case here first, with the problem's own reference, so that case
    gets the clear message; any other failure is left for eval.py to report."""
    import torch

    cases = job.tests or job.benchmarks
    if torch.cuda.is_available() or not cases or not os.path.isfile(os.path.join(job.workdir, "reference.py")):
        return
    from .problem import Problem

    problem = None
    try:
        problem = Problem(job.workdir)
        problem.generate(cases[0], 0)
    except Exception as exc:
        if needs_cuda(exc):
            raise
    finally:
        if problem is not None:
            problem.close()


def prestart(spare: dict) -> None:
    """A spare parent (runners.harness.warm) starts its sandboxed child before its job exists, in the shape the job is
    expected to have; `kernelbot.ChildSession.for_job` takes it when the job matches and starts a new one when not."""
    try:
        job = parse_job(spare)
        if job.protocol != "kernelbot" or job.lang != "py":
            return
        if job.gpus:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus)
        from .kernelbot import prestart as start_child

        start_child(job, warm_device=bool(spare.get("warm_device")))
    except Exception:  # the run starts its child itself and reports what fails then
        traceback.print_exc()


def process_age() -> float:
    """Seconds since this process started (was forked, for a warm parent), to the kernel's clock tick; 0 if unknown."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 0.0
    return max(0.0, uptime - ticks / os.sysconf("SC_CLK_TCK"))


def visible_devices() -> list[str]:
    """The run's devices (host indices), as main sets them; [] (every device) when the job names none."""
    return [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]


def main(spare: dict | None = None) -> int:
    _harden_self()
    if spare:
        prestart(spare)
    emitter = Emitter(sys.stdout)
    mode, protocol = "test", "kernelbot"
    nonce, started = "", 0.0
    try:
        raw = json.loads(sys.stdin.read())
        if isinstance(raw, dict):
            mode, protocol = str(raw.get("mode", mode)), str(raw.get("protocol", protocol))
            nonce = str(raw.get("nonce") or "")
        job = parse_job(raw)
        del raw
        started = 0.0 if spare else process_age()  # a spare waited for its job: its age says nothing
        if job.gpus:  # the trusted parent works on the run's own GPU, the one the sandbox exposes to the child
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(job.gpus)
        if job.lang == "cu":  # KernelBot's CUDA tasks: nvcc builds eval.out, which speaks POPCORN_FD
            from .cuda import run
        elif job.protocol == "popcorn":
            from .popcorn import run

            preflight_popcorn(job)
        else:
            from .kernelbot import run
        result = run(job, emitter)
    except ProblemError as exc:
        result = Result(mode=mode, protocol=protocol, status="error")
        said = device.exception_text(exc.cause)
        oom = device.oom_raised(exc.cause)  # a device that ran out of memory exists: not a CUDA-less runner
        judged = exc.blame or (device.blame(device.measure(visible_devices()), device.figures(said).asked,
                                            "problem") if oom else None)
        if judged is not None and judged.who in ("device", "unknown"):
            result.out_of_memory(judged, said)
        elif judged is not None and judged.who == "submission":
            result.status = "ok"
            result.fail("fail", f"the submission's processes held the device's memory when the problem's own code "
                        f"ran out of it ({exc.where}): {judged.why}")
            result.extra["device_memory"] = judged.memory.as_dict() if judged.memory else None
        elif not oom and needs_cuda(exc.cause):
            result.fail("fail", NEEDS_CUDA)
            result.flags.append(NEEDS_CUDA_FLAG)
            result.extra["cause"] = f"{type(exc.cause).__name__}: {str(exc.cause)[:500]}"
        else:
            result.fail("fail", str(exc) + (f" (out of device memory: {judged.why})" if judged else ""))
            result.flags.append(PROBLEM_ERROR_FLAG)
            result.extra["problem_error"] = {"where": exc.where, "traceback": exc.traceback}
    except (JobError, json.JSONDecodeError) as exc:
        result = Result(mode=mode, protocol=protocol, status="error")
        result.fail("fail", f"invalid job: {exc}")
    except Exception as exc:
        result = Result(mode=mode, protocol=protocol, status="error")
        if needs_cuda(exc):
            result.fail("fail", NEEDS_CUDA)
            result.flags.append(NEEDS_CUDA_FLAG)
            result.extra["cause"] = f"{type(exc).__name__}: {str(exc)[:500]}"
        else:
            result.fail("fail", f"internal harness error:\n{traceback.format_exc(limit=-10)}")
    if started:
        result.extra.setdefault("seconds", {})
        result.extra["seconds"] = {"parent_start": round(started, 3), **result.extra["seconds"]}
    emitter.line(result.as_dict(nonce))
    return 0


if __name__ == "__main__":
    sys.exit(main())
