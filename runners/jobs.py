"""What a runner needs to evaluate a run: the harness job (JSON) and the files of its working directory."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django.conf import settings

from leaderboards.models import Run, SubmissionMode

SANDBOX_UID_BASE = 61000  # + device: concurrent runs never share a uid, so never share RLIMIT_NPROC
DEFAULT_LIMITS = {"memory_bytes": 16 << 30, "cpu_seconds": 3600, "processes": 256,
                  "file_size_bytes": 256 << 20, "output_bytes": 64 << 10}
CUDA_COMPILE_TIMEOUT = 120  # KernelBot's Timeout.COMPILE


def derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 2


def run_seed(run: Run) -> int:
    """Public runs are reproducible from the task seed; the secret run mixes in the leaderboard's secret."""
    submission = run.submission
    base = submission.problem.definition.get("seed") or 0
    if run.secret:
        return derive_seed("secret", submission.leaderboard.secret_seed, submission.pk, run.gpu_type_id)
    return derive_seed("public", base, submission.pk, run.gpu_type_id)


def workdir_files(run: Run) -> dict[str, str]:
    definition = run.submission.problem.definition
    return {**definition["files"], definition["submission_name"]: run.submission.code.text}


def harness_job(run: Run, workdir: Path, devices: list[str], gpu_pk: int) -> dict:
    definition = run.submission.problem.definition
    return {
        "mode": run.submission.mode,
        "protocol": run.submission.problem.harness,
        "lang": definition["lang"],
        "workdir": str(workdir),
        "main": definition.get("main"),
        "tests": definition["tests"],
        "benchmarks": definition["benchmarks"],
        "ranking_by": run.submission.leaderboard.ranking_by,
        "seed": run_seed(run),
        "multi_gpu": definition.get("multi_gpu", False),
        "gpus": devices,
        "timeouts": {"test": definition["test_timeout"], "benchmark": definition["benchmark_timeout"],
                     "ranked": definition["ranked_timeout"], "compile": CUDA_COMPILE_TIMEOUT},
        "limits": DEFAULT_LIMITS,
        "timing": settings.HARNESS_TIMING,
        "cuda": cuda_config(run),
        "sandbox_uid": SANDBOX_UID_BASE + gpu_pk % 4000,
    }


def cuda_config(run: Run) -> dict:
    """A `lang: cu` task's config as declared, its other files as headers, and the GPU type's arch."""
    definition = run.submission.problem.definition
    if definition["lang"] != "cu":
        return {}
    config = definition.get("config", {})
    files = [*definition["files"], definition["submission_name"]]
    arch = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3}[a-z]?)", run.gpu_type.architecture.strip())
    return {**config, "headers": [f for f in files if f not in config.get("sources", [])],
            "arch": arch.group(1) if arch else ""}


def total_timeout(run: Run) -> int:
    definition = run.submission.problem.definition
    phases = {SubmissionMode.TEST: ["test_timeout"], SubmissionMode.BENCHMARK: ["benchmark_timeout"],
              SubmissionMode.PROFILE: ["benchmark_timeout"],
              SubmissionMode.LEADERBOARD: ["test_timeout", "benchmark_timeout", "ranked_timeout"]}
    compile_s = CUDA_COMPILE_TIMEOUT if definition["lang"] == "cu" else 0
    return sum(int(definition[key]) for key in phases[run.submission.mode]) + compile_s + 60
