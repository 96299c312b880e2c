"""What a runner needs to evaluate a run: the harness job (runners/harness/contract.py) and its workdir's files.

Takes a `leaderboards.models.Run` (duck-typed: `runners` never imports `leaderboards`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.conf import settings

from runners.harness import contract
from runners.models import Gpu, GpuPool
from taskspec import jobspec
from taskspec.jobspec import DEFAULT_LIMITS, derive_seed

CUDA_COMPILE_TIMEOUT = contract.COMPILE_TIMEOUT_S
Run = Any  # leaderboards.models.Run


def sandbox_uid(gpu: Gpu) -> int:
    """One host uid per device and installation: concurrent runs never share RLIMIT_NPROC."""
    return settings.SANDBOX_UID_BASE + gpu.pk % settings.SANDBOX_UID_SLOTS


def pool_limits(pool: GpuPool | None) -> dict[str, int]:
    """The sandbox limits every node of `pool` applies: the pool's memory limit for the whole tree when it sets one,
    else the harness's default (`sandbox.tree_memory_limit`), its disk limit for the run's workdir, and its CPU
    cores per device (else the node's share, `sandbox.cpu_limit`)."""
    limits = dict(DEFAULT_LIMITS)
    if pool is not None and pool.memory_limit_mib:
        limits["tree_memory_bytes"] = pool.memory_limit_mib << 20
    if pool is not None and pool.disk_limit_mib:
        limits["disk_bytes"] = pool.disk_limit_mib << 20
    if pool is not None and pool.cpus_per_device:
        limits["cpus_per_device"] = pool.cpus_per_device
    return limits


def run_limits(gpu: Gpu) -> dict[str, int]:
    """`pool_limits` of a run on this machine's `gpu`, sharing the node between its enabled devices."""
    return {**pool_limits(gpu.node.pool),
            "runs_per_node": Gpu.objects.filter(node_id=gpu.node_id, enabled=True).count() or 1}


def run_seed(run: Run) -> int:
    """Public runs are reproducible from the task seed; the secret run mixes in the leaderboard's secret. A final
    standings' re-run (`submission.final_entry`) takes its round's fresh seed: every entry of a round gets the same
    inputs, which no earlier run saw."""
    submission = run.submission
    if getattr(submission, "final_entry_id", None):
        return derive_seed("final", submission.final_entry.final.seed, submission.final_round, run.gpu_type_id)
    base = submission.problem.definition.get("seed") or 0
    if run.secret:
        return derive_seed("secret", submission.leaderboard.secret_seed, submission.pk, run.gpu_type_id)
    return derive_seed("public", base, submission.pk, run.gpu_type_id)


def workdir_files(run: Run) -> dict[str, str]:
    return jobspec.workdir_files(run.submission.problem.definition, run.submission.code.text)


def run_timing(run: Run) -> dict[str, Any]:
    """The platform's timing settings, with the run's between-run spread (its board's own, else the one measured on
    its GPU type: `Run.between_run_spread`) where there is one."""
    spread = run.between_run_spread()
    return settings.HARNESS_TIMING if spread is None else {**settings.HARNESS_TIMING, "run_spread": spread}


def run_job(run: Run, pool: GpuPool | None = None) -> dict:
    """The job without the fields only the runner machine knows (contract.RUNNER_FIELDS)."""
    submission = run.submission
    return jobspec.task_job(submission.problem.definition, mode=submission.mode, protocol=submission.problem.harness,
                            ranking_by=submission.leaderboard.ranking_by, seed=run_seed(run),
                            limits=pool_limits(pool), timing=run_timing(run),
                            architecture=run.gpu_type.architecture)


def harness_job(run: Run, workdir: Path, devices: list[str], gpu: Gpu) -> dict:
    """The whole job for a run on this machine's `gpu`."""
    return {**run_job(run), "limits": run_limits(gpu), "workdir": str(workdir), "gpus": devices,
            "sandbox_uid": sandbox_uid(gpu)}


def gpu_count(run: Run) -> int:
    """Devices the run needs on one node: the largest world_size of a multi-GPU task, else one (none on CPU)."""
    if run.gpu_type.is_cpu:
        return 0
    definition = run.submission.problem.definition
    if not definition.get("multi_gpu"):
        return 1
    cases = [*definition.get("tests", []), *definition.get("benchmarks", [])]
    return max([int(c.get("world_size") or 1) for c in cases] or [1])


def job_payload(run: Run, pool: GpuPool | None) -> dict:
    """What the runner API hands a remote agent (see contract): the job, the workdir's files, the devices it needs
    and the run's total time budget."""
    return {"job": run_job(run, pool), "files": workdir_files(run), "gpu_count": gpu_count(run),
            "timeout_s": total_timeout(run)}


def total_timeout(run: Run) -> int:
    return jobspec.total_timeout(run.submission.problem.definition, run.submission.mode)
