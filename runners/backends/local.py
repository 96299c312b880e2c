"""Runs the harness on this machine, one run per device at a time (a file lock per `Gpu` row)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import logging
import os
import queue
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings

from leaderboards import actions
from leaderboards.models import Run, RunStatus
from runners.jobs import harness_job, total_timeout, workdir_files
from runners.models import Gpu

from .base import RunnerBackend

log = logging.getLogger(__name__)
PROGRESS_INTERVAL = 0.5
HEARTBEAT_INTERVAL = 2.0  # at most; a quarter of the heartbeat deadline when that is shorter


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphaned harness


def heartbeat_interval() -> float:
    return min(HEARTBEAT_INTERVAL, settings.RUN_HEARTBEAT_DEADLINE / 4)


class LocalBackend(RunnerBackend):
    heartbeats = True  # the run lives in this worker: its deadline follows the worker's heartbeats

    def dispatch(self, run_id: int, attempt: int) -> None:
        run = Run.objects.select_related("submission__problem", "submission__leaderboard", "submission__code",
                                         "gpu_type").get(pk=run_id)
        with self.device(run, attempt) as gpu:
            if gpu is None:
                return
            timeout = total_timeout(run)
            if not actions.do_mark_running(run_id, attempt, deadline_seconds=settings.RUN_HEARTBEAT_DEADLINE):
                return
            workdir = Path(settings.RUNS_DIR) / f"run-{run_id}-{attempt}"
            shutil.rmtree(workdir, ignore_errors=True)
            try:
                workdir.mkdir(parents=True)
                for name, text in workdir_files(run).items():
                    (workdir / name).write_text(text)
                devices = [] if run.gpu_type.is_cpu else [str(gpu.index)]
                job = harness_job(run, workdir, devices, gpu)
                result, failure = self.run_harness(run_id, attempt, job, timeout)
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
        if result is not None:
            actions.do_ingest_result(run_id, attempt, result)
        elif failure:
            actions.do_report_failure(run_id, attempt, failure)

    @contextlib.contextmanager
    def device(self, run: Run, attempt: int) -> Iterator[Gpu | None]:
        """Hold an exclusive lock on one free device of the run's type, waiting for one if all are busy (with
        heartbeats); None when the run moved on meanwhile."""
        gpus = list(Gpu.objects.filter(node__pool=self.pool, node__enabled=True, enabled=True,
                                       gpu_type=run.gpu_type))
        if not gpus:
            raise RuntimeError(f"pool '{self.pool.name}' has no enabled {run.gpu_type} device")
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
                if not actions.do_heartbeat(run.pk, attempt, RunStatus.DISPATCHED):
                    yield None
                    return

    def run_harness(self, run_id: int, attempt: int, job: dict, timeout: int) -> tuple[dict | None, str]:
        python = settings.HARNESS_PYTHON or sys.executable
        env = {"PATH": os.environ.get("PATH", os.defpath), "LANG": "C.UTF-8", "PYTHONPATH": str(settings.BASE_DIR),
               "HOME": job["workdir"], "KERNELBOT_SANDBOX": os.environ.get("KERNELBOT_SANDBOX", ""),
               "KERNELBOT_CGROUP": os.environ.get("KERNELBOT_CGROUP", "")}
        job = {**job, "nonce": secrets.token_hex(16)}  # only the trusted parent's result echoes it
        proc = subprocess.Popen(
            [python, "-m", "runners.harness"], cwd=settings.BASE_DIR, env=env, stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
        lines: queue.Queue[bytes | None] = queue.Queue()
        stderr_tail: list[bytes] = []
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        threading.Thread(target=_tail, args=(proc.stderr, stderr_tail), daemon=True).start()
        proc.stdin.write(json.dumps(job).encode())
        proc.stdin.close()

        started = last_check = last_progress = time.monotonic()
        result, failure = None, ""
        while True:
            try:
                line = lines.get(timeout=0.5)
            except queue.Empty:
                line = b""
            now = time.monotonic()
            if line is None:
                break
            if line.strip():
                event = _parse(line)
                if event.get("event") == "result":
                    if event.get("nonce") != job["nonce"]:
                        result = {"status": "ok", "verdict": "hacked", "passed": False,
                                  "error": "a result line without the run's nonce reached the runner (forged)"}
                        break
                    result = {**event, "runner_timing": {"harness_s": round(now - started, 4)}}
                    break  # the verdict is final; don't wait for the interpreter's teardown
                elif event.get("event") == "progress" and now - last_progress >= PROGRESS_INTERVAL:
                    last_progress = now
                    actions.do_record_progress(run_id, attempt, event)
            if now - started > timeout:
                failure = f"harness exceeded the run's total time limit of {timeout} s"
                break
            if now - last_check > heartbeat_interval():
                last_check = now
                if not actions.do_heartbeat(run_id, attempt, RunStatus.RUNNING):
                    log.info("run %s attempt %s moved on; stopping its harness", run_id, attempt)
                    failure = ""
                    break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if result is None and not failure and proc.returncode not in (None, -signal.SIGKILL):
            tail = b"".join(stderr_tail).decode(errors="replace")[-2000:]
            failure = f"harness exited with code {proc.returncode} without a result: {tail}"
        return result, failure


def _pump(stream, lines: queue.Queue) -> None:
    for line in iter(stream.readline, b""):
        lines.put(line)
    lines.put(None)


def _tail(stream, keep: list[bytes], limit: int = 64 << 10) -> None:
    size = 0
    for chunk in iter(lambda: stream.read(4096), b""):
        keep.append(chunk)
        size += len(chunk)
        while size > limit and len(keep) > 1:
            size -= len(keep.pop(0))


def _parse(line: bytes) -> dict:
    try:
        event = json.loads(line)
    except ValueError:
        return {}
    return event if isinstance(event, dict) else {}
