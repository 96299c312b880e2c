"""A task's harness job, built one way for the platform (`runners.jobs`, per run) and for `kernelbot run` (a
competitor's own machine, public seed only). Django-free: the CLI imports it. `definition` is a problem version's
parsed task (`taskspec.model.TaskDefinition.to_json()`, `Problem.definition`)."""

from __future__ import annotations

import hashlib
import io
import re
import tarfile
from pathlib import Path
from typing import Any

from runners.harness import contract

DEFAULT_LIMITS = {k: contract.DEFAULT_LIMITS[k] for k in ("memory_bytes", "cpu_seconds", "processes",
                                                           "file_size_bytes", "output_bytes")}
LOCAL_MODES = ("test", "benchmark")  # what `kernelbot run` runs: the ranked phase only counts on the platform


def derive_seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(":".join(map(str, parts)).encode()).digest()[:8], "big") >> 2


def public_seed(definition: dict) -> int:
    """The seed of a run on a competitor's machine: from the task's own (public) seed only, the same for everyone
    and every try. The platform's runs mix in the submission (public runs) or the leaderboard's secret (secret
    runs), which never leave the server."""
    return derive_seed("public", definition.get("seed") or 0, "local")


def phase_timeouts(definition: dict) -> dict[str, float]:
    return {"test": definition["test_timeout"], "benchmark": definition["benchmark_timeout"],
            "ranked": definition["ranked_timeout"]}


def cuda_config(definition: dict, architecture: str) -> dict:
    """A `lang: cu` task's config as declared, its other files as headers, and the GPU type's arch ("" = the
    device's own, as on a competitor's machine)."""
    if definition["lang"] != "cu":
        return {}
    config = definition.get("config", {})
    files = [*definition["files"], definition["submission_name"]]
    arch = re.fullmatch(r"(?:sm_|compute_)?(\d{2,3}[a-z]?)", architecture.strip())
    return {**config, "headers": [f for f in files if f not in config.get("sources", [])],
            "arch": arch.group(1) if arch else ""}


def task_job(definition: dict, *, mode: str, protocol: str, ranking_by: str, seed: int, limits: dict[str, int],
             timing: dict, architecture: str = "") -> dict:
    """The job without the fields only the runner machine knows (contract.RUNNER_FIELDS)."""
    return {
        "mode": mode,
        "protocol": protocol,
        "lang": definition["lang"],
        "main": definition.get("main"),
        "tests": definition["tests"],
        "benchmarks": definition["benchmarks"],
        "ranking_by": ranking_by,
        "seed": seed,
        "multi_gpu": definition.get("multi_gpu", False),
        "timeouts": {**phase_timeouts(definition), "compile": contract.COMPILE_TIMEOUT_S},
        "limits": limits,
        "timing": timing,
        "cuda": cuda_config(definition, architecture),
    }


def total_timeout(definition: dict, mode: str) -> int:
    return contract.total_timeout(mode, definition["lang"], phase_timeouts(definition))


def workdir_files(definition: dict, code: str) -> dict[str, str]:
    return {**definition["files"], definition["submission_name"]: code}


def local_jobs(definition: dict, *, protocol: str, ranking_by: str, timing: dict) -> dict[str, dict]:
    """Per local mode, the job `kernelbot run` gives the harness and its total time budget: the platform's job for
    that mode with the public seed, the default sandbox limits and the local device's own CUDA arch."""
    return {mode: {"job": task_job(definition, mode=mode, protocol=protocol, ranking_by=ranking_by,
                                   seed=public_seed(definition), limits=dict(DEFAULT_LIMITS), timing=timing),
                   "timeout_s": total_timeout(definition, mode)}
            for mode in LOCAL_MODES}


def tarball_digest(data: bytes) -> str:
    """The harness tarball's version: sha256 over its regular files' names and contents (not the gzip or tar
    headers, whose times differ from one server process to the next)."""
    digest = hashlib.sha256()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        for member in sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name):
            content = tar.extractfile(member).read()
            digest.update(f"{member.name}\0{len(content)}\0".encode())
            digest.update(content)
    return digest.hexdigest()


def extract_tarball(data: bytes, dest: str | Path) -> None:
    """A (gzipped) tarball of ours under `dest`: the harness checked by `tarball_digest`, a `git archive`. Through
    tarfile's "data" filter where this Python has it (3.11.4 and later; Debian 12's python3 is 3.11.2), else as
    written."""
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))


def public_bundle(definition: dict, *, protocol: str, ranking_by: str, timing: dict) -> dict[str, Any]:
    """What a competitor's machine needs to run a task as the platform does: its files (the submission left out),
    the submission's file name and `local_jobs`."""
    return {"files": dict(definition["files"]), "submission_name": definition["submission_name"],
            "jobs": local_jobs(definition, protocol=protocol, ranking_by=ranking_by, timing=timing)}
