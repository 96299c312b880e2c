"""`lang: cu` problems, run as KernelBot runs them.

The task's `config.sources` (typically `eval.cu` + `submission.cu`; the other files are headers) are compiled
by nvcc, inside the sandbox, into one program `eval.out` with KernelBot's flags, the task's compile flags,
include dirs and defines, and `-arch` from the GPU type (`native` when unknown). Every source and header is
deleted before the program runs, so it cannot read the submission or the task files back. The program then
speaks the popcorn protocol (`./eval.out <mode> <cases-file>`, `key: value` lines on POPCORN_FD), once per
phase like KernelBot: test; benchmark; or, for a leaderboard run, test, benchmark and leaderboard. The
evaluator shares its process with the submission, so results carry the `popcorn:untrusted-eval` flag.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess

from .job import Job
from .popcorn import FLAG, STAGES, phase_limits, run_stages
from .problem import derive_seed
from .result import NEEDS_CUDA, NEEDS_CUDA_FLAG, Emitter, Result, cap, tail
from .sandbox import Sandbox

PROGRAM = "eval.out"
# KernelBot's CUDA_FLAGS (libkernelbot/consts.py), so its tasks compile unchanged
KERNELBOT_FLAGS = ("--std=c++20", "-DNDEBUG", "-Xcompiler=-Wno-psabi", "-Xcompiler=-fno-strict-aliasing",
                   "--expt-extended-lambda", "--expt-relaxed-constexpr", "-forward-unknown-to-host-compiler",
                   "-O3", "-Xnvlink=--verbose", "-Xptxas=--verbose", "-Xptxas=--warn-on-spills")
COMPILE_OUTPUT_BYTES = 256 << 10
# what the CUDA runtime says when there is no usable GPU (cudaErrorNoDevice, InsufficientDriver, StubLibrary)
NO_GPU = re.compile(r"no CUDA-capable device|CUDA driver version is insufficient|CUDA driver is a stub library"
                    r"|cudaErrorNoDevice|cudaErrorInsufficientDriver|cudaErrorStubLibrary")
# eval modes a submission mode runs, in order (KernelBot's run_evaluation)


def find_nvcc() -> str | None:
    """nvcc on PATH, else under $CUDA_HOME/bin."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return shutil.which("nvcc") or (shutil.which("nvcc", path=os.path.join(home, "bin")) if home else None)


def toolkit_paths(nvcc: str) -> list[str]:
    """Host directories of the CUDA installation the sandbox must see read-only (/usr is always bound)."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    found = {os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), *([home] if home else [])}
    return sorted(p for p in found if os.path.isdir(p) and not _under(os.path.realpath(p), "/usr"))


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


def nvcc_argv(nvcc: str, job: Job) -> list[str]:
    cuda = job.cuda
    arch = f"-gencode=arch=compute_{cuda.arch},code=sm_{cuda.arch}" if cuda.arch else "-arch=native"
    return [nvcc, *KERNELBOT_FLAGS, *cuda.compile_flags, *(f"-I{d}" for d in cuda.include_dirs),
            *(f"-D{k}" if v is None else f"-D{k}={v}" for k, v in cuda.defines.items()),
            *cuda.sources, arch, "-o", PROGRAM]


def has_gpu(job: Job) -> bool:
    """Whether this run has a CUDA device at all (decided here, never by the program)."""
    return bool(job.gpus) and os.path.exists("/dev/nvidiactl")


def run(job: Job, emitter: Emitter) -> Result:
    result = Result(mode=job.mode, protocol="popcorn", flags=[FLAG])
    if job.mode not in STAGES:
        return result.fail("fail", "profiling is not available for CUDA (eval.cu) problems on this runner")
    nvcc = find_nvcc()
    if nvcc is None:
        result.status = "error"
        return result.fail("compile_error", "nvcc (the CUDA compiler) was not found on this runner: a runner "
                                            "configuration problem, not your code (install the CUDA toolkit)")
    missing_dirs = [d for d in job.cuda.include_dirs if not os.path.isdir(os.path.join(job.workdir, d))]
    if missing_dirs:
        result.status = "error"
        return result.fail("compile_error", f"include directories missing on this runner: {', '.join(missing_dirs)}")
    ro_paths = toolkit_paths(nvcc) + [d for d in job.cuda.include_dirs if os.path.isabs(d)]
    devices = list(job.gpus)
    try:
        if not compile_program(job, nvcc, ro_paths, devices, result):
            return result
    finally:  # like KernelBot: no source or header survives into the run, whatever the compile did
        for name in (*job.cuda.sources, *job.cuda.headers):
            if os.path.lexists(path := os.path.join(job.workdir, name)):
                os.unlink(path)
    seed = derive_seed(job.seed, "popcorn", 0, 0) & 0x7FFF_FFFF  # eval.cu parses it with std::stoi
    failed = run_stages(job, emitter, result, [f"./{PROGRAM}"], seed, lambda phase: Sandbox(
        job.workdir, phase_limits(job, phase), devices=devices, uid=job.sandbox_uid, ro_paths=ro_paths), PROGRAM)
    if failed is None:
        return result
    if not has_gpu(job) and NO_GPU.search(failed.stderr):
        result.status = "error"
        result.flags.append(NEEDS_CUDA_FLAG)
        return result.fail("crash", f"{NEEDS_CUDA} (the program's CUDA calls failed):\n{tail(failed.stderr, 5)}")
    return result.fail(failed.verdict, failed.error)


def compile_program(job: Job, nvcc: str, ro_paths: list[str], devices: list[str], result: Result) -> bool:
    """Compile in the sandbox; True when `eval.out` was built, else `result` holds the compile error."""
    missing = [s for s in job.cuda.sources if not os.path.isfile(os.path.join(job.workdir, s))]
    if not job.cuda.sources or missing:
        result.status = "error"
        result.fail("compile_error", f"CUDA sources missing: {', '.join(missing) or 'config.sources is empty'}")
        return False
    argv = nvcc_argv(nvcc, job)
    limits = dataclasses.replace(job.sandbox_limits(), wall_seconds=job.timeout("compile"),
                                 output_bytes=COMPILE_OUTPUT_BYTES)
    env = {"PATH": f"{os.path.dirname(nvcc)}:/usr/local/bin:/usr/bin:/bin"}
    sandbox = Sandbox(job.workdir, limits, devices=devices, uid=job.sandbox_uid, ro_paths=ro_paths)
    outcome = sandbox.start(argv, env=env).wait()
    command = shlex.join([os.path.basename(nvcc), *argv[1:]])
    result.extra["compile"] = {"command": command, "exit_code": outcome.returncode, "version": nvcc_version(nvcc),
                               "stdout": cap(outcome.stdout), "stderr": cap(outcome.stderr)}
    program = os.path.join(job.workdir, PROGRAM)
    if outcome.timed_out or outcome.returncode != 0 or not os.path.isfile(program) or os.path.islink(program):
        why = outcome.reason or f"exit code {outcome.returncode}"
        result.stdout, result.stderr = outcome.stdout, outcome.stderr
        result.fail("compile_error", f"compilation failed ({why}): {command}\n{tail(outcome.stderr, 40)}")
        return False
    return True


def nvcc_version(nvcc: str) -> str:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    return next((line.strip() for line in out.splitlines() if "release" in line), out.strip()[-200:])
