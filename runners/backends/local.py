"""Runs the harness on this machine, one run per device at a time (a device hold from the allocator that runs and
reservations share)."""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from runners.harness.runner import run_harness, write_workdir
from runners.jobs import run_limits, sandbox_uid
from runners.models import Gpu
from runners.reservations import allocator

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
        with self.device(job, reporter) as gpu:
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
    def device(self, job: Dispatch, reporter: Reporter) -> Iterator[Gpu | None]:
        """One device of the run's type from the allocator, which runs and reservations share, waiting for one while
        all are held (with heartbeats); None when the run moved on meanwhile."""
        if not Gpu.objects.filter(node__pool=self.pool, node__enabled=True, enabled=True,
                                  gpu_type=job.gpu_type).exists():
            raise RuntimeError(f"pool '{self.pool.name}' has no enabled {job.gpu_type} device")
        last_beat = time.monotonic()
        while (hold := allocator.acquire_for_run(
                self.pool, job.gpu_type, run_id=job.run_id, attempt=job.attempt, user_id=job.user_id,
                leaderboard=job.project, seconds=job.timeout_s,
                lease_seconds=allocator.run_lease_seconds())) is None:
            time.sleep(0.05)
            if time.monotonic() - last_beat > heartbeat_interval():
                last_beat = time.monotonic()
                if not reporter.heartbeat():
                    yield None
                    return
        with allocator.leased(hold, allocator.run_lease_seconds()):
            yield hold.gpu
