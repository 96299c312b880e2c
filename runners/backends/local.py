"""Runs the harness on this machine, one run per device at a time (a file lock per `Gpu` row)."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from runners.harness.runner import run_harness, write_workdir
from runners.jobs import run_limits, sandbox_uid
from runners.models import Gpu, GpuType

from .base import Dispatch, Reporter, RunnerBackend

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL = 2.0  # at most; a quarter of the heartbeat deadline when that is shorter


def heartbeat_interval() -> float:
    return min(HEARTBEAT_INTERVAL, settings.RUN_HEARTBEAT_DEADLINE / 4)


class LocalBackend(RunnerBackend):
    """Not remote: `dispatch` does the work inside the worker that dispatched it, heartbeating the run's deadline
    (RUN_HEARTBEAT_DEADLINE) so a run whose worker dies is retried within seconds."""

    remote = False

    def dispatch(self, job: Dispatch, reporter: Reporter) -> str:
        with self.device(job.gpu_type, reporter) as gpu:
            if gpu is None or not reporter.running():
                return ""
            payload = reporter.job()
            workdir = Path(settings.RUNS_DIR) / f"run-{job.run_id}-{job.attempt}"
            shutil.rmtree(workdir, ignore_errors=True)
            try:
                write_workdir(workdir, payload["files"])
                harness_job = {**payload["job"], "limits": {**payload["job"]["limits"], **run_limits(gpu)},
                               "workdir": str(workdir), "gpus": [] if job.gpu_type.is_cpu else [str(gpu.index)],
                               "sandbox_uid": sandbox_uid(gpu)}
                result, failure = run_harness(
                    harness_job, python=settings.HARNESS_PYTHON or sys.executable, pythonpath=str(settings.BASE_DIR),
                    timeout=job.timeout_s, on_progress=reporter.progress, still_wanted=reporter.heartbeat,
                    check_interval=heartbeat_interval())
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        if result is not None:
            reporter.result(result)
        elif failure:
            reporter.failure(failure)
        else:
            log.info("run %s attempt %s moved on; stopped its harness", job.run_id, job.attempt)
        return ""

    @contextlib.contextmanager
    def device(self, gpu_type: GpuType, reporter: Reporter) -> Iterator[Gpu | None]:
        """Hold an exclusive lock on one free device of the run's type, waiting for one if all are busy (with
        heartbeats); None when the run moved on meanwhile."""
        gpus = list(Gpu.objects.filter(node__pool=self.pool, node__enabled=True, enabled=True,
                                       gpu_type=gpu_type))
        if not gpus:
            raise RuntimeError(f"pool '{self.pool.name}' has no enabled {gpu_type} device")
        lock_dir = Path(settings.RUNS_DIR) / "locks"
        lock_dir.mkdir(parents=True, exist_ok=True)
        last_beat = time.monotonic()
        while True:
            for gpu in gpus:
                handle = open(lock_dir / f"gpu-{gpu.pk}.lock", "w")  # noqa: SIM115 - held for the run
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    handle.close()
                    continue
                try:
                    yield gpu
                finally:
                    handle.close()
                return
            time.sleep(0.02)
            if time.monotonic() - last_beat > heartbeat_interval():
                last_beat = time.monotonic()
                if not reporter.heartbeat():
                    yield None
                    return
