"""What a runner needs to evaluate a run: the harness job (JSON) and the files of its working directory."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from django.conf import settings

from leaderboards.models import Run, SubmissionMode
from runners.models import Gpu

# memory_bytes is per process (address space); the whole tree's memory is run_limits' cgroup limit
DEFAULT_LIMITS = {"memory_bytes": 16 << 30, "cpu_seconds": 3600, "processes": 256,
                  "file_size_bytes": 256 << 20, "output_bytes": 64 << 10}
CUDA_COMPILE_TIMEOUT = 120  # KernelBot's Timeout.COMPILE


def sandbox_uid(gpu: Gpu) -> int:
    """One host uid per device and installation: concurrent runs never share RLIMIT_NPROC."""
    return settings.SANDBOX_UID_BASE + gpu.pk % settings.SANDBOX_UID_SLOTS


def run_limits(gpu: Gpu) -> dict[str, int]:
    """The sandbox limits of a run on `gpu`: the pool's memory limit for the whole tree when it sets one, else the
    harness gives the run its node's share (the node's spare memory split between its enabled devices)."""
    pool = gpu.node.pool
    limits = {**DEFAULT_LIMITS, "runs_per_node": Gpu.objects.filter(node_id=gpu.node_id, enabled=True).count() or 1}
    if pool.memory_limit_mib:
        limits["tree_memory_bytes"] = pool.memory_limit_mib << 20
    return limits


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


def harness_job(run: Run, workdir: Path, devices: list[str], gpu: Gpu) -> dict:
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
        "limits": run_limits(gpu),
        "timing": settings.HARNESS_TIMING,
        "cuda": cuda_config(run),
        "sandbox_uid": sandbox_uid(gpu),
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
