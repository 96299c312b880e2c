"""`kernelbot run`'s service: get a task (a leaderboard's from its server, cached per problem version, or a local
reference-kernels directory) and run the platform's harness on it here, with the task's public seed.

From a server: `GET /api/v1/leaderboards/{name}/local` gives the task's files and the platform's harness job per mode
(`taskspec.jobspec`, the builder the platform uses); the harness is the server's own tarball
(`/api/runner/v1/harness.tar.gz`), kept under its version (sha256 of its files). Both stay in the cache
(`$XDG_CACHE_HOME/kernelbot`, or KERNELBOT_CACHE): when the server cannot be reached, the leaderboard's last
downloaded task and its harness are used. With `--problem DIR` the job is built here by the same builder and run
by the harness installed with this package. No Django: the harness runs as a separate `python -m runners.harness`
process (`runners.harness.runner.run_harness`, as every agent runs it)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from platformdirs import user_cache_path

import runners.harness
from runners.harness.runner import new_workdir, run_harness, write_workdir
from taskspec import jobspec
from taskspec.loader import load_task
from taskspec.model import has_own_evaluator
from taskspec.scoring import score_seconds

INSTALLED_HARNESS = Path(runners.harness.__file__).resolve().parents[2]  # the directory that holds runners/harness


class LocalRunError(Exception):
    """Why there is nothing to run (no task, no harness): the message says what to do."""


@dataclasses.dataclass
class LocalTask:
    name: str  # the leaderboard, or the problem directory's name
    bundle: dict[str, Any]  # taskspec.jobspec.public_bundle: files, submission_name, jobs
    harness_dir: Path  # PYTHONPATH of the harness that runs it
    origin: str  # how it was obtained, for the user
    problem: dict[str, Any] = dataclasses.field(default_factory=dict)
    harness_version: str = ""


def cache_root() -> Path:
    return Path(os.environ.get("KERNELBOT_CACHE") or user_cache_path("kernelbot"))


def server_dir(url: str) -> Path:
    return cache_root() / "servers" / re.sub(r"[^A-Za-z0-9.-]+", "_", url.split("://", 1)[-1].rstrip("/"))


def _write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def harness_dir(version: str) -> Path:
    return cache_root() / "harness" / version


def install_harness(data: bytes, version: str) -> Path:
    """Unpack a downloaded harness tarball under its version, after checking it is that version."""
    found = jobspec.tarball_digest(data)
    if found != version:
        raise LocalRunError(f"the harness downloaded is version {found[:12]}, not the {version[:12]} the server "
                            "announced (was the server upgraded meanwhile?); run again")
    target = harness_dir(version)
    if (target / "runners" / "harness" / "__main__.py").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version[:12]}-", dir=target.parent))
    jobspec.extract_tarball(data, staging)
    try:
        staging.rename(target)
    except OSError:  # another `kernelbot run` unpacked it first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def server_task(client: httpx.Client, base_url: str, leaderboard: str) -> LocalTask:
    """The leaderboard's task and harness from the server (downloading what the cache lacks), or from the cache
    when the server cannot be reached. A refusal (unknown or invisible leaderboard, bad token) is final."""
    pointer = server_dir(base_url) / "leaderboards" / f"{leaderboard}.json"
    try:
        response = client.get(f"/leaderboards/{leaderboard}/local")
    except httpx.TransportError as exc:
        return _cached_task(pointer, leaderboard, f"{type(exc).__name__}: {exc}")
    if response.status_code >= 500:
        return _cached_task(pointer, leaderboard, f"HTTP {response.status_code}")
    if not response.is_success:
        raise LocalRunError(f"{_detail(response)} (HTTP {response.status_code})")
    payload = response.json()
    problem, harness = payload["problem"], payload["harness"]
    version_dir = (server_dir(base_url) / "problems" / problem["name"] /
                   f"v{problem['version']}-{problem['content_hash'][:12]}")
    target = harness_dir(harness["version"])
    origin = "cached"
    if not (target / "runners" / "harness" / "__main__.py").is_file():
        tarball = client.get(base_url.rstrip("/") + harness["url"])
        if not tarball.is_success:
            raise LocalRunError(f"could not download the harness: HTTP {tarball.status_code}")
        install_harness(tarball.content, harness["version"])
        origin = "downloaded"
    bundle = {k: payload[k] for k in ("files", "submission_name", "jobs")}
    _write_json(version_dir / "task.json", {**bundle, "problem": problem, "harness": harness})
    _write_json(pointer, {"task": str(version_dir / "task.json"), "fetched": datetime.now(UTC).isoformat()})
    return LocalTask(leaderboard, bundle, target, f"{base_url} (harness {origin})", problem, harness["version"])


def _cached_task(pointer: Path, leaderboard: str, why: str) -> LocalTask:
    if not pointer.is_file():
        raise LocalRunError(f"the server cannot be reached ({why}) and {leaderboard} was never downloaded here: "
                            "run once while online")
    seen = json.loads(pointer.read_text())
    task = json.loads(Path(seen["task"]).read_text())
    target = harness_dir(task["harness"]["version"])
    if not (target / "runners" / "harness" / "__main__.py").is_file():
        raise LocalRunError(f"the server cannot be reached ({why}) and its harness is no longer in the cache "
                            f"({target}): run once while online")
    bundle = {k: task[k] for k in ("files", "submission_name", "jobs")}
    return LocalTask(leaderboard, bundle, target, f"the cache, downloaded {seen['fetched'][:16]} UTC (offline: "
                     f"{why})", task["problem"], task["harness"]["version"])


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return detail if isinstance(detail, str) else response.text[:500]


def directory_task(directory: Path) -> LocalTask:
    """A reference-kernels task directory (task.yml), run by the harness installed with this package."""
    try:
        task = load_task(directory)
    except (OSError, ValueError) as exc:  # TaskFileError is a ValueError listing every issue
        raise LocalRunError(f"{directory}: not a usable task directory:\n{exc}") from exc
    definition = task.to_json()
    protocol = "popcorn" if has_own_evaluator(task) else "kernelbot"
    bundle = jobspec.public_bundle(definition, protocol=protocol, ranking_by=task.ranking_by, timing={})
    return LocalTask(task.name, bundle, INSTALLED_HARNESS, f"{Path(directory).resolve()} (installed harness)",
                     {"name": task.name, "version": None, "content_hash": task.content_hash})


def default_gpus() -> list[str]:
    """The first GPU when this machine has an NVIDIA device, else none (the CPU)."""
    return ["0"] if Path("/dev/nvidia0").exists() else []


def run_task(task: LocalTask, code: str, mode: str, *, gpus: list[str], python: str = sys.executable,
             on_progress: Callable[[dict], None] = lambda event: None) -> dict[str, Any]:
    """Run `code` as the task's submission in `mode`; the harness's result, with `wall_s` (the whole local run).
    Raises LocalRunError when the harness gives no result."""
    if mode not in task.bundle["jobs"]:
        raise LocalRunError(f"mode {mode!r} does not run locally; choose one of {', '.join(task.bundle['jobs'])}")
    planned = task.bundle["jobs"][mode]
    started = time.monotonic()
    workdir = new_workdir(Path(tempfile.gettempdir()))
    try:
        write_workdir(workdir, {**task.bundle["files"], task.bundle["submission_name"]: code})
        result, failure = run_harness({**planned["job"], "workdir": str(workdir), "gpus": gpus}, python=python,
                                      pythonpath=str(task.harness_dir), timeout=float(planned["timeout_s"]),
                                      on_progress=on_progress, still_wanted=lambda: True, check_interval=5.0)
    finally:
        shutil.rmtree(workdir.parent, ignore_errors=True)
    if result is None and "No module named 'torch'" in failure:
        raise LocalRunError(f"{python} cannot run the harness: it has no torch (install torch there, or name a Python "
                            "that has it with --python)")
    if result is None:
        raise LocalRunError(failure or "the harness ended without a result")
    return {**result, "wall_s": round(time.monotonic() - started, 3)}


def local_score(result: dict[str, Any], ranking_by: str) -> float | None:
    """A passing benchmark run's score in seconds, as the platform computes a benchmark run's
    (`leaderboards.scoring.score_from_result`); None otherwise."""
    cases = result.get("benchmarks") or []
    if not result.get("passed") or result.get("mode") != "benchmark" or not cases:
        return None
    try:
        return score_seconds([float(c["time"] if c.get("time") is not None else c["mean"]) for c in cases],
                             ranking_by)
    except (KeyError, TypeError, ValueError):
        return None
