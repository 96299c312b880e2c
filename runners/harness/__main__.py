"""`python -m runners.harness` (or `python -m harness` when shipped): one JSON job on stdin, JSON lines out.

Input: {"mode": "test|benchmark|leaderboard|profile", "workdir": "/abs", "protocol": "kernelbot|popcorn",
"lang": "py|cu", "main", "tests", "benchmarks", "ranking_by", "seed", "multi_gpu", "gpus", "timeouts",
"limits", "timing", "cuda": {"sources", "headers", "include_dirs", "defines", "compile_flags", "arch"}, "nonce"}
(all but mode/workdir optional).
Output: zero or more {"event": "progress", ...} lines, then exactly one {"event": "result", ...} line.
Exit code 0 whenever the result line was written. status "error" means the harness (or the problem
definition) broke, not the submission: the platform may retry.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import sys
import traceback

from .job import JobError, parse_job
from .result import Emitter, Result

PR_SET_DUMPABLE = 4


def _harden_self() -> None:
    """Make /proc/<our pid>/mem, environ and fd unreadable to other same-uid processes (the child)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)


def main() -> int:
    _harden_self()
    emitter = Emitter(sys.stdout)
    mode, protocol = "test", "kernelbot"
    nonce = ""
    try:
        raw = json.loads(sys.stdin.read())
        if isinstance(raw, dict):
            mode, protocol = str(raw.get("mode", mode)), str(raw.get("protocol", protocol))
            nonce = str(raw.get("nonce") or "")
        job = parse_job(raw)
        del raw
        if job.lang == "cu":  # KernelBot's CUDA tasks: nvcc builds eval.out, which speaks POPCORN_FD
            from .cuda import run
        elif job.protocol == "popcorn":
            from .popcorn import run
        else:
            from .kernelbot import run
        result = run(job, emitter)
    except (JobError, json.JSONDecodeError) as exc:
        result = Result(mode=mode, protocol=protocol, status="error")
        result.fail("fail", f"invalid job: {exc}")
    except Exception:
        result = Result(mode=mode, protocol=protocol, status="error")
        result.fail("fail", f"internal harness error:\n{traceback.format_exc(limit=-10)}")
    emitter.line(result.as_dict(nonce))
    return 0


if __name__ == "__main__":
    sys.exit(main())
