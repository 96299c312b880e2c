"""The runner backend interface. A GPU pool names its backend; each backend is a small module."""

from __future__ import annotations

from abc import ABC, abstractmethod
from importlib import import_module
from typing import ClassVar

from runners.models import GpuPool, RunnerBackendName

BACKENDS = {
    RunnerBackendName.LOCAL: "runners.backends.local.LocalBackend",
}


class BackendUnavailable(Exception):
    pass


class RunnerBackend(ABC):
    """Starts a run's harness somewhere and makes sure its result reaches `do_ingest_result`.

    `dispatch` must not block on remote work: a remote backend submits and returns, and the result
    arrives through a callback or a short scheduled poll. The local backend runs on this machine and
    therefore does the work inside the worker that dispatched it."""

    # True when `dispatch` keeps the run's deadline a heartbeat ahead (actions.do_heartbeat) while it holds the run
    heartbeats: ClassVar[bool] = False

    def __init__(self, pool: GpuPool):
        self.pool = pool

    @abstractmethod
    def dispatch(self, run_id: int, attempt: int) -> None: ...


def backend_for(pool: GpuPool) -> RunnerBackend:
    path = BACKENDS.get(pool.backend)
    if path is None:
        raise BackendUnavailable(f"GPU pool '{pool.name}' uses backend '{pool.backend}', "
                                 "which this deployment does not provide yet")
    module, name = path.rsplit(".", 1)
    return getattr(import_module(module), name)(pool)
