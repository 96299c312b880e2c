"""The runner backend interface (docs/architecture.md "Runs").

A GPU pool names its backend. The run lifecycle (`leaderboards.lifecycle`) hands a backend plain data (`Dispatch`)
and a `Reporter`; the backend starts the harness somewhere and returns at once (remote) or runs it in the worker
(local). Remote harnesses report over the runner HTTP API with a per-attempt token; `poll` catches what they miss.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from enum import StrEnum
from importlib import import_module
from typing import ClassVar, Protocol

from django import forms
from django.conf import settings

from runners.harness.agent import runner_token
from runners.models import GpuPool, GpuType, RunnerBackendName

BACKENDS = {
    RunnerBackendName.LOCAL: "runners.backends.local.LocalBackend",
    RunnerBackendName.SLURM: "runners.backends.slurm.SlurmBackend",
    RunnerBackendName.GITHUB: "runners.backends.github.GithubBackend",
    RunnerBackendName.MODAL: "runners.backends.modal.ModalBackend",
}


class BackendUnavailable(Exception):
    pass


@dataclass(frozen=True)
class Dispatch:
    run_id: int
    attempt: int
    nonce: str  # public per-attempt value (a correlation id the runner may show)
    platform_url: str  # where the remote side reaches the platform
    gpu_type: GpuType
    gpu_count: int  # world_size for multi_gpu problems, else 1 (0 on a CPU type)
    timeout_s: int  # the run's total wall-clock budget
    label: str  # short human string for job names, e.g. "kernelbot run 42 attempt 1"
    user_id: int | None = None  # whose run: usage reports count the devices it holds for them
    project: str = ""  # what the usage is for (the run's leaderboard)
    # the attempt's credential, the only one its runner gets (attempt_token); never logged
    token: str = field(default="", repr=False)


class RemoteState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    FINISHED = "finished"
    FAILED = "failed"
    LOST = "lost"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class Poll:
    state: RemoteState
    detail: str = ""  # human reason, e.g. "PREEMPTED", "runner offline", "exit code 1"
    result: dict | None = None  # the harness result when the service hands it back


class Reporter(Protocol):
    """Implemented by leaderboards.lifecycle for one attempt; every call is attempt-checked and idempotent."""

    def running(self) -> bool: ...  # the harness started; False: the run moved on, stop
    def progress(self, event: dict) -> None: ...
    def result(self, result: dict) -> bool: ...
    def failure(self, reason: str) -> bool: ...  # infrastructure failure: retried, never charged to the user
    def heartbeat(self) -> bool: ...  # still holding the attempt; False: the run moved on, stop
    def job(self) -> dict: ...  # the job payload the runner API serves (runners.jobs.job_payload), for in-process use


class PoolOptions(forms.Form):
    """Settings every remote pool has; a backend's `options` form subclasses it."""

    queue_timeout = forms.IntegerField(
        required=False, min_value=30, help_text="Seconds a run may wait in the service's queue before it is retried "
        "elsewhere (default KERNELBOT_REMOTE_QUEUE_TIMEOUT, 30 min).")
    runner_key_env = forms.RegexField(
        required=False, regex=r"^[A-Z_][A-Z0-9_]*$", help_text="Environment variable holding this pool's runner key "
        "(default KERNELBOT_RUNNER_KEY); it stays on the platform, which gives each runner its attempt's token.")
    platform_url = forms.URLField(
        required=False, assume_scheme="https",
        help_text="Where this pool's runners reach the platform, if not KERNELBOT_PUBLIC_URL.")


class RunnerBackend(ABC):
    # False only for the local backend: nothing is started at dispatch (its node agents claim the run and beat it),
    # so `lifecycle.dispatch_run` builds no `Dispatch` for it and never calls its `dispatch`
    remote: ClassVar[bool] = True
    options: ClassVar[type[forms.Form] | None] = None  # the pool's settings, validated; the admin renders its fields
    # secrets read from fixed environment variables, label → variable (the pool page says whether each is set); a
    # settings field ending in `_env` names a variable of its own
    secrets: ClassVar[dict[str, str]] = {}

    def __init__(self, pool: GpuPool):
        self.pool = pool
        self.settings = validated_settings(pool, self.options)

    @abstractmethod
    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        """Start the harness; return the service's id for it. Never waits for remote work."""

    def poll(self, external_id: str) -> Poll:
        return Poll(RemoteState.RUNNING)

    def cancel(self, external_id: str) -> None:  # noqa: B027 - optional
        pass

    @classmethod
    def available(cls) -> str | None:
        """None when this backend is usable here, else why not (missing client or environment)."""
        return None


def validated_settings(pool: GpuPool, options: type[forms.Form] | None) -> dict:
    if options is None:
        return dict(pool.settings or {})
    form = options(data=pool.settings or {})
    if not form.is_valid():
        problems = "; ".join(f"{name}: {' '.join(errors)}" for name, errors in form.errors.items())
        raise BackendUnavailable(f"GPU pool '{pool.name}' has invalid settings: {problems}")
    return {k: v for k, v in form.cleaned_data.items() if v not in (None, "")}


def backend_class(name: str) -> type[RunnerBackend]:
    path = BACKENDS.get(name)
    if path is None:
        raise BackendUnavailable(f"backend '{name}' does not exist")
    module, attr = path.rsplit(".", 1)
    try:
        return getattr(import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(f"this deployment does not provide backend '{name}' ({exc})") from exc


def backend_for(pool: GpuPool) -> RunnerBackend:
    try:
        cls = backend_class(pool.backend)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"GPU pool '{pool.name}' uses backend '{pool.backend}': {exc}") from exc
    if why := cls.available():
        raise BackendUnavailable(f"GPU pool '{pool.name}' uses backend '{pool.backend}', unavailable here: {why}")
    return cls(pool)


def available_backends() -> dict[str, type[RunnerBackend]]:
    """The backends this deployment can use, by RunnerBackendName: the only ones the admin offers."""
    usable = {}
    for name in BACKENDS:
        try:
            cls = backend_class(name)
        except BackendUnavailable:
            continue
        if cls.available() is None:
            usable[name] = cls
    return usable


def attempt_token(pool: GpuPool, run_id: int, attempt: int, nonce: str) -> str:
    """The token that opens one attempt's runner routes while it is current: HMAC-SHA256(the pool's runner key,
    "run:attempt:nonce"), issued with the dispatch (or a node agent's claim). The key stays on the platform."""
    return runner_token(runner_key(pool), run_id, attempt, nonce)


def runner_key(pool: GpuPool | None) -> str:
    """The pool's runner key, from the environment variable its settings name (else KERNELBOT_RUNNER_KEY)."""
    name = ((pool.settings or {}).get("runner_key_env") if pool is not None else None) or ""
    return os.environ.get(name, "") if name else settings.RUNNER_KEY


def platform_url(pool: GpuPool | None) -> str:
    url = (pool.settings or {}).get("platform_url") if pool is not None else None
    return (url or settings.PUBLIC_URL).rstrip("/")


def queue_timeout(pool: GpuPool) -> int:
    return int((pool.settings or {}).get("queue_timeout") or settings.RUN_REMOTE_QUEUE_TIMEOUT)
