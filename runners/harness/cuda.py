"""`lang: cu`: compile the submission's CUDA sources (inside the sandbox) before running it.

The build produces `submission_cuda.so` in the working directory; the Python side of the submission loads
it (e.g. with torch.ops.load_library or ctypes). Untested here: this runner has no GPU.
"""

from __future__ import annotations

import os
import shutil

from .job import Job
from .result import Result, tail
from .sandbox import Limits, Sandbox

OUTPUT = "submission_cuda.so"


def toolchain_problem() -> str | None:
    nvcc = shutil.which("nvcc")
    try:
        import torch

        torch_cuda = torch.version.cuda if torch.cuda.is_available() else None
    except Exception:
        torch_cuda = None
    if nvcc and torch_cuda:
        return None
    return (f"CUDA toolchain not available on this runner (nvcc: {nvcc or 'missing'}, "
            f"torch CUDA runtime: {torch_cuda or 'missing'})")


def nvcc_argv(job: Job) -> list[str]:
    import torch.utils.cpp_extension as ext

    includes = [*job.cuda.include_dirs, *ext.include_paths(device_type="cuda")]
    return [
        shutil.which("nvcc") or "nvcc", "-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17",
        *[f"-I{d}" for d in includes], *[f"-D{k}={v}" for k, v in job.cuda.defines.items()],
        *job.cuda.compile_flags, *job.cuda.sources, "-o", OUTPUT,
    ]


def compile_sources(job: Job) -> Result | None:
    """None when the build succeeded (go on and run), else a `compile_error` result."""
    result = Result(mode=job.mode, protocol=job.protocol)
    if problem := toolchain_problem():
        return result.fail("compile_error", problem)
    missing = [s for s in job.cuda.sources if not os.path.isfile(os.path.join(job.workdir, s))]
    if not job.cuda.sources or missing:
        return result.fail("compile_error", f"CUDA sources missing: {', '.join(missing) or 'none given'}")
    limits = Limits(wall_seconds=job.timeout("compile"), output_bytes=256 << 10)
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": job.workdir}
    outcome = Sandbox(job.workdir, limits, uid=job.sandbox_uid).start(nvcc_argv(job), env=env).wait()
    if outcome.timed_out or outcome.returncode != 0:
        why = "timed out" if outcome.timed_out else f"exit code {outcome.returncode}"
        result.stderr = outcome.stderr
        return result.fail("compile_error", f"nvcc failed ({why}):\n{tail(outcome.stderr, 40)}")
    return None
